"""The control loop: one scheduling round, and the small steps between rounds.

A round (`ControlLoop.schedule`), every scheduling period:

    observe  Store.snapshot + Executor.report + Cloud.list  ->  ClusterView
    plan     Planner.plan(view)                             ->  Plan
    diff     (view, plan)                                   ->  launches, drains, moves
    guard    guardrails (instance cap, hourly budget)       ->  allowed; the rest refused
    record   Store.record_round                             ->  every decision and its reason
    act      Cloud.launch / Store transitions               ->  outcomes recorded

Between rounds (`ControlLoop.progress`, on every event in replay, every few
seconds in the daemon) the loop only carries out what the last plan decided:
it starts tasks on instances whose worker became ready, moves a task once its
destination is ready (make-before-break: the task keeps running where it is
until then), terminates drained instances once their tasks have left, and
absorbs completions. It never plans.

The same code runs against EC2 and in replay: it talks only to the `Cloud`,
`Executor`, `Store` and `Clock` interfaces.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from autoscaler.catalog import Catalog
from autoscaler.cloud import (
    Cloud,
    CloudError,
    Guardrails,
    InsufficientCapacity,
    LaunchRefused,
    LaunchRequest,
    reconcile,
)
from autoscaler.configuration import Configuration, Instance
from autoscaler.execution import Clock, Executor, ExecutorReport
from autoscaler.planner import Plan
from autoscaler.store import (
    FINAL_INSTANCE_STATUSES,
    ActionRecord,
    RoundRecord,
    StateSnapshot,
    Store,
    TaskRecord,
)
from autoscaler.view import ClusterView

#: After a launch found no capacity in any allowed zone, the type is left out
#: of plans for this long (Karpenter's cool-down).
CAPACITY_COOLDOWN_S = 180.0


class Planner(Protocol):
    name: str

    def plan(self, view: ClusterView) -> Plan: ...


@dataclass(frozen=True, slots=True)
class ControlOptions:
    default_throughput: float = 0.95
    guardrails: Guardrails = field(default_factory=Guardrails)
    dry_run: bool = False  # decide and record, but launch, move and terminate nothing
    learn: bool = True  # update the throughput table from observed throughputs


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What a round decided and did (also recorded in the store)."""

    record: RoundRecord
    plan: Plan | None
    planning_seconds: float


def counter_ids(prefix: str = "inst") -> Callable[[], str]:
    """Deterministic instance ids (replays); production uses random ones."""
    numbers = itertools.count(1)
    return lambda: f"{prefix}-{next(numbers)}"


def random_ids() -> str:
    import uuid

    return f"inst-{uuid.uuid4().hex[:16]}"


