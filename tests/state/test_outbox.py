"""The notification outbox on both backends: a job's end and its event are one transaction,
an event is one per fact (its key), it survives the process, and dispatching fans it out
once to the webhooks that subscribe to its kind."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.jobs import TaskRun
from state.outbox import EVENT_KINDS, OutboxEvent, SqlOutbox
from state.store import SqlStore
from tests.builders import job


def secret_job(job_id: str):
    """A job whose task carries an env value that must never reach a notification."""
    spec = job(job_id, (0, 1, 1))
    task = dataclasses.replace(
        spec.tasks[0], run=TaskRun(image="img", env=(("API_KEY", "hunter2-value"),))
    )
    return dataclasses.replace(spec, tasks=(task,))


def test_a_jobs_end_writes_its_event_once_without_its_env(sql_store: SqlStore):
    for name in ("a", "b", "c"):
        sql_store.submit_job(secret_job(name), owner="alice", at=1.0, team="ml")
    assert sql_store.job_finished("a", 10.0)
    assert sql_store.job_finished("b", 11.0, "failed", "exit code 1")
    assert sql_store.cancel_job("c", 12.0)
    # Finished is final: a second end changes nothing, and writes no second event.
    assert not sql_store.job_finished("a", 13.0, "failed", "late")
    assert not sql_store.cancel_job("b", 14.0)
    events = SqlOutbox(sql_store.engine).events()
    assert [(e.key, e.kind, e.at) for e in events] == [
        ("job.completed:a", "job.completed", 10.0),
        ("job.failed:b", "job.failed", 11.0),
        ("job.cancelled:c", "job.cancelled", 12.0),
    ]
    assert events[1].payload["reason"] == "exit code 1"
    assert events[0].payload["owner"] == "alice" and events[0].payload["team"] == "ml"
    assert all("hunter2" not in repr(e) for e in events)


def test_a_job_that_ends_nowhere_leaves_no_event(sql_store: SqlStore):
    """The event is written by the transaction that ends the job: no end, no event."""
    sql_store.submit_job(job("a", (0, 1, 1)), owner="alice", at=1.0)
    sql_store.job_started("a", 2.0)
    assert SqlOutbox(sql_store.engine).events() == []


def test_events_survive_the_process_and_are_dispatched_once_to_subscribers(db_url):
    with SqlStore(db_url) as first:
        first.submit_job(job("a", (0, 1, 1)), owner="alice", at=1.0)
        first.job_finished("a", 100.0)
    # A new process (a restarted daemon) finds the event and fans it out.
    with SqlStore(db_url) as second:
        outbox = SqlOutbox(second.engine)
        sinks = {
            "slack": frozenset({"job.completed"}),
            "ops": frozenset({"job.failed"}),
            "all": frozenset(EVENT_KINDS),
        }
        assert outbox.dispatch(sinks, 120.0, max_age_s=3600.0) == 2
        assert outbox.dispatch(sinks, 121.0, max_age_s=3600.0) == 0  # dispatched once
        due = outbox.due(120.0)
        assert sorted(d.sink for d in due) == ["all", "slack"]
        assert all(d.status == "pending" and d.attempts == 0 for d in due)
        assert due[0].event.key == "job.completed:a"
        outbox.attempted(due[0].delivery_id, 121.0, "delivered", next_at=None)
        outbox.attempted(due[1].delivery_id, 121.0, "pending", next_at=200.0, error="HTTP 503")
        assert outbox.due(199.0) == []
        [retry] = outbox.due(200.0)
        assert (retry.attempts, retry.last_error) == (1, "HTTP 503")
        assert outbox.next_due() == 200.0


def test_old_events_are_dispatched_to_no_one(sql_store: SqlStore):
    outbox = SqlOutbox(sql_store.engine)
    outbox.emit([OutboxEvent("test:1", "test", 0.0)], 0.0)
    assert outbox.dispatch({"all": frozenset({"test"})}, 90_000.0, max_age_s=86_400.0) == 0
    assert outbox.deliveries() == []
    # ... and once dispatched, never again.
    assert outbox.dispatch({"all": frozenset({"test"})}, 90_000.0, max_age_s=1e9) == 0


def test_emit_is_one_event_per_key_and_sets_marks_with_it(sql_store: SqlStore):
    outbox = SqlOutbox(sql_store.engine)
    event = OutboxEvent("budget.80:max_hourly_spend:round-3", "budget.80", 5.0, {"level": 80})
    assert outbox.emit([event], 5.0, {"budget:max_hourly_spend": 80}) == [event.key]
    assert outbox.emit([event], 6.0, {"budget:max_hourly_spend": 80}) == []
    assert outbox.marks() == {"budget:max_hourly_spend": 80}
    assert [e.key for e in outbox.events()] == [event.key]
    outbox.emit([], 7.0, {"budget:max_hourly_spend": 0, "held": ["gpu4"]})
    assert outbox.marks() == {"budget:max_hourly_spend": 0, "held": ["gpu4"]}


@pytest.mark.parametrize("status", ["delivered", "failed"])
def test_an_attempt_is_recorded_with_its_outcome(sql_store: SqlStore, status):
    outbox = SqlOutbox(sql_store.engine)
    outbox.emit([OutboxEvent("test:1", "test", 0.0)], 0.0)
    outbox.dispatch({"w": frozenset({"test"})}, 1.0, max_age_s=60.0)
    [delivery] = outbox.due(1.0)
    outbox.attempted(delivery.delivery_id, 2.0, status, next_at=None, error="x")
    [after] = outbox.deliveries("w")
    assert (after.status, after.attempts, after.next_at) == (status, 1, None)
    assert outbox.due(1e9) == [] and outbox.next_due() is None


def test_prune_forgets_only_what_ended_before_the_cut(sql_store: SqlStore):
    outbox = SqlOutbox(sql_store.engine)
    outbox.emit([OutboxEvent(f"test:{n}", "test", float(n)) for n in (1, 2, 3, 4)], 0.0)
    outbox.dispatch({"w": frozenset({"test"})}, 5.0, max_age_s=3.5)  # test:1 is too old
    by_key = {d.event.key: d for d in outbox.due(5.0)}
    assert sorted(by_key) == ["test:2", "test:3", "test:4"]
    outbox.attempted(by_key["test:2"].delivery_id, 6.0, "delivered", next_at=None)
    outbox.attempted(by_key["test:3"].delivery_id, 6.0, "pending", next_at=9.0, error="503")
    outbox.attempted(by_key["test:4"].delivery_id, 20.0, "failed", next_at=None, error="404")
    assert outbox.prune(before=10.0) == 2  # test:1 (never sent) and test:2 (delivered)
    assert [e.key for e in outbox.events()] == ["test:3", "test:4"]
    assert sorted(d.event.key for d in outbox.deliveries()) == ["test:3", "test:4"]
