"""The in-memory store keeps what a snapshot copies as its records change: after any
sequence of writes, a snapshot equals what walking the store's own records gives, in
the same order, and its learned table equals one built from the entries recorded."""

from __future__ import annotations

import random

from autoscaler.store import (
    FINAL_INSTANCE_STATUSES,
    FINAL_JOB_STATUSES,
    InstanceChange,
    TaskUpdate,
)
from autoscaler.throughput import ThroughputEntry, ThroughputTable
from state.memory import InMemoryStore
from tests.builders import job
from tests.store_writes import adopted_round

TYPES = (("c7i.large", 0.08925), ("p3.2xlarge", 3.06))
WORKLOADS = ("a", "b", "c")


def walked(store: InMemoryStore) -> tuple[list, dict, list]:
    """The active jobs, their tasks and the live instances, read record by record."""
    jobs = [j for j in store.jobs() if j.status not in FINAL_JOB_STATUSES]
    tasks = {t.task_id: t for j in jobs for t in store.tasks_of(j.job_id)}
    live = [
        i for i in store.instances(include_finished=True) if i.status not in FINAL_INSTANCE_STATUSES
    ]
    return jobs, tasks, live


def test_snapshots_equal_the_records_walked_under_random_writes() -> None:
    for seed in range(4):
        rng = random.Random(seed)
        store = InMemoryStore()
        entries: dict = {}
        at, jobs, instances = 0.0, 0, 0
        for _ in range(300):
            at += 1.0
            active = [j.job_id for j in walked(store)[0]]
            live = [i.instance_id for i in walked(store)[2]]
            action = rng.randrange(8)
            if action <= 1:
                jobs += 1
                shapes = [(rng.choice((0, 1)), 2, 4)] * rng.randint(1, 3)
                store.submit_job(job(f"j{jobs}", *shapes), owner="ana", at=at)
            elif action == 2 and active:
                store.job_finished(rng.choice(active), at, rng.choice(("completed", "failed")))
            elif action == 3 and active:
                store.cancel_job(rng.choice(active), at)
            elif action == 4:
                requests = []
                for _ in range(rng.randint(0, 2)):
                    instances += 1
                    requests.append((f"i{instances}", *rng.choice(TYPES)))
                targets = {
                    t: rng.choice([*live, *(r[0] for r in requests), None])
                    for t in walked(store)[1]
                    if rng.random() < 0.3
                }
                adopted_round(store, at, requests=requests, targets=targets)
            elif action == 5 and active:
                job_id = rng.choice(active)
                updates = [
                    TaskUpdate(
                        t.task_id,
                        status=rng.choice(("starting", "running", "pending")),
                        instance_id=rng.choice(live) if live else None,
                        progress=rng.random(),
                    )
                    for t in store.tasks_of(job_id)
                ]
                store.update_tasks(updates, at)
                store.job_started(job_id, at)
                store.learn_solo_throughput(job_id, rng.random() + 0.1)
            elif action == 6 and live:
                inst = store.instance(rng.choice(live))
                assert inst is not None
                following = {
                    "requested": ("pending", "failed"),
                    "pending": ("running", "terminated"),
                    "running": ("draining", "terminating"),
                    "draining": ("running", "terminating"),
                    "terminating": ("terminated",),
                }[inst.status]
                cloud_id = f"c-{inst.instance_id}" if inst.status == "requested" else None
                change = InstanceChange(inst.instance_id, rng.choice(following), cloud_id=cloud_id)  # type: ignore[arg-type]
                store.transition_instances([change], at)
                store.instance_worker(inst.instance_id, at, ready=True)
            elif action == 7:
                upserts = [
                    (rng.choice(WORKLOADS), tuple(rng.sample(WORKLOADS, rng.randint(1, 2))))
                    for _ in range(rng.randint(0, 3))
                ]
                forget = [
                    (rng.choice(WORKLOADS), (rng.choice(WORKLOADS),))
                    for _ in range(rng.randint(0, 2))
                ]
                written = [(w, c, ThroughputEntry(rng.random(), 1, at)) for w, c in upserts]
                store.record_throughput(written, forget=forget)
                for w, c in forget:
                    entries.pop((w, tuple(sorted(c))), None)
                for w, c, entry in written:
                    entries[(w, tuple(sorted(c)))] = entry
            if rng.random() < 0.5:
                snap = store.snapshot(0.9)
                jobs_now, tasks_now, live_now = walked(store)
                assert list(snap.jobs) == jobs_now
                assert list(snap.tasks.items()) == list(tasks_now.items())  # in order too
                assert list(snap.instances) == live_now
                fresh = ThroughputTable(entries, 0.9)
                assert list(snap.throughput.items()) == list(fresh.items())
                assert snap.throughput.estimates() == fresh.estimates()
                assert snap.throughput.default == 0.9
        # another default: the same entries, looked up with it
        other = store.snapshot(0.8).throughput
        assert (list(other.items()), other.default) == (list(fresh.items()), 0.8)
        assert walked(store)[0] and walked(store)[2]  # the writes left something to compare