class ControlLoop:
    """Runs rounds and the steps between them for one cluster."""

    def __init__(
        self,
        planner: Planner,
        cloud: Cloud,
        executor: Executor,
        store: Store,
        clock: Clock,
        options: ControlOptions | None = None,
        new_instance_id: Callable[[], str] = random_ids,
    ) -> None:
        self.planner = planner
        self.cloud = cloud
        self.executor = executor
        self.store = store
        self.clock = clock
        self.options = options or ControlOptions()
        self._new_id = new_instance_id
        self._jobs_at_last_round: frozenset[str] | None = None
        self._cooling: dict[str, float] = {}  # instance type -> until
        self._stopping: set[str] = set()  # tasks asked to checkpoint and stop

    # -- a round --------------------------------------------------------------

    def schedule(self) -> RoundOutcome:
        """One scheduling round; returns what it decided (also recorded in the store)."""
        now = self.clock.now()
        report = self.executor.report()
        self._absorb(report, now, with_progress=True)
        snap = self.store.snapshot(self.options.default_throughput)
        if self.options.learn:
            snap = self._learn(snap, report, now)
        self._reconcile(snap, now)
        catalog = self._usable_catalog(now)
        self._retry_unconfirmed(catalog, now)
        active = frozenset(j.job_id for j in snap.jobs)
        had_event = active != self._jobs_at_last_round
        self._jobs_at_last_round = active
        current = _current_configuration(snap, catalog)
        progress = {
            j.job_id: max((snap.tasks[t.task_id].progress for t in j.spec.tasks), default=0.0)
            for j in snap.jobs
        }
        view = ClusterView(
            catalog,
            tuple(j.spec for j in snap.jobs),
            current,
            snap.throughput,
            snap.history(now),
            now,
            progress,
        )
        if not view.jobs and not current.instances:
            record = RoundRecord(now, self.planner.name, "none", had_event, "no jobs")
            self.store.record_round(record)
            return RoundOutcome(record, None, 0.0)
        started = time.perf_counter()
        plan = self.planner.plan(view)
        planning_seconds = time.perf_counter() - started

        launches, drains, targets, moves = _diff(current, plan.configuration, snap, self._new_id)
        actions, refused = self._guard(launches, catalog, snap)
        for token in refused:
            for task_id in launches[token][1]:
                targets[task_id] = None
        actions += [
            ActionRecord("terminate", inst_id, "the plan no longer uses it; drain, then terminate")
            for inst_id in drains
        ]
        actions += moves
        record = RoundRecord(
            now,
            self.planner.name,
            plan.chosen,
            had_event,
            plan.reason,
            _numbers(plan, planning_seconds, catalog),
            tuple(actions),
        )
        round_id = self.store.record_round(record)
        record = replace(record, round_id=round_id)
        if self.options.dry_run:
            return RoundOutcome(record, plan, planning_seconds)

        for index, action in enumerate(actions):
            if action.kind != "launch" or action.outcome == "refused":
                continue
            itype_name, tasks = launches[action.target]
            outcome, message = self._launch(action.target, catalog, itype_name, now)
            self.store.record_action_outcome(round_id, index, outcome, message)
            actions[index] = replace(action, outcome=outcome, message=message)  # type: ignore[arg-type]
            if outcome != "done":
                for task_id in tasks:
                    targets[task_id] = None
        self.store.assign_tasks(targets, now)
        for inst_id in drains:
            self.store.transition_instance(inst_id, "draining", now)
        self.progress()
        return RoundOutcome(replace(record, actions=tuple(actions)), plan, planning_seconds)

    # -- between rounds ----------------------------------------------------------

    def progress(self) -> None:
        """Carry out the adopted plan as far as the world allows right now."""
        if self.options.dry_run:
            return
        now = self.clock.now()
        report = self.executor.report()
        # what absorbing writes (task states) is not what the rest reads (targets)
        snap = self._absorb(report, now)
        self._follow_cloud(snap, now)
        jobs = {j.job_id: j.spec for j in snap.jobs}
        specs = {t.task_id: t for j in snap.jobs for t in j.spec.tasks}
        catalog = self.cloud.catalog()
        type_of = {
            i.instance_id: catalog[i.instance_type]
            for i in snap.instances
            if i.instance_type in catalog
        }
        # What occupies each instance right now, per the executor (tasks that are
        # leaving still hold their resources until their checkpoint is uploaded).
        used: dict[str, list[float]] = {}
        where_is: dict[str, str] = {}
        for task_id, seen in report.tasks.items():
            if seen.state in _ON_INSTANCE and seen.instance_id is not None:
                where_is[task_id] = seen.instance_id
                itype = type_of.get(seen.instance_id)
                spec = specs.get(task_id)
                if itype is not None and spec is not None:
                    _occupy(used, seen.instance_id, spec.demand_on(itype.family))
        for task in snap.tasks.values():
            seen = report.tasks.get(task.task_id)
            where = where_is.get(task.task_id)
            target = task.target_instance_id
            if where is not None and where != target:
                # Make before break: leave only once the destination can take it.
                if (target is None or target in report.ready_instances) and (
                    task.task_id not in self._stopping
                ):
                    self.executor.stop(task.task_id)
                    self._stopping.add(task.task_id)
                    self.store.update_task(task.task_id, now, status="checkpointing")
            elif where is None and target is not None and target in report.ready_instances:
                itype = type_of.get(target)
                demand = specs[task.task_id].demand_on(itype.family) if itype else None
                if itype is None or demand is None or not _room(used, target, demand, itype):
                    continue  # wait until the tasks leaving the destination are gone
                checkpoint = seen.checkpoint if seen else task.checkpoint
                self._stopping.discard(task.task_id)
                self.executor.start(jobs[task.job_id], task.task_id, target, checkpoint)
                self.store.update_task(task.task_id, now, status="starting", instance_id=target)
                _occupy(used, target, demand)
        # Tasks of jobs that are no longer active (cancelled) are stopped.
        for task_id in where_is:
            if task_id not in snap.tasks and task_id not in self._stopping:
                self.executor.stop(task_id)
                self._stopping.add(task_id)
        for inst in snap.instances:
            if inst.status == "draining" and inst.instance_id not in used:
                self._terminate(inst.instance_id, inst.cloud_id, now)

    # -- steps --------------------------------------------------------------------

    def _absorb(
        self, report: ExecutorReport, now: float, with_progress: bool = False
    ) -> StateSnapshot:
        """Record what the executor reports: task states, completions and — at
        rounds, not on every small step — progress and checkpoints."""
        for job_id in sorted(report.completed_jobs):
            self.store.job_finished(job_id, now)
            self.executor.forget(job_id)
        snap = self.store.snapshot(self.options.default_throughput)
        for job in snap.jobs:
            states = []
            for task_id in (t.task_id for t in job.spec.tasks):
                task = snap.tasks[task_id]
                seen = report.tasks.get(task.task_id)
                if seen is None:
                    states.append(task.status)
                    continue
                status = _STATUS_OF.get(seen.state, task.status)
                instance_id = seen.instance_id if seen.state in _ON_INSTANCE else None
                changed = (status, instance_id) != (task.status, task.instance_id)
                if with_progress:
                    changed = changed or (seen.progress, seen.checkpoint) != (
                        task.progress,
                        task.checkpoint,
                    )
                if changed:
                    self.store.update_task(
                        task.task_id,
                        now,
                        status=status,
                        instance_id=instance_id,
                        progress=seen.progress if with_progress else None,
                        checkpoint=seen.checkpoint if with_progress else None,
                    )
                states.append(status)
            if job.started_at is None and states and all(s == "running" for s in states):
                self.store.job_started(job.job_id, now)
        return snap

    def _learn(self, snap: StateSnapshot, report: ExecutorReport, now: float) -> StateSnapshot:
        """Update the throughput table from each running job's observed throughput (§4.3–4.4)."""
        placed: dict[str, list[str]] = {}  # instance -> workloads of the tasks running there
        workload = {t.task_id: t.workload for j in snap.jobs for t in j.spec.tasks}
        for task_id, seen in report.tasks.items():
            if seen.state == "running" and seen.instance_id is not None and task_id in workload:
                placed.setdefault(seen.instance_id, []).append(task_id)
        on = {tid: inst for inst, tids in placed.items() for tid in tids}
        observations = []
        for job in snap.jobs:
            tput = report.job_throughput.get(job.job_id)
            task_ids = [t.task_id for t in job.spec.tasks]
            if tput is None or any(tid not in on for tid in task_ids):
                continue
            placements = [
                (workload[tid], [workload[o] for o in placed[on[tid]] if o != tid])
                for tid in task_ids
            ]
            observations.append((placements, tput))
        table, chosen = snap.throughput.observe_jobs(observations, at_s=now)
        changed: dict[tuple, tuple] = {}  # the latest entry for each key updated this round
        for (placements, _), index in zip(observations, chosen, strict=True):
            if index is not None:
                w, colocated = placements[index]
                key = (w, tuple(sorted(colocated)))
                entry = table.entry(w, colocated)
                assert entry is not None
                changed[key] = (w, key[1], entry)
        if changed:
            self.store.record_throughput(list(changed.values()))
            snap = StateSnapshot(
                snap.jobs,
                snap.tasks,
                snap.instances,
                table,
                snap.first_round_at,
                snap.event_rounds,
                snap.full_rounds,
            )
        return snap

    def _reconcile(self, snap: StateSnapshot, now: float) -> None:
        """Instances the cloud has but the store does not are orphans: terminate them."""
        listed = self.cloud.list()
        known = {i.cloud_id for i in self.store.instances(include_finished=False) if i.cloud_id}
        tokens = {i.instance_id for i in snap.instances}
        found = reconcile(known, listed)
        orphans = [o.instance_id for o in found.orphans if o.launch_token not in tokens]
        if orphans:
            self.cloud.terminate(orphans)
        self._follow_cloud(snap, now, listed)

    def _follow_cloud(self, snap: StateSnapshot, now: float, listed: list | None = None) -> None:
        """Move instances along the status machine as the cloud reports them.

        An instance recorded as requested but never confirmed (the process died
        between asking the cloud and recording the answer) is adopted when the
        cloud lists an instance with its launch token.
        """
        listed = listed if listed is not None else self.cloud.list()
        by_cloud_id = {c.instance_id: c for c in listed}
        by_token = {c.launch_token: c for c in listed if c.launch_token}
        for inst in snap.instances:
            if inst.cloud_id is None:
                found = by_token.get(inst.instance_id)
                if found is not None and inst.status == "requested":
                    self.store.transition_instance(
                        inst.instance_id,
                        "pending",
                        now,
                        cloud_id=found.instance_id,
                        zone=found.zone,
                    )
                continue
            seen = by_cloud_id.get(inst.cloud_id)
            if seen is None or seen.state == "terminated":
                if inst.status not in FINAL_INSTANCE_STATUSES and inst.status != "requested":
                    self.store.transition_instance(inst.instance_id, "terminated", now)
            elif seen.state == "running" and inst.status == "pending":
                self.store.transition_instance(inst.instance_id, "running", now)

    def _retry_unconfirmed(self, catalog: Catalog, now: float) -> None:
        """Launches recorded but never confirmed are retried with the same token
        (the cloud binding returns the instance if the first call did start one)."""
        for inst in self.store.instances():
            if (
                inst.status == "requested"
                and inst.cloud_id is None
                and (inst.instance_type in catalog)
            ):
                self._launch(inst.instance_id, catalog, inst.instance_type, now)

    def _usable_catalog(self, now: float) -> Catalog:
        catalog = self.cloud.catalog()
        cooling = {t for t, until in self._cooling.items() if until > now}
        if not cooling:
            return catalog
        return catalog.restricted_to({t.name for t in catalog if t.name not in cooling})

    def _guard(
        self, launches: dict[str, tuple[str, list[str]]], catalog: Catalog, snap: StateSnapshot
    ) -> tuple[list[ActionRecord], set[str]]:
        """Check every launch against the guardrails; refused ones are recorded, not done."""
        live = [i.instance_type for i in snap.instances]
        actions, refused = [], set()
        for token, (itype, tasks) in launches.items():
            reason = f"launch {itype} for {len(tasks)} task(s): {', '.join(tasks[:5])}" + (
                " …" if len(tasks) > 5 else ""
            )
            try:
                self.options.guardrails.check_launch(itype, catalog, live)
            except LaunchRefused as exc:
                refused.add(token)
                actions.append(
                    ActionRecord(
                        "launch",
                        token,
                        reason,
                        "refused",
                        str(exc),
                        {"type": itype, "tasks": tasks},
                    )
                )
                continue
            live.append(itype)
            actions.append(
                ActionRecord("launch", token, reason, detail={"type": itype, "tasks": tasks})
            )
        return actions, refused

    def _launch(self, token: str, catalog: Catalog, itype: str, now: float) -> tuple[str, str]:
        """Record, then launch: a crash in between leaves a token the retry finds."""
        self.store.request_instance(token, itype, catalog[itype].hourly_cost, now)
        try:
            got = self.cloud.launch(LaunchRequest(itype, token))
        except CloudError as exc:
            if isinstance(exc, InsufficientCapacity):
                self._cooling[itype] = now + CAPACITY_COOLDOWN_S
            self.store.transition_instance(token, "failed", now)
            return "failed", f"{type(exc).__name__}: {exc}"
        self.store.transition_instance(
            token,
            "running" if got.state == "running" else "pending",
            now,
            cloud_id=got.instance_id,
            zone=got.zone,
        )
        return "done", got.instance_id

    def _terminate(self, instance_id: str, cloud_id: str | None, now: float) -> None:
        if cloud_id is not None:
            try:
                self.cloud.terminate([cloud_id])
            except CloudError:
                return  # still draining; retried at the next step
        self.store.transition_instance(instance_id, "terminating", now)


