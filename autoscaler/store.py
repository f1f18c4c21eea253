"""The `Store` interface: what the control loop persists, as named state transitions.

Bindings: `state` (SQLAlchemy; SQLite by default, PostgreSQL in production)
and `state.memory.InMemoryStore` (replay and unit tests). Both call the pure
rules of `autoscaler.transitions` and only persist what they return: one owner
per transition, storage only stores (as in Ray autoscaler v2's instance manager).

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
  read the ledger, so they stay right when catalog prices change. A running
  spot instance is billed at the spot price in effect, which moves while it
  runs: `reprice_instances` closes its stretch when the price changed and opens
  one at the new price (`autoscaler.spot.repriced`), so the ledger is a chain
  of price segments whose sum is what the provider bills.
- **Snapshots are consistent**: `snapshot()` reads everything the planner
  needs in one transaction.
- **A round is recorded with its intents, at once.** `record_round` stores the
  decision and, unless it is a dry run, what it means for the state (instances
  requested, tasks' targets, instances to drain) in the same transaction: the
  round's actions are carried out only after, from the state, so a crash
  between the two leaves a decision the next step carries out.
- **Placements are written by task updates**: a task's instance changing closes
  its open placement and opens the next, so reports know what ran where, when.
- **Measured delays are written by task updates**: the phase durations an
  update carries (`TaskUpdate.phases`) fold into a bounded running mean per
  instance type and phase, in the same transaction, so an attempt's phases
  count once; the snapshot carries them to the migration criterion (Eva §4.5).
- **Transitions carry their reasons** (an instance terminated because its
  worker went silent; a task back to pending because its start timed out).

The protocol holds what production calls, nothing more: tests set a state up
through the same methods the control loop and the API use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from autoscaler.jobs import JobSpec
from autoscaler.throughput import Colocated, ThroughputEntry, ThroughputTable
from autoscaler.view import MeasuredDelays, PhaseSample, ReconfigurationHistory

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
    reason: str = ""  # why it failed (or was cancelled)
    # Iterations per second when the job ran alone, learned when the spec gave none.
    solo_throughput: float | None = None
    # The owner's team when the job was submitted ("": none): whose share of a binding
    # budget it spends (`autoscaler.fairshare`).
    team: str = ""

    @property
    def job_id(self) -> str:
        return self.spec.job_id


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """Where a task is and where the current plan wants it.

    `instance_id` is the instance it runs on (or is starting on, or is being
    checkpointed from); `target_instance_id` the one the latest adopted plan
    assigned it to. `progress` is the job's completed iterations as last
    observed; `checkpoint` where its latest complete checkpoint is stored.
    `attempt` counts its starts (the executor's idempotency key); of the
    attempts that ended early, `moves` counts those the plan moved, `retries`
    those that failed (of any class) and were started again, `failures` those
    that count toward `max_attempts` (the job's own failures, not the
    infrastructure's), `failure` the class of the latest (`FailureClass`), and
    `retry_at` when a transient failure's back-off lets the next attempt start;
    `drain_from` an instance the operator drained this task (only) off: the next
    round places it elsewhere (cleared once it starts elsewhere).
    `status_since` is when it entered its status (timeouts are measured from
    it) and `reason` why.
    """

    task_id: str
    job_id: str
    status: TaskStatus = "pending"
    instance_id: str | None = None
    target_instance_id: str | None = None
    progress: float = 0.0
    checkpoint: str | None = None
    updated_at: float | None = None
    attempt: int = 0
    failures: int = 0
    status_since: float | None = None
    reason: str = ""
    throughput: float | None = None  # raw iterations per second, as last reported
    gpus: tuple[int, ...] = ()  # device indices on its instance
    moves: int = 0
    retries: int = 0
    failure: str | None = None  # "deterministic", "transient" or "infrastructure"
    retry_at: float | None = None
    drain_from: str | None = None


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """What to change in one task (fields left at their defaults are kept)."""

    task_id: str
    status: TaskStatus | None = None
    instance_id: str | Literal["keep"] | None = "keep"
    progress: float | None = None
    checkpoint: str | None = None
    attempt: int | None = None
    failures: int | None = None
    reason: str | None = None
    throughput: float | Literal["keep"] | None = "keep"
    gpus: tuple[int, ...] | None = None
    # Phases of the attempt this update starts or ends, measured by its worker, to fold
    # into the measured delays of the instance type it ran on (`MeasuredDelays`).
    phases: tuple[PhaseSample, ...] = ()
    moves: int | None = None
    retries: int | None = None
    failure: str | None = None
    retry_at: float | None = None
    drain_from: str | None = None  # "": cleared


@dataclass(frozen=True, slots=True)
class InstanceChange:
    """One instance transition, for `transition_instances`."""

    instance_id: str
    status: InstanceStatus
    cloud_id: str | None = None
    zone: str | None = None
    reason: str = ""
    private_address: str | None = None  # as the cloud reports it (kept once known)
    # The price the cloud bills it at, when it says (`CloudInstance.hourly_price`): taken
    # when the instance enters billing, so its uptime is billed at it.
    hourly_price: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """An instance the cluster asked for. `instance_id` is ours (the launch token),
    used everywhere outside the Cloud binding; `cloud_id` the cloud's, once the
    launch succeeded, known only to the binding and the state. `ready_at` is
    when its worker registered, `lost_at` when it was declared lost; `reason`
    is why it entered its current status."""

    instance_id: str
    instance_type: str
    status: InstanceStatus
    # At the time of the request, or the price the cloud named when it landed (a spot
    # instance's zone price); the ledger bills this.
    hourly_price: float
    requested_at: float
    cloud_id: str | None = None
    zone: str | None = None
    history: tuple[tuple[str, float], ...] = ()
    ready_at: float | None = None
    lost_at: float | None = None
    reason: str = ""
    # Its private address as the cloud reported it: an enrolling worker's signed identity
    # document must name it (and `cloud_id`).
    private_address: str | None = None
    # When its provider announced it reclaims it (a spot interruption notice): from then
    # on nothing is placed on it, and it is terminated once its tasks have left.
    reclaimed_at: float | None = None
    # The on-demand price of its EC2 type when it was requested (its catalog's): what a
    # spot instance saved is measured against it, not against a later price (None: not
    # recorded, an instance requested before it was).
    on_demand_price: float | None = None

    def entered(self, status: str) -> float | None:
        """When the instance last entered `status` (None if it never did)."""
        for name, at in reversed(self.history):
            if name == status:
                return at
        return None


@dataclass(frozen=True, slots=True)
class UptimeInterval:
    """A stretch of billed uptime of one instance, at its record's price (`InstanceRecord`)."""

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
class PriceChange:
    """The price a running instance is billed at changed at `at` (its spot offering's
    price in its zone moved): for `reprice_instances`."""

    instance_id: str
    hourly_price: float
    at: float


@dataclass(frozen=True, slots=True)
class RefreshedPrices:
    """The spot prices a cluster last refreshed from its provider (USD/hour by type and
    zone, as the cloud binding names zones), dated: kept in the state so a restarted
    daemon plans and quotes with them rather than with a bundled snapshot."""

    region: str
    prices: Mapping[str, Mapping[str, float]]
    retrieved_at: float
    source: str = ""


#: What an interruption record may be: the provider reclaimed the instance (its two-minute
#: notice), or recommended rebalancing away from it.
InterruptionKind = Literal["reclaim", "rebalance"]


@dataclass(frozen=True, slots=True)
class InterruptionRecord:
    """One notice a provider gave about an instance, with the offering it was bought as
    (the instance's catalog name: type, market, zone): the cluster's own interruption
    history, from which an observed rate per offering is drawn."""

    offering: str
    instance_id: str
    at: float
    kind: InterruptionKind = "reclaim"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A stretch of time a task occupied an instance (from its start until it left).

    The second ledger beside the uptime intervals: what ran where, when. Cost
    reports split an instance's bill among the tasks on it from these.
    """

    task_id: str
    job_id: str
    instance_id: str
    attempt: int
    start: float
    end: float | None = None  # None: still there


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One action a round decided, why, and what came of it."""

    kind: Literal["launch", "terminate", "start", "migrate", "stop", "adopt", "report"]
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
    job_events: int = 0  # the store's count of arrivals and completions its snapshot saw


@dataclass(frozen=True, slots=True)
class RoundIntents:
    """What an adopted round means for the state, recorded with the round.

    `requests`: (our id, type, hourly price) of instances to launch;
    `targets`: task -> the instance the plan assigns it to (None: unplaced);
    `drains`: (instance, reason) of instances the plan no longer uses;
    `keeps`: (instance, reason) of drained instances the plan takes back (running again);
    `terminations`: (instance, status, reason) of instances to give up now:
    `terminating` (then terminated by the cloud) or `failed` (never launched);
    `on_demand_prices`: requested instance -> the on-demand price of its EC2 type at
    the request (the catalog's then), kept with it.
    """

    requests: tuple[tuple[str, str, float], ...] = ()
    targets: Mapping[str, str | None] = field(default_factory=dict)
    drains: tuple[tuple[str, str], ...] = ()
    keeps: tuple[tuple[str, str], ...] = ()
    terminations: tuple[tuple[str, InstanceStatus, str], ...] = ()
    on_demand_prices: Mapping[str, float] = field(default_factory=dict)

    def instance_changes(self) -> list[InstanceChange]:
        """The instance transitions the round asks for: its keeps, drains, then terminations."""
        keeps = [InstanceChange(i, "running", reason=why) for i, why in self.keeps]
        drains = [InstanceChange(i, "draining", reason=why) for i, why in self.drains]
        return (
            keeps + drains + [InstanceChange(i, s, reason=why) for i, s, why in self.terminations]
        )


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
    instances_requested: int = 0  # every instance ever requested (numbers new launch tokens)
    job_events: int = 0  # arrivals plus completions so far
    last_round_job_events: int | None = None  # what the latest round saw (None: no round yet)
    delays: MeasuredDelays = field(default_factory=MeasuredDelays)  # phases measured per type

    def history(self, now: float) -> ReconfigurationHistory:
        """What the migration criterion needs, as of `now`."""
        elapsed = 0.0 if self.first_round_at is None else max(0.0, now - self.first_round_at)
        return ReconfigurationHistory(elapsed, self.event_rounds, self.full_rounds)


@dataclass(frozen=True, slots=True)
class StateCounts:
    """How many of each there are now, what the daemon's metrics show: the active jobs
    and their tasks by status, the live instances by (type, status), and the $/h of the
    billed ones at the prices recorded with their requests (summed in request order)."""

    jobs: Mapping[str, int]
    tasks: Mapping[str, int]
    instances: Mapping[tuple[str, str], int]
    hourly_cost: float

    @classmethod
    def of(cls, snapshot: StateSnapshot) -> StateCounts:
        """The counts of a snapshot (what a binding without a cheaper query returns)."""
        jobs: dict[str, int] = {}
        for job in snapshot.jobs:
            jobs[job.status] = jobs.get(job.status, 0) + 1
        tasks: dict[str, int] = {}
        for task in snapshot.tasks.values():
            tasks[task.status] = tasks.get(task.status, 0) + 1
        return cls(
            jobs,
            tasks,
            *instance_counts(
                (i.instance_type, i.status, i.hourly_price) for i in snapshot.instances
            ),
        )


def instance_counts(
    rows: Iterable[tuple[str, str, float]],
) -> tuple[dict[tuple[str, str], int], float]:
    """Live instances, each (type, status, hourly price) in request order: their counts by
    (type, status), and the $/h of the billed ones."""
    counts: dict[tuple[str, str], int] = {}
    cost = 0.0
    for instance_type, status, price in rows:
        key = (instance_type, status)
        counts[key] = counts.get(key, 0) + 1
        if status in BILLED_STATUSES:
            cost += price
    return counts, cost


@runtime_checkable
class Store(Protocol):
    """Persistent state of the cluster, changed only by the transitions below."""

    # -- jobs -------------------------------------------------------------
    def submit_job(self, job: JobSpec, *, owner: str, at: float, team: str = "") -> JobRecord:
        """Queue a job and its tasks (pending), owned by `owner` of `team`; raises DuplicateJob."""
        ...

    def cancel_job(self, job_id: str, at: float) -> bool:
        """Cancel a queued or running job and its tasks; False if it had already finished."""
        ...

    def job_started(self, job_id: str, at: float) -> bool:
        """First moment all its tasks run: queued → running (started_at set once)."""
        ...

    def job_finished(
        self, job_id: str, at: float, status: JobStatus = "completed", reason: str = ""
    ) -> bool:
        """A running or queued job completed (or failed, with the reason); its tasks end too."""
        ...

    def learn_solo_throughput(self, job_id: str, throughput: float) -> bool:
        """Record the job's iterations per second alone, once (False if already known)."""
        ...

    # -- tasks ------------------------------------------------------------
    def update_tasks(self, updates: Iterable[TaskUpdate], at: float) -> set[str]:
        """Record what the executor reports, or what a step starts, in one transaction.
        Returns the tasks updated (tasks of finished jobs are left alone); a change of
        status resets `status_since`. UnknownEntity for an unknown task."""
        ...

    # -- instances --------------------------------------------------------
    def transition_instances(self, changes: Iterable[InstanceChange], at: float) -> set[str]:
        """Move instances along the status machine, in one transaction, all or none
        (IllegalTransition if one move is not allowed). Each opens or closes its uptime
        interval; returns the instances that changed (one already in its status did not)."""
        ...

    def transition_instance(
        self,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        *,
        cloud_id: str | None = None,
        zone: str | None = None,
        reason: str = "",
    ) -> bool:
        """`transition_instances` of one change: False if it is already in that status.
        (Defined here once: bindings subclass `Store` and inherit it.)"""
        change = InstanceChange(instance_id, status, cloud_id, zone, reason)
        return instance_id in self.transition_instances([change], at)

    def reprice_instances(self, changes: Iterable[PriceChange]) -> set[str]:
        """Bill running instances at new prices, in one transaction: each change closes
        the instance's open uptime stretch at its time and opens one at its price (the
        rule, `autoscaler.spot.repriced`: a change at the stretch's own start re-prices
        it in place, one before it or at the price already billed writes nothing, so a
        replayed refresh writes nothing twice); the instance's record takes the price.
        Changes apply in time order; an instance without an open stretch is left alone.
        Returns the instances whose ledger changed."""
        ...

    def record_spot_prices(self, prices: RefreshedPrices) -> bool:
        """Keep `prices` as the region's last refreshed spot prices, unless those kept are
        as new or newer (False then)."""
        ...

    def spot_prices(self, region: str) -> RefreshedPrices | None:
        """The region's last refreshed spot prices kept, None when none are."""
        ...

    def instance_worker(
        self, instance_id: str, at: float, *, ready: bool, reason: str = ""
    ) -> bool:
        """Its worker registered (`ready`) or was declared lost (with the reason), once each."""
        ...

    def instance_notice(
        self, instance_id: str, kind: InterruptionKind, at: float, reason: str = ""
    ) -> bool:
        """Its provider reclaims it (a spot interruption notice: `reclaimed_at` is set, with
        the reason) or recommends rebalancing away from it; either is added to the
        interruption history with the instance's offering, once per instance and kind
        (False: recorded before). UnknownEntity for an unknown instance."""
        ...

    def interruption_counts(self, since: float) -> dict[str, int]:
        """Reclaims per offering at or after `since` (offerings with none are absent)."""
        ...

    def interruptions(self, since: float | None = None) -> list[InterruptionRecord]:
        """The interruption history (reclaims and rebalance recommendations) at or after
        `since` (all when None), oldest first."""
        ...

    # -- learning ---------------------------------------------------------
    def record_throughput(
        self,
        entries: Iterable[tuple[str, Colocated, ThroughputEntry]],
        forget: Iterable[tuple[str, Colocated]] = (),
    ) -> None:
        """Upsert co-location throughput table entries and delete the `forget` keys
        (`ThroughputTable.bounded` decides which), in one transaction."""
        ...

    # -- rounds -----------------------------------------------------------
    def record_round(self, record: RoundRecord, intents: RoundIntents | None = None) -> int:
        """Store a round's decision and planned actions, with its intents (none in a
        dry run), in one transaction; returns its id."""
        ...

    def record_action_outcomes(
        self, round_id: int, outcomes: Iterable[tuple[int, str, str]]
    ) -> None:
        """What came of a round's actions, each (index, outcome, message), in one
        transaction (UnknownEntity, and nothing recorded, if the round has no such action)."""
        ...

    # -- reads ------------------------------------------------------------
    def snapshot(
        self, default_throughput: float = ..., *, with_throughput: bool = True
    ) -> StateSnapshot:
        """Everything a round reads, in one transaction (the throughput table only
        when asked: a step between rounds does not need it)."""
        ...

    def state_counts(self) -> StateCounts:
        """The counts the metrics show, now (`StateCounts`); bindings that can count in
        one query override it. (Defined here once: bindings inherit it.)"""
        return StateCounts.of(self.snapshot(with_throughput=False))

    def job(self, job_id: str) -> JobRecord | None: ...

    def jobs(self, statuses: Iterable[str] | None = None) -> list[JobRecord]: ...

    def tasks_of(self, job_id: str) -> list[TaskRecord]: ...

    def tasks_of_jobs(self, job_ids: Iterable[str]) -> dict[str, list[TaskRecord]]:
        """`tasks_of` for many jobs at once (a job list, a dashboard page); bindings
        that pay per query read them in one. (Defined here once: bindings inherit it.)"""
        return {job_id: self.tasks_of(job_id) for job_id in job_ids}

    def instance(self, instance_id: str) -> InstanceRecord | None: ...

    def instances(self, include_finished: bool = False) -> list[InstanceRecord]: ...

    def rounds(self, limit: int | None = None) -> list[RoundRecord]:
        """The latest `limit` rounds (all when None), oldest first."""
        ...

    def uptime(self, since: float | None = None) -> list[UptimeInterval]:
        """Billed intervals overlapping [since, now] (all when None), oldest first: a
        reader of a window reads that window, not the cluster's whole history."""
        ...

    def placements(self, since: float | None = None) -> list[Placement]:
        """Placements overlapping [since, now] (all when None), oldest first."""
        ...

    def cost_between(self, t0: float, t1: float) -> float:
        """Dollars billed within [t0, t1], from the ledger."""
        ...
