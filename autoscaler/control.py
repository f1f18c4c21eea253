"""The control loop: a scheduling round, and the small steps between rounds, as a reconciler.

A round (`ControlLoop.schedule`, every scheduling period), in the manner of
Ray autoscaler v2's reconciler and Karpenter's decide → validate → execute:

    sync      Cloud.list + Executor.report  ->  Store      what is, written down; changes
                                                           nothing in the cloud
    snapshot  Store                         ->  StateSnapshot, read once, after sync
    decide    autoscaler.decide.decide      ->  RoundDecision (pure: plan, diff, guardrails,
                                                infeasible tasks, orphans; every reason)
    record    Store.record_round            ->  the decision and its intents, one transaction
    act       Cloud / Executor              ->  launches and terminations; outcomes recorded

A step (`ControlLoop.progress`, on every event in replay, every few seconds
in the daemon) is the same with `advance` in place of `decide`: it carries
out what the last round decided (start, move, terminate), never plans.

Nothing the loop needs lives only in this object: tasks being stopped are
tasks in status `checkpointing`, cool-downs are the cloud's availability
cache, D̂'s event rate and Full share come from recorded rounds, launch
tokens are numbered from the store. A `ControlLoop` thrown away and rebuilt
from the store between any two calls decides exactly the same (tested).
`dry_run` means exactly "record, don't act".

The loop talks only to the `Cloud`, `Executor`, `Store` and `Clock`
interfaces: the same code runs against EC2, on this machine, and in replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from autoscaler.catalog import Catalog
from autoscaler.cloud import (
    Cloud,
    CloudError,
    CloudInstance,
    CloudUnavailable,
    Diagnoses,
    LaunchRequest,
    match_listing,
)
from autoscaler.decide import (
    ON_INSTANCE,
    RECLAIM_HOLD_S,
    ControlOptions,
    InstanceAction,
    Planner,
    RoundDecision,
    StepDecision,
    advance,
    decide,
)
from autoscaler.execution import (
    TERMINAL_TASK_STATES,
    Clock,
    Executor,
    ExecutorReport,
    FailureClass,
    InstanceNotice,
    TaskReport,
)
from autoscaler.failures import AttemptEnd, attempt_ended, classify
from autoscaler.jobs import TaskRun
from autoscaler.planner import Plan
from autoscaler.spend import Spending, day_start, spending
from autoscaler.stopwatch import stopwatch
from autoscaler.store import (
    ActionRecord,
    InstanceChange,
    InstanceRecord,
    InterruptionKind,
    RoundRecord,
    StateSnapshot,
    Store,
    TaskRecord,
    TaskStatus,
    TaskUpdate,
)
from autoscaler.throughput import Colocated, ThroughputEntry
from autoscaler.view import PhaseSample

__all__ = [
    "ControlLoop",
    "ControlOptions",
    "Observed",
    "Planner",
    "RoundOutcome",
    "act",
    "decide",
    "record",
    "sync",
]

log = logging.getLogger(__name__)

#: How the executor's task states map onto task statuses in the state.
_STATUS_OF: dict[str, TaskStatus] = {
    "starting": "starting",
    "running": "running",
    "checkpointing": "checkpointing",
    "stopped": "pending",
    "completed": "completed",
    "failed": "pending",
}


@dataclass(frozen=True, slots=True)
class Observed:
    """What `sync` saw that the state does not hold, for the decision that follows."""

    orphans: tuple[CloudInstance, ...] = ()  # ours by tag, unknown to the state
    strays: tuple[tuple[str, int], ...] = ()  # (task, attempt) running for no active job
    ready: frozenset[str] = frozenset()  # instances whose worker the executor reaches now
    listed: Mapping[str, str] | None = None  # our instance id -> the cloud's state of it
    # The store as sync read it, when sync wrote nothing: then it is the snapshot after sync.
    unchanged: StateSnapshot | None = None
    ended: tuple[AttemptEnd, ...] = ()  # attempts that ended without completing, and why


@dataclass(frozen=True, slots=True)
class TaskSync:
    """What `sync` did to tasks: strays to stop, terminal attempts to acknowledge,
    whether it wrote, the attempts that ended without completing."""

    strays: list[tuple[str, int]]
    acknowledged: list[tuple[str, int]]
    wrote: bool
    ended: tuple[AttemptEnd, ...]


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What a round decided and did (also recorded in the store)."""

    record: RoundRecord
    plan: Plan | None
    planning_seconds: float


# -- sync ---------------------------------------------------------------------------------------


