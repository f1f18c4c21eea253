from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class MissingContextsRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digests: _Optional[_Iterable[str]] = ...) -> None: ...

class MissingContextsResponse(_message.Message):
    __slots__ = ("missing", "refs")
    class RefsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MISSING_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    missing: _containers.RepeatedScalarFieldContainer[str]
    refs: _containers.ScalarMap[str, str]
    def __init__(self, missing: _Optional[_Iterable[str]] = ..., refs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ContextChunk(_message.Message):
    __slots__ = ("digest", "size", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size: int
    data: bytes
    def __init__(self, digest: _Optional[str] = ..., size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadContextResponse(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: str
    def __init__(self, ref: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec_json", "owner")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    owner: str
    def __init__(self, spec_json: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "show_secrets")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SHOW_SECRETS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    show_secrets: bool
    def __init__(self, job_id: _Optional[str] = ..., show_secrets: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("statuses", "limit")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, statuses: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("cancelled", "status")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    status: str
    def __init__(self, cancelled: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class DrainInstanceRequest(_message.Message):
    __slots__ = ("instance_id", "job_id")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    job_id: str
    def __init__(self, instance_id: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class DrainInstanceResponse(_message.Message):
    __slots__ = ("draining", "status", "tasks")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    status: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, draining: _Optional[bool] = ..., status: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ...) -> None: ...

class GetLogsRequest(_message.Message):
    __slots__ = ("job_id", "task", "tail")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task: str
    tail: int
    def __init__(self, job_id: _Optional[str] = ..., task: _Optional[str] = ..., tail: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CostReportRequest(_message.Message):
    __slots__ = ("since", "dry_run_json")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_JSON_FIELD_NUMBER: _ClassVar[int]
    since: float
    dry_run_json: str
    def __init__(self, since: _Optional[float] = ..., dry_run_json: _Optional[str] = ...) -> None: ...

class GetCatalogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UserRequest(_message.Message):
    __slots__ = ("name", "role", "team", "overlap_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    team: str
    overlap_s: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., team: _Optional[str] = ..., overlap_s: _Optional[float] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("user", "since", "limit")
    USER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user: str
    since: float
    limit: int
    def __init__(self, user: _Optional[str] = ..., since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class TeamRequest(_message.Message):
    __slots__ = ("name", "weight", "max_hourly_spend", "max_share", "daily_budget", "priority", "max_priority")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_HOURLY_SPEND_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARE_FIELD_NUMBER: _ClassVar[int]
    DAILY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    max_hourly_spend: float
    max_share: float
    daily_budget: float
    priority: int
    max_priority: int
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ..., max_hourly_spend: _Optional[float] = ..., max_share: _Optional[float] = ..., daily_budget: _Optional[float] = ..., priority: _Optional[int] = ..., max_priority: _Optional[int] = ...) -> None: ...

class ListTeamsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QuoteJobRequest(_message.Message):
    __slots__ = ("spec_json", "duration_s", "iterations", "throughput")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    duration_s: float
    iterations: float
    throughput: float
    def __init__(self, spec_json: _Optional[str] = ..., duration_s: _Optional[float] = ..., iterations: _Optional[float] = ..., throughput: _Optional[float] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
