from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FailureClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_CLASS_UNSPECIFIED: _ClassVar[FailureClass]
    FAILURE_CLASS_DETERMINISTIC: _ClassVar[FailureClass]
    FAILURE_CLASS_TRANSIENT: _ClassVar[FailureClass]
    FAILURE_CLASS_INFRASTRUCTURE: _ClassVar[FailureClass]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_CHECKPOINTING: _ClassVar[TaskState]
    TASK_STATE_STOPPED: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]

class ObjectKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECT_KIND_UNSPECIFIED: _ClassVar[ObjectKind]
    OBJECT_KIND_CHECKPOINT: _ClassVar[ObjectKind]
    OBJECT_KIND_LOG: _ClassVar[ObjectKind]
FAILURE_CLASS_UNSPECIFIED: FailureClass
FAILURE_CLASS_DETERMINISTIC: FailureClass
FAILURE_CLASS_TRANSIENT: FailureClass
FAILURE_CLASS_INFRASTRUCTURE: FailureClass
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_CHECKPOINTING: TaskState
TASK_STATE_STOPPED: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
OBJECT_KIND_UNSPECIFIED: ObjectKind
OBJECT_KIND_CHECKPOINT: ObjectKind
OBJECT_KIND_LOG: ObjectKind

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
    __slots__ = ("task_id", "attempt", "job_id", "state", "iterations", "throughput", "window_s", "checkpoint", "exit_code", "reason", "phases", "log_tail", "failure")
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
    FAILURE_FIELD_NUMBER: _ClassVar[int]
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
    failure: FailureClass
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., job_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., iterations: _Optional[float] = ..., throughput: _Optional[float] = ..., window_s: _Optional[float] = ..., checkpoint: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., phases: _Optional[_Mapping[str, float]] = ..., log_tail: _Optional[_Iterable[str]] = ..., failure: _Optional[_Union[FailureClass, str]] = ...) -> None: ...

class Ec2Identity(_message.Message):
    __slots__ = ("document", "pkcs7", "rsa2048")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    PKCS7_FIELD_NUMBER: _ClassVar[int]
    RSA2048_FIELD_NUMBER: _ClassVar[int]
    document: bytes
    pkcs7: str
    rsa2048: str
    def __init__(self, document: _Optional[bytes] = ..., pkcs7: _Optional[str] = ..., rsa2048: _Optional[str] = ...) -> None: ...

class EnrollRequest(_message.Message):
    __slots__ = ("instance_id", "ec2", "local_secret", "csr_pem", "held")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EC2_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SECRET_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    ec2: Ec2Identity
    local_secret: str
    csr_pem: bytes
    held: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    def __init__(self, instance_id: _Optional[str] = ..., ec2: _Optional[_Union[Ec2Identity, _Mapping]] = ..., local_secret: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., held: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("certificate_pem", "registry_address", "heartbeat_interval_s", "stop", "heartbeat_timeout_s")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    registry_address: str
    heartbeat_interval_s: float
    stop: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    heartbeat_timeout_s: float
    def __init__(self, certificate_pem: _Optional[bytes] = ..., registry_address: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., stop: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., heartbeat_timeout_s: _Optional[float] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("certificate_pem",)
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    def __init__(self, certificate_pem: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("capacity", "agent_version", "gpu_devices", "tasks", "notices")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPU_DEVICES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    capacity: Capacity
    agent_version: str
    gpu_devices: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    notices: _containers.RepeatedCompositeFieldContainer[InterruptionNotice]
    def __init__(self, capacity: _Optional[_Union[Capacity, _Mapping]] = ..., agent_version: _Optional[str] = ..., gpu_devices: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., notices: _Optional[_Iterable[_Union[InterruptionNotice, _Mapping]]] = ...) -> None: ...

class InterruptionNotice(_message.Message):
    __slots__ = ("kind", "action", "time")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    action: str
    time: str
    def __init__(self, kind: _Optional[str] = ..., action: _Optional[str] = ..., time: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("acknowledged", "stop", "heartbeat_interval_s", "heartbeat_timeout_s")
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    acknowledged: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    stop: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    def __init__(self, acknowledged: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., stop: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., heartbeat_interval_s: _Optional[float] = ..., heartbeat_timeout_s: _Optional[float] = ...) -> None: ...

class CommandsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class TaskRun(_message.Message):
    __slots__ = ("build_context", "image", "command", "env", "shm_size_gb", "network", "checkpoint_every_s", "fatal_exit_codes")
    BUILD_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_GB_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_S_FIELD_NUMBER: _ClassVar[int]
    FATAL_EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    build_context: str
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    shm_size_gb: float
    network: bool
    checkpoint_every_s: float
    fatal_exit_codes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, build_context: _Optional[str] = ..., image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., shm_size_gb: _Optional[float] = ..., network: _Optional[bool] = ..., checkpoint_every_s: _Optional[float] = ..., fatal_exit_codes: _Optional[_Iterable[int]] = ...) -> None: ...

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

class StartTask(_message.Message):
    __slots__ = ("task_id", "job_id", "attempt", "instance_id", "workload", "run", "limits", "checkpoint", "build_context_url", "checkpoint_url")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BUILD_CONTEXT_URL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    attempt: int
    instance_id: str
    workload: str
    run: TaskRun
    limits: Limits
    checkpoint: str
    build_context_url: str
    checkpoint_url: str
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., instance_id: _Optional[str] = ..., workload: _Optional[str] = ..., run: _Optional[_Union[TaskRun, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., checkpoint: _Optional[str] = ..., build_context_url: _Optional[str] = ..., checkpoint_url: _Optional[str] = ...) -> None: ...

class StopTask(_message.Message):
    __slots__ = ("task_id", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: StartTask
    stop: StopTask
    def __init__(self, start: _Optional[_Union[StartTask, _Mapping]] = ..., stop: _Optional[_Union[StopTask, _Mapping]] = ...) -> None: ...

class GrantUploadRequest(_message.Message):
    __slots__ = ("task_id", "attempt", "kind", "step")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    kind: ObjectKind
    step: int
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., kind: _Optional[_Union[ObjectKind, str]] = ..., step: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("url", "ref", "expires_at")
    URL_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    url: str
    ref: str
    expires_at: float
    def __init__(self, url: _Optional[str] = ..., ref: _Optional[str] = ..., expires_at: _Optional[float] = ...) -> None: ...
