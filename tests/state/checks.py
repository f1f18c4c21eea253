"""What the state tests compare and check: a store's whole state, and its invariants."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from sqlalchemy import text

from autoscaler.store import (
    BILLED_STATUSES,
    FINAL_JOB_STATUSES,
    TRANSITIONS,
    RoundIntents,
    RoundRecord,
    Store,
    TaskUpdate,
)
from autoscaler.throughput import ThroughputEntry
from state.memory import InMemoryStore
from state.store import SqlStore
from tests.builders import job

FINAL_TASK_STATUSES = frozenset({"completed", "cancelled", "failed"})


def state_of(store: Store) -> dict[str, Any]:
    """Everything a store holds, through its public reads, for comparing two stores."""
    jobs = store.jobs()
    snapshot = store.snapshot()
    return {
        "jobs": jobs,
        "tasks": {j.job_id: store.tasks_of(j.job_id) for j in jobs},
        "instances": store.instances(include_finished=True),
        "uptime": store.uptime(),
        "rounds": store.rounds(),
        "throughput": list(snapshot.throughput.items()),
        "history": snapshot.history(now=10_000.0),
        "delays": snapshot.delays,
        "placements": store.placements(),
    }


def assert_consistent(store: SqlStore) -> None:
    """The invariants every transition keeps; a half-done transition breaks one of them."""
    uptime = store.uptime()
    for inst in store.instances(include_finished=True):
        statuses = [status for status, _ in inst.history]
        assert inst.history[0] == ("requested", inst.requested_at), inst
        assert statuses[-1] == inst.status, inst
        assert all(b in TRANSITIONS[a] for a, b in pairwise(statuses)), inst
        open_intervals = [u for u in uptime if u.instance_id == inst.instance_id and u.end is None]
        assert len(open_intervals) == (inst.status in BILLED_STATUSES), (inst, uptime)
    for record in store.jobs():
        tasks = store.tasks_of(record.job_id)
        assert [t.task_id for t in tasks] == [t.task_id for t in record.spec.tasks], record
        if record.status in FINAL_JOB_STATUSES:
            assert all(t.status in FINAL_TASK_STATUSES for t in tasks), tasks
            assert all(t.target_instance_id is None for t in tasks), tasks
        else:
            assert not any(t.status in FINAL_TASK_STATUSES for t in tasks), tasks
    with store.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        else:
            orphans = conn.execute(
                text(
                    "SELECT count(*) FROM tasks t LEFT JOIN jobs j USING (job_id) "
                    "WHERE j.job_id IS NULL"
                )
            ).scalar()
            assert orphans == 0


def populate(*stores: Store) -> None:
    """The same history on every store given: a queued job, a running one, an instance
    billed since its request, a failed launch, two rounds, a throughput entry and a
    measured phase."""
    for store in stores:
        store.submit_job(job("j1", (1, 4, 8), (1, 4, 8)), owner="ana", at=10.0)
        store.submit_job(job("j0", (0, 2, 4)), owner="ana", at=11.0)
        store.job_started("j0", 20.0)
        requests = (("i-1", "p3.8xlarge", 12.24), ("i-2", "p3.8xlarge", 12.24))
        store.record_round(RoundRecord(30.0, "eva", "full", True, "launch"), RoundIntents(requests))
        store.transition_instance("i-1", "pending", 31.0, cloud_id="i-0abc", zone="us-east-1a")
        store.transition_instance("i-1", "running", 90.0)
        store.transition_instance("i-2", "failed", 32.0)
        targets = {"j1/0": "i-1", "j1/1": "i-1"}
        store.record_round(
            RoundRecord(100.0, "eva", "full", False, "place"), RoundIntents(targets=targets)
        )
        running = TaskUpdate(
            "j1/0",
            status="running",
            instance_id="i-1",
            progress=5.0,
            phases=(("p3.8xlarge", "start", 2.5),),
        )
        store.update_tasks([running], 101.0)
        store.record_throughput([("wj1_node0", ("wj1_node1",), ThroughputEntry(0.9, 2, 99.0))])


def reference(*stores: Store) -> InMemoryStore:
    memory = InMemoryStore()
    populate(memory, *stores)
    return memory
