from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_CHECKPOINTING: _ClassVar[TaskState]
    TASK_STATE_STOPPED: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_CHECKPOINTING: TaskState
TASK_STATE_STOPPED: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState

class Capacity(_message.Message):
    __slots__ = ("gpus", "cpus", "memory_gb")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    gpus: float
    cpus: float
    memory_gb: float
    def __init__(self, gpus: _Optional[float] = ..., cpus: _Optional[float] = ..., memory_gb: _Optional[float] = ...) -> None: ...

class AttemptRef(_message.Message):
    __slots__ = ("task_id", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("task_id", "attempt", "job_id", "state", "iterations", "throughput", "window_s", "checkpoint", "exit_code", "reason", "phases", "log_tail")
    class PhasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    job_id: str
    state: TaskState
    iterations: float
    throughput: float
    window_s: float
    checkpoint: str
    exit_code: int
    reason: str
    phases: _containers.ScalarMap[str, float]
    log_tail: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., job_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., iterations: _Optional[float] = ..., throughput: _Optional[float] = ..., window_s: _Optional[float] = ..., checkpoint: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., phases: _Optional[_Mapping[str, float]] = ..., log_tail: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("instance_id", "capacity", "agent_version", "address", "csr_pem", "tasks", "gpu_devices")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    GPU_DEVICES_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    capacity: Capacity
    agent_version: str
    address: str
    csr_pem: bytes
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    gpu_devices: int
    def __init__(self, instance_id: _Optional[str] = ..., capacity: _Optional[_Union[Capacity, _Mapping]] = ..., agent_version: _Optional[str] = ..., address: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., gpu_devices: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session", "certificate_pem", "server_name", "daemon_token", "storage_url", "heartbeat_interval_s", "acknowledged")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    DAEMON_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STORAGE_URL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    session: str
    certificate_pem: bytes
    server_name: str
    daemon_token: str
    storage_url: str
    heartbeat_interval_s: float
    acknowledged: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    def __init__(self, session: _Optional[str] = ..., certificate_pem: _Optional[bytes] = ..., server_name: _Optional[str] = ..., daemon_token: _Optional[str] = ..., storage_url: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., acknowledged: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("instance_id", "session", "tasks")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    session: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, instance_id: _Optional[str] = ..., session: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("acknowledged", "heartbeat_interval_s")
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    acknowledged: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    heartbeat_interval_s: float
    def __init__(self, acknowledged: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class TaskRun(_message.Message):
    __slots__ = ("build_context", "image", "command", "env", "shm_size_gb", "network")
    BUILD_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_GB_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    build_context: str
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    shm_size_gb: float
    network: bool
    def __init__(self, build_context: _Optional[str] = ..., image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., shm_size_gb: _Optional[float] = ..., network: _Optional[bool] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("cpus", "memory_gb", "gpus", "shm_size_gb")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_GB_FIELD_NUMBER: _ClassVar[int]
    cpus: float
    memory_gb: float
    gpus: _containers.RepeatedScalarFieldContainer[int]
    shm_size_gb: float
    def __init__(self, cpus: _Optional[float] = ..., memory_gb: _Optional[float] = ..., gpus: _Optional[_Iterable[int]] = ..., shm_size_gb: _Optional[float] = ...) -> None: ...

class StartTaskRequest(_message.Message):
    __slots__ = ("task_id", "job_id", "attempt", "instance_id", "workload", "run", "limits", "checkpoint")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    attempt: int
    instance_id: str
    workload: str
    run: TaskRun
    limits: Limits
    checkpoint: str
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., instance_id: _Optional[str] = ..., workload: _Optional[str] = ..., run: _Optional[_Union[TaskRun, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., checkpoint: _Optional[str] = ...) -> None: ...

class StartTaskResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: TaskStatus
    def __init__(self, status: _Optional[_Union[TaskStatus, _Mapping]] = ...) -> None: ...

class StopTaskRequest(_message.Message):
    __slots__ = ("task_id", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class StopTaskResponse(_message.Message):
    __slots__ = ("known", "status")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    known: bool
    status: TaskStatus
    def __init__(self, known: _Optional[bool] = ..., status: _Optional[_Union[TaskStatus, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...