def sync(
    cloud: Cloud,
    executor: Executor,
    store: Store,
    *,
    now: float,
    options: ControlOptions,
    learn: bool = False,
) -> Observed:
    """Write into the store what the cloud and the executor say; change nothing outside.

    Instances: adopted when a launch's answer was never recorded, running once
    the cloud says so, terminated once the cloud no longer lists them, ready
    when their worker registers, lost when it falls silent. Tasks: their state,
    checkpoints, failures by class (`autoscaler.failures`: only the job's own
    count toward `max_attempts`), completions; progress at every step with
    `options.progress_at_steps`. With `learn` (at rounds): progress, throughputs,
    and the co-location throughputs observed (Eva §4.3–4.4).
    """
    listed = cloud.list()
    report = executor.report()
    snap = store.snapshot(options.default_throughput, with_throughput=learn)
    listing = match_listing(((i.instance_id, i.cloud_id) for i in snap.instances), listed)
    gone, wrote = _sync_instances(
        store, snap, listing.by_instance, report, now, options.unlisted_grace_s, cloud
    )
    tasks = _sync_tasks(store, snap, report, gone, now, options, learn)
    wrote = wrote or tasks.wrote
    if learn and options.learn:
        wrote = _learn(store, snap, report, now) or wrote
    for task_id, attempt in tasks.acknowledged:
        executor.acknowledge(task_id, attempt)
    return Observed(
        listing.orphans,
        tuple(tasks.strays),
        frozenset(report.ready_instances),
        {our_id: seen.state for our_id, seen in listing.by_instance.items()},
        None if wrote else snap,
        tasks.ended,
    )


def _sync_instances(
    store: Store,
    snap: StateSnapshot,
    seen_by_id: Mapping[str, CloudInstance],
    report: ExecutorReport,
    now: float,
    unlisted_grace_s: float,
    cloud: Cloud | None = None,
) -> tuple[set[str], bool]:
    """Follow the cloud and the workers; returns the instances that are gone, and
    whether anything was written. A boot that ended before its worker registered keeps
    its cause in the reason of every later status (the back-off of its type shows it)."""
    gone: set[str] = set()
    changes: list[tuple[str, str, str, CloudInstance | None]] = []  # id, status, reason, seen
    wrote = False
    for inst in snap.instances:
        seen = seen_by_id.get(inst.instance_id)
        our_id = inst.instance_id
        if inst.cloud_id is None:
            if seen is not None and inst.status == "requested":
                status = "running" if seen.state == "running" else "pending"
                reason = "the cloud lists the instance this launch token started"
                changes.append((our_id, status, reason, seen))
            continue
        if seen is None:
            found_lost = inst.lost_at is not None or our_id in report.lost_instances
            if presumed_gone(inst, now, report.ready_instances, unlisted_grace_s, lost=found_lost):
                since = now - last_confirmed(inst)
                reason = f"the cloud no longer lists it (last confirmed {since:.0f} s ago)"
                if inst.status == "terminating" and _never_a_worker(inst):
                    reason = f"{reason}; {inst.reason}"
                changes.append((our_id, "terminated", reason, None))
                gone.add(our_id)
            continue
        if seen.state == "running" and inst.status == "pending":
            changes.append((our_id, "running", "the cloud reports it running", seen))
        elif seen.state in ("shutting-down", "stopping", "stopped") and inst.status != (
            "terminating"
        ):
            reason = f"the cloud reports it {seen.state}"
            if _never_a_worker(inst) and our_id not in report.ready_instances:
                reason = _with_diagnosis(cloud, inst, f"{reason} before its worker registered")
            changes.append((our_id, "terminating", reason, None))
        if our_id in report.ready_instances and inst.ready_at is None:
            wrote = store.instance_worker(our_id, now, ready=True) or wrote
        lost = report.lost_instances.get(our_id)
        if lost is not None and inst.lost_at is None:
            wrote = store.instance_worker(our_id, now, ready=False, reason=lost) or wrote
        for notice in report.notices.get(our_id, ()):
            wrote = _record_notice(store, inst, notice, now) or wrote
    for our_id, status, reason, seen in changes:
        change = InstanceChange(
            our_id,
            status,  # type: ignore[arg-type]
            seen.cloud_id if seen else None,
            seen.zone if seen else None,
            reason,
            seen.private_address if seen else None,
            seen.hourly_price if seen else None,
        )
        store.transition_instances([change], now)
    return gone, wrote or bool(changes)


def _record_notice(store: Store, inst: InstanceRecord, notice: InstanceNotice, now: float) -> bool:
    """A provider's notice about an instance into the state, once: a reclaim marks it
    (nothing is placed on it any more; its tasks, checkpointed and stopped by its worker,
    start elsewhere without counting as failures) and both kinds join the interruption
    history with the instance's offering."""
    if notice.reclaims and inst.reclaimed_at is not None:
        return False
    kind: InterruptionKind = "reclaim" if notice.reclaims else "rebalance"
    reason = f"{notice.describe()} for {inst.instance_type}"
    recorded = store.instance_notice(inst.instance_id, kind, now, reason)
    if recorded:
        log.warning("instance %s: %s", inst.instance_id, reason)
    return recorded


