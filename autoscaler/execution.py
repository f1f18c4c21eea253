"""The `Executor` and `Clock` interfaces: running tasks, and telling time.

Executor bindings: `executor.client.GrpcExecutor` (gRPC to a worker agent
running Docker on every instance) in production, `simulator.world` in replay.
Instances are named by *our* id (the launch token) everywhere here: a worker
learns it from its instance (user data), never from the cloud's id.

The contract, which every binding honours:

- **Asynchronous.** `start` and `stop` return at once; what happened shows in
  a later `report()` (a task moves starting → running, or checkpointing →
  stopped).
- **Attempts, and idempotence by attempt.** Every start of a task carries an
  attempt number, one more than the last; starting the same (task, attempt)
  twice starts one container, and stopping an attempt that already stopped,
  or that the executor never saw, does nothing. The control loop records an
  attempt before asking for it, so after a crash it simply asks again.
- **Checkpoint before stop.** `stop` asks the task to checkpoint, then stops
  it; the checkpoint's location is reported with the `stopped` state, and a
  later `start` anywhere resumes from it, losing no checkpointed work. A
  checkpoint is referenced only once it is complete.
- **Terminal states are reported until acknowledged.** `stopped`,
  `completed` and `failed` stay in every report until `acknowledge`, so a
  control loop that crashed before recording one sees it again.
- **Failures carry their reason and their class** (`FailureClass`): the image
  did not build, the process exited with a code, it ran out of memory, its
  worker was lost — and whether that was the job's deterministic error, a
  transient one, or the infrastructure's doing (which never counts against
  the job).
- **Readiness and liveness.** An instance can take tasks once its worker has
  registered (`ready_instances`); a worker silent past the heartbeat timeout
  is reported in `lost_instances` with the reason, and its tasks as `failed`.
- **Raw throughput.** Each running task reports iterations per second over
  its last window (None until a window has passed). The core normalizes it by
  the job's solo throughput (`JobSpec.full_throughput`, else learned the first
  time the job runs alone): bindings never guess what "alone" means.
- **Measured phases.** A report may carry how long each phase of the attempt
  took (fetch, build, start, checkpoint, upload), in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from autoscaler.jobs import TaskRun

TaskState = Literal["starting", "running", "checkpointing", "stopped", "completed", "failed"]

#: Whose doing an attempt's end was, so only the job's own failures count against it:
#: - "deterministic": the job's error, and a retry would repeat it (the build fails, the
#:   image cannot be pulled, the command is not found, an exit code the job declares
#:   fatal): fail the job at once, with the reason;
#: - "transient": the job failed but a retry may not (a crash, out of memory, a runtime
#:   error): retry with back-off, counting toward `max_attempts`;
#: - "infrastructure": not the job's doing (stopped on request, worker or instance lost,
#:   the agent going down, storage out of reach): never counts.
FailureClass = Literal["deterministic", "transient", "infrastructure"]

#: States after which an attempt does nothing more (reported until acknowledged).
TERMINAL_TASK_STATES: frozenset[str] = frozenset({"stopped", "completed", "failed"})


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """What the container of one task may use on its instance."""

    cpus: float  # physical cores
    memory_gb: float
    gpus: tuple[int, ...] = ()  # device indices on the instance
    shm_size_gb: float | None = None


@dataclass(frozen=True, slots=True)
class TaskLaunch:
    """Everything a worker needs to start (or resume) one attempt of a task."""

    task_id: str
    job_id: str
    attempt: int  # 1 for the first start; one more at every start after it
    instance_id: str  # ours (the launch token)
    workload: str
    run: TaskRun
    limits: ResourceLimits
    checkpoint: str | None = None  # resume from here; None: start from scratch


@dataclass(frozen=True, slots=True)
class TaskReport:
    """What the executor knows about the latest attempt of one task."""

    task_id: str
    state: TaskState
    instance_id: str | None
    attempt: int = 1
    progress: float = 0.0  # iterations done, as of the latest report or checkpoint
    throughput: float | None = None  # raw iterations per second over the last window
    checkpoint: str | None = None  # latest complete checkpoint
    exit_code: int | None = None
    reason: str = ""  # why it failed or stopped
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> seconds
    log_tail: tuple[str, ...] = ()
    failure: FailureClass | None = None  # of a failed (or stopped) attempt: whose doing


#: The provider's two-minute warning before it reclaims a spot instance.
INSTANCE_ACTION = "instance-action"
#: A rebalance recommendation: a higher risk of interruption soon.
REBALANCE = "rebalance"


@dataclass(frozen=True, slots=True)
class InstanceNotice:
    """What the provider announced about an instance (EC2 spot, through IMDS; the local
    cloud emulates it): `kind` INSTANCE_ACTION (it is being reclaimed: its worker
    checkpoints and stops its tasks) or REBALANCE; `action` and `time` as published."""

    kind: str
    action: str = ""
    time: str = ""

    @property
    def reclaims(self) -> bool:
        return self.kind == INSTANCE_ACTION

    def describe(self) -> str:
        if self.reclaims:
            return f"spot interruption notice ({self.action or 'terminate'} at {self.time})"
        return f"rebalance recommendation ({self.time})"


@dataclass(frozen=True, slots=True)
class ExecutorReport:
    tasks: Mapping[str, TaskReport] = field(default_factory=dict)
    ready_instances: frozenset[str] = frozenset()
    lost_instances: Mapping[str, str] = field(default_factory=dict)  # instance -> reason
    # instance -> what its provider announced (spot notices), oldest first
    notices: Mapping[str, tuple[InstanceNotice, ...]] = field(default_factory=dict)


@runtime_checkable
class Executor(Protocol):
    """Start, checkpoint-and-stop, and observe tasks on instances."""

    def start(self, launch: TaskLaunch) -> None:
        """Start (or resume from `launch.checkpoint`) one attempt of a task on a ready instance."""
        ...

    def stop(self, task_id: str, attempt: int) -> None:
        """Checkpoint the attempt, then stop it (reported `stopped` when done)."""
        ...

    def report(self) -> ExecutorReport:
        """Current state of the tasks it runs and of the instances' workers."""
        ...

    def acknowledge(self, task_id: str, attempt: int) -> None:
        """The attempt's terminal state is recorded: stop reporting it."""
        ...

    def release(self, instance_id: str) -> None:
        """The instance is gone or going: forget its worker."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Seconds: the wall clock in production, the event loop's virtual clock in replay."""

    def now(self) -> float: ...
