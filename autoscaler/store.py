"""The `Store` interface: what the control loop persists, as named state transitions.

Bindings: `state` (SQLAlchemy; SQLite by default, PostgreSQL in production)
and `InMemoryStore` below (replay and unit tests).

The contract every binding honours (checked by `tests/store_contract.py`):

- **One transition, one transaction.** Each method that changes state either
  happens entirely or not at all; a process killed at any point leaves a
  store the next start continues from.
- **Finished is final.** A transition never touches a job that is cancelled,
  completed or failed, nor its tasks (it returns False instead): a user's
  cancellation committed while a round was planning survives the round's
  writes.
- **Instances follow a status machine** (`TRANSITIONS`) and keep the history
  of their statuses with times; an illegal transition is refused.
- **The cost ledger is written by instance transitions**: an uptime interval
  opens when an instance starts billing (`pending`) at the price recorded at
  its request, and closes when it is `terminated` or `failed`. Reports
  read the ledger, so they stay right when catalog prices change.
- **Snapshots are consistent**: `snapshot()` reads everything the planner
  needs in one transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from autoscaler.jobs import JobSpec
from autoscaler.throughput import Colocated, ThroughputEntry, ThroughputTable
from autoscaler.view import ReconfigurationHistory

JobStatus = Literal["queued", "running", "completed", "cancelled", "failed"]
TaskStatus = Literal[
    "pending", "starting", "running", "checkpointing", "completed", "cancelled", "failed"
]
InstanceStatus = Literal[
    "requested", "pending", "running", "draining", "terminating", "terminated", "failed"
]

FINAL_JOB_STATUSES: frozenset[str] = frozenset({"completed", "cancelled", "failed"})
FINAL_INSTANCE_STATUSES: frozenset[str] = frozenset({"terminated", "failed"})

#: Allowed instance transitions: requested → pending → running → draining →
#: terminating → terminated, or failed; draining can be undone (the plan kept
#: it after all); a requested instance the cloud refused fails directly.
TRANSITIONS: Mapping[str, frozenset[str]] = {
    "requested": frozenset({"pending", "running", "failed", "terminating", "terminated"}),
    "pending": frozenset({"running", "draining", "terminating", "terminated", "failed"}),
    "running": frozenset({"draining", "terminating", "terminated", "failed"}),
    "draining": frozenset({"running", "terminating", "terminated", "failed"}),
    "terminating": frozenset({"terminated", "failed"}),
    "terminated": frozenset(),
    "failed": frozenset(),
}
#: Statuses in which the cloud bills for an instance.
BILLED_STATUSES: frozenset[str] = frozenset({"pending", "running", "draining", "terminating"})


class StoreError(Exception):
    """A store operation could not be done as asked."""


class DuplicateJob(StoreError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"a job with id {job_id!r} already exists")
        self.job_id = job_id


class UnknownEntity(StoreError):
    pass


class IllegalTransition(StoreError):
    def __init__(self, instance_id: str, current: str, wanted: str) -> None:
        super().__init__(f"instance {instance_id}: cannot go from {current} to {wanted}")
        self.instance_id, self.current, self.wanted = instance_id, current, wanted


@dataclass(frozen=True, slots=True)
class JobRecord:
    spec: JobSpec
    status: JobStatus
    owner: str
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def job_id(self) -> str:
        return self.spec.job_id


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """Where a task is and where the current plan wants it.

    `instance_id` is the instance it runs on (or is starting on, or is being
    checkpointed from); `target_instance_id` the one the latest adopted plan
    assigned it to. `progress` is the job's completed iterations as last
    observed; `checkpoint` where its latest checkpoint is stored.
    """

    task_id: str
    job_id: str
    status: TaskStatus = "pending"
    instance_id: str | None = None
    target_instance_id: str | None = None
    progress: float = 0.0
    checkpoint: str | None = None
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """An instance the cluster asked for. `instance_id` is ours (the launch token);
    `cloud_id` the cloud's, once the launch succeeded."""

    instance_id: str
    instance_type: str
    status: InstanceStatus
    hourly_price: float  # at the time of the request; the ledger bills this
    requested_at: float
    cloud_id: str | None = None
    zone: str | None = None
    history: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class UptimeInterval:
    """A stretch of billed uptime of one instance, at the price of its request."""

    instance_id: str
    instance_type: str
    hourly_price: float
    start: float
    end: float | None = None  # None: still running

    def cost(self, t0: float, t1: float) -> float:
        """Dollars billed within [t0, t1] (an open interval is billed up to t1)."""
        end = t1 if self.end is None else min(self.end, t1)
        seconds = max(0.0, end - max(self.start, t0))
        return seconds / 3600.0 * self.hourly_price


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One action a round decided, why, and what came of it."""

    kind: Literal["launch", "terminate", "start", "migrate", "stop", "adopt"]
    target: str  # an instance id or a task id
    reason: str
    outcome: Literal["planned", "done", "refused", "failed", "skipped"] = "planned"
    message: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A scheduling round: the decision, the numbers behind it, its actions."""

    at: float
    planner: str
    chosen: str  # "full", "partial", or "none" (nothing to plan)
    had_event: bool
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    actions: tuple[ActionRecord, ...] = ()
    round_id: int | None = None


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """Everything a round reads, from one consistent point in time."""

    jobs: tuple[JobRecord, ...]  # queued and running
    tasks: Mapping[str, TaskRecord]  # of those jobs
    instances: tuple[InstanceRecord, ...]  # not terminated or failed
    throughput: ThroughputTable
    first_round_at: float | None = None
    event_rounds: int = 0  # rounds in which a job arrived or completed
    full_rounds: int = 0  # of those, rounds that adopted a Full Reconfiguration

    def history(self, now: float) -> ReconfigurationHistory:
        """What the migration criterion needs, as of `now`."""
        elapsed = 0.0 if self.first_round_at is None else max(0.0, now - self.first_round_at)
        return ReconfigurationHistory(elapsed, self.event_rounds, self.full_rounds)