_ON_INSTANCE = frozenset({"starting", "running", "checkpointing"})
_STATUS_OF = {
    "starting": "starting",
    "running": "running",
    "checkpointing": "checkpointing",
    "stopped": "pending",
    "completed": "completed",
    "failed": "failed",
}


def _occupy(used: dict[str, list[float]], instance_id: str, demand) -> None:
    total = used.setdefault(instance_id, [0.0, 0.0, 0.0])
    if demand is not None:
        for r in range(3):
            total[r] += demand[r]


def _room(used: dict[str, list[float]], instance_id: str, demand, itype) -> bool:
    total = used.get(instance_id, [0.0, 0.0, 0.0])
    return all(total[r] + demand[r] <= itype.capacity[r] + 1e-9 for r in range(3))


def _current_configuration(snap: StateSnapshot, catalog: Catalog) -> Configuration:
    """Live instances the plan may keep, each with the tasks assigned to it."""
    assigned: dict[str, list[str]] = {}
    for task in snap.tasks.values():
        if task.target_instance_id is not None:
            assigned.setdefault(task.target_instance_id, []).append(task.task_id)
    instances = []
    for inst in snap.instances:
        if inst.status not in ("requested", "pending", "running") or inst.instance_type not in (
            catalog
        ):
            continue
        instances.append(
            Instance(
                inst.instance_id,
                catalog[inst.instance_type],
                tuple(sorted(assigned.get(inst.instance_id, ()))),
            )
        )
    return Configuration(tuple(instances))


