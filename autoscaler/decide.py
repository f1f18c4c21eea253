"""Deciding: pure functions from a snapshot of the state to what should happen.

Two decisions, both functions of plain data (no cloud, no executor, no
database, no clock — the time is an argument):

- `decide` — a scheduling round (Eva §4, every period): plan the jobs onto
  instances (the planner), diff the plan against the current configuration
  into launches, drains and task moves, check every launch against the
  guardrails, report tasks that nothing available can host (they wait; the
  round goes on for everyone else), and judge orphans.
- `advance` — a step between rounds (every few seconds): carry the adopted
  plan out as far as the world allows — start tasks on instances whose worker
  is ready, move a task once its destination is ready (make before break: it
  keeps running where it is until then), terminate drained instances once
  empty — and apply the timeouts (an instance that never boots or whose worker
  never registers, a task stuck starting or checkpointing, a lost worker),
  each with its reason.

`autoscaler.control` records each decision before it acts on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from autoscaler.catalog import Catalog
from autoscaler.cloud import (
    UNAVAILABLE_COOLDOWN_S,
    CloudInstance,
    Guardrails,
    LaunchRefused,
    OrphanAction,
    OrphanPolicy,
    UnavailableOffering,
    live_spend_of,
    unavailable_types,
)
from autoscaler.configuration import Configuration, Instance
from autoscaler.criterion import expected_duration_h
from autoscaler.errors import InputError
from autoscaler.execution import ResourceLimits, TaskLaunch
from autoscaler.failures import Backoff, attempt_ended
from autoscaler.fairshare import Admission, Claim, TeamPolicy, admit
from autoscaler.jobs import Demands, JobSpec, TaskSpec
from autoscaler.planner import Plan
from autoscaler.pricing import cheapest_type, reservation_price
from autoscaler.resources import Resources, total
from autoscaler.spend import Spending
from autoscaler.spot import (
    NOTICE_S,
    SpotPolicy,
    exposure_hours,
    from_scratch_pins,
    job_capacity,
    job_deadline_s,
    on_demand_price,
    pinned_on_demand,
    planned_rate,
    reclaim_ceiling,
    reclaim_loss_s,
    reclaim_lost_s,
    reclaims_pin,
    restart_s,
    rollback_s,
    spot_discount,
    spread,
    without_misfits,
)
from autoscaler.store import (
    ActionRecord,
    InstanceRecord,
    InterruptionRecord,
    JobRecord,
    RoundIntents,
    RoundRecord,
    StateSnapshot,
    TaskRecord,
    TaskUpdate,
)
from autoscaler.throughput import DEFAULT_THROUGHPUT
from autoscaler.view import ClusterView
from autoscaler.work import Work, job_work

#: Task statuses in which a task occupies an instance.
ON_INSTANCE: frozenset[str] = frozenset({"starting", "running", "checkpointing"})
#: Instance statuses a plan may keep or place tasks on.
PLANNABLE: frozenset[str] = frozenset({"requested", "pending", "running"})
#: A job whose solo speed is unknown (no `full_throughput` in its spec, none learned
#: yet) runs each task alone until it is measured: its throughput beside others can
#: only be normalized by it (§4.3), so until then no interference it suffers is
#: learned, and a job that is never alone would stay packed however slow it runs. One
#: that has run alone this long and still reported no throughput cannot be measured: it
#: is packed on the default throughput from then on.
SOLO_PROBE_S = 1800.0


#: Why a round drains an instance; `stranded_sources` takes back only drains of this reason.
PLAN_DRAIN = "the plan no longer uses it: drain, then terminate"
#: Why a round takes back an instance it had drained (`stranded_sources`).
KEPT_STRANDED = "kept: the instance its task(s) were to move to is gone; they stay where they run"


class Planner(Protocol):
    name: str

    def plan(self, view: ClusterView) -> Plan: ...


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long each transition may take before it is given up, with a reason (seconds).

    Defaults are generous multiples of Eva's Table 1 (acquisition ≤ 83 s, setup
    ≤ 251 s, launch ≤ 160 s, checkpoint ≤ 30 s): they catch what is stuck,
    not what is slow.
    """

    boot_s: float = 900.0  # launch request → the cloud reports it running
    register_s: float = 900.0  # running → its worker registered
    start_s: float = 1800.0  # task starting → running (fetch, build, start)
    checkpoint_s: float = 900.0  # task checkpointing → stopped


@dataclass(frozen=True, slots=True)
class BootBackoff:
    """How launches of a type back off when its instances boot but their workers never
    register (a broken image, bootstrap, network or permission: relaunching at once only
    pays for the same failure again).

    After k such failures in a row (none of that type registering since), the type is
    not launched again until `base_s * 2**(k-1)` after the last one ended; from
    `hold_after` failures on it is held for `hold_s`, with the last failure's cause as
    the reason; after `cluster_hold_after` in a row of any types, every type is.
    Counted from the state's instance records, so a restarted daemon holds the same.
    A worker of the type registering ends the streak.
    """

    base_s: float = 300.0
    hold_after: int = 3
    hold_s: float = 6 * 3600.0
    #: After this many boots in a row of any types never registered (no worker registering
    #: since), every type is held: a cause common to all of them (the bootstrap, the
    #: network, a permission) would otherwise be learnt type by type, each paying
    #: `hold_after` boots, while the planner turns to the next.
    cluster_hold_after: int = 6
    #: Ended instances older than this are not read back (a hold is at most this old).
    window_s: float = 2 * 86400.0


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """When a newly arrived job waits for room rather than opening an instance for it.

    Packing only what is present pays for poorly filled instances opened for jobs that
    arrive alone; a job allowed to wait a little can start in the room a departing job
    leaves instead (the waiting limit of `benchmarks limits` lies below the
    present-only one by exactly that). A new instance of the plan is held back —
    its tasks stay pending, the round launches nothing for them — when all of:

    - its tasks are of jobs that have not started, without deadlines (`deadline_s`,
      `max_jct_factor`), whose work the spec states (the budget is measured in it);
    - it saves less than `min_saving` of its tasks' reservation prices (Eva §4.2):
      packing them now gains little over running each alone;
    - each of its tasks fits, on an instance the plan keeps, in room that residents
      expected to finish (their work left at the pace their job has kept since it
      started, at most full speed: `_left_s`) leave before the job's wait budget runs
      out: `(jct_factor - 1)` × its solo duration since it was submitted.

    Past its budget a job is planned as any other, so no job waits longer.
    """

    jct_factor: float = 1.05
    min_saving: float = 0.1


