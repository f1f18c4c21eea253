"""The state's transitions and its ledgers, as pure functions of records.

Both `Store` bindings call these and only persist what they return, so each
rule has one owner (Ray autoscaler v2: one component changes an instance's
status, its storage only stores it). A function takes the current record(s),
the change and the time, and returns the new record(s) with the ledger effects
the change implies — an uptime interval to open, at the price recorded with the
instance's request, or to close; a placement to open or to close — or None when
the rule leaves the state as it is; it raises `IllegalTransition` for a change
the instance status machine forbids.

The rules (the contract of `autoscaler.store`):

- **Finished is final**: a completed, cancelled or failed job and its tasks are
  never changed again; a job that finishes ends its tasks (their status follows
  the job's, their targets are cleared, their placements close).
- **Instances follow `TRANSITIONS`** and keep the history of their statuses.
- **Billing** runs while an instance is in a `BILLED_STATUSES` status, from its
  launch request (the cloud bills from then on) at the price of the request, or at
  the price the cloud named when the instance landed (a spot zone's).
- **Placements**: a task whose instance changes leaves the one it was on and
  enters the next, so reports know what ran where, when.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoscaler.jobs import JobSpec
from autoscaler.store import (
    BILLED_STATUSES,
    FINAL_JOB_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    InstanceChange,
    InstanceRecord,
    JobRecord,
    JobStatus,
    Placement,
    TaskRecord,
    TaskStatus,
    TaskUpdate,
    UptimeInterval,
)
from autoscaler.view import PhaseSample

#: What a finished job's tasks become.
TASK_STATUS_OF_FINISHED_JOB: dict[str, TaskStatus] = {
    "completed": "completed",
    "cancelled": "cancelled",
    "failed": "failed",
}


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A job's end: the job and its tasks after it, and the tasks whose open placement
    closes at the time of the end."""

    job: JobRecord
    tasks: tuple[TaskRecord, ...]
    leaves: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TaskStep:
    """A task update's effects: the task after it; whether the placement it had closes
    (at the time of the update); the placement it opens; the phases to measure."""

    task: TaskRecord
    leaves: bool = False
    enters: Placement | None = None
    measured: tuple[PhaseSample, ...] = ()


@dataclass(frozen=True, slots=True)
class InstanceStep:
    """An instance transition's effects: the instance after it (its history ending with
    the new status), the uptime interval it opens, whether its open one closes (at the
    time of the transition)."""

    instance: InstanceRecord
    opens: UptimeInterval | None = None
    closes: bool = False


# -- jobs -------------------------------------------------------------------------------------


def submitted_job(
    spec: JobSpec, owner: str, at: float, team: str = ""
) -> tuple[JobRecord, tuple[TaskRecord, ...]]:
    """A job just submitted: queued, each of its tasks pending since `at`."""
    tasks = tuple(
        TaskRecord(t.task_id, spec.job_id, updated_at=at, status_since=at) for t in spec.tasks
    )
    return JobRecord(spec, "queued", owner, at, team=team), tasks


def start_job(job: JobRecord, at: float) -> JobRecord | None:
    """The first moment all its tasks run: queued → running, `started_at` set once
    (None: the job finished, or started before)."""
    if job.status in FINAL_JOB_STATUSES or job.started_at is not None:
        return None
    return replace(job, status="running", started_at=at)


def finish_job(
    job: JobRecord, tasks: tuple[TaskRecord, ...], status: JobStatus, reason: str, at: float
) -> JobEnd | None:
    """The job ends with `status` (and why); its tasks end with it (None: it had ended)."""
    if job.status in FINAL_JOB_STATUSES:
        return None
    task_status = TASK_STATUS_OF_FINISHED_JOB[status]
    # A task says why it ended: its job's end, unless it had completed on its own.
    why = {"cancelled": "cancelled", "failed": "its job failed", "completed": "completed"}[status]
    ended = tuple(
        replace(
            t,
            status=task_status,
            target_instance_id=None,
            updated_at=at,
            status_since=at,
            reason=t.reason if t.status == "completed" else why,
        )
        for t in tasks
    )
    leaves = tuple(t.task_id for t in tasks if t.instance_id is not None)
    return JobEnd(replace(job, status=status, finished_at=at, reason=reason), ended, leaves)


def learn_solo_throughput(job: JobRecord, throughput: float) -> JobRecord | None:
    """The job's iterations per second alone, learned once (None: already known)."""
    if job.solo_throughput is not None:
        return None
    return replace(job, solo_throughput=throughput)


# -- tasks ------------------------------------------------------------------------------------


def retarget_task(
    job_status: str, task: TaskRecord, target: str | None, at: float
) -> TaskRecord | None:
    """The task with the target instance an adopted plan gives it: itself when its
    target is already that one, None when its job has finished."""
    if job_status in FINAL_JOB_STATUSES:
        return None
    if not retargets(job_status, task.target_instance_id, target):
        return task
    return replace(task, target_instance_id=target, updated_at=at)


def retargets(job_status: str, current: str | None, target: str | None) -> bool:
    """Whether adopting `target` changes a task whose target is `current` (`retarget_task`
    then writes its target and `updated_at`, nothing else): a store can decide it from
    those two columns without reading whole tasks."""
    return job_status not in FINAL_JOB_STATUSES and current != target


