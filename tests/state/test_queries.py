"""The queries the planner and the cost reports need, on both databases, and state that
outlives the process that wrote it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from autoscaler.store import Store
from autoscaler.throughput import ThroughputEntry
from state import store as sql_store_module
from state.database import create_state_engine
from state.memory import InMemoryStore
from state.migrate import upgrade
from state.store import TASKS, SqlStore
from tests.builders import job
from tests.state.checks import populate, reference, state_of
from tests.store_writes import adopted_round, request

HOUR = 3600.0


def test_throughput_lookups_use_recorded_sets_then_pairs_then_the_default(
    sql_store: SqlStore,
) -> None:
    entries = [
        ("a", ("b",), ThroughputEntry(0.8, 3, 10.0)),
        ("a", ("c",), ThroughputEntry(0.9, 1, None)),
        ("a", ("c", "b"), ThroughputEntry(0.75, 2, 12.0)),
        ("b", ("a",), ThroughputEntry(0.6, 1, 11.0)),
    ]
    sql_store.record_throughput(entries)
    table = sql_store.snapshot(default_throughput=0.95).throughput
    assert table.throughput("a", ["b"]) == 0.8
    assert table.throughput("a", ["b", "c"]) == 0.75  # the recorded set, in any order
    assert table.throughput("a", ["b", "d"]) == 0.8 * 0.95  # pairs, the unknown one at default
    assert table.throughput("a", ["b", "b"]) == 0.8 * 0.8  # a multiset: b twice
    assert table.throughput("b", ["a"]) == 0.6
    assert table.throughput("d", ["a"]) == 0.95
    assert table.throughput("a", []) == 1.0
    memory = InMemoryStore()
    memory.record_throughput(entries)
    assert list(table.items()) == list(memory.snapshot().throughput.items())


def test_cost_over_an_interval_reads_the_ledger_at_the_prices_of_the_time(
    sql_store: SqlStore,
) -> None:
    # i-1: $3.06/h billed from its request at 1 h to its termination at 3 h.
    request(sql_store, "i-1", "p3.2xlarge", 3.06, at=1 * HOUR)
    sql_store.transition_instance("i-1", "pending", 1 * HOUR + 30)
    sql_store.transition_instance("i-1", "terminated", 3 * HOUR)
    # i-2: $0.17/h from 2 h, still running.
    request(sql_store, "i-2", "c7i.xlarge", 0.17, at=2 * HOUR)
    sql_store.transition_instance("i-2", "running", 2 * HOUR + 60)
    # i-3: refused by the cloud, never billed; i-4: requested, not yet billed.
    request(sql_store, "i-3", "p3.2xlarge", 3.06, at=2 * HOUR)
    sql_store.transition_instance("i-3", "failed", 2 * HOUR + 1)
    request(sql_store, "i-4", "p3.2xlarge", 3.06, at=2 * HOUR)

    assert sql_store.cost_between(0, 1 * HOUR) == 0.0
    assert sql_store.cost_between(0, 4 * HOUR) == pytest.approx(2 * 3.06 + 2 * 0.17)
    assert sql_store.cost_between(2.5 * HOUR, 5 * HOUR) == pytest.approx(0.5 * 3.06 + 2.5 * 0.17)
    assert sql_store.cost_between(3 * HOUR, 3 * HOUR) == 0.0
    assert sql_store.cost_between(4 * HOUR, 3 * HOUR) == 0.0
    assert [(u.instance_id, u.start, u.end) for u in sql_store.uptime()] == [
        ("i-1", 1 * HOUR, 3 * HOUR),
        ("i-2", 2 * HOUR, None),
    ]


def test_state_survives_the_process_that_wrote_it(db_url: str) -> None:
    with SqlStore(db_url) as first:
        expected = reference(first)
    with SqlStore(db_url) as restarted:
        assert state_of(restarted) == state_of(expected)
        # ... and the next start continues where the last one stopped.
        for store in (restarted, expected):
            store.job_finished("j0", 200.0)
            store.transition_instance("i-1", "terminated", 300.0)
        assert state_of(restarted) == state_of(expected)
        assert restarted.cost_between(0.0, 1000.0) == pytest.approx((300.0 - 30.0) / HOUR * 12.24)


def test_sql_store_is_a_store(sql_store: SqlStore) -> None:
    assert isinstance(sql_store, Store)
    populate(sql_store)
    assert state_of(sql_store) == state_of(reference())


def test_large_plans_are_adopted_in_chunks(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_store_module, "CHUNK", 7)  # many chunks from a few tasks
    jobs = [job(f"j{n}", *[(0, 1, 1)] * 10) for n in range(3)]
    for spec in jobs:
        sql_store.submit_job(spec, owner="ana", at=0.0)
    sql_store.cancel_job("j1", 1.0)
    targets = {t.task_id: f"i-{n % 4}" for spec in jobs for n, t in enumerate(spec.tasks)}
    adopted_round(sql_store, 2.0, targets=targets)
    for spec in jobs:
        for task in sql_store.tasks_of(spec.job_id):
            expected = None if spec.job_id == "j1" else targets[task.task_id]
            assert task.target_instance_id == expected


def test_sqlite_connections_use_wal_foreign_keys_and_a_busy_timeout(
    sqlite_template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "state.db"
    shutil.copyfile(sqlite_template, path)
    with SqlStore(f"sqlite:///{path}") as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        with pytest.raises(IntegrityError, match="FOREIGN KEY"), store.engine.begin() as conn:
            conn.execute(
                insert(TASKS).values(
                    task_id="ghost/0",
                    job_id="ghost",
                    position=0,
                    workload="w",
                    status="pending",
                    progress=0.0,
                )
            )


def test_an_in_memory_sqlite_database_serves_a_replay() -> None:
    engine = create_state_engine("sqlite://")
    upgrade(engine)
    with SqlStore(engine) as store:
        populate(store)
        assert state_of(store) == state_of(reference())
    engine.dispose()


def test_a_store_that_took_the_submissions_reads_the_specs_a_fresh_one_parses(
    db_url: str,
) -> None:
    """The specs a store keeps from its own submissions are the ones its database holds:
    a daemon's snapshot must not depend on whether it or another process took a job."""
    with SqlStore(db_url) as took, SqlStore(db_url) as fresh:
        took.submit_job(job("j1", (1, 4, 8.5), (0, 2, 4), family="p3"), owner="ana", at=1.0)
        took.submit_job(job("j2", (0, 1, 2), max_cost=12.5, priority=3), owner="bo", at=2.0)
        assert took.snapshot().jobs == fresh.snapshot().jobs
        assert [j.spec for j in took.snapshot().jobs] == [took.job(j).spec for j in ("j1", "j2")]