def _never_a_worker(inst: InstanceRecord) -> bool:
    """Launched, never registered, and not drained by a plan that stopped needing it."""
    return inst.cloud_id is not None and inst.ready_at is None and inst.entered("draining") is None


def _with_diagnosis(cloud: Cloud | None, inst: InstanceRecord, reason: str) -> str:
    """`reason`, and what the cloud can say of the instance's boot (`Diagnoses`)."""
    if inst.cloud_id is None or not isinstance(cloud, Diagnoses):
        return reason
    try:
        found = cloud.diagnose(inst.cloud_id, inst.instance_id)
    except Exception as exc:  # a diagnosis is a courtesy: it never stops the loop
        found = f"no diagnosis ({type(exc).__name__}: {exc})"
    return f"{reason}: {found}" if found else reason


def diagnosed(
    cloud: Cloud, snapshot: StateSnapshot, actions: tuple[InstanceAction, ...]
) -> tuple[InstanceAction, ...]:
    """The step's terminations, each of an instance whose worker never registered
    with the cloud's diagnosis of its boot in its reason, recorded before it is gone."""
    if not isinstance(cloud, Diagnoses):
        return actions
    records = {i.instance_id: i for i in snapshot.instances}
    out = []
    for action in actions:
        inst = records.get(action.instance_id)
        if inst is not None and action.status == "terminating" and _never_a_worker(inst):
            action = replace(action, reason=_with_diagnosis(cloud, inst, action.reason))
        out.append(action)
    return tuple(out)


def last_confirmed(inst: InstanceRecord) -> float:
    """The last time the state heard of this instance from the cloud, or asked for it:
    its request, its launch answered or adopted (`pending`), or reported `running`."""
    times = [at for status, at in inst.history if status in ("pending", "running")]
    return max([inst.requested_at, *times])


def presumed_gone(
    inst: InstanceRecord, now: float, ready: frozenset[str], grace_s: float, *, lost: bool = False
) -> bool:
    """Whether an instance the cloud does not list is really gone.

    `DescribeInstances` lags `RunInstances` by seconds: one missed listing of an
    instance launched a moment ago is not its end. It is presumed gone only once
    `grace_s` have passed since it was last confirmed (`last_confirmed`, from its
    status history) and its worker is not reachable now — several listings of the
    daemon's steps. Both come from the state and the executor, not from memory, so
    a daemon restarted in between counts the same way.

    An instance being terminated whose worker once registered is gone as soon as
    the cloud stops listing it: it booted long after its launch became visible,
    and its worker may answer a moment more while it shuts down. Waiting would
    only bill the ledger for time the cloud does not charge.

    So is an instance whose worker registered and has since been found `lost` (silent
    past the heartbeat timeout, now or before): the listing's lag is a launch's, and this one was
    listed for as long as it took to boot; waiting out the grace would only keep its
    tasks from starting elsewhere for a minute.
    """
    if inst.status == "terminating" and inst.ready_at is not None:
        return True
    if inst.instance_id in ready:
        return False
    if inst.ready_at is not None and lost:
        return True
    return now - last_confirmed(inst) >= grace_s