@dataclass(frozen=True, slots=True)
class ControlOptions:
    """Everything a round and a step decide by, besides the snapshot."""

    default_throughput: float = DEFAULT_THROUGHPUT
    guardrails: Guardrails = field(default_factory=Guardrails)
    orphans: OrphanPolicy = field(default_factory=OrphanPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_attempts: int = 3  # a task failing this many times fails its job (its own failures)
    backoff: Backoff = field(default_factory=Backoff)  # before retrying a transient failure
    dry_run: bool = False  # decide and record, but launch, move and terminate nothing
    # Record each task's progress at every step where it changed (the daemon: what is
    # shown is one step old), not only at rounds. Replay leaves it off: its steps come
    # at every event, and what it decides reads progress only at rounds.
    progress_at_steps: bool = False
    learn: bool = True  # update the throughput table from observed throughputs
    instance_prefix: str = "inst-"  # launch tokens are this prefix and a sequence number
    # A launched instance the cloud stops listing is presumed gone only after this long
    # without news of it: EC2's listing lags its launches by seconds (`presumed_gone`).
    unlisted_grace_s: float = 60.0
    # Launches of a type whose workers never register back off, then are held (None: never,
    # as in replay, where every simulated worker registers).
    boot_backoff: BootBackoff | None = None
    # Teams share a binding `guardrails.max_hourly_spend` by weight (`autoscaler.fairshare`);
    # None: no admission, every job is planned and the guardrails alone refuse launches.
    teams: TeamPolicy | None = None
    # Spot offerings priced by their interruption risk, jobs' capacity and deadlines
    # (`autoscaler.spot`); None: every offering is planned at its price, as it is.
    spot: SpotPolicy | None = None
    # Newly arrived jobs may wait within a JCT budget for room a departure frees, rather
    # than open a poorly filled instance (`WaitPolicy`); None: every job is placed at once.
    waiting: WaitPolicy | None = None


# -- a round --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    instance_id: str  # ours: the launch token
    instance_type: str
    hourly_price: float
    tasks: tuple[str, ...]
    reason: str
    # Its EC2 type's on-demand price now (None: not offered on-demand), kept with the
    # instance so its savings against on-demand are measured against the price of the time.
    on_demand_price: float | None = None


@dataclass(frozen=True, slots=True)
class RefusedLaunch:
    instance_type: str
    tasks: tuple[str, ...]
    reason: str
    rule: str
    message: str  # the guardrail's numbers


@dataclass(frozen=True, slots=True)
class InstanceAction:
    """Drain, terminate or keep one instance, and why.

    `status` is what the state records first: `terminating` for an instance the
    cloud has (then the cloud is asked), `failed` for a launch that never
    produced one (nothing to terminate, nothing was billed), `running` for a
    drained one taken back (`stranded_sources`).
    """

    instance_id: str
    reason: str
    status: Literal["draining", "terminating", "failed", "running"] = "terminating"


@dataclass(frozen=True, slots=True)
class OrphanDecision:
    instance: CloudInstance
    action: OrphanAction
    reason: str


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """What a round decided, with every reason; `record()` is how it is stored."""

    at: float
    planner: str
    chosen: Literal["full", "partial", "none"]
    reason: str
    had_event: bool
    job_events: int
    plan: Plan | None = None
    launches: tuple[Launch, ...] = ()
    refused: tuple[RefusedLaunch, ...] = ()
    drains: tuple[InstanceAction, ...] = ()
    terminations: tuple[InstanceAction, ...] = ()
    # drained instances taken back (`stranded_sources`): recorded done, with the round
    keeps: tuple[InstanceAction, ...] = ()
    targets: Mapping[str, str | None] = field(default_factory=dict)
    moves: tuple[ActionRecord, ...] = ()
    infeasible: Mapping[str, str] = field(default_factory=dict)  # task -> why it waits
    orphans: tuple[OrphanDecision, ...] = ()
    numbers: Mapping[str, Any] = field(default_factory=dict)
    round_id: int | None = None
    # Jobs at their `max_cost` with no task left on an instance: the round ends them
    # (cancelled, with the reason), job -> reason.
    stopped: Mapping[str, str] = field(default_factory=dict)

    def actions(self) -> tuple[ActionRecord, ...]:
        """Every action in a fixed order: launches first (their index is their position)."""
        actions = [
            ActionRecord(
                "launch",
                launch.instance_id,
                launch.reason,
                detail={"type": launch.instance_type, "tasks": list(launch.tasks)},
            )
            for launch in self.launches
        ]
        actions += [
            ActionRecord(
                "launch",
                refused.instance_type,
                refused.reason,
                "refused",
                refused.message,
                {"type": refused.instance_type, "tasks": list(refused.tasks), "rule": refused.rule},
            )
            for refused in self.refused
        ]
        actions += [ActionRecord("terminate", d.instance_id, d.reason) for d in self.drains]
        actions += [ActionRecord("terminate", t.instance_id, t.reason) for t in self.terminations]
        actions += [
            ActionRecord(
                "terminate" if o.action == "terminate" else "report",
                o.instance.cloud_id,
                o.reason,
                detail={"type": o.instance.instance_type, "orphan": True},
            )
            for o in self.orphans
        ]
        actions += self.moves
        actions += [ActionRecord("adopt", k.instance_id, k.reason, "done") for k in self.keeps]
        return tuple(actions)

    def orphan_index(self, position: int) -> int:
        """Index among `actions()` of the `position`-th orphan decision."""
        return (
            len(self.launches)
            + len(self.refused)
            + len(self.drains)
            + len(self.terminations)
            + position
        )

    def record(self, actions: tuple[ActionRecord, ...] | None = None) -> RoundRecord:
        """The round as stored, with `actions` in place of `actions()` when given (those
        answered by `act`: a first round has thousands, not built twice)."""
        numbers = dict(self.numbers)
        if self.infeasible:
            numbers["infeasible"] = dict(self.infeasible)
        return RoundRecord(
            self.at,
            self.planner,
            self.chosen,
            self.had_event,
            self.reason,
            numbers,
            self.actions() if actions is None else actions,
            self.round_id,
            self.job_events,
        )

    def intents(self) -> RoundIntents:
        return RoundIntents(
            requests=tuple(
                (launch.instance_id, launch.instance_type, launch.hourly_price)
                for launch in self.launches
            ),
            targets=self.targets,
            drains=tuple((d.instance_id, d.reason) for d in self.drains),
            keeps=tuple((k.instance_id, k.reason) for k in self.keeps),
            terminations=tuple((t.instance_id, t.status, t.reason) for t in self.terminations),
            on_demand_prices={
                launch.instance_id: launch.on_demand_price
                for launch in self.launches
                if launch.on_demand_price is not None
            },
        )


def decide(
    snapshot: StateSnapshot,
    catalog: Catalog,
    unavailable: Sequence[UnavailableOffering],
    options: ControlOptions,
    *,
    planner: Planner,
    now: float,
    orphans: Sequence[CloudInstance] = (),
    ended: Sequence[InstanceRecord] = (),
    spent_last_day: float = 0.0,
    spending: Spending | None = None,
    reclaims: Sequence[InterruptionRecord] = (),
) -> RoundDecision:
    """One scheduling round's decision, from the snapshot taken after `sync`.

    `ended` are instances terminated or failed lately (the snapshot holds live ones
    only): with the live ones they count launches per type in the last hour and
    boots that never registered (`boot_holds`). `spent_last_day` is the ledger's last
    24 hours, for the daily budget. `spending` is the attributed spend of teams today
    and of jobs so far (`autoscaler.spend`), for teams' daily budgets and jobs'
    `max_cost` (None: neither is in use). `reclaims` are the interruption history's
    latest notices (`reclaim_holds`)."""
    had_event = (
        snapshot.last_round_job_events is None
        or snapshot.job_events != snapshot.last_round_job_events
    )
    judged = tuple(
        OrphanDecision(orphan, *options.orphans.judge(orphan, now)) for orphan in orphans
    )
    terminations = instance_timeouts(snapshot, now, options.timeouts)
    leaving = {t.instance_id for t in terminations}
    known = (*snapshot.instances, *ended)
    held = (
        boot_holds(known, now, options.boot_backoff, [t.name for t in catalog])
        if options.boot_backoff
        else []
    )
    blocked = unavailable_types([*unavailable, *held, *reclaim_holds(reclaims, now)], now)
    # A reclaimed instance is gone for planning from its notice on: its tasks are planned
    # elsewhere at once (they resume from the checkpoints its worker takes as it stops them).
    leaving |= {i.instance_id for i in snapshot.instances if i.reclaimed_at is not None}
    live = [
        i
        for i in snapshot.instances
        if i.status in PLANNABLE and i.instance_id not in leaving and i.instance_type in catalog
    ]
    stranded = stranded_sources(snapshot, live, leaving, catalog)
    live += stranded
    usable = _usable(catalog, blocked, live)
    infeasible = _infeasible(snapshot, usable, blocked, live)
    # A job's tasks end one by one: those done are neither planned nor given room.
    jobs = tuple(
        spec
        for j in snapshot.jobs
        if not any(t.task_id in infeasible for t in j.spec.tasks)
        and (spec := _unfinished(j.spec, snapshot)) is not None
    )
    over_cost = over_max_cost(snapshot, spending)
    jobs = tuple(j for j in jobs if j.job_id not in over_cost)
    stopped = {
        job_id: why
        for job_id, why in over_cost.items()
        if not any(t.job_id == job_id and t.status in ON_INSTANCE for t in snapshot.tasks.values())
    }
    admission = _admission(snapshot, jobs, usable, options, spending)
    if admission is not None:
        jobs = tuple(j for j in jobs if j.job_id in admission.admitted)
    planned_tasks = {t.task_id for j in jobs for t in j.tasks}
    current = current_configuration(snapshot, catalog, live, planned_tasks)
    if not jobs and not current.instances:
        return RoundDecision(
            at=now,
            planner=planner.name,
            chosen="none",
            reason="no jobs",
            had_event=had_event,
            job_events=snapshot.job_events,
            terminations=terminations,
            targets={tid: None for tid in snapshot.tasks},
            infeasible=infeasible,
            orphans=judged,
            numbers={
                **_held_numbers(held),
                **_admission_numbers(admission),
                **_cost_numbers(over_cost, stopped),
                **_reclaimed_numbers(snapshot),
            },
            stopped=stopped,
        )

    progress = {
        j.job_id: max((snapshot.tasks[t.task_id].progress for t in j.spec.tasks), default=0.0)
        for j in snapshot.jobs
    }
    unknown, learned = _solo_speeds(snapshot, jobs)
    planning, plan_jobs, plan_current = usable, jobs, current
    if options.spot is not None:
        planning, plan_jobs, plan_current = _spot_view(
            options.spot, snapshot, usable, jobs, current, progress, now
        )
    view = ClusterView(
        planning,
        plan_jobs,
        plan_current,
        snapshot.throughput,
        snapshot.history(now),
        now,
        progress,
        _probed(snapshot, learned, current),
        delays=snapshot.delays,
    )
    unmeasured = _unmeasured(snapshot, unknown, now) if options.learn else set()
    tight = (
        out_of_slack(options.spot, snapshot, jobs, progress, now)
        if options.spot is not None
        else set()
    )
    plan = _plan(planner, view, unmeasured | tight, tight)
    drained = drained_off(plan.configuration, snapshot, planning)
    if options.spot is not None:
        drained = spread(
            drained, planning, [i.instance_type for i in snapshot.instances], options.spot
        )
    if drained is not plan.configuration:
        plan = dataclasses.replace(plan, configuration=drained)
    waiting: dict[str, str] = {}
    if options.waiting is not None:
        plan, waiting = hold_for_room(plan, snapshot, planning, options.waiting, now)
    stranded_ids = {i.instance_id for i in stranded}
    diff = _diff(
        snapshot,
        plan.configuration,
        current,
        catalog,
        options,
        billed=[*snapshot.instances, *(o for o in orphans if not o.dry_run)],
        launched_last_hour=launches_since(known, now - 3600.0),
        spent_last_day=spent_last_day,
    )
    return RoundDecision(
        at=now,
        planner=planner.name,
        chosen=plan.chosen,
        reason=plan.reason,
        had_event=had_event,
        job_events=snapshot.job_events,
        plan=plan,
        launches=diff.launches,
        refused=diff.refused,
        drains=tuple(
            d
            for d in _drains(current, plan.configuration, diff.targets)
            if d.instance_id not in stranded_ids
        ),
        keeps=tuple(
            InstanceAction(instance_id, KEPT_STRANDED, "running")
            for instance_id in sorted(stranded_ids & set(diff.targets.values()))
        ),
        terminations=terminations,
        targets=diff.targets,
        moves=diff.moves,
        infeasible=infeasible,
        orphans=judged,
        numbers={
            **plan_numbers(plan, len(usable)),
            **_held_numbers(held),
            **_admission_numbers(admission),
            **_cost_numbers(over_cost, stopped),
            **_reclaimed_numbers(snapshot),
            **({"waiting_for_room": waiting} if waiting else {}),
        },
        stopped=stopped,
    )


def _wait_until(snapshot: StateSnapshot, policy: WaitPolicy, now: float) -> dict[str, float]:
    """The jobs that may still wait for room, each with the time its wait budget ends."""
    until: dict[str, float] = {}
    for rec in snapshot.jobs:
        if rec.started_at is not None or _has_deadline(rec.spec):
            continue
        if any(
            (task := snapshot.tasks[t.task_id]).status != "pending" or task.progress > 0
            for t in rec.spec.tasks
        ):
            continue
        solo = _solo_s(rec.spec)
        if solo is None:
            continue
        end = rec.submitted_at + (policy.jct_factor - 1.0) * solo
        if end > now:
            until[rec.job_id] = end
    return until


def _left_s(job: JobRecord, progress: float, now: float) -> float:
    """Seconds a job is expected to have left (infinite when its work is unknown): its
    iterations left at the pace it has kept since it started (slowdowns, moves and all),
    at most its full speed; at full speed before it has progressed."""
    work = _known_work(job.spec)
    if work is None:
        return math.inf
    left = max(0.0, work.iterations - progress)
    speed = work.speed
    if job.started_at is not None and progress > 0 and now > job.started_at:
        speed = min(speed, progress / (now - job.started_at))
    return left / speed


def hold_for_room(
    plan: Plan,
    snapshot: StateSnapshot,
    catalog: Catalog,
    policy: WaitPolicy,
    now: float,
) -> tuple[Plan, dict[str, str]]:
    """The plan without the new instances whose jobs wait for room instead (`WaitPolicy`),
    and for each job held, why.

    `catalog` is the one the plan was made on (reservation prices). Room is counted
    per instance the plan keeps: its capacity less the demands of the residents not
    expected to have left by the job's budget, less what jobs held before it in this
    round count on there (tasks in plan order, first fit)."""
    new = [inst for inst in plan.configuration if inst.instance_id is None]
    if not new:
        return plan, {}
    until = _wait_until(snapshot, policy, now)
    if not until:
        return plan, {}
    specs = {t.task_id: t for rec in snapshot.jobs for t in rec.spec.tasks}
    records = {rec.job_id: rec for rec in snapshot.jobs}
    jobs = {rec.job_id: rec.spec for rec in snapshot.jobs}

    def poorly_filled(inst: Instance) -> bool:
        if not all(t in specs and specs[t].job_id in until for t in inst.tasks):
            return False
        rp = sum(reservation_price(specs[t], catalog) for t in inst.tasks)
        return inst.hourly_cost > (1.0 - policy.min_saving) * rp

    candidates = [inst for inst in new if inst.tasks and poorly_filled(inst)]
    if not candidates:
        return plan, {}
    # residents of kept instances: (expected end, task) — the room each leaves
    kept = [inst for inst in plan.configuration if inst.instance_id is not None]
    ends: dict[str, float] = {}
    for inst in kept:
        for task_id in inst.tasks:
            spec = specs.get(task_id)
            task = snapshot.tasks.get(task_id)
            ends[task_id] = (
                math.inf
                if spec is None or task is None
                else now + _left_s(records[spec.job_id], task.progress, now)
            )
    claimed: dict[int, list[Resources]] = {}
    placed_in_new = {t: i for i, inst in enumerate(new) for t in inst.tasks}
    candidate_ids = {id(inst) for inst in candidates}
    held: dict[str, str] = {}
    for inst in candidates:
        job_ids = {specs[t].job_id for t in inst.tasks}
        # a job is held whole: every task of it on a new instance that may be held
        if any(
            t.task_id not in placed_in_new or id(new[placed_in_new[t.task_id]]) not in candidate_ids
            for j in job_ids
            for t in jobs[j].tasks
        ):
            continue
        trial = {k: list(v) for k, v in claimed.items()}
        ok = True
        for task_id in inst.tasks:
            deadline = until[specs[task_id].job_id]
            found = False
            for k, room_inst in enumerate(kept):
                demand = specs[task_id].demand_on(room_inst.type.family)
                if demand is None:
                    continue
                used = total(
                    [
                        d
                        for t in room_inst.tasks
                        if ends[t] > deadline
                        and (d := _demand_of(specs.get(t), room_inst)) is not None
                    ]
                    + trial.get(k, [])
                )
                if demand.plus(used).fits_in(room_inst.type.capacity):
                    trial.setdefault(k, []).append(demand)
                    found = True
                    break
            if not found:
                ok = False
                break
        if not ok:
            continue
        claimed = trial
        for j in job_ids:
            held[j] = "waits for room a departure frees (within its wait budget)"
    if not held:
        return plan, {}
    remaining = tuple(
        inst
        for inst in plan.configuration
        if not (inst.instance_id is None and any(specs[t].job_id in held for t in inst.tasks))
    )
    names = ", ".join(sorted(held)[:5]) + (", …" if len(held) > 5 else "")
    return (
        dataclasses.replace(
            plan,
            configuration=Configuration(remaining),
            reason=f"{plan.reason}; {len(held)} job(s) wait for room: {names}",
        ),
        held,
    )


def _demand_of(spec: TaskSpec | None, inst: Instance) -> Resources | None:
    return None if spec is None else spec.demand_on(inst.type.family)


def over_max_cost(snapshot: StateSnapshot, spending: Spending | None) -> dict[str, str]:
    """The unfinished jobs whose attributed spend has reached their `max_cost`, each with
    the reason it ends with. Such a job is planned no more: its running tasks are
    checkpointed and stopped (an infrastructure stop, not a failure), and the first
    round that finds none of them on an instance ends it, cancelled with that reason
    (`RoundDecision.stopped`)."""
    if spending is None:
        return {}
    over = {}
    for record in snapshot.jobs:
        cap = record.spec.max_cost
        spent = spending.job_total.get(record.job_id, 0.0)
        if cap is not None and spent >= cap:
            over[record.job_id] = f"stopped: max_cost ${cap:.2f} reached (${spent:.2f} spent)"
    return over


def _cost_numbers(over_cost: Mapping[str, str], stopped: Mapping[str, str]) -> dict[str, Any]:
    """What a round records of jobs at their `max_cost`: stopping (being checkpointed)
    or stopped (ended by this round), and why."""
    if not over_cost:
        return {}
    return {
        "max_cost": {
            job_id: {"state": "stopped" if job_id in stopped else "stopping", "reason": why}
            for job_id, why in sorted(over_cost.items())
        }
    }


def _spot_view(
    policy: SpotPolicy,
    snapshot: StateSnapshot,
    usable: Catalog,
    jobs: tuple[JobSpec, ...],
    current: Configuration,
    progress: Mapping[str, float],
    now: float,
) -> tuple[Catalog, tuple[JobSpec, ...], Configuration]:
    """What the planner sees with spot offerings (`autoscaler.spot`): the catalog at
    effective prices, each job restricted to the capacity it may use this round (a
    deadline job pinned to on-demand as its slack runs out), and the current
    configuration without the tasks their instance no longer suits."""
    planning, restricted = capacity_view(policy, snapshot, usable, jobs, progress, now)
    if planning is usable and restricted is jobs:
        return usable, jobs, current  # no spot offering, nothing to restrict
    # A job no offering can take under its capacity (spot only, none offered now) waits.
    fits: dict[Demands, bool] = {}
    waiting: set[str] = set()
    for job in restricted:
        for task in job.tasks:
            fit = fits.get(task.demands)
            if fit is None:
                fit = fits[task.demands] = any(task.fits_alone(t) for t in planning)
            if not fit:
                waiting.update(t.task_id for t in job.tasks)
                break
    plan_jobs = tuple(j for j in restricted if j.tasks[0].task_id not in waiting)
    if waiting:
        current = Configuration(
            tuple(
                Instance(i.instance_id, i.type, tuple(t for t in i.tasks if t not in waiting))
                for i in current
            )
        )
    plan_current = without_misfits(
        Configuration(
            tuple(
                Instance(i.instance_id, planning[i.type.name], i.tasks)
                if i.type.name in planning
                else i
                for i in current
            )
        ),
        {j.job_id: j for j in plan_jobs},
    )
    return planning, plan_jobs, plan_current


def capacity_view(
    policy: SpotPolicy,
    snapshot: StateSnapshot,
    usable: Catalog,
    jobs: tuple[JobSpec, ...],
    progress: Mapping[str, float],
    now: float,
) -> tuple[Catalog, tuple[JobSpec, ...]]:
    """The catalog at effective prices and each job restricted to the offerings it may
    use this round (`job_capacities`): what the planner, its LP bound and the no-packing
    baseline price (`jobs` itself when there is nothing to restrict)."""
    planning = policy.planning_catalog(usable)
    if planning is usable and not any(j.capacity != "auto" or _has_deadline(j) for j in jobs):
        return usable, jobs
    families = planning.families
    capacity = job_capacities(policy, snapshot, jobs, progress, now, usable)
    return planning, tuple(policy.restricted(j, capacity[j.job_id], families) for j in jobs)


def job_capacities(
    policy: SpotPolicy,
    snapshot: StateSnapshot,
    jobs: Sequence[JobSpec],
    progress: Mapping[str, float],
    now: float,
    catalog: Catalog,
) -> dict[str, str]:
    """The capacity each job is planned under this round: its own, or "on-demand" once
    pinned there — when its own reclaims are more than the rate it was planned at (that
    of `catalog`'s spot offerings) explains, or reach the ceiling (`reclaims_pin`; a job
    that asked for spot, only the ceiling: `pinned_by_reclaims`), or as
    a deadline's slack runs out (`pinned_on_demand`). The one rule deciding which
    offerings a job may use: the planner (and with it the LP bound) and the reports'
    no-packing baseline read it alike."""
    records = {j.job_id: j for j in snapshot.jobs}
    out: dict[str, str] = {}
    for job in jobs:
        record = records.get(job.job_id)
        pinned = pinned_by_reclaims(
            policy,
            job,
            [snapshot.tasks[t.task_id] for t in job.tasks if t.task_id in snapshot.tasks],
            None if record is None else record.started_at or record.submitted_at,
            now,
            catalog,
        )
        if not pinned:
            pinned = _slack_out(policy, job, record, progress, now) is not False
        out[job.job_id] = job_capacity(job, pinned)
    return out


def _slack_out(
    policy: SpotPolicy,
    job: JobSpec,
    record: JobRecord | None,
    progress: Mapping[str, float],
    now: float,
) -> bool | None:
    """Whether the job's deadline slack has run out (`spot.pinned_on_demand`): True,
    False, or None when it cannot be told (no deadline: False; unknown work: None)."""
    deadline = job_deadline_s(job, _solo_s(job))
    if deadline is None:
        return False
    work = _known_work(job)
    if work is None:
        return None
    remaining = max(0.0, work.iterations - progress.get(job.job_id, 0.0)) / work.speed
    return pinned_on_demand(
        now=now,
        submitted_at=now if record is None else record.submitted_at,
        deadline_s=deadline,
        remaining_s=remaining,
        restart_s=restart_s(job),
        margin_s=policy.deadline_margin_s + rollback_s(job, policy),
    )


def out_of_slack(
    policy: SpotPolicy,
    snapshot: StateSnapshot,
    jobs: Sequence[JobSpec],
    progress: Mapping[str, float],
    now: float,
) -> set[str]:
    """The jobs of known work whose deadline slack has run out (`_slack_out`): they run
    alone where they are from now on (`_plan`). The slack rule promised them one more
    restart at full speed, not a co-location slowdown nor the migrations of later
    reconfigurations — a job moved between on-demand instances ten times missed its
    deadline under a bursty availability trace while it never ran on spot."""
    records = {j.job_id: j for j in snapshot.jobs}
    return {
        job.job_id
        for job in jobs
        if _has_deadline(job) and _slack_out(policy, job, records.get(job.job_id), progress, now)
    }


def pinned_by_reclaims(
    policy: SpotPolicy,
    job: JobSpec,
    tasks: Sequence[TaskRecord],
    started_at: float | None,
    now: float,
    catalog: Catalog,
) -> bool:
    """Whether the job's own reclaims pin it to on-demand (`spot.reclaims_pin`): the
    most attempts one of its `tasks` lost to the infrastructure, against the rate of
    `catalog`'s spot offerings it fits over its exposure (`spot.exposure_hours`; `now`:
    the time it is judged at, its finish for a finished job)."""
    reclaims = max((t.retries - t.failures for t in tasks), default=0)
    if reclaims <= 0:
        return False
    solo_s = _solo_s(job)
    ceiling = reclaim_ceiling(
        solo_s, reclaim_loss_s(job, policy), reclaim_lost_s(job, policy), policy
    )
    if job.capacity == "spot":
        # Its owner chose spot, not its price: the test of the rate it was priced at
        # does not apply, and only the ceiling (every job finishes) moves it.
        return ceiling is not None and reclaims >= ceiling
    rate = planned_rate(job, catalog)
    if policy.from_scratch and solo_s is not None:
        discount = spot_discount(job, catalog)
        restart_h = restart_s(job) / 3600.0
        if discount is not None and from_scratch_pins(solo_s / 3600.0, restart_h, rate, discount):
            return True
    exposure = exposure_hours(solo_s, reclaims, started_at, now, policy)
    return reclaims_pin(reclaims, exposure, rate, len(job.tasks), policy, ceiling)


def _has_deadline(job: JobSpec) -> bool:
    return job.deadline_s is not None or job.max_jct_factor is not None


def _known_work(job: JobSpec) -> Work | None:
    """The job's work when its spec says it (a trace's facts), else None."""
    try:
        return job_work(job)
    except InputError:
        return None


def _solo_s(job: JobSpec) -> float | None:
    work = _known_work(job)
    return None if work is None else work.seconds


def _admission(
    snapshot: StateSnapshot,
    jobs: Sequence[JobSpec],
    usable: Catalog,
    options: ControlOptions,
    spending: Spending | None = None,
) -> Admission | None:
    """The jobs the round may plan when teams share the budget (None: no team policy).

    Each job claims its reservation price (Eva §4.2) for the planner's `jobs`, which
    exclude infeasible and finished work."""
    if options.teams is None:
        return None
    records = {j.job_id: j for j in snapshot.jobs}
    claims = [
        Claim(
            job.job_id,
            records[job.job_id].team,
            sum(reservation_price(t, usable) for t in job.tasks),
            options.teams.priority(records[job.job_id].team, job.priority),
            records[job.job_id].submitted_at,
        )
        for job in jobs
    ]
    return admit(
        claims,
        options.teams,
        options.guardrails.max_hourly_spend,
        spending.team_today if spending is not None else None,
    )


def _admission_numbers(admission: Admission | None) -> dict[str, Any]:
    """What a round records of the teams' fair share: demands, shares, who waits and why."""
    if admission is None:
        return {}
    document: dict[str, Any] = {
        "demands": dict(admission.demands),
        "shares": dict(admission.shares),
        "waiting": dict(admission.waiting),
    }
    if admission.over_daily_budget:
        document["over_daily_budget"] = {
            team: {"spent_today": round(spent, 6), "daily_budget": budget}
            for team, (spent, budget) in sorted(admission.over_daily_budget.items())
        }
    return {"fair_share": document}


def drained_off(
    configuration: Configuration, snapshot: StateSnapshot, catalog: Catalog
) -> Configuration:
    """The plan with each task the operator drained off an instance (`drain --job`:
    `TaskRecord.drain_from`) placed elsewhere, when the plan left it there.

    Only those tasks move — the instance and its other tasks stay. Each goes to
    another instance of the plan with room for it (the fullest first, so the move
    adds nothing), else to a new instance of its cheapest type. The same
    configuration is returned when nothing was drained.
    """
    avoid = {
        t.task_id: t.drain_from
        for t in snapshot.tasks.values()
        if t.drain_from is not None and t.instance_id == t.drain_from
    }
    if not any(
        avoid.get(task) == inst.instance_id for inst in configuration for task in inst.tasks
    ):
        return configuration
    specs = _specs(snapshot)
    kept: list[Instance] = []
    moving: list[str] = []
    emptied: set[str] = set()
    for inst in configuration:
        stays = tuple(t for t in inst.tasks if t not in avoid or avoid[t] != inst.instance_id)
        moving += [t for t in inst.tasks if t not in stays]
        if inst.tasks and not stays and inst.instance_id is not None:
            emptied.add(inst.instance_id)  # held only drained tasks: it drains
        kept.append(Instance(inst.instance_id, inst.type, stays))
    for task_id in moving:
        spec = specs[task_id]
        hosts = []
        for position, inst in enumerate(kept):
            demand = spec.demand_on(inst.type.family)
            if inst.instance_id in (avoid[task_id], *emptied) or demand is None:
                continue
            used = _NOTHING
            for other in inst.tasks:
                other_demand = specs[other].demand_on(inst.type.family) if other in specs else None
                used = used.plus(other_demand or _NOTHING)
            after = used.plus(demand)
            if after.fits_in(inst.type.capacity):
                hosts.append((-len(inst.tasks), position))
        if hosts:
            _, position = min(hosts)
            inst = kept[position]
            kept[position] = Instance(inst.instance_id, inst.type, (*inst.tasks, task_id))
        else:
            kept.append(Instance(None, cheapest_type(spec, catalog), (task_id,)))
    return Configuration(tuple(i for i in kept if i.instance_id not in emptied))


def _reclaimed_numbers(snapshot: StateSnapshot) -> dict[str, Any]:
    """What a round records of the instances their provider reclaims (spot notices): the
    offering each was bought as, when, and the notice."""
    reclaimed = {
        i.instance_id: {"offering": i.instance_type, "at": i.reclaimed_at, "reason": i.reason}
        for i in snapshot.instances
        if i.reclaimed_at is not None
    }
    return {"reclaimed": reclaimed} if reclaimed else {}


def _held_numbers(held: Sequence[UnavailableOffering]) -> dict[str, Any]:
    """What a round records of the types held after boots that never registered."""
    return {"held": {o.instance_type: o.reason for o in held}} if held else {}


def boot_failed(inst: InstanceRecord) -> bool:
    """Whether the cloud started this instance and it ended before its worker ever
    registered — given up by a timeout, or shut down by its own bootstrap — rather than
    being drained by a plan that no longer needed it."""
    return (
        inst.cloud_id is not None
        and inst.ready_at is None
        and inst.status in ("terminating", "terminated")
        and inst.entered("draining") is None
    )


def boot_holds(
    instances: Sequence[InstanceRecord],
    now: float,
    backoff: BootBackoff,
    all_types: Sequence[str] = (),
) -> list[UnavailableOffering]:
    """Types whose latest launches booted and never registered a worker, held back with
    the last one's cause (`BootBackoff`): the planner leaves them out until then, and a
    task nothing else fits waits with that reason. After `cluster_hold_after` such boots
    in a row of any types, each of `all_types` (the catalog's) is held."""
    everywhere = _cluster_hold(instances, now, backoff, all_types)
    if everywhere:
        return everywhere
    by_type: dict[str, list[InstanceRecord]] = {}
    for inst in instances:
        by_type.setdefault(inst.instance_type, []).append(inst)
    holds = []
    for itype, records in sorted(by_type.items()):
        streak: list[InstanceRecord] = []
        for inst in sorted(records, key=lambda i: (i.requested_at, i.instance_id)):
            if inst.ready_at is not None:
                streak = []
            elif boot_failed(inst):
                streak.append(inst)
        if not streak:
            continue
        last, count = streak[-1], len(streak)
        ended = last.entered("terminating") or last.entered("terminated") or last.requested_at
        if count >= backoff.hold_after:
            until = ended + backoff.hold_s
            what = f"held: {count} launches in a row never registered a worker"
        else:
            until = ended + backoff.base_s * 2 ** (count - 1)
            what = f"backing off: {count} launch(es) in a row never registered a worker"
        if until > now:
            cause = f"last {last.instance_id}: {last.reason or last.status}"
            holds.append(UnavailableOffering(itype, None, until, f"{what} ({cause})"))
    return holds


#: How long an offering is left alone after a spot interruption notice for one of its
#: instances: its capacity is being taken back, so a launch there now would be
#: reclaimed within minutes (Karpenter marks the offering unavailable on a notice, for
#: the same three minutes as after a capacity error).
RECLAIM_HOLD_S = UNAVAILABLE_COOLDOWN_S


def reclaim_holds(
    interruptions: Sequence[InterruptionRecord], now: float, hold_s: float = RECLAIM_HOLD_S
) -> list[UnavailableOffering]:
    """Offerings with a reclaim notice in the last `hold_s` (the interruption history),
    held back until `hold_s` after the newest: a replacement goes elsewhere, not into the
    capacity the provider is taking back."""
    latest: dict[str, InterruptionRecord] = {}
    for r in interruptions:
        if r.kind == "reclaim" and now - r.at < hold_s:
            seen = latest.get(r.offering)
            if seen is None or seen.at < r.at:
                latest[r.offering] = r
    return [
        UnavailableOffering(
            offering,
            None,
            r.at + hold_s,
            f"held: its capacity is being reclaimed ({r.instance_id}: {r.reason})",
        )
        for offering, r in sorted(latest.items())
    ]


def _cluster_hold(
    instances: Sequence[InstanceRecord],
    now: float,
    backoff: BootBackoff,
    all_types: Sequence[str],
) -> list[UnavailableOffering]:
    """Every type held, when the cluster's latest boots, whatever their types, all ended
    before their worker registered (`BootBackoff.cluster_hold_after`)."""
    streak: list[InstanceRecord] = []
    for inst in sorted(instances, key=lambda i: (i.requested_at, i.instance_id)):
        if inst.ready_at is not None:
            streak = []
        elif boot_failed(inst):
            streak.append(inst)
    if not all_types or len(streak) < backoff.cluster_hold_after:
        return []
    last = streak[-1]
    ended = last.entered("terminating") or last.entered("terminated") or last.requested_at
    until = ended + backoff.hold_s
    if until <= now:
        return []
    kinds = len({i.instance_type for i in streak})
    why = (
        f"held: {len(streak)} launches in a row, of {kinds} type(s), never registered a "
        f"worker (last {last.instance_id}: {last.reason or last.status})"
    )
    return [UnavailableOffering(t, None, until, why) for t in sorted(set(all_types))]


def launches_since(instances: Sequence[InstanceRecord], since: float) -> dict[str, int]:
    """How many instances of each type were requested after `since`."""
    counts: dict[str, int] = {}
    for inst in instances:
        if inst.requested_at > since:
            counts[inst.instance_type] = counts.get(inst.instance_type, 0) + 1
    return counts


def _usable(
    catalog: Catalog, blocked: Mapping[str, str], live: Sequence[InstanceRecord]
) -> Catalog:
    """The types a plan may use: those not cooling down after capacity errors, and the
    types of instances that exist even while they cool down (a plan may keep an
    instance it cannot launch another of)."""
    kept_types = {i.instance_type for i in live}
    return catalog.restricted_to(
        {t.name for t in catalog if t.name not in blocked or t.name in kept_types}
    )


def stranded_sources(
    snapshot: StateSnapshot,
    live: Sequence[InstanceRecord],
    leaving: set[str],
    catalog: Catalog,
) -> list[InstanceRecord]:
    """Instances a plan drained that a task still runs on while the instance it was to move
    to is gone (lost, reclaimed, failed, given up) or it has none: the round may keep them.

    A move is make-before-break: the task runs on its source until the target is ready.
    When the target never gets there, the source is still the task's best host — it is
    running, paid for and holds the task's state — so the round plans it as live, like
    any running instance, and takes it back (`KEPT_STRANDED`) if the plan uses it.
    Without this the task, on an instance no plan could keep, was placed on a new one:
    a launch and a migration to get back where it already was. Only the plan's own
    drains are taken back; an operator's drain stands."""
    live_ids = {i.instance_id for i in live}
    hosts = {
        t.instance_id
        for t in snapshot.tasks.values()
        if t.status in ON_INSTANCE
        and t.instance_id is not None
        and t.target_instance_id not in live_ids
    }
    return [
        i
        for i in snapshot.instances
        if i.status == "draining"
        and i.reason == PLAN_DRAIN
        and i.instance_id in hosts
        and i.instance_id not in leaving
        and i.instance_type in catalog
    ]


def _drains(
    current: Configuration, target: Configuration, targets: Mapping[str, str | None]
) -> tuple[InstanceAction, ...]:
    """Instances to drain: those the plan does not keep, unless a refused launch left
    tasks on them."""
    kept = {i.instance_id for i in target if i.instance_id is not None}
    kept |= {where for where in targets.values() if where is not None}
    return tuple(
        InstanceAction(i.instance_id, PLAN_DRAIN, "draining")
        for i in current
        if i.instance_id is not None and i.instance_id not in kept
    )


def _solo_speeds(
    snapshot: StateSnapshot, jobs: Sequence[JobSpec]
) -> tuple[list[JobSpec], list[JobSpec]]:
    """The jobs whose spec states no solo speed: (not measured yet, measured since)."""
    records = {j.job_id: j for j in snapshot.jobs}
    unknown: list[JobSpec] = []
    learned: list[JobSpec] = []
    for j in jobs:
        if j.full_throughput is None:
            (unknown if records[j.job_id].solo_throughput is None else learned).append(j)
    return unknown, learned


def _unmeasured(snapshot: StateSnapshot, unknown: Sequence[JobSpec], now: float) -> set[str]:
    """Of the jobs of `unknown` solo speed, those to run alone this round to measure it
    (`SOLO_PROBE_S`)."""
    if not unknown:
        return set()
    sharing: dict[str, int] = {}
    for task in snapshot.tasks.values():
        if task.status in ON_INSTANCE and task.instance_id is not None:
            sharing[task.instance_id] = sharing.get(task.instance_id, 0) + 1

    def gave_up(job: JobSpec) -> bool:
        """Every task has run alone for `SOLO_PROBE_S` with no throughput to show."""
        for t in job.tasks:
            task = snapshot.tasks[t.task_id]
            if (
                task.status != "running"
                or task.status_since is None
                or now - task.status_since < SOLO_PROBE_S
                or sharing.get(task.instance_id or "", 0) != 1
            ):
                return False
        return True

    return {j.job_id for j in unknown if not gave_up(j)}


def _probed(
    snapshot: StateSnapshot, learned: Sequence[JobSpec], current: Configuration
) -> frozenset[str]:
    """Instances that host a task only because its job ran alone to be measured.

    Its job's solo speed has been learned and the task has not moved since it
    started there; Partial Reconfiguration re-places such tasks as it does a new
    job's, rather than keeping the instance because one task pays for it.
    """
    measured = {t.task_id for j in learned for t in j.tasks}
    if not measured:
        return frozenset()
    return frozenset(
        inst.instance_id
        for inst in current
        if inst.instance_id is not None
        and len(inst.tasks) == 1
        and inst.tasks[0] in measured
        and snapshot.tasks[inst.tasks[0]].attempt <= 1
    )


def _plan(
    planner: Planner,
    view: ClusterView,
    alone: set[str],
    tight: frozenset[str] | set[str] = frozenset(),
) -> Plan:
    """The planner's plan, with the tasks of the jobs in `alone` each on an instance of its own.

    Those stay where they are if they are alone there already, else each gets its
    cheapest type (its reservation price, what no packing would pay); the planner
    places every other job, on the instances that are left. `alone` holds the jobs
    whose solo speed is being measured and those of `tight`, out of deadline slack.
    """
    if not alone:
        return planner.plan(view)
    solo_tasks = {t.task_id: t for j in view.jobs if j.job_id in alone for t in j.tasks}
    kept: list[Instance] = []
    rest: list[Instance] = []
    for inst in view.current:
        if len(inst.tasks) == 1 and inst.tasks[0] in solo_tasks:
            kept.append(inst)
        else:
            rest.append(
                dataclasses.replace(inst, tasks=tuple(t for t in inst.tasks if t not in solo_tasks))
            )
    placed = {inst.tasks[0] for inst in kept}
    cheapest = {task_id: cheapest_type(task, view.catalog) for task_id, task in solo_tasks.items()}
    launched = [
        Instance(None, itype, (task_id,))
        for task_id, itype in cheapest.items()
        if task_id not in placed
    ]
    solo = kept + launched
    at_rp = sum(itype.hourly_cost for itype in cheapest.values())  # their RPs
    others = tuple(j for j in view.jobs if j.job_id not in alone)
    notes = []
    for group, why in (
        (alone - tight, "alone until their solo speed is measured"),
        (tight & alone, "alone and not moved, out of deadline slack"),
    ):
        if group:
            names = ", ".join(sorted(group)[:5]) + (", …" if len(group) > 5 else "")
            notes.append(f"{len(group)} job(s) {why}: {names}")
    note = "; ".join(notes)
    if not others:  # nothing else to plan: the instances left are drained
        d_hat = expected_duration_h(view.history)
        return Plan(Configuration(tuple(solo)), "partial", (), d_hat, at_rp, note)
    plan = planner.plan(dataclasses.replace(view, jobs=others, current=Configuration(tuple(rest))))
    bound = plan.lower_bound
    return dataclasses.replace(
        plan,
        configuration=Configuration(plan.configuration.instances + tuple(solo)),
        no_packing_hourly_cost=plan.no_packing_hourly_cost + at_rp,
        reason=f"{plan.reason}; {note}",
        lower_bound=None
        if bound is None
        else dataclasses.replace(bound, lower_bound=bound.lower_bound + at_rp),
    )


def _unfinished(spec: JobSpec, snapshot: StateSnapshot) -> JobSpec | None:
    """The job as the planner should see it: without its completed tasks (None: all are)."""
    left = tuple(t for t in spec.tasks if snapshot.tasks[t.task_id].status != "completed")
    if len(left) == len(spec.tasks):
        return spec
    return dataclasses.replace(spec, tasks=left) if left else None


def current_configuration(
    snapshot: StateSnapshot,
    catalog: Catalog,
    live: Sequence[InstanceRecord],
    planned_tasks: set[str],
) -> Configuration:
    """The instances a plan may keep, each with the tasks assigned to it.

    A task counts on the instance the adopted plan assigned it to, or — while
    that instance is gone or never came — on the one it still runs on.
    """
    live_ids = {i.instance_id for i in live}
    assigned: dict[str, list[str]] = {}
    for task in snapshot.tasks.values():
        if task.task_id not in planned_tasks:
            continue
        where = task.target_instance_id
        if where not in live_ids and task.status in ON_INSTANCE:
            where = task.instance_id
        if where is not None and where in live_ids:
            assigned.setdefault(where, []).append(task.task_id)
    return Configuration(
        tuple(
            Instance(
                inst.instance_id,
                catalog[inst.instance_type],
                tuple(sorted(assigned.get(inst.instance_id, ()))),
            )
            for inst in live
        )
    )


def _infeasible(
    snapshot: StateSnapshot,
    usable: Catalog,
    blocked: Mapping[str, str],
    live: Sequence[InstanceRecord],
) -> dict[str, str]:
    """Tasks not on a live instance that no usable type can host, with the reason.

    Their jobs wait (a data-parallel job runs whole or not at all) and are
    reported; every other job is planned as usual.
    """
    live_ids = {i.instance_id for i in live}
    infeasible: dict[str, str] = {}
    fits_cache: dict[Demands, bool] = {}
    for job in snapshot.jobs:
        for task in job.spec.tasks:
            record = snapshot.tasks[task.task_id]
            if record.status == "completed" or (
                record.status in ON_INSTANCE and record.instance_id in live_ids
            ):
                continue
            fits = fits_cache.get(task.demands)
            if fits is None:
                fits = fits_cache[task.demands] = any(task.fits_alone(t) for t in usable)
            if not fits:
                waiting = sorted(blocked)
                infeasible[task.task_id] = (
                    "fits no instance type available now"
                    + (f" ({', '.join(f'{t}: {blocked[t]}' for t in waiting)})" if waiting else "")
                    + "; it waits and is planned again every round"
                )
    return infeasible


@dataclass(frozen=True, slots=True)
class _Diff:
    """A plan against the current configuration: what to launch (each launch checked
    against the guardrails), what the guardrails refused, every task's target, moves."""

    launches: tuple[Launch, ...]
    refused: tuple[RefusedLaunch, ...]
    targets: Mapping[str, str | None]
    moves: tuple[ActionRecord, ...]


def _diff(
    snapshot: StateSnapshot,
    target: Configuration,
    current: Configuration,
    catalog: Catalog,
    options: ControlOptions,
    *,
    billed: Sequence[InstanceRecord | CloudInstance] = (),
    launched_last_hour: Mapping[str, int] | None = None,
    spent_last_day: float = 0.0,
) -> _Diff:
    """The launches, refusals, targets and moves that turn `current` into `target`.

    `billed` are the instances the guardrails count: the state's live ones and the
    orphans (ours by tag, unknown to the state, billed all the same)."""
    targets: dict[str, str | None] = {tid: None for tid in snapshot.tasks}
    live_types = [i.instance_type for i in billed]
    live_spend = live_spend_of(live_types, catalog)  # kept as launches are accepted
    launched = dict(launched_last_hour or {})
    current_ids = {i.instance_id for i in current}
    launches: list[Launch] = []
    refused: list[RefusedLaunch] = []
    number = snapshot.instances_requested
    for inst in target:
        tasks = inst.tasks
        if inst.instance_id is not None:
            for task_id in tasks:
                targets[task_id] = inst.instance_id
            continue
        reason = f"launch {inst.type.name} for {len(tasks)} task(s): {', '.join(tasks[:5])}" + (
            " …" if len(tasks) > 5 else ""
        )
        try:
            options.guardrails.check_launch(
                inst.type.name,
                catalog,
                live_types,
                launched_last_hour=launched.get(inst.type.name, 0),
                spent_last_day=spent_last_day,
                live_spend=live_spend,
            )
        except LaunchRefused as exc:
            refused.append(RefusedLaunch(inst.type.name, tasks, reason, exc.rule, str(exc)))
            for task_id in tasks:
                # it stays where the last plan put it, if that instance still exists
                previous = snapshot.tasks[task_id].target_instance_id
                targets[task_id] = previous if previous in current_ids else None
            continue
        number += 1
        token = f"{options.instance_prefix}{number}"
        live_types.append(inst.type.name)
        live_spend += catalog[inst.type.name].hourly_cost  # accepted: it is in the catalog
        launched[inst.type.name] = launched.get(inst.type.name, 0) + 1
        # the price paid: a spot offering is planned at its effective price (`autoscaler.spot`)
        paid = inst.type.hourly_cost
        if inst.type.name in catalog:
            paid = catalog[inst.type.name].hourly_cost
        ec2_type = catalog[inst.type.name].launch_type if inst.type.name in catalog else ""
        on_demand = on_demand_price(catalog, ec2_type) if ec2_type else None
        launches.append(Launch(token, inst.type.name, paid, tasks, reason, on_demand))
        for task_id in tasks:
            targets[task_id] = token
    moves: list[ActionRecord] = []
    for task_id, new in targets.items():
        old = snapshot.tasks[task_id].target_instance_id
        if new == old or new is None:
            continue
        if old is None:
            moves.append(ActionRecord("start", task_id, "new task placed", detail={"to": new}))
        elif new == snapshot.tasks[task_id].instance_id:
            moves.append(
                ActionRecord(
                    "migrate",
                    task_id,
                    "it stays where it runs: the instance it was to move to is gone",
                    detail={"from": old, "to": new},
                )
            )
        else:
            moves.append(
                ActionRecord(
                    "migrate", task_id, "the adopted plan moves it", detail={"from": old, "to": new}
                )
            )
    return _Diff(tuple(launches), tuple(refused), targets, tuple(moves))


def plan_numbers(plan: Plan, instance_types: int) -> dict[str, Any]:
    """The numbers behind a plan, as a round records them."""
    return {
        "hourly_cost": plan.hourly_cost,
        "no_packing_hourly_cost": plan.no_packing_hourly_cost,
        "lower_bound_hourly_cost": plan.lower_bound_hourly_cost,
        "expected_duration_h": plan.expected_duration_h,
        "candidates": [c.summary() for c in plan.candidates],
        "instance_types": instance_types,
    }


# -- timeouts ---------------------------------------------------------------------------------


#: How long the provider gives a reclaimed spot instance (EC2: two minutes from the notice).
RECLAIM_WINDOW_S = NOTICE_S


def instance_timeouts(
    snapshot: StateSnapshot, now: float, timeouts: Timeouts
) -> tuple[InstanceAction, ...]:
    """Instances to terminate now: lost workers, launches that never boot, workers that
    never register (Ray autoscaler v2's stuck-instance handling)."""
    found: list[InstanceAction] = []
    occupied = {
        t.instance_id for t in snapshot.tasks.values() if t.status in ON_INSTANCE and t.instance_id
    }
    for inst in snapshot.instances:
        if inst.status not in ("requested", "pending", "running", "draining"):
            continue
        if inst.reclaimed_at is not None:
            # Its tasks leave first (checkpointed by its worker, inside the provider's
            # window); then it goes, whether or not they managed to.
            waited = now - inst.reclaimed_at
            if inst.instance_id not in occupied or waited > RECLAIM_WINDOW_S:
                found.append(
                    InstanceAction(
                        inst.instance_id,
                        f"reclaimed by its provider ({inst.instance_type}): {inst.reason}",
                    )
                )
            continue
        if inst.lost_at is not None:
            found.append(InstanceAction(inst.instance_id, f"worker lost: {inst.reason}"))
        elif inst.status in ("requested", "pending") and now - inst.requested_at > timeouts.boot_s:
            found.append(
                InstanceAction(
                    inst.instance_id,
                    f"still {inst.status} {now - inst.requested_at:.0f} s after its launch "
                    f"request (limit {timeouts.boot_s:.0f} s)",
                    "failed" if inst.cloud_id is None else "terminating",
                )
            )
        elif inst.ready_at is None and inst.status in ("running", "draining"):
            running_since = inst.entered("running")
            if running_since is not None and now - running_since > timeouts.register_s:
                found.append(
                    InstanceAction(
                        inst.instance_id,
                        f"its worker did not register within {timeouts.register_s:.0f} s "
                        "of the instance running",
                    )
                )
    return tuple(found)


# -- a step between rounds ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stop:
    task_id: str
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class StepDecision:
    """What a step does: each change recorded (`updates`, `failed_jobs`, `terminations`)
    before the executor and the cloud are asked (`starts`, `stops`, `terminations`)."""

    at: float
    starts: tuple[TaskLaunch, ...] = ()
    stops: tuple[Stop, ...] = ()
    updates: tuple[TaskUpdate, ...] = ()
    failed_jobs: tuple[tuple[str, str], ...] = ()  # (job, reason)
    terminations: tuple[InstanceAction, ...] = ()
    relaunch: tuple[str, ...] = ()  # requested instances to ask the cloud for (again)
    reterminate: tuple[str, ...] = ()  # terminating instances the cloud still runs
    replan: bool = False  # something happened that the next round should not wait for

    def __bool__(self) -> bool:
        return bool(
            self.starts
            or self.stops
            or self.updates
            or self.failed_jobs
            or self.terminations
            or self.relaunch
            or self.reterminate
        )


def advance(
    snapshot: StateSnapshot,
    catalog: Catalog,
    options: ControlOptions,
    *,
    now: float,
    ready: frozenset[str] | None = None,
    strays: Sequence[tuple[str, int]] = (),
    listed: Mapping[str, str] | None = None,
) -> StepDecision:
    """Carry the adopted plan out as far as the world allows right now.

    What the state cannot hold comes from `sync`: `ready` are the instances
    whose worker the executor can reach now (None: every instance whose worker
    ever registered); `strays` are (task, attempt) the executor runs that
    belong to no active job (a cancelled job's), stopped here; `listed` maps
    our instance ids to the cloud's state of them.

    The step is these rules, each a function of the snapshot: instances given up
    (`instance_timeouts`), what occupies each instance (`occupancy_of`), stuck
    tasks given up (`given_up_tasks`), tasks leaving for a ready destination
    (`moves_out`, make before break), starts on ready instances with room
    (`starts_on_ready`), drained instances terminated once empty
    (`drained_instances`), launches and terminations asked for again
    (`unconfirmed_launches`, `unfinished_terminations`).
    """
    timed_out = instance_timeouts(snapshot, now, options.timeouts)
    leaving = frozenset(t.instance_id for t in timed_out)
    ready_now = ready_instances(snapshot, ready, leaving)
    given_up = given_up_tasks(
        snapshot, now, options.timeouts, options.max_attempts, options.backoff
    )
    leaving_tasks = moves_out(snapshot, ready_now, leaving, given_up.task_ids)
    # What occupies each instance is read by the starts, and by the drained instances'
    # check: a step where no task waits for a ready target and nothing drains (most of
    # them, in a replay's thousands) skips that walk over every task.
    if any(
        t.status == "pending" and t.target_instance_id in ready_now for t in snapshot.tasks.values()
    ) or any(i.status == "draining" for i in snapshot.instances):
        started = starts_on_ready(
            snapshot,
            catalog,
            ready_now,
            occupancy_of(snapshot, catalog),
            set(given_up.failed_jobs),
            now,
        )
    else:
        started = Starts((), (), frozenset())
    stray_stops = tuple(
        Stop(task_id, attempt, "its job is no longer active") for task_id, attempt in strays
    )
    # A task changes at most once a step; the changes keep the snapshot's task order.
    stops = given_up.stops + leaving_tasks.stops
    updates = given_up.updates + leaving_tasks.updates + started.updates
    if len(stops) > 1 or len(updates) > 1:  # most steps change one task or none
        order = {task_id: position for position, task_id in enumerate(snapshot.tasks)}
        stops, updates = _in_task_order(stops, order), _in_task_order(updates, order)
    return StepDecision(
        at=now,
        starts=started.launches,
        stops=stray_stops + stops,
        updates=updates,
        failed_jobs=tuple(sorted(given_up.failed_jobs.items())),
        terminations=timed_out + drained_instances(snapshot, started.occupied, leaving),
        relaunch=unconfirmed_launches(snapshot),
        reterminate=unfinished_terminations(snapshot, listed or {}),
        replan=bool(leaving),
    )


_Ordered = TypeVar("_Ordered", Stop, TaskUpdate)


def _in_task_order(changes: Sequence[_Ordered], order: Mapping[str, int]) -> tuple[_Ordered, ...]:
    return tuple(sorted(changes, key=lambda change: order[change.task_id]))


def ready_instances(
    snapshot: StateSnapshot, ready: frozenset[str] | None, leaving: frozenset[str]
) -> frozenset[str]:
    """Instances that can take a task now: running or draining, their worker registered
    and reachable (`ready`; None: every registered one), and not being given up."""
    return frozenset(
        i.instance_id
        for i in snapshot.instances
        if i.status in ("running", "draining")
        and i.ready_at is not None
        and i.reclaimed_at is None
        and i.instance_id not in leaving
        and (ready is None or i.instance_id in ready)
    )


@dataclass(frozen=True, slots=True)
class Occupancy:
    """What the tasks on each instance use: the resources (`used`) and each GPU's
    share in use (`gpu_load`: instance -> device index -> share)."""

    used: Mapping[str, Resources] = field(default_factory=dict)
    gpu_load: Mapping[str, Mapping[int, float]] = field(default_factory=dict)


def occupancy_of(snapshot: StateSnapshot, catalog: Catalog) -> Occupancy:
    """What occupies each instance now, the tasks leaving it included: their room is
    free only once they are gone."""
    instances = {i.instance_id: i for i in snapshot.instances}
    specs = _specs(snapshot)
    used: dict[str, Resources] = {}
    gpu_load: dict[str, dict[int, float]] = {}
    for task in snapshot.tasks.values():
        if task.status in ON_INSTANCE and task.instance_id is not None:
            demand = _demand(specs[task.task_id], instances.get(task.instance_id), catalog)
            if demand is not None:
                used[task.instance_id] = used.get(task.instance_id, _NOTHING).plus(demand)
                _load_gpus(gpu_load.setdefault(task.instance_id, {}), task.gpus, demand.gpu)
    return Occupancy(used, gpu_load)


@dataclass(frozen=True, slots=True)
class TaskChanges:
    """What a rule of the step does to tasks: their recorded changes and the attempts
    to stop."""

    updates: tuple[TaskUpdate, ...] = ()
    stops: tuple[Stop, ...] = ()


@dataclass(frozen=True, slots=True)
class GivenUp(TaskChanges):
    """Tasks stuck starting or checkpointing, each counted a failed attempt and sent
    back to pending; `failed_jobs` (job -> reason) reached `max_attempts`."""

    task_ids: frozenset[str] = frozenset()
    failed_jobs: Mapping[str, str] = field(default_factory=dict)


def given_up_tasks(
    snapshot: StateSnapshot, now: float, timeouts: Timeouts, max_attempts: int, backoff: Backoff
) -> GivenUp:
    """A step that takes too long is given up: a transient failure of the attempt
    (counted, retried after its back-off); a task failing `max_attempts` times fails
    its job, with its last reason."""
    updates: list[TaskUpdate] = []
    stops: list[Stop] = []
    failed: dict[str, str] = {}
    for task in snapshot.tasks.values():
        stuck = _stuck(task, now, timeouts)
        if not stuck:
            continue
        why = stuck.removeprefix(f"attempt {task.attempt} ")
        end = attempt_ended(
            task, "transient", why, now=now, max_attempts=max_attempts, backoff=backoff
        )
        updates.append(end.update)
        stops.append(Stop(task.task_id, task.attempt, stuck))
        if end.job_failure:
            failed.setdefault(task.job_id, end.job_failure)
    return GivenUp(tuple(updates), tuple(stops), frozenset(u.task_id for u in updates), failed)


def moves_out(
    snapshot: StateSnapshot,
    ready_now: frozenset[str],
    leaving: frozenset[str],
    given_up: frozenset[str],
) -> TaskChanges:
    """Tasks the plan moves elsewhere (or no longer places) are checkpointed and stopped —
    make before break: each leaves only once its destination is ready, and keeps
    running where it is until then. A task already checkpointing is not asked
    twice; one on an instance being given up is left to `sync`."""
    updates: list[TaskUpdate] = []
    stops: list[Stop] = []
    for task in snapshot.tasks.values():
        where, target = task.instance_id, task.target_instance_id
        if (
            task.task_id in given_up
            or task.status not in ON_INSTANCE
            or task.status == "checkpointing"
            or where == target
            or where in leaving
        ):
            continue
        if target is None or target in ready_now:
            reason = "no longer planned" if target is None else f"moving to {target}"
            moves = None if target is None else task.moves + 1
            updates.append(
                TaskUpdate(task.task_id, status="checkpointing", reason=reason, moves=moves)
            )
            stops.append(Stop(task.task_id, task.attempt, reason))
    return TaskChanges(tuple(updates), tuple(stops))


@dataclass(frozen=True, slots=True)
class Starts:
    """Attempts to start (`launches`, with their recorded `updates`) and what each
    instance is occupied by once they run (`occupied`)."""

    launches: tuple[TaskLaunch, ...]
    updates: tuple[TaskUpdate, ...]
    occupied: frozenset[str]


def starts_on_ready(
    snapshot: StateSnapshot,
    catalog: Catalog,
    ready_now: frozenset[str],
    occupied: Occupancy,
    failed_jobs: set[str],
    now: float,
) -> Starts:
    """Pending tasks start on their target once it is ready and has room for them
    (the tasks leaving it still count until gone), in the snapshot's task order,
    on the least-loaded GPUs; tasks of a job failing this step do not start, nor
    tasks waiting out a transient failure's back-off (`retry_at`)."""
    instances = {i.instance_id: i for i in snapshot.instances}
    specs: dict[str, TaskSpec] | None = None  # built once a task may start
    used = dict(occupied.used)
    gpu_load = {instance_id: dict(load) for instance_id, load in occupied.gpu_load.items()}
    launches: list[TaskLaunch] = []
    updates: list[TaskUpdate] = []
    for task in snapshot.tasks.values():
        target = task.target_instance_id
        if (
            task.status != "pending"
            or target is None
            or target not in ready_now
            or task.job_id in failed_jobs
            or (task.retry_at is not None and now < task.retry_at)
        ):
            continue
        inst = instances[target]
        if specs is None:
            specs = _specs(snapshot)
        spec = specs[task.task_id]
        demand = _demand(spec, inst, catalog)
        if demand is None:
            continue
        itype = catalog[inst.instance_type]
        after = used.get(target, _NOTHING).plus(demand)
        if not after.fits_in(itype.capacity):
            continue  # wait until the tasks leaving the destination are gone
        load = gpu_load.setdefault(target, {})
        gpus = pick_gpus(load, int(itype.capacity.gpu), demand.gpu)
        attempt = task.attempt + 1
        launches.append(
            TaskLaunch(
                task.task_id,
                task.job_id,
                attempt,
                target,
                spec.workload,
                spec.run,
                ResourceLimits(demand.cpu, demand.ram_gb, gpus, spec.run.shm_size_gb),
                task.checkpoint,
            )
        )
        updates.append(
            TaskUpdate(
                task.task_id,
                status="starting",
                instance_id=target,
                attempt=attempt,
                reason=f"attempt {attempt} on {target}"
                + (" from its checkpoint" if task.checkpoint else ""),
                gpus=gpus,
                drain_from="" if task.drain_from not in (None, target) else None,
            )
        )
        used[target] = after
        _load_gpus(load, gpus, demand.gpu)
    return Starts(tuple(launches), tuple(updates), frozenset(used))


def drained_instances(
    snapshot: StateSnapshot, occupied: frozenset[str], leaving: frozenset[str]
) -> tuple[InstanceAction, ...]:
    """Draining instances no task occupies any more are terminated."""
    return tuple(
        InstanceAction(inst.instance_id, "drained: no task left on it")
        for inst in snapshot.instances
        if inst.status == "draining"
        and inst.instance_id not in occupied
        and inst.instance_id not in leaving
    )


def unconfirmed_launches(snapshot: StateSnapshot) -> tuple[str, ...]:
    """Launches recorded but never confirmed (a crash between recording and asking):
    asked again with the same token, so the cloud starts at most one."""
    return tuple(
        i.instance_id for i in snapshot.instances if i.status == "requested" and not i.cloud_id
    )


def unfinished_terminations(snapshot: StateSnapshot, listed: Mapping[str, str]) -> tuple[str, ...]:
    """Instances recorded terminating that the cloud still lists as pending or running:
    asked to terminate again."""
    return tuple(
        i.instance_id
        for i in snapshot.instances
        if i.status == "terminating" and listed.get(i.instance_id) in ("pending", "running")
    )


def _stuck(task: TaskRecord, now: float, timeouts: Timeouts) -> str:
    since = task.status_since
    if since is None:
        return ""
    if task.status == "starting" and now - since > timeouts.start_s:
        return (
            f"attempt {task.attempt} still starting after {now - since:.0f} s "
            f"(limit {timeouts.start_s:.0f} s)"
        )
    if task.status == "checkpointing" and now - since > timeouts.checkpoint_s:
        return (
            f"attempt {task.attempt} still checkpointing after {now - since:.0f} s "
            f"(limit {timeouts.checkpoint_s:.0f} s); it resumes from its previous checkpoint"
        )
    return ""


def _specs(snapshot: StateSnapshot) -> dict[str, TaskSpec]:
    return {t.task_id: t for j in snapshot.jobs for t in j.spec.tasks}


def _demand(spec: TaskSpec, inst: InstanceRecord | None, catalog: Catalog) -> Resources | None:
    if inst is None or inst.instance_type not in catalog:
        return None
    return spec.demand_on(catalog[inst.instance_type].family)


_NOTHING = Resources()


def pick_gpus(load: Mapping[int, float], count: int, demand: float) -> tuple[int, ...]:
    """GPU indices for a task needing `demand` GPUs on an instance with `count` of them.

    Whole GPUs go to the least-loaded devices (idle ones first, lowest index on
    ties); a fractional demand shares a device. The planner has already checked
    that the demand fits, so this never refuses: at worst devices are shared.
    """
    wanted = min(math.ceil(demand - 1e-9), count)
    if wanted <= 0:
        return ()
    ranked = sorted(range(count), key=lambda g: (load.get(g, 0.0), g))
    return tuple(sorted(ranked[:wanted]))


def _load_gpus(load: dict[int, float], gpus: Sequence[int], demand: float) -> None:
    for g in gpus:
        load[g] = load.get(g, 0.0) + demand / len(gpus)
