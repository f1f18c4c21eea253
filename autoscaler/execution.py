"""The `Executor` and `Clock` interfaces: running tasks, and telling time.

Executor bindings: `executor` (gRPC to a worker agent running Docker) in
production, `simulator` in replay. The contract:

- **Asynchronous.** `start` and `stop` return at once; what happened shows in
  the next `report()` (a task moves starting → running, or checkpointing →
  stopped).
- **Checkpoint before stop.** `stop` checkpoints the task and then stops it;
  the checkpoint's location is reported, and a later `start` elsewhere
  resumes from it, losing no completed work.
- **Readiness.** An instance can take tasks once its worker has registered;
  `report().ready_instances` lists those.
- **Throughput.** Each running job's throughput over the last window is
  reported normalized (1.0 = as fast as alone). For a multi-task job this is
  the job's pace, set by its slowest task (Eva §4.4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from autoscaler.jobs import JobSpec

TaskState = Literal["starting", "running", "checkpointing", "stopped", "completed", "failed"]


@dataclass(frozen=True, slots=True)
class TaskReport:
    """What the executor knows about one task it was asked to run."""

    task_id: str
    state: TaskState
    instance_id: str | None
    progress: float = 0.0  # the job's completed iterations, as of the latest checkpoint or report
    checkpoint: str | None = None


@dataclass(frozen=True, slots=True)
class ExecutorReport:
    tasks: Mapping[str, TaskReport] = field(default_factory=dict)
    ready_instances: frozenset[str] = frozenset()
    job_throughput: Mapping[str, float] = field(default_factory=dict)  # normalized, running jobs
    completed_jobs: frozenset[str] = frozenset()  # completed and not yet forgotten


@runtime_checkable
class Executor(Protocol):
    """Start, checkpoint-and-stop, and observe tasks on instances."""

    def start(self, job: JobSpec, task_id: str, instance_id: str, checkpoint: str | None) -> None:
        """Start (or resume from `checkpoint`) a task on a ready instance."""
        ...

    def stop(self, task_id: str) -> None:
        """Checkpoint the task, then stop it (reported `stopped` when done)."""
        ...

    def report(self) -> ExecutorReport:
        """Current state of the tasks it runs and of the instances' workers."""
        ...

    def forget(self, job_id: str) -> None:
        """The job's completion is recorded: stop reporting it."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Seconds: the wall clock in production, the event loop's virtual clock in replay."""

    def now(self) -> float: ...