def _sync_tasks(
    store: Store,
    snap: StateSnapshot,
    report: ExecutorReport,
    gone: set[str],
    now: float,
    options: ControlOptions,
    with_throughput: bool,
) -> TaskSync:
    """Record task states, and what each attempt that ended without completing does to
    its task and its job (`autoscaler.failures`)."""
    live = {i.instance_id for i in snap.instances} - gone
    types = {i.instance_id: i.instance_type for i in snap.instances}
    # Instances their provider reclaims: recorded before, or noticed in this very report.
    reclaimed = frozenset(
        {i.instance_id for i in snap.instances if i.reclaimed_at is not None}
        | {i for i, notices in report.notices.items() if any(n.reclaims for n in notices)}
    )
    updates: list[TaskUpdate] = []
    acknowledged: list[tuple[str, int]] = []
    strays: list[tuple[str, int]] = []
    started: list[str] = []
    completed: list[str] = []
    failed_jobs: dict[str, str] = {}
    ended: list[AttemptEnd] = []
    # Without progress or throughput to record (most steps), a task whose report says
    # what the state holds changes nothing: that case, the most frequent by far, is
    # answered here as `_task_change` answers it, without the call.
    quiet = not (with_throughput or options.progress_at_steps)
    for job in snap.jobs:
        statuses: list[str] = []
        for spec in job.spec.tasks:
            task = snap.tasks[spec.task_id]
            seen = report.tasks.get(spec.task_id)
            if (
                quiet
                and seen is not None
                and seen.attempt == task.attempt
                and seen.state in ON_INSTANCE
                and seen.state == task.status
                and seen.instance_id == task.instance_id
                and seen.checkpoint == task.checkpoint
            ):
                statuses.append(task.status)
                continue
            if seen is None and task.status not in ON_INSTANCE:
                # Not on an instance and not reported: nothing to change (`_task_change`'s
                # first answer, without the call: a first round's tasks are all pending).
                statuses.append(task.status)
                continue
            if seen is not None and seen.attempt != task.attempt:
                # Another attempt than the one the state knows: an old one still running
                # is stopped; an old terminal report is only acknowledged.
                if seen.state in TERMINAL_TASK_STATES:
                    acknowledged.append((spec.task_id, seen.attempt))
                elif seen.attempt < task.attempt:
                    strays.append((spec.task_id, seen.attempt))
                seen = None
            change, status = _task_change(
                task, seen, spec.run, live, types, report, with_throughput, now, options, reclaimed
            )
            if isinstance(change, AttemptEnd):
                ended.append(change)
                if change.job_failure:
                    failed_jobs.setdefault(job.job_id, change.job_failure)
                change = change.update
            if change is not None:
                updates.append(change)
            if seen is not None and seen.state in TERMINAL_TASK_STATES:
                acknowledged.append((spec.task_id, seen.attempt))
            statuses.append(status)
        if job.started_at is None and statuses and all(s == "running" for s in statuses):
            started.append(job.job_id)
        if statuses and all(s == "completed" for s in statuses):
            completed.append(job.job_id)
    if updates:
        store.update_tasks(updates, now)
    for job_id in started:
        store.job_started(job_id, now)
    for job_id in completed:
        store.job_finished(job_id, now)
    for job_id, reason in sorted(failed_jobs.items()):
        store.job_finished(job_id, now, "failed", reason)
    wrote = bool(updates or started or completed or failed_jobs)
    for task_id, seen in report.tasks.items():
        if task_id not in snap.tasks:
            if seen.state in TERMINAL_TASK_STATES:
                acknowledged.append((task_id, seen.attempt))
            else:
                strays.append((task_id, seen.attempt))
    return TaskSync(sorted(strays), acknowledged, wrote, tuple(ended))


def _task_change(
    task: TaskRecord,
    seen: TaskReport | None,
    run: TaskRun,
    live: set[str],
    types: Mapping[str, str],
    report: ExecutorReport,
    with_throughput: bool,
    now: float,
    options: ControlOptions,
    reclaimed: frozenset[str] = frozenset(),
) -> tuple[TaskUpdate | AttemptEnd | None, str]:
    """The update a report implies for one task (None: nothing changed; an `AttemptEnd`
    when its attempt ended without completing), and its status.

    Progress is recorded at rounds, and at every step where it changed when
    `options.progress_at_steps` (the daemon: what is shown is one step old);
    throughput (learning, §4.3) only at rounds (`with_throughput`).
    """

    def ended(failure: FailureClass, why: str, checkpoint: str | None = None) -> AttemptEnd:
        return attempt_ended(
            task,
            failure,
            why,
            now=now,
            max_attempts=options.max_attempts,
            backoff=options.backoff,
            checkpoint=checkpoint,
        )

    if seen is None:
        if task.status not in ON_INSTANCE:
            return None, task.status
        where = task.instance_id
        if where not in live or where in report.lost_instances:
            why = report.lost_instances.get(where or "", "its instance is gone")
            return ended("infrastructure", f"lost with its instance {where}: {why}"), "pending"
        if where in report.ready_instances:
            # The worker is reachable but does not know this attempt: it never started
            # (the process stopped between recording the start and asking for it).
            return (
                TaskUpdate(
                    task.task_id,
                    status="pending",
                    instance_id=None,
                    reason=f"attempt {task.attempt} never reached its worker; starting again",
                    gpus=(),
                ),
                "pending",
            )
        return None, task.status  # its worker has not re-registered yet: wait
    status = _STATUS_OF[seen.state]
    if seen.state == "failed":
        if task.status not in ON_INSTANCE:
            return None, task.status  # already recorded
        why = seen.reason or f"exit code {seen.exit_code}"
        checkpoint = seen.checkpoint if seen.checkpoint != task.checkpoint else None
        return ended(classify(seen, run), why, checkpoint), status
    instance_id = seen.instance_id if status in ON_INSTANCE else None
    checkpoint = seen.checkpoint if seen.checkpoint != task.checkpoint else None
    changed = (status, instance_id) != (task.status, task.instance_id) or checkpoint is not None
    with_progress = with_throughput or options.progress_at_steps
    if with_progress:
        changed = changed or seen.progress != task.progress
    if with_throughput:
        changed = changed or seen.throughput != task.throughput
    if not changed:
        return None, status
    reason: str | None = None
    retries: int | None = None
    failure: str | None = None
    if status != task.status:
        reason = {
            "running": "running",
            "pending": "checkpointed and stopped" if seen.checkpoint else "stopped",
            "completed": "completed",
        }.get(status, seen.reason or status)
        if task.instance_id in reclaimed and status == "pending":
            # Its provider reclaimed the instance (a spot interruption notice): the agent
            # checkpointed and stopped it, whether or not a move was asked for meanwhile.
            reason = f"attempt {task.attempt} stopped (infrastructure): its instance was reclaimed"
            retries, failure = task.retries + 1, "infrastructure"
        elif status == "pending" and task.status != "checkpointing":
            # Stopped without being asked (its agent or instance going down): the
            # infrastructure's doing, started again at once, never counted.
            reason = f"attempt {task.attempt} stopped (infrastructure): {seen.reason or reason}"
            retries, failure = task.retries + 1, "infrastructure"
    return (
        TaskUpdate(
            task.task_id,
            status=status,
            instance_id=instance_id,
            # when recorded (see above); and when an attempt ends, so a finished task
            # shows where it got
            progress=seen.progress if with_progress or status != task.status else None,
            checkpoint=checkpoint,
            reason=reason,
            throughput=seen.throughput if with_throughput else "keep",
            gpus=() if instance_id is None else None,
            phases=_measured_phases(task, seen, status, types),
            retries=retries,
            failure=failure,
        ),
        status,
    )