def update_task(
    job_status: str, task: TaskRecord, change: TaskUpdate, at: float
) -> TaskStep | None:
    """`change` applied to `task` at `at` (None: its job has finished).

    Fields the change leaves at their defaults are kept; a change of status resets
    `status_since`. A change of instance closes the placement the task had and opens
    one on its new instance (none when it leaves for no instance).
    """
    if job_status in FINAL_JOB_STATUSES:
        return None
    status = task.status if change.status is None else change.status
    new = TaskRecord(
        task.task_id,
        task.job_id,
        status,
        task.instance_id if change.instance_id == "keep" else change.instance_id,
        task.target_instance_id,
        task.progress if change.progress is None else change.progress,
        task.checkpoint if change.checkpoint is None else change.checkpoint,
        at,
        task.attempt if change.attempt is None else change.attempt,
        task.failures if change.failures is None else change.failures,
        at if status != task.status or task.status_since is None else task.status_since,
        task.reason if change.reason is None else change.reason,
        task.throughput if change.throughput == "keep" else change.throughput,
        task.gpus if change.gpus is None else change.gpus,
        task.moves if change.moves is None else change.moves,
        task.retries if change.retries is None else change.retries,
        task.failure if change.failure is None else change.failure,
        task.retry_at if change.retry_at is None else change.retry_at,
        task.drain_from if change.drain_from is None else (change.drain_from or None),
    )
    if new.instance_id == task.instance_id:
        return TaskStep(new, measured=change.phases)
    enters = (
        None
        if new.instance_id is None
        else Placement(new.task_id, new.job_id, new.instance_id, new.attempt, at)
    )
    return TaskStep(new, task.instance_id is not None, enters, change.phases)


# -- instances --------------------------------------------------------------------------------


def request_instance(
    instance_id: str,
    instance_type: str,
    hourly_price: float,
    at: float,
    on_demand_price: float | None = None,
) -> InstanceRecord:
    """An instance recorded before the cloud is asked for it (its id is the launch
    token), at the price of the time; it bills from here once it is launched.
    `on_demand_price`: its EC2 type's on-demand price of the time, if known."""
    return InstanceRecord(
        instance_id,
        instance_type,
        "requested",
        hourly_price,
        at,
        history=(("requested", at),),
        on_demand_price=on_demand_price,
    )


def transition_instance(
    inst: InstanceRecord, change: InstanceChange, at: float
) -> InstanceStep | None:
    """Move an instance along `TRANSITIONS` (None: it is in that status already).

    Entering billing opens an uptime interval from its request at its request's
    price, or at the price the cloud named for it when it landed (`change.hourly_price`:
    a spot instance is billed at the price of the zone it landed in, not at the regional
    figure it was planned at); leaving billing closes it. A cloud id, zone or private
    address the change does not give is kept. Raises IllegalTransition for a move the
    status machine forbids.
    """
    if inst.status == change.status:
        return None
    if change.status not in TRANSITIONS[inst.status]:
        raise IllegalTransition(inst.instance_id, inst.status, change.status)
    billed_before = inst.status in BILLED_STATUSES
    billed_after = change.status in BILLED_STATUSES
    opening = billed_after and not billed_before
    # Built field by field, not with `dataclasses.replace` (which inspects the fields on
    # every call): a first round's launches are answered thousands at a time.
    new = InstanceRecord(
        instance_id=inst.instance_id,
        instance_type=inst.instance_type,
        status=change.status,
        # billing starts once (from "requested"), at the price the cloud named if it did
        hourly_price=change.hourly_price
        if opening and change.hourly_price is not None
        else inst.hourly_price,
        requested_at=inst.requested_at,
        cloud_id=change.cloud_id or inst.cloud_id,
        zone=change.zone or inst.zone,
        history=(*inst.history, (change.status, at)),
        ready_at=inst.ready_at,
        lost_at=inst.lost_at,
        reason=change.reason,
        private_address=change.private_address or inst.private_address,
        reclaimed_at=inst.reclaimed_at,
        on_demand_price=inst.on_demand_price,
    )
    if opening:
        # From the request, at its price: the cloud bills from the launch on.
        start = inst.requested_at
        opens = UptimeInterval(inst.instance_id, inst.instance_type, new.hourly_price, start)
        return InstanceStep(new, opens=opens)
    return InstanceStep(new, closes=billed_before and not billed_after)


def instance_worker(
    inst: InstanceRecord, at: float, *, ready: bool, reason: str = ""
) -> InstanceRecord | None:
    """Its worker registered (`ready`) or was declared lost, with the reason; each
    once (None: already recorded)."""
    if ready:
        return None if inst.ready_at is not None else replace(inst, ready_at=at)
    return None if inst.lost_at is not None else replace(inst, lost_at=at, reason=reason)


def reclaim_instance(inst: InstanceRecord, at: float, reason: str) -> InstanceRecord | None:
    """Its provider announced it reclaims it: `reclaimed_at` set once, with the reason
    (None: recorded before, or the instance has ended)."""
    if inst.reclaimed_at is not None or inst.status in ("terminated", "failed"):
        return None
    return replace(inst, reclaimed_at=at, reason=reason)
