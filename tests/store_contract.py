"""The `Store` contract, as tests any binding must pass.

A binding's test module provides a `store` fixture (a fresh, empty store) and
imports these tests: `from tests.store_contract import *  # noqa: F403`.
"""

from __future__ import annotations

import pytest

from autoscaler.store import (
    ActionRecord,
    DuplicateJob,
    IllegalTransition,
    RoundRecord,
)
from autoscaler.throughput import ThroughputEntry
from tests.builders import job

HOUR = 3600.0


def submit(store, job_id="j1", n_tasks=2, at=0.0, **fields):
    return store.submit_job(job(job_id, *[(1, 4, 8)] * n_tasks, **fields), owner="ana", at=at)


def test_submitted_job_round_trips_with_its_tasks(store):
    spec = job(
        "j1",
        (1, 4, 8),
        (0, 2, 16),
        name="resnet18[3]",
        init_delay_s=80.0,
        max_tasks_per_instance=1,
        arrival_time_s=12.0,
        duration_s=3600.0,
        total_iters=1000.0,
        full_throughput=2.5,
    )
    record = store.submit_job(spec, owner="ana", at=5.0)
    assert (record.status, record.owner, record.submitted_at) == ("queued", "ana", 5.0)
    again = store.job("j1")
    assert again.spec == spec
    assert again.status == "queued" and again.started_at is None
    tasks = store.tasks_of("j1")
    assert [(t.task_id, t.status, t.instance_id, t.target_instance_id) for t in tasks] == [
        ("j1/0", "pending", None, None),
        ("j1/1", "pending", None, None),
    ]


def test_duplicate_job_is_rejected_and_the_first_is_kept(store):
    submit(store, "j1", n_tasks=1)
    with pytest.raises(DuplicateJob):
        submit(store, "j1", n_tasks=3)
    assert len(store.tasks_of("j1")) == 1


def test_job_lifecycle_sets_times_once(store):
    submit(store, "j1")
    assert store.job_started("j1", 10.0)
    assert not store.job_started("j1", 20.0)  # started once
    assert store.job("j1").status == "running" and store.job("j1").started_at == 10.0
    assert store.job_finished("j1", 99.0)
    finished = store.job("j1")
    assert (finished.status, finished.finished_at) == ("completed", 99.0)
    assert {t.status for t in store.tasks_of("j1")} == {"completed"}
    assert not store.job_finished("j1", 120.0)


def test_cancelled_job_is_final(store):
    submit(store, "j1")
    assert store.cancel_job("j1", 7.0)
    assert not store.cancel_job("j1", 8.0)
    assert not store.job_started("j1", 9.0)
    assert not store.job_finished("j1", 9.0)
    assert store.assign_tasks({"j1/0": "i-1"}, 9.0) == set()
    assert not store.update_task("j1/0", 9.0, status="running", instance_id="i-1")
    record = store.job("j1")
    assert (record.status, record.finished_at) == ("cancelled", 7.0)
    assert {(t.status, t.instance_id, t.target_instance_id) for t in store.tasks_of("j1")} == {
        ("cancelled", None, None)
    }


def test_tasks_record_targets_placement_progress_and_checkpoints(store):
    submit(store, "j1")
    store.request_instance("i-1", "p3.8xlarge", 12.24, at=0.0)
    assert store.assign_tasks({"j1/0": "i-1", "j1/1": "i-1", "nope/0": "i-1"}, 1.0) == {
        "j1/0",
        "j1/1",
    }
    assert store.update_task(
        "j1/0", 2.0, status="running", instance_id="i-1", progress=50.0, checkpoint="s3://b/j1/0/50"
    )
    task = store.tasks_of("j1")[0]
    assert (
        task.status,
        task.instance_id,
        task.target_instance_id,
        task.progress,
        task.checkpoint,
        task.updated_at,
    ) == ("running", "i-1", "i-1", 50.0, "s3://b/j1/0/50", 2.0)
    # unspecified fields are kept; instance_id=None clears
    store.update_task("j1/0", 3.0, status="pending", instance_id=None)
    task = store.tasks_of("j1")[0]
    assert (task.status, task.instance_id, task.progress, task.checkpoint) == (
        "pending",
        None,
        50.0,
        "s3://b/j1/0/50",
    )


def test_instance_status_machine_keeps_its_history(store):
    store.request_instance("i-1", "c7i.large", 0.08925, at=10.0)
    assert store.transition_instance("i-1", "pending", 11.0, cloud_id="i-0abc", zone="us-east-1a")
    assert not store.transition_instance("i-1", "pending", 12.0)  # already there
    store.transition_instance("i-1", "running", 30.0)
    store.transition_instance("i-1", "draining", 40.0)
    store.transition_instance("i-1", "terminating", 50.0)
    store.transition_instance("i-1", "terminated", 51.0)
    inst = store.instance("i-1")
    assert (inst.cloud_id, inst.zone, inst.status) == ("i-0abc", "us-east-1a", "terminated")
    assert inst.history == (
        ("requested", 10.0),
        ("pending", 11.0),
        ("running", 30.0),
        ("draining", 40.0),
        ("terminating", 50.0),
        ("terminated", 51.0),
    )
    with pytest.raises(IllegalTransition):
        store.transition_instance("i-1", "running", 60.0)
    assert store.instances() == []
    assert [i.instance_id for i in store.instances(include_finished=True)] == ["i-1"]