#: Phases an attempt has measured once its container runs: recorded with the update
#: that takes it out of `starting` (Eva Table 1's fetch and build; the container's start).
LAUNCH_PHASES = ("fetch", "build", "start")
#: Phases measured later: recorded with the update that ends the attempt, stopped or completed.
END_PHASES = ("init", "checkpoint", "upload")


def _measured_phases(
    task: TaskRecord, seen: TaskReport, status: str, types: Mapping[str, str]
) -> tuple[PhaseSample, ...]:
    """The phases of the attempt to measure with this update, on the type it ran on.

    Each phase counts once per attempt: the update that records its attempt past
    `starting`, or ending, is written once (a report seen again after a restart
    changes nothing, so it carries nothing). A failed attempt's phases are not
    measured: its build may have failed half way.
    """
    instance_type = types.get(seen.instance_id or task.instance_id or "")
    if instance_type is None or not seen.phases:
        return ()
    names: tuple[str, ...] = ()
    if task.status == "starting" and status != "starting":
        names += LAUNCH_PHASES
    if task.status in ON_INSTANCE and seen.state in ("stopped", "completed"):
        names += END_PHASES
    measured = [name for name in names if name in seen.phases]
    return tuple((instance_type, name, float(seen.phases[name])) for name in measured)


def _learn(store: Store, snap: StateSnapshot, report: ExecutorReport, now: float) -> bool:
    """Update the throughput table from each running job's observed throughput (§4.3–4.4).

    Workers report raw iterations per second; a job's normalized throughput is
    its slowest task's rate over its solo rate (the spec's, else learned the
    first time all its tasks ran alone).
    """
    placed: dict[str, list[str]] = {}  # instance -> tasks running there
    workload = {t.task_id: t.workload for j in snap.jobs for t in j.spec.tasks}
    for task_id, seen in report.tasks.items():
        if seen.state == "running" and seen.instance_id is not None and task_id in workload:
            placed.setdefault(seen.instance_id, []).append(task_id)
    on = {tid: inst for inst, tids in placed.items() for tid in tids}
    observations = []
    wrote = False
    for job in snap.jobs:
        task_ids = [t.task_id for t in job.spec.tasks]
        reported = [report.tasks[t].throughput if t in on else None for t in task_ids]
        rates = [r for r in reported if r is not None]
        if len(rates) < len(reported):
            continue
        rate = min(rates)
        solo = job.spec.full_throughput or job.solo_throughput
        alone = all(len(placed[on[t]]) == 1 for t in task_ids)
        if solo is None:
            if not alone or not rate:
                continue
            wrote = store.learn_solo_throughput(job.job_id, rate) or wrote
            solo = rate
        placements = [
            (workload[tid], [workload[o] for o in placed[on[tid]] if o != tid]) for tid in task_ids
        ]
        observations.append((placements, rate / solo))
    table, chosen = snap.throughput.observe_jobs(observations, at_s=now)
    # Bounded in memory and in the store: old exact sets are forgotten (see `bounded`).
    table, forgotten = table.bounded()
    # the latest entry for each key updated this round
    changed: dict[tuple[str, Colocated], tuple[str, Colocated, ThroughputEntry]] = {}
    for (placements, _), index in zip(observations, chosen, strict=True):
        if index is not None:
            w, colocated = placements[index]
            key = (w, tuple(sorted(colocated)))
            entry = table.entry(w, colocated)
            if entry is not None:  # None: just learned, and already the oldest
                changed[key] = (w, key[1], entry)
    if changed or forgotten:
        store.record_throughput(list(changed.values()), forget=forgotten)
    return wrote or bool(changed) or bool(forgotten)


