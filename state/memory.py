"""`InMemoryStore`: the `Store` interface in process memory, for replays and tests.

It persists what the rules of `autoscaler.transitions` return, as `state.store.SqlStore`
does (the same tests hold both bindings to `autoscaler.store`'s contract); the SQL
store is the one that survives a process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from autoscaler import spot, transitions
from autoscaler.jobs import JobSpec
from autoscaler.store import (
    FINAL_INSTANCE_STATUSES,
    DuplicateJob,
    InstanceChange,
    InstanceRecord,
    InterruptionKind,
    InterruptionRecord,
    JobRecord,
    JobStatus,
    Placement,
    PriceChange,
    RefreshedPrices,
    RoundIntents,
    RoundRecord,
    StateSnapshot,
    Store,
    TaskRecord,
    TaskUpdate,
    UnknownEntity,
    UptimeInterval,
)
from autoscaler.throughput import Colocated, ThroughputEntry, ThroughputTable
from autoscaler.view import MeasuredDelays


class InMemoryStore(Store):
    """`Store` in process memory: for replays and tests. Thread-safe; snapshots are copies."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, JobRecord] = {}
        # What a snapshot copies, kept as the records change so that taking one is a
        # few C-level copies rather than a walk over every job, task and instance
        # (the replay takes one at every step): unfinished jobs in submission order,
        # their tasks in the same order (each job's in its spec's), live instances.
        self._active: dict[str, JobRecord] = {}
        self._active_tasks: dict[str, TaskRecord] = {}
        self._live: dict[str, InstanceRecord] = {}  # not yet terminated or failed
        self._tasks: dict[str, TaskRecord] = {}
        self._tasks_of: dict[str, list[str]] = {}
        self._instances: dict[str, InstanceRecord] = {}
        self._entries: dict[tuple[str, Colocated], ThroughputEntry] = {}
        # The learned table as snapshots hand it out (immutable, so shared), revised
        # as entries are recorded rather than rebuilt at every round.
        self._table: ThroughputTable | None = None
        self._rounds: list[RoundRecord] = []
        self._uptime: list[UptimeInterval] = []
        self._open: dict[str, int] = {}  # instance id -> index of its open interval
        self._spot_prices: dict[str, RefreshedPrices] = {}  # region -> last refreshed
        self._first_round_at: float | None = None
        self._event_rounds = 0
        self._full_rounds = 0
        self._job_events = 0
        self._placements: list[Placement] = []
        self._placed: dict[str, int] = {}  # task -> index of its open placement
        self._delays = MeasuredDelays()
        self._interruptions: list[InterruptionRecord] = []

    # -- jobs -------------------------------------------------------------
    def submit_job(self, job: JobSpec, *, owner: str, at: float, team: str = "") -> JobRecord:
        with self._lock:
            if job.job_id in self._jobs:
                raise DuplicateJob(job.job_id)
            record, tasks = transitions.submitted_job(job, owner, at, team)
            self._jobs[job.job_id] = record
            self._active[job.job_id] = record
            self._tasks_of[job.job_id] = [t.task_id for t in tasks]
            self._tasks.update((t.task_id, t) for t in tasks)
            self._active_tasks.update((t.task_id, t) for t in tasks)
            self._job_events += 1
            return record

    def cancel_job(self, job_id: str, at: float) -> bool:
        return self._finish(job_id, at, "cancelled", "cancelled by the user")

    def job_started(self, job_id: str, at: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            started = None if job is None else transitions.start_job(job, at)
            if started is None:
                return False
            self._put_job(started)
            return True

    def job_finished(
        self, job_id: str, at: float, status: JobStatus = "completed", reason: str = ""
    ) -> bool:
        return self._finish(job_id, at, status, reason)

    def _finish(self, job_id: str, at: float, status: JobStatus, reason: str) -> bool:
        with self._lock:
            job = self._job(job_id)
            tasks = tuple(self._tasks[t] for t in self._tasks_of[job_id])
            end = transitions.finish_job(job, tasks, status, reason, at)
            if end is None:
                return False
            self._jobs[job_id] = end.job
            self._active.pop(job_id, None)
            self._job_events += 1
            self._tasks.update((t.task_id, t) for t in end.tasks)
            for task_id in self._tasks_of[job_id]:
                self._active_tasks.pop(task_id, None)
            for task_id in end.leaves:
                self._leave(task_id, at)
            return True

    def learn_solo_throughput(self, job_id: str, throughput: float) -> bool:
        with self._lock:
            learned = transitions.learn_solo_throughput(self._job(job_id), throughput)
            if learned is None:
                return False
            self._put_job(learned)
            return True

    def _put_job(self, record: JobRecord) -> None:
        self._jobs[record.job_id] = record
        if record.job_id in self._active:
            self._active[record.job_id] = record

    def _put_task(self, record: TaskRecord) -> None:
        self._tasks[record.task_id] = record
        if record.task_id in self._active_tasks:
            self._active_tasks[record.task_id] = record

    def _put_instance(self, record: InstanceRecord) -> None:
        self._instances[record.instance_id] = record
        if record.instance_id in self._live:
            self._live[record.instance_id] = record

    def _job(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownEntity(f"no job {job_id!r}")
        return job

    # -- tasks ------------------------------------------------------------
    def _assign(self, targets: Mapping[str, str | None], at: float) -> None:
        for task_id, target in targets.items():
            task = self._tasks.get(task_id)
            if task is None:
                continue
            new = transitions.retarget_task(self._jobs[task.job_id].status, task, target, at)
            if new is not None:
                self._put_task(new)

    def update_tasks(self, updates: Iterable[TaskUpdate], at: float) -> set[str]:
        with self._lock:
            done = set()
            for change in updates:
                task = self._tasks.get(change.task_id)
                if task is None:
                    raise UnknownEntity(f"no task {change.task_id!r}")
                step = transitions.update_task(self._jobs[task.job_id].status, task, change, at)
                if step is None:
                    continue
                self._put_task(step.task)
                if step.leaves:
                    self._leave(change.task_id, at)
                if step.enters is not None:
                    self._placed[change.task_id] = len(self._placements)
                    self._placements.append(step.enters)
                if step.measured:
                    self._delays = self._delays.observed(step.measured)
                done.add(change.task_id)
            return done

    def _leave(self, task_id: str, at: float) -> None:
        index = self._placed.pop(task_id, None)
        if index is not None:
            self._placements[index] = replace(self._placements[index], end=at)

    # -- instances --------------------------------------------------------
    def _request(
        self,
        instance_id: str,
        instance_type: str,
        hourly_price: float,
        at: float,
        on_demand_price: float | None = None,
    ) -> None:
        if instance_id in self._instances:
            return  # idempotent: the same launch token
        record = transitions.request_instance(
            instance_id, instance_type, hourly_price, at, on_demand_price
        )
        self._instances[instance_id] = record
        self._live[instance_id] = record

    def instance_worker(
        self, instance_id: str, at: float, *, ready: bool, reason: str = ""
    ) -> bool:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            seen = transitions.instance_worker(inst, at, ready=ready, reason=reason)
            if seen is None:
                return False
            self._put_instance(seen)
            return True

    def instance_notice(
        self, instance_id: str, kind: InterruptionKind, at: float, reason: str = ""
    ) -> bool:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            if any(r.instance_id == instance_id and r.kind == kind for r in self._interruptions):
                return False
            if kind == "reclaim":
                seen = transitions.reclaim_instance(inst, at, reason)
                if seen is not None:
                    self._put_instance(seen)
            record = InterruptionRecord(inst.instance_type, instance_id, at, kind, reason)
            self._interruptions.append(record)
            return True

    def interruption_counts(self, since: float) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for r in self._interruptions:
                if r.kind == "reclaim" and r.at >= since:
                    counts[r.offering] = counts.get(r.offering, 0) + 1
            return counts

    def interruptions(self, since: float | None = None) -> list[InterruptionRecord]:
        with self._lock:
            kept = [r for r in self._interruptions if since is None or r.at >= since]
            return sorted(kept, key=lambda r: r.at)

    def transition_instances(self, changes: Iterable[InstanceChange], at: float) -> set[str]:
        with self._lock:
            return self._transition(list(changes), at)

    def _transition(self, changes: Sequence[InstanceChange], at: float) -> set[str]:
        """Apply the changes in order (all or none: an illegal one raises before any
        is stored); returns the instances that changed."""
        instances: dict[str, InstanceRecord] = {}
        steps: list[transitions.InstanceStep] = []
        for change in changes:
            inst = instances.get(change.instance_id) or self._instances.get(change.instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {change.instance_id!r}")
            step = transitions.transition_instance(inst, change, at)
            if step is not None:
                instances[change.instance_id] = step.instance
                steps.append(step)
        for step in steps:
            instance_id = step.instance.instance_id
            self._put_instance(step.instance)
            if step.instance.status in FINAL_INSTANCE_STATUSES:
                self._live.pop(instance_id, None)
            if step.opens is not None:
                self._open[instance_id] = len(self._uptime)
                self._uptime.append(step.opens)
            if step.closes:
                index = self._open.pop(instance_id)
                self._uptime[index] = replace(self._uptime[index], end=at)
        return set(instances)

    def reprice_instances(self, changes: Iterable[PriceChange]) -> set[str]:
        with self._lock:
            changed: set[str] = set()
            for change in sorted(changes, key=lambda c: (c.instance_id, c.at)):
                index = self._open.get(change.instance_id)
                inst = self._instances.get(change.instance_id)
                if index is None or inst is None:
                    continue
                step = spot.repriced(self._uptime[index], change)
                if step is None:
                    continue
                if step.closes_at is None:
                    self._uptime[index] = step.opens
                else:
                    self._uptime[index] = replace(self._uptime[index], end=step.closes_at)
                    self._open[change.instance_id] = len(self._uptime)
                    self._uptime.append(step.opens)
                self._put_instance(replace(inst, hourly_price=step.opens.hourly_price))
                changed.add(inst.instance_id)
            return changed

    def record_spot_prices(self, prices: RefreshedPrices) -> bool:
        with self._lock:
            kept = self._spot_prices.get(prices.region)
            if kept is not None and kept.retrieved_at >= prices.retrieved_at:
                return False
            frozen = {t: dict(z) for t, z in prices.prices.items()}
            self._spot_prices[prices.region] = replace(prices, prices=frozen)
            return True

    def spot_prices(self, region: str) -> RefreshedPrices | None:
        with self._lock:
            return self._spot_prices.get(region)

    # -- learning ---------------------------------------------------------
    def record_throughput(
        self,
        entries: Iterable[tuple[str, Colocated, ThroughputEntry]],
        forget: Iterable[tuple[str, Colocated]] = (),
    ) -> None:
        with self._lock:
            dropped = [(workload, tuple(sorted(colocated))) for workload, colocated in forget]
            upserts = [
                ((workload, tuple(sorted(colocated))), entry)
                for workload, colocated, entry in entries
            ]
            for key in dropped:  # before the upserts, which win
                self._entries.pop(key, None)
            for key, entry in upserts:
                self._entries[key] = entry
            if self._table is not None:
                self._table = self._table.revised(upserts, dropped)

    # -- rounds -----------------------------------------------------------
    def record_round(self, record: RoundRecord, intents: RoundIntents | None = None) -> int:
        with self._lock:
            round_id = len(self._rounds) + 1
            self._rounds.append(replace(record, round_id=round_id))
            if self._first_round_at is None:
                self._first_round_at = record.at
            if record.had_event:
                self._event_rounds += 1
                self._full_rounds += record.chosen == "full"
            if intents is not None:
                at = record.at
                for instance_id, instance_type, price in intents.requests:
                    on_demand = intents.on_demand_prices.get(instance_id)
                    self._request(instance_id, instance_type, price, at, on_demand)
                self._assign(intents.targets, at)
                self._transition(intents.instance_changes(), at)
            return round_id

    def record_action_outcomes(
        self, round_id: int, outcomes: Iterable[tuple[int, str, str]]
    ) -> None:
        with self._lock:
            if not 1 <= round_id <= len(self._rounds):
                raise UnknownEntity(f"no round {round_id}")
            rnd = self._rounds[round_id - 1]
            actions = list(rnd.actions)
            for index, outcome, message in outcomes:
                if not 0 <= index < len(actions):
                    raise UnknownEntity(f"no action {index} in round {round_id}")
                actions[index] = replace(actions[index], outcome=outcome, message=message)  # type: ignore[arg-type]
            self._rounds[round_id - 1] = replace(rnd, actions=tuple(actions))

    # -- reads ------------------------------------------------------------
    def snapshot(
        self, default_throughput: float = 0.95, *, with_throughput: bool = True
    ) -> StateSnapshot:
        with self._lock:
            return StateSnapshot(
                tuple(self._active.values()),
                dict(self._active_tasks),
                tuple(self._live.values()),
                self._learned(default_throughput)
                if with_throughput
                else ThroughputTable({}, default_throughput),
                self._first_round_at,
                self._event_rounds,
                self._full_rounds,
                len(self._instances),
                self._job_events,
                self._rounds[-1].job_events if self._rounds else None,
                self._delays,
            )

    def _learned(self, default_throughput: float) -> ThroughputTable:
        table = self._table
        if table is None or table.default != default_throughput:
            table = self._table = ThroughputTable(self._entries, default_throughput)
        return table

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
            return list(self._live.values())

    def rounds(self, limit: int | None = None) -> list[RoundRecord]:
        with self._lock:
            if limit is None:
                return list(self._rounds)
            return self._rounds[max(len(self._rounds) - limit, 0) :] if limit > 0 else []

    def uptime(self, since: float | None = None) -> list[UptimeInterval]:
        with self._lock:
            if since is None:
                return list(self._uptime)
            return [u for u in self._uptime if u.end is None or u.end >= since]

    def placements(self, since: float | None = None) -> list[Placement]:
        with self._lock:
            return [p for p in self._placements if since is None or p.end is None or p.end >= since]

    def cost_between(self, t0: float, t1: float) -> float:
        with self._lock:
            return sum(i.cost(t0, t1) for i in self._uptime)
