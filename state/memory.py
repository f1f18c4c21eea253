"""`InMemoryStore`: the `Store` interface in process memory, for replays and tests.

It follows `autoscaler.store`'s contract transition for transition (the same
tests hold both bindings to it); `state.store.SqlStore` is the one that
survives a process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Literal

from autoscaler.jobs import JobSpec
from autoscaler.store import (
    BILLED_STATUSES,
    FINAL_INSTANCE_STATUSES,
    FINAL_JOB_STATUSES,
    TRANSITIONS,
    DuplicateJob,
    IllegalTransition,
    InstanceChange,
    InstanceRecord,
    InstanceStatus,
    JobRecord,
    JobStatus,
    Placement,
    RoundIntents,
    RoundRecord,
    StateSnapshot,
    TaskRecord,
    TaskStatus,
    TaskUpdate,
    UnknownEntity,
    UptimeInterval,
    updated_task,
)
from autoscaler.throughput import Colocated, ThroughputEntry, ThroughputTable


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
        self._job_events = 0
        self._placements: list[Placement] = []
        self._placed: dict[str, int] = {}  # task -> index of its open placement

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
                self._tasks[t.task_id] = TaskRecord(
                    t.task_id, job.job_id, updated_at=at, status_since=at
                )
            self._job_events += 1
            return record

    def cancel_job(self, job_id: str, at: float) -> bool:
        return self._finish(job_id, at, "cancelled", "cancelled", "cancelled by the user")

    def job_started(self, job_id: str, at: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status in FINAL_JOB_STATUSES:
                return False
            if job.started_at is not None:
                return False
            self._jobs[job_id] = replace(job, status="running", started_at=at)
            return True

    def job_finished(
        self, job_id: str, at: float, status: JobStatus = "completed", reason: str = ""
    ) -> bool:
        task_status = "completed" if status == "completed" else "failed"
        return self._finish(job_id, at, status, task_status, reason)

    def _finish(self, job_id: str, at: float, status: str, task_status: str, reason: str) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownEntity(f"no job {job_id!r}")
            if job.status in FINAL_JOB_STATUSES:
                return False
            self._jobs[job_id] = replace(job, status=status, finished_at=at, reason=reason)  # type: ignore[arg-type]
            self._active.pop(job_id, None)
            self._job_events += 1
            for tid in self._tasks_of[job_id]:
                self._leave(tid, at)
                task = self._tasks[tid]
                self._tasks[tid] = replace(
                    task,
                    status=task_status,  # type: ignore[arg-type]
                    target_instance_id=None,
                    updated_at=at,
                    status_since=at,
                )
            return True

    def learn_solo_throughput(self, job_id: str, throughput: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownEntity(f"no job {job_id!r}")
            if job.solo_throughput is not None:
                return False
            self._jobs[job_id] = replace(job, solo_throughput=throughput)
            return True

    # -- tasks ------------------------------------------------------------
    def assign_tasks(self, targets: Mapping[str, str | None], at: float) -> set[str]:
        with self._lock:
            return self._assign(targets, at)

    def _assign(self, targets: Mapping[str, str | None], at: float) -> set[str]:
        done = set()
        for tid, target in targets.items():
            task = self._tasks.get(tid)
            if task is None or self._jobs[task.job_id].status in FINAL_JOB_STATUSES:
                continue
            if task.target_instance_id != target:
                self._tasks[tid] = replace(task, target_instance_id=target, updated_at=at)
            done.add(tid)
        return done

    def update_tasks(self, updates: Iterable[TaskUpdate], at: float) -> set[str]:
        with self._lock:
            done = set()
            for change in updates:
                task = self._tasks.get(change.task_id)
                if task is None:
                    raise UnknownEntity(f"no task {change.task_id!r}")
                if self._jobs[task.job_id].status in FINAL_JOB_STATUSES:
                    continue
                new = self._tasks[change.task_id] = updated_task(task, change, at)
                if new.instance_id != task.instance_id:
                    self._leave(task.task_id, at)
                    if new.instance_id is not None:
                        self._placed[task.task_id] = len(self._placements)
                        self._placements.append(
                            Placement(task.task_id, task.job_id, new.instance_id, new.attempt, at)
                        )
                done.add(change.task_id)
            return done

    def _leave(self, task_id: str, at: float) -> None:
        index = self._placed.pop(task_id, None)
        if index is not None:
            self._placements[index] = replace(self._placements[index], end=at)

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
        change = TaskUpdate(task_id, status, instance_id, progress, checkpoint)
        return bool(self.update_tasks([change], at))

    # -- instances --------------------------------------------------------
    def request_instance(
        self, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> InstanceRecord:
        with self._lock:
            return self._request(instance_id, instance_type, hourly_price, at)

    def _request(
        self, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> InstanceRecord:
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
        reason: str = "",
    ) -> bool:
        with self._lock:
            return self._transition(instance_id, status, at, cloud_id, zone, reason)

    def _transition(
        self,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        cloud_id: str | None = None,
        zone: str | None = None,
        reason: str = "",
        private_address: str | None = None,
    ) -> bool:
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
            private_address=private_address or inst.private_address,
            history=(*inst.history, (status, at)),
            reason=reason,
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

    def transition_instances(self, changes: Iterable[InstanceChange], at: float) -> None:
        with self._lock:
            for c in changes:
                self._transition(
                    c.instance_id, c.status, at, c.cloud_id, c.zone, c.reason, c.private_address
                )

    def instance_worker(
        self, instance_id: str, at: float, *, ready: bool, reason: str = ""
    ) -> bool:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            if ready:
                if inst.ready_at is not None:
                    return False
                self._instances[instance_id] = replace(inst, ready_at=at)
            else:
                if inst.lost_at is not None:
                    return False
                self._instances[instance_id] = replace(inst, lost_at=at, reason=reason)
            return True

    # -- learning ---------------------------------------------------------
    def record_throughput(
        self,
        entries: Iterable[tuple[str, Colocated, ThroughputEntry]],
        forget: Iterable[tuple[str, Colocated]] = (),
    ) -> None:
        with self._lock:
            for workload, colocated in forget:  # before the upserts, which win
                self._entries.pop((workload, tuple(sorted(colocated))), None)
            for workload, colocated, entry in entries:
                self._entries[(workload, tuple(sorted(colocated)))] = entry

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
                    self._request(instance_id, instance_type, price, at)
                self._assign(intents.targets, at)
                for instance_id, reason in intents.drains:
                    self._transition(instance_id, "draining", at, reason=reason)
                for instance_id, status, reason in intents.terminations:
                    self._transition(instance_id, status, at, reason=reason)
            return round_id

    def record_action_outcomes(
        self, round_id: int, outcomes: Iterable[tuple[int, str, str]]
    ) -> None:
        with self._lock:
            for index, outcome, message in outcomes:
                self.record_action_outcome(round_id, index, outcome, message)

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
    def snapshot(
        self, default_throughput: float = 0.95, *, with_throughput: bool = True
    ) -> StateSnapshot:
        with self._lock:
            jobs = tuple(self._jobs[j] for j in self._active)
            tasks = {tid: self._tasks[tid] for j in jobs for tid in self._tasks_of[j.job_id]}
            instances = tuple(self._instances[i] for i in self._live)
            return StateSnapshot(
                jobs,
                tasks,
                instances,
                ThroughputTable(self._entries if with_throughput else {}, default_throughput),
                self._first_round_at,
                self._event_rounds,
                self._full_rounds,
                len(self._instances),
                self._job_events,
                self._rounds[-1].job_events if self._rounds else None,
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

    def placements(self, since: float | None = None) -> list[Placement]:
        with self._lock:
            return [p for p in self._placements if since is None or p.end is None or p.end >= since]

    def cost_between(self, t0: float, t1: float) -> float:
        with self._lock:
            return sum(i.cost(t0, t1) for i in self._uptime)