# -- record ------------------------------------------------------------------------------------


def record(
    store: Store,
    decision: RoundDecision,
    *,
    dry_run: bool = False,
    recorded: RoundRecord | None = None,
) -> RoundDecision:
    """Store the round's decision (`recorded`: its `record()`, if built already), with its
    intents unless this is a dry run; returns it with its round id. Nothing has been done
    yet."""
    intents = None if dry_run else decision.intents()
    round_id = store.record_round(recorded if recorded is not None else decision.record(), intents)
    if not dry_run:
        for job_id, reason in sorted(decision.stopped.items()):
            store.job_finished(job_id, decision.at, "cancelled", reason)
    return replace(decision, round_id=round_id)


def record_step(store: Store, step: StepDecision) -> None:
    """Store what a step is about to do, each change with its reason."""
    if step.updates:
        store.update_tasks(step.updates, step.at)
    for job_id, reason in step.failed_jobs:
        store.job_finished(job_id, step.at, "failed", reason)
    for action in step.terminations:
        store.transition_instance(action.instance_id, action.status, step.at, reason=action.reason)


# -- act ---------------------------------------------------------------------------------------


def act(
    decision: RoundDecision,
    *,
    cloud: Cloud,
    store: Store,
    now: float,
    after_launch: Callable[[str], None] = lambda instance_id: None,
    actions: tuple[ActionRecord, ...] | None = None,
) -> tuple[ActionRecord, ...]:
    """Carry out the round's launches and orphan terminations; record what came of them.

    The launches were recorded (requested, with their tokens) before this; their
    answers are recorded together after the calls: a crash in between leaves
    instances the cloud lists under tokens the state knows, which the next sync
    adopts. A launch is retried with the same token if the cloud could not be
    reached (it may have started the instance); any other failure fails the
    instance, whose tasks are planned again next round. `actions`: the decision's
    `actions()` as recorded, if built already (a first round has thousands).
    """
    assert decision.round_id is not None, "record the decision before acting on it"
    answered = list(decision.actions() if actions is None else actions)
    changes: list[InstanceChange] = []
    outcomes: list[tuple[int, str, str]] = []
    for index, launch in enumerate(decision.launches):
        outcome, message, change = ask_cloud(cloud, launch.instance_id, launch.instance_type)
        after_launch(launch.instance_id)
        if change is not None:
            changes.append(change)
        if outcome != "planned":
            outcomes.append((index, outcome, message))
        answered[index] = _answered(answered[index], outcome, message)
    refused = {
        decision.launches[index].instance_id
        for index, outcome, _ in outcomes
        if outcome in ("failed", "skipped")
    }
    for position, change in _kept_for_refused(decision, refused):
        # Make-before-break: the tasks stay where they run, so the instance does too.
        changes.append(change)
        index = len(decision.launches) + len(decision.refused) + position
        outcomes.append((index, "skipped", change.reason))
        answered[index] = _answered(answered[index], "skipped", change.reason)
    if changes:
        store.transition_instances(changes, now)
    doomed = [
        (position, o) for position, o in enumerate(decision.orphans) if o.action == "terminate"
    ]
    if doomed:
        try:
            cloud.terminate([o.instance.cloud_id for _, o in doomed])
            outcome, message = "done", ""
        except CloudError as exc:
            outcome, message = "failed", f"{type(exc).__name__}: {exc}"
        for position, _ in doomed:
            index = decision.orphan_index(position)
            outcomes.append((index, outcome, message))
            answered[index] = _answered(answered[index], outcome, message)
    if outcomes:
        store.record_action_outcomes(decision.round_id, outcomes)
    return tuple(answered)


def _kept_for_refused(
    decision: RoundDecision, refused: set[str]
) -> list[tuple[int, InstanceChange]]:
    """The round's drains to undo, by position in `decision.drains`: instances it drained
    for tasks to move to instances the cloud then refused. Those tasks keep running
    where they are, so their instance goes back to running (a drain can be undone) and
    the next round plans them there; left draining, they were placed on a new instance
    each round the refused offering came out of its cooldown, moving a task between
    identical on-demand instances every few minutes."""
    if not refused:
        return []
    stranded = {
        move.detail.get("from")
        for move in decision.moves
        if move.kind == "migrate" and move.detail.get("to") in refused
    }
    return [
        (
            position,
            InstanceChange(
                drain.instance_id,
                "running",
                reason="kept: the instance its tasks were to move to was refused",
            ),
        )
        for position, drain in enumerate(decision.drains)
        if drain.status == "draining" and drain.instance_id in stranded
    ]