def test_request_is_idempotent_by_launch_token(store):
    first = store.request_instance("tok-1", "c7i.large", 0.08925, at=1.0)
    second = store.request_instance("tok-1", "c7i.large", 0.08925, at=2.0)
    assert first == second and len(store.instances()) == 1


def test_ledger_bills_from_request_to_termination_at_the_request_price(store):
    store.request_instance("i-1", "p3.2xlarge", 3.06, at=HOUR)
    store.transition_instance("i-1", "pending", HOUR + 20)
    store.transition_instance("i-1", "running", HOUR + 200)
    assert store.cost_between(0, 2 * HOUR) == pytest.approx(3.06)  # still running: billed to t1
    store.transition_instance("i-1", "terminated", 3 * HOUR)
    [interval] = store.uptime()
    assert (interval.start, interval.end, interval.hourly_price) == (HOUR, 3 * HOUR, 3.06)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(2 * 3.06)
    assert store.cost_between(2 * HOUR, 2.5 * HOUR) == pytest.approx(0.5 * 3.06)
    # a launch the cloud refused was never billed
    store.request_instance("i-2", "p3.2xlarge", 3.06, at=HOUR)
    store.transition_instance("i-2", "failed", HOUR + 1)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(2 * 3.06)


def test_reports_keep_the_price_of_the_time(store):
    store.request_instance("old", "c7i.large", 0.10, at=0.0)
    store.transition_instance("old", "pending", 1.0)
    store.transition_instance("old", "terminated", HOUR)
    store.request_instance("new", "c7i.large", 0.20, at=HOUR)  # the catalog price changed
    store.transition_instance("new", "pending", HOUR + 1)
    store.transition_instance("new", "terminated", 2 * HOUR)
    assert store.cost_between(0, 2 * HOUR) == pytest.approx(0.30)


def test_throughput_table_round_trips(store):
    store.record_throughput(
        [
            ("resnet18_node0", ("gpt2_node0",), ThroughputEntry(0.8, 3, 100.0)),
            ("gpt2_node0", ("resnet18_node0", "a3c_node0"), ThroughputEntry(0.7, 1, 120.0)),
        ]
    )
    store.record_throughput([("resnet18_node0", ("gpt2_node0",), ThroughputEntry(0.85, 4, 200.0))])
    table = store.snapshot(default_throughput=0.9).throughput
    assert table.default == 0.9
    assert table.recorded("resnet18_node0", ["gpt2_node0"]) == 0.85
    # the co-located set is a multiset, order-free
    assert table.recorded("gpt2_node0", ["a3c_node0", "resnet18_node0"]) == 0.7
    assert dict(table.items())[("resnet18_node0", ("gpt2_node0",))] == ThroughputEntry(
        0.85, 4, 200.0
    )


def test_rounds_and_their_actions_are_recorded_with_reasons(store):
    actions = (
        ActionRecord(
            "launch",
            "tok-1",
            "new instance for j1/0",
            detail={"type": "p3.8xlarge", "tasks": ["j1/0"]},
        ),
        ActionRecord("terminate", "i-9", "no tasks left"),
    )
    rid = store.record_round(
        RoundRecord(
            300.0,
            "eva",
            "partial",
            True,
            "partial: ...",
            {"hourly_cost": 12.24, "d_hat_h": 1.5},
            actions,
        )
    )
    store.record_action_outcome(rid, 1, "failed", "throttled")
    [rnd] = store.rounds()
    assert (rnd.round_id, rnd.at, rnd.planner, rnd.chosen, rnd.had_event) == (
        rid,
        300.0,
        "eva",
        "partial",
        True,
    )
    assert rnd.numbers["hourly_cost"] == 12.24
    assert [(a.kind, a.target, a.outcome, a.message) for a in rnd.actions] == [
        ("launch", "tok-1", "planned", ""),
        ("terminate", "i-9", "failed", "throttled"),
    ]
    assert rnd.actions[0].detail["tasks"] == ["j1/0"]


def test_snapshot_holds_active_jobs_live_instances_and_history(store):
    submit(store, "a")
    submit(store, "b")
    submit(store, "c")
    store.job_finished("b", 5.0)
    store.cancel_job("c", 5.0)
    store.request_instance("i-1", "c7i.large", 0.1, at=0.0)
    store.request_instance("i-2", "c7i.large", 0.1, at=0.0)
    store.transition_instance("i-2", "failed", 1.0)
    store.record_round(RoundRecord(300.0, "eva", "full", True, ""))
    store.record_round(RoundRecord(600.0, "eva", "full", False, ""))
    store.record_round(RoundRecord(900.0, "eva", "partial", True, ""))
    snap = store.snapshot()
    assert [j.job_id for j in snap.jobs] == ["a"]
    assert sorted(snap.tasks) == ["a/0", "a/1"]
    assert [i.instance_id for i in snap.instances] == ["i-1"]
    history = snap.history(now=1200.0)
    assert (history.elapsed_s, history.event_rounds, history.full_rounds) == (900.0, 2, 1)


def test_jobs_query_by_status(store):
    submit(store, "a")
    submit(store, "b")
    store.job_started("b", 1.0)
    assert [j.job_id for j in store.jobs(["running"])] == ["b"]
    assert sorted(j.job_id for j in store.jobs()) == ["a", "b"]
