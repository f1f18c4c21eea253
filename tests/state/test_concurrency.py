"""Submissions and a scheduling round at the same time: the round plans from one
consistent snapshot, and its writes never resurrect a job cancelled meanwhile.

Each store here has its own engine, as separate processes would (the daemon's round
and the submission API).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import event

from autoscaler.store import TaskUpdate
from state.store import SqlStore
from tests.builders import job
from tests.store_writes import adopted_round, request


@pytest.fixture
def round_store(db_url: str) -> Iterator[SqlStore]:
    with SqlStore(db_url) as store:
        store.submit_job(job("j1", (1, 4, 8), (1, 4, 8)), owner="ana", at=0.0)
        request(store, "i-1", "p3.8xlarge", 12.24, at=0.0)
        yield store


@pytest.fixture
def user_store(db_url: str, round_store: SqlStore) -> Iterator[SqlStore]:
    with SqlStore(db_url) as store:
        yield store


def assert_cancelled(db_url: str) -> None:
    with SqlStore(db_url) as fresh:
        assert fresh.job("j1").status == "cancelled"
        assert [(t.status, t.target_instance_id) for t in fresh.tasks_of("j1")] == [
            ("cancelled", None),
            ("cancelled", None),
        ]


def test_a_cancellation_committed_during_a_round_stays_cancelled(
    db_url: str, round_store: SqlStore, user_store: SqlStore
) -> None:
    snapshot = round_store.snapshot()  # the round plans from this ...
    assert [j.job_id for j in snapshot.jobs] == ["j1"]
    assert user_store.cancel_job("j1", 5.0)  # ... while the user cancels
    # The round adopts its plan: every write for the cancelled job is refused.
    adopted_round(round_store, 6.0, targets={"j1/0": "i-1", "j1/1": "i-1"})
    assert not round_store.job_started("j1", 6.0)
    running = TaskUpdate("j1/0", status="running", instance_id="i-1")
    assert round_store.update_tasks([running], 6.0) == set()
    assert not round_store.job_finished("j1", 7.0)
    assert_cancelled(db_url)


def test_a_round_write_waits_for_a_cancellation_in_flight_then_leaves_the_job_alone(
    db_url: str, round_store: SqlStore, user_store: SqlStore
) -> None:
    """The cancellation has written the job and its tasks but not committed yet when the
    round writes. Reading the job's status without a lock would see it still queued and
    write the targets after the cancellation cleared them."""
    inside, release = threading.Event(), threading.Event()

    @event.listens_for(user_store.engine, "commit")
    def hold_the_commit(_conn: Any) -> None:
        inside.set()
        assert release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        cancelled = pool.submit(user_store.cancel_job, "j1", 5.0)
        assert inside.wait(30)
        targets = {"j1/0": "i-1", "j1/1": "i-1"}
        adopted = pool.submit(adopted_round, round_store, 6.0, targets=targets)
        with pytest.raises(TimeoutError):
            adopted.result(timeout=0.5)  # it waits for the cancellation's lock
        release.set()
        assert cancelled.result(timeout=30) is True
        adopted.result(timeout=30)
    assert_cancelled(db_url)


def test_a_snapshot_is_one_point_in_time(
    db_url: str, round_store: SqlStore, user_store: SqlStore
) -> None:
    """Writers commit between the snapshot's first query and its others; the snapshot
    sees none of it (read separately, it would hold a job without its tasks)."""
    adopted_round(round_store, 1.0, targets={"j1/0": "i-1"})
    writes: list[str] = []

    @event.listens_for(round_store.engine, "after_cursor_execute")
    def meanwhile(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not writes and "FROM jobs" in statement:
            writes.append(statement)
            user_store.cancel_job("j1", 5.0)  # commits at once: readers block no writer
            user_store.submit_job(job("j2", (0, 2, 4)), owner="bo", at=5.0)
            user_store.transition_instance("i-1", "pending", 5.0)

    snapshot = round_store.snapshot()
    event.remove(round_store.engine, "after_cursor_execute", meanwhile)
    assert writes, "the writes ran during the snapshot"
    assert [j.job_id for j in snapshot.jobs] == ["j1"]
    assert [(t.task_id, t.status, t.target_instance_id) for t in snapshot.tasks.values()] == [
        ("j1/0", "pending", "i-1"),
        ("j1/1", "pending", None),
    ]
    assert [(i.instance_id, i.status) for i in snapshot.instances] == [("i-1", "requested")]
    later = round_store.snapshot()
    assert [j.job_id for j in later.jobs] == ["j2"]
    assert [(i.instance_id, i.status) for i in later.instances] == [("i-1", "pending")]