def _answered(action: ActionRecord, outcome: str, message: str) -> ActionRecord:
    """The action with what came of it (built directly: `dataclasses.replace` inspects the
    fields on every call, and a first round answers thousands of launches)."""
    return ActionRecord(
        action.kind,
        action.target,
        action.reason,
        outcome,  # type: ignore[arg-type]
        message,
        action.detail,
    )


def ask_cloud(
    cloud: Cloud, instance_id: str, instance_type: str
) -> tuple[str, str, InstanceChange | None]:
    """Ask the cloud for one recorded instance (idempotent by its token):
    (outcome, message, the transition to record)."""
    try:
        got = cloud.launch(LaunchRequest(instance_type, instance_id))
    except CloudUnavailable as exc:
        log.warning("launch %s: %s; retried with the same token", instance_id, exc)
        return "planned", f"CloudUnavailable: {exc}; retried with the same token", None
    except CloudError as exc:
        message = f"{type(exc).__name__}: {exc}"
        return "failed", message, InstanceChange(instance_id, "failed", reason=message)
    if got.dry_run:
        # EC2 checked the call (permissions and parameters) and started nothing.
        message = f"dry run: the cloud accepted the launch of {instance_type} and started nothing"
        return "skipped", message, InstanceChange(instance_id, "failed", reason=message)
    change = InstanceChange(
        instance_id,
        "running" if got.state == "running" else "pending",
        got.cloud_id,
        got.zone,
        f"launched as {got.cloud_id}",
        got.private_address,
        got.hourly_price,
    )
    return "done", got.cloud_id, change


def launch_instance(cloud: Cloud, store: Store, instance_id: str, now: float) -> tuple[str, str]:
    """Ask the cloud again for an instance recorded but never confirmed; record the answer."""
    inst = store.instance(instance_id)
    if inst is None or inst.status != "requested" or inst.cloud_id is not None:
        return "skipped", "no longer requested"
    outcome, message, change = ask_cloud(cloud, instance_id, inst.instance_type)
    if change is not None:
        store.transition_instances([change], now)
    return outcome, message


def act_step(
    step: StepDecision,
    snapshot: StateSnapshot,
    *,
    cloud: Cloud,
    executor: Executor,
    store: Store,
) -> None:
    """Carry out a recorded step: stop, start, launch again, terminate."""
    for stop in step.stops:
        executor.stop(stop.task_id, stop.attempt)
    for launch in step.starts:
        executor.start(launch)
    for instance_id in step.relaunch:
        launch_instance(cloud, store, instance_id, step.at)
    cloud_ids = {i.instance_id: i.cloud_id for i in snapshot.instances}
    doomed = [t.instance_id for t in step.terminations if t.status == "terminating"]
    doomed += list(step.reterminate)
    for instance_id in doomed:
        executor.release(instance_id)
    ids = [cloud_id for i in doomed if (cloud_id := cloud_ids.get(i))]
    if ids:
        try:
            cloud.terminate(ids)
        except CloudError as exc:
            # The state says terminating: the next step asks again.
            log.warning("terminate %s: %s", ", ".join(ids), exc)


# -- the loop ------------------------------------------------------------------------------------