@runtime_checkable
class Store(Protocol):
    """Persistent state of the cluster, changed only by the transitions below."""

    # -- jobs -------------------------------------------------------------
    def submit_job(self, job: JobSpec, *, owner: str, at: float) -> JobRecord:
        """Queue a job and its tasks (pending); raises DuplicateJob."""
        ...

    def cancel_job(self, job_id: str, at: float) -> bool:
        """Cancel a queued or running job and its tasks; False if it had already finished."""
        ...

    def job_started(self, job_id: str, at: float) -> bool:
        """First moment all its tasks run: queued → running (started_at set once)."""
        ...

    def job_finished(self, job_id: str, at: float, status: JobStatus = "completed") -> bool:
        """A running or queued job completed (or failed); its tasks complete."""
        ...

    # -- tasks ------------------------------------------------------------
    def assign_tasks(self, targets: Mapping[str, str | None], at: float) -> set[str]:
        """Adopt a plan: set each task's target instance. Returns the tasks whose
        target is now as asked (tasks of finished jobs are left alone)."""
        ...

    def update_task(
        self,
        task_id: str,
        at: float,
        *,
        status: TaskStatus | None = None,
        instance_id: str | Literal["keep"] | None = "keep",
        progress: float | None = None,
        checkpoint: str | None = None,
    ) -> bool:
        """Record what the executor reports about a task; False if its job has finished."""
        ...

    # -- instances --------------------------------------------------------
    def request_instance(
        self, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> InstanceRecord:
        """Record an instance before asking the cloud for it (its id is the launch token)."""
        ...

    def transition_instance(
        self,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        *,
        cloud_id: str | None = None,
        zone: str | None = None,
    ) -> bool:
        """Move an instance along the status machine (IllegalTransition if not allowed;
        False if it is already in that status). Opens/closes its uptime interval."""
        ...

    # -- learning ---------------------------------------------------------
    def record_throughput(self, entries: Iterable[tuple[str, Colocated, ThroughputEntry]]) -> None:
        """Upsert co-location throughput table entries."""
        ...

    # -- rounds -----------------------------------------------------------
    def record_round(self, record: RoundRecord) -> int:
        """Store a round's decision and planned actions; returns its id."""
        ...

    def record_action_outcome(
        self, round_id: int, index: int, outcome: str, message: str = ""
    ) -> None:
        """Record what came of a round's action (UnknownEntity if it has no such action)."""
        ...

    # -- reads ------------------------------------------------------------
    def snapshot(self, default_throughput: float = ...) -> StateSnapshot: ...

    def job(self, job_id: str) -> JobRecord | None: ...

    def jobs(self, statuses: Iterable[str] | None = None) -> list[JobRecord]: ...

    def tasks_of(self, job_id: str) -> list[TaskRecord]: ...

    def instance(self, instance_id: str) -> InstanceRecord | None: ...

    def instances(self, include_finished: bool = False) -> list[InstanceRecord]: ...

    def rounds(self, limit: int | None = None) -> list[RoundRecord]:
        """The latest `limit` rounds (all when None), oldest first."""
        ...

    def uptime(self) -> list[UptimeInterval]: ...

    def cost_between(self, t0: float, t1: float) -> float:
        """Dollars billed within [t0, t1], from the ledger."""
        ...


class InMemoryStore:
    """`Store` in process memory: for replays and tests. Thread-safe; snapshots are copies."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, JobRecord] = {}
        self._active: dict[str, None] = {}  # unfinished jobs, in submission order
        self._live: dict[str, None] = {}  # instances not yet terminated or failed
        self._tasks: dict[str, TaskRecord] = {}
        self._tasks_of: dict[str, list[str]] = {}
        self._instances: dict[str, InstanceRecord] = {}
        self._entries: dict[tuple[str, Colocated], ThroughputEntry] = {}
        self._rounds: list[RoundRecord] = []
        self._uptime: list[UptimeInterval] = []
        self._open: dict[str, int] = {}  # instance id -> index of its open interval
        self._first_round_at: float | None = None
        self._event_rounds = 0
        self._full_rounds = 0

    # -- jobs -------------------------------------------------------------
    def submit_job(self, job: JobSpec, *, owner: str, at: float) -> JobRecord:
        with self._lock:
            if job.job_id in self._jobs:
                raise DuplicateJob(job.job_id)
            record = JobRecord(job, "queued", owner, at)
            self._jobs[job.job_id] = record
            self._active[job.job_id] = None
            self._tasks_of[job.job_id] = [t.task_id for t in job.tasks]
            for t in job.tasks:
                self._tasks[t.task_id] = TaskRecord(t.task_id, job.job_id, updated_at=at)
            return record

    def cancel_job(self, job_id: str, at: float) -> bool:
        return self._finish(job_id, at, "cancelled", "cancelled")

    def job_started(self, job_id: str, at: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status in FINAL_JOB_STATUSES:
                return False
            if job.started_at is not None:
                return False
            self._jobs[job_id] = replace(job, status="running", started_at=at)
            return True

    def job_finished(self, job_id: str, at: float, status: JobStatus = "completed") -> bool:
        return self._finish(job_id, at, status, "completed" if status == "completed" else "failed")

    def _finish(self, job_id: str, at: float, status: str, task_status: str) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownEntity(f"no job {job_id!r}")
            if job.status in FINAL_JOB_STATUSES:
                return False
            self._jobs[job_id] = replace(job, status=status, finished_at=at)  # type: ignore[arg-type]
            self._active.pop(job_id, None)
            for tid in self._tasks_of[job_id]:
                self._tasks[tid] = replace(
                    self._tasks[tid],
                    status=task_status,  # type: ignore[arg-type]
                    target_instance_id=None,
                    updated_at=at,
                )
            return True

    # -- tasks ------------------------------------------------------------
    def assign_tasks(self, targets: Mapping[str, str | None], at: float) -> set[str]:
        with self._lock:
            done = set()
            for tid, target in targets.items():
                task = self._tasks.get(tid)
                if task is None or self._jobs[task.job_id].status in FINAL_JOB_STATUSES:
                    continue
                if task.target_instance_id != target:
                    self._tasks[tid] = replace(task, target_instance_id=target, updated_at=at)
                done.add(tid)
            return done

    def update_task(
        self,
        task_id: str,
        at: float,
        *,
        status: TaskStatus | None = None,
        instance_id: str | Literal["keep"] | None = "keep",
        progress: float | None = None,
        checkpoint: str | None = None,
    ) -> bool:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise UnknownEntity(f"no task {task_id!r}")
            if self._jobs[task.job_id].status in FINAL_JOB_STATUSES:
                return False
            self._tasks[task_id] = TaskRecord(
                task_id,
                task.job_id,
                task.status if status is None else status,
                task.instance_id if instance_id == "keep" else instance_id,
                task.target_instance_id,
                task.progress if progress is None else progress,
                task.checkpoint if checkpoint is None else checkpoint,
                at,
            )
            return True

    # -- instances --------------------------------------------------------
    def request_instance(
        self, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> InstanceRecord:
        with self._lock:
            existing = self._instances.get(instance_id)
            if existing is not None:
                return existing  # idempotent: the same launch token
            record = InstanceRecord(
                instance_id,
                instance_type,
                "requested",
                hourly_price,
                at,
                history=(("requested", at),),
            )
            self._instances[instance_id] = record
            self._live[instance_id] = None
            return record

    def transition_instance(
        self,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        *,
        cloud_id: str | None = None,
        zone: str | None = None,
    ) -> bool:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            if inst.status == status:
                return False
            if status not in TRANSITIONS[inst.status]:
                raise IllegalTransition(instance_id, inst.status, status)
            self._instances[instance_id] = replace(
                inst,
                status=status,
                cloud_id=cloud_id or inst.cloud_id,
                zone=zone or inst.zone,
                history=(*inst.history, (status, at)),
            )
            if status in FINAL_INSTANCE_STATUSES:
                self._live.pop(instance_id, None)
            billed_before = inst.status in BILLED_STATUSES
            billed_after = status in BILLED_STATUSES
            if billed_after and not billed_before:
                # Billing runs from the launch request (the cloud bills from then on).
                self._open[instance_id] = len(self._uptime)
                self._uptime.append(
                    UptimeInterval(
                        instance_id, inst.instance_type, inst.hourly_price, inst.requested_at
                    )
                )
            elif billed_before and not billed_after:
                index = self._open.pop(instance_id)
                self._uptime[index] = replace(self._uptime[index], end=at)
            return True

    # -- learning ---------------------------------------------------------
    def record_throughput(self, entries: Iterable[tuple[str, Colocated, ThroughputEntry]]) -> None:
        with self._lock:
            for workload, colocated, entry in entries:
                self._entries[(workload, tuple(sorted(colocated)))] = entry

    # -- rounds -----------------------------------------------------------
    def record_round(self, record: RoundRecord) -> int:
        with self._lock:
            round_id = len(self._rounds) + 1
            self._rounds.append(replace(record, round_id=round_id))
            if self._first_round_at is None:
                self._first_round_at = record.at
            if record.had_event:
                self._event_rounds += 1
                self._full_rounds += record.chosen == "full"
            return round_id

    def record_action_outcome(
        self, round_id: int, index: int, outcome: str, message: str = ""
    ) -> None:
        with self._lock:
            if not 1 <= round_id <= len(self._rounds):
                raise UnknownEntity(f"no round {round_id}")
            rnd = self._rounds[round_id - 1]
            if not 0 <= index < len(rnd.actions):
                raise UnknownEntity(f"no action {index} in round {round_id}")
            actions = list(rnd.actions)
            actions[index] = replace(actions[index], outcome=outcome, message=message)  # type: ignore[arg-type]
            self._rounds[round_id - 1] = replace(rnd, actions=tuple(actions))

    # -- reads ------------------------------------------------------------
    def snapshot(self, default_throughput: float = 0.95) -> StateSnapshot:
        with self._lock:
            jobs = tuple(self._jobs[j] for j in self._active)
            tasks = {tid: self._tasks[tid] for j in jobs for tid in self._tasks_of[j.job_id]}
            instances = tuple(self._instances[i] for i in self._live)
            return StateSnapshot(
                jobs,
                tasks,
                instances,
                ThroughputTable(self._entries, default_throughput),
                self._first_round_at,
                self._event_rounds,
                self._full_rounds,
            )

    def job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self, statuses: Iterable[str] | None = None) -> list[JobRecord]:
        with self._lock:
            wanted = None if statuses is None else set(statuses)
            return [j for j in self._jobs.values() if wanted is None or j.status in wanted]

    def tasks_of(self, job_id: str) -> list[TaskRecord]:
        with self._lock:
            return [self._tasks[t] for t in self._tasks_of.get(job_id, ())]

    def instance(self, instance_id: str) -> InstanceRecord | None:
        with self._lock:
            return self._instances.get(instance_id)

    def instances(self, include_finished: bool = False) -> list[InstanceRecord]:
        with self._lock:
            if include_finished:
                return list(self._instances.values())
            return [self._instances[i] for i in self._live]

    def rounds(self, limit: int | None = None) -> list[RoundRecord]:
        with self._lock:
            if limit is None:
                return list(self._rounds)
            return self._rounds[max(len(self._rounds) - limit, 0) :] if limit > 0 else []

    def uptime(self) -> list[UptimeInterval]:
        with self._lock:
            return list(self._uptime)

    def cost_between(self, t0: float, t1: float) -> float:
        with self._lock:
            return sum(i.cost(t0, t1) for i in self._uptime)