def _diff(
    current: Configuration, target: Configuration, snap: StateSnapshot, new_id: Callable[[], str]
) -> tuple[dict[str, tuple[str, list[str]]], list[str], dict[str, str | None], list[ActionRecord]]:
    """Launches, drains, the new target of every task, and the moves that implies."""
    launches: dict[str, tuple[str, list[str]]] = {}
    targets: dict[str, str | None] = {tid: None for tid in snap.tasks}
    kept: set[str] = set()
    for inst in target:
        inst_id = inst.instance_id
        if inst_id is None:
            inst_id = new_id()
            launches[inst_id] = (inst.type.name, list(inst.tasks))
        else:
            kept.add(inst_id)
        for task_id in inst.tasks:
            targets[task_id] = inst_id
    drains = [i.instance_id for i in current if i.instance_id not in kept]
    moves = []
    for task_id, new in targets.items():
        task: TaskRecord = snap.tasks[task_id]
        old = task.target_instance_id
        if new == old:
            continue
        if old is None:
            moves.append(ActionRecord("start", task_id, "new task placed", detail={"to": new}))
        else:
            moves.append(
                ActionRecord(
                    "migrate", task_id, "the adopted plan moves it", detail={"from": old, "to": new}
                )
            )
    return launches, drains, targets, moves


def _numbers(plan: Plan, seconds: float, catalog: Catalog) -> dict[str, Any]:
    return {
        "hourly_cost": plan.hourly_cost,
        "no_packing_hourly_cost": plan.no_packing_hourly_cost,
        "lower_bound_hourly_cost": plan.lower_bound_hourly_cost,
        "expected_duration_h": plan.expected_duration_h,
        "planning_seconds": seconds,
        "candidates": [c.summary() for c in plan.candidates],
        "instance_types": len(catalog),
    }