class ControlLoop:
    """Runs rounds and the steps between them for one cluster.

    It holds the bindings and the planner, nothing else: every call starts
    from the store. `passed(point)` is called as each named point of a round
    is passed (`synced`, `decided`, `recorded`, `launched` after each launch,
    `acted`, and `stepped` after a step is recorded): the daemon logs there,
    and its crash tests kill it there. `attempt_ended` hears of each attempt
    that ended without completing, with its class (the daemon logs it).
    """

    def __init__(
        self,
        planner: Planner,
        cloud: Cloud,
        executor: Executor,
        store: Store,
        clock: Clock,
        options: ControlOptions | None = None,
        passed: Callable[[str], None] | None = None,
        attempt_ended: Callable[[AttemptEnd], None] | None = None,
        catalog: Callable[[Catalog, float], Catalog] | None = None,
    ) -> None:
        self.planner = planner
        self.cloud = cloud
        self.executor = executor
        self.store = store
        self.clock = clock
        self.options = options or ControlOptions()
        self.passed = passed or (lambda point: None)
        self.attempt_ended = attempt_ended or (lambda end: None)
        # The cloud's catalog as the rounds and steps price it at a time: the daemon's
        # learned spot interruption rates (`app.spot_rates`); None: as the cloud says.
        self.priced = catalog

    def catalog(self, now: float) -> Catalog:
        """The catalog this round or step plans and prices with."""
        base = self.cloud.catalog()
        return base if self.priced is None else self.priced(base, now)

    def _sync(self, now: float, *, learn: bool) -> Observed:
        observed = sync(
            self.cloud, self.executor, self.store, now=now, options=self.options, learn=learn
        )
        for end in observed.ended:
            self.attempt_ended(end)
        return observed

    def schedule(self) -> RoundOutcome:
        """One scheduling round: sync → snapshot → decide → record → act."""
        now = self.clock.now()
        options = self.options
        observed = self._sync(now, learn=True)
        self.passed("synced")
        snapshot = observed.unchanged or self.store.snapshot(options.default_throughput)
        ended, spent = self._history(now)
        spending = self._spending(snapshot, now)
        elapsed = stopwatch()
        decision = decide(
            snapshot,
            self.catalog(now),
            self.cloud.unavailable(),
            options,
            planner=self.planner,
            now=now,
            orphans=observed.orphans,
            ended=ended,
            spent_last_day=spent,
            spending=spending,
            reclaims=self.store.interruptions(now - RECLAIM_HOLD_S),
        )
        seconds = elapsed()
        if decision.plan is not None:
            decision = replace(decision, numbers={**decision.numbers, "planning_seconds": seconds})
        self.passed("decided")
        recorded = decision.record()
        decision = record(self.store, decision, dry_run=options.dry_run, recorded=recorded)
        self.passed("recorded")
        if options.dry_run:
            return RoundOutcome(
                replace(recorded, round_id=decision.round_id), decision.plan, seconds
            )
        actions = act(
            decision,
            cloud=self.cloud,
            store=self.store,
            now=now,
            after_launch=lambda _: self.passed("launched"),
            actions=recorded.actions,
        )
        self.passed("acted")
        self.progress()
        return RoundOutcome(decision.record(actions), decision.plan, seconds)

    def _history(self, now: float) -> tuple[tuple[InstanceRecord, ...], float]:
        """What the guardrails and the boot back-off read beyond the snapshot: instances
        ended lately, and the ledger's last 24 hours (read only when they are in use,
        so a replay reads neither)."""
        options = self.options
        ended: tuple[InstanceRecord, ...] = ()
        rails = options.guardrails
        if options.boot_backoff is not None or rails.max_launches_per_type_hour is not None:
            window = max(3600.0, options.boot_backoff.window_s if options.boot_backoff else 0.0)
            ended = tuple(
                i
                for i in self.store.instances(include_finished=True)
                if i.status in ("terminated", "failed") and i.requested_at >= now - window
            )
        spent = 0.0
        if rails.max_daily_spend is not None:
            spent = self.store.cost_between(now - 86400.0, now)
        return ended, spent

    def _spending(self, snapshot: StateSnapshot, now: float) -> Spending | None:
        """The attributed spend the budgets read (`autoscaler.spend`): read from the ledgers
        only when a team has a daily budget or an unfinished job a `max_cost`, so a round
        without either (a replay) reads neither ledger."""
        teams = self.options.teams
        budgets = teams is not None and any(
            t.daily_budget is not None for t in (*teams.teams.values(), teams.default)
        )
        capped = [j.submitted_at for j in snapshot.jobs if j.spec.max_cost is not None]
        if not budgets and not capped:
            return None
        # Placements from the earliest moment either reads: today's start, or the oldest
        # capped job's submission (every placement of it is later).
        since = min([day_start(now), *capped])
        records = {j.job_id: j for j in self.store.jobs()}
        return spending(
            self.store.uptime(since),
            self.store.placements(since),
            {job_id: r.spec for job_id, r in records.items()},
            {job_id: r.team for job_id, r in records.items()},
            self.catalog(now),
            now,
        )

    def progress(self) -> StepDecision:
        """Carry out the adopted plan as far as the world allows right now."""
        now = self.clock.now()
        options = self.options
        observed = self._sync(now, learn=False)
        if options.dry_run:
            return StepDecision(now)
        snapshot = observed.unchanged or self.store.snapshot(
            options.default_throughput, with_throughput=False
        )
        step = advance(
            snapshot,
            self.catalog(now),
            options,
            now=now,
            ready=observed.ready,
            strays=observed.strays,
            listed=observed.listed,
        )
        if step:
            step = replace(step, terminations=diagnosed(self.cloud, snapshot, step.terminations))
            record_step(self.store, step)
            self.passed("stepped")
            act_step(step, snapshot, cloud=self.cloud, executor=self.executor, store=self.store)
        return step
