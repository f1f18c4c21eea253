"""The `Store` contract, as tests any binding must pass.

A binding's test module provides a `store` fixture (a fresh, empty store) and
imports these tests: `from tests.store_contract import *  # noqa: F403`.
"""

from __future__ import annotations

import math

import pytest

from app.bundled import bundled
from app.files import jobs_from_eva, load_jobs
from autoscaler.jobs import TraceFacts
from autoscaler.store import (
    ActionRecord,
    DuplicateJob,
    IllegalTransition,
    InstanceChange,
    PriceChange,
    RefreshedPrices,
    RoundIntents,
    RoundRecord,
    StateCounts,
    TaskUpdate,
    UnknownEntity,
)
from autoscaler.throughput import ThroughputEntry
from tests.builders import job
from tests.store_writes import adopted_round, request

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
        full_throughput=2.5,
        trace=TraceFacts(arrival_time_s=12.0, duration_s=3600.0, total_iters=1000.0),
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


def test_tasks_of_many_jobs_are_each_jobs_tasks(store):
    for n, job_id in enumerate(("j1", "j2", "j3")):
        submit(store, job_id, n_tasks=n + 1)
    store.update_tasks([TaskUpdate("j2/1", progress=7.0)], 1.0)
    many = store.tasks_of_jobs(["j3", "j2", "nope"])
    assert list(many) == ["j3", "j2", "nope"] and many["nope"] == []
    for job_id in ("j2", "j3"):
        assert many[job_id] == store.tasks_of(job_id)
    assert many["j2"][1].progress == 7.0


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
    adopted_round(store, 9.0, targets={"j1/0": "i-1"})
    assert (
        store.update_tasks([TaskUpdate("j1/0", status="running", instance_id="i-1")], 9.0) == set()
    )
    record = store.job("j1")
    assert (record.status, record.finished_at) == ("cancelled", 7.0)
    assert {(t.status, t.instance_id, t.target_instance_id) for t in store.tasks_of("j1")} == {
        ("cancelled", None, None)
    }


def test_tasks_record_targets_placement_progress_and_checkpoints(store):
    submit(store, "j1")
    targets = {"j1/0": "i-1", "j1/1": "i-1", "nope/0": "i-1"}  # an unknown task is ignored
    adopted_round(store, 1.0, requests=[("i-1", "p3.8xlarge", 12.24)], targets=targets)
    assert [t.target_instance_id for t in store.tasks_of("j1")] == ["i-1", "i-1"]
    running = TaskUpdate(
        "j1/0", status="running", instance_id="i-1", progress=50.0, checkpoint="s3://b/j1/0/50"
    )
    assert store.update_tasks([running], 2.0) == {"j1/0"}
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
    store.update_tasks([TaskUpdate("j1/0", status="pending", instance_id=None)], 3.0)
    task = store.tasks_of("j1")[0]
    assert (task.status, task.instance_id, task.progress, task.checkpoint) == (
        "pending",
        None,
        50.0,
        "s3://b/j1/0/50",
    )


def test_instance_status_machine_keeps_its_history(store):
    request(store, "i-1", "c7i.large", 0.08925, at=10.0)
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


def test_a_price_the_cloud_names_at_landing_is_billed_from_the_request(store):
    # A regional spot offering planned at the median of its zones lands in one of them,
    # where EC2 bills that zone's price: the instance and its ledger take it, from the
    # request on. A later change naming a price does not reprice billed uptime.
    request(store, "i-1", "c7i.large:spot", 0.030, at=HOUR)
    store.transition_instances(
        [InstanceChange("i-1", "pending", "ec2-1", "z-b", hourly_price=0.021)], HOUR + 5
    )
    store.transition_instances([InstanceChange("i-1", "running", hourly_price=0.5)], HOUR + 60)
    assert store.instance("i-1").hourly_price == 0.021
    store.transition_instance("i-1", "terminated", 3 * HOUR)
    [interval] = store.uptime()
    assert (interval.start, interval.end, interval.hourly_price) == (HOUR, 3 * HOUR, 0.021)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(2 * 0.021)
    # none named: the request's price stands
    request(store, "i-2", "c7i.large:spot", 0.030, at=HOUR)
    store.transition_instances([InstanceChange("i-2", "running", "ec2-2", "z-a")], HOUR + 5)
    assert store.instance("i-2").hourly_price == 0.030


def test_uptime_since_gives_the_intervals_overlapping_the_window(store):
    # A reader of a window (spend today, learned spot rates, a price refresh) reads the
    # intervals that overlap it, the open ones included, not the whole history.
    for name, start, end in (("i-1", HOUR, 2 * HOUR), ("i-2", HOUR, 4 * HOUR), ("i-3", HOUR, None)):
        request(store, name, "c7i.large", 0.08925, at=start)
        store.transition_instance(name, "pending", start + 20)
        store.transition_instance(name, "running", start + 200)
        if end is not None:
            store.transition_instance(name, "terminated", end)
    window = [u.instance_id for u in store.uptime(3 * HOUR)]
    assert window == ["i-2", "i-3"]
    assert [u.instance_id for u in store.uptime(2 * HOUR)] == ["i-1", "i-2", "i-3"]  # ends at it
    assert [u.instance_id for u in store.uptime()] == ["i-1", "i-2", "i-3"]


def test_request_is_idempotent_by_launch_token(store):
    request(store, "tok-1", "c7i.large", 0.08925, at=1.0)
    first = store.instance("tok-1")
    request(store, "tok-1", "c7i.large", 0.08925, at=2.0)  # a round recorded again
    assert store.instance("tok-1") == first and first.requested_at == 1.0
    assert len(store.instances()) == 1


def test_ledger_bills_from_request_to_termination_at_the_request_price(store):
    request(store, "i-1", "p3.2xlarge", 3.06, at=HOUR)
    store.transition_instance("i-1", "pending", HOUR + 20)
    store.transition_instance("i-1", "running", HOUR + 200)
    assert store.cost_between(0, 2 * HOUR) == pytest.approx(3.06)  # still running: billed to t1
    store.transition_instance("i-1", "terminated", 3 * HOUR)
    [interval] = store.uptime()
    assert (interval.start, interval.end, interval.hourly_price) == (HOUR, 3 * HOUR, 3.06)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(2 * 3.06)
    assert store.cost_between(2 * HOUR, 2.5 * HOUR) == pytest.approx(0.5 * 3.06)
    # a launch the cloud refused was never billed
    request(store, "i-2", "p3.2xlarge", 3.06, at=HOUR)
    store.transition_instance("i-2", "failed", HOUR + 1)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(2 * 3.06)


def test_reports_keep_the_price_of_the_time(store):
    request(store, "old", "c7i.large", 0.10, at=0.0)
    store.transition_instance("old", "pending", 1.0)
    store.transition_instance("old", "terminated", HOUR)
    request(store, "new", "c7i.large", 0.20, at=HOUR)  # the catalog price changed
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


def test_forgotten_throughput_entries_are_deleted_and_upserts_win(store):
    store.record_throughput(
        [
            ("a_node0", ("b_node0", "c_node0"), ThroughputEntry(0.6, 1, 10.0)),
            ("a_node0", ("b_node0",), ThroughputEntry(0.9, 1, 10.0)),
        ]
    )
    store.record_throughput(
        [("a_node0", ("d_node0",), ThroughputEntry(0.8, 1, 20.0))],
        forget=[("a_node0", ("c_node0", "b_node0")), ("a_node0", ("d_node0",))],
    )
    table = store.snapshot().throughput
    assert table.recorded("a_node0", ["b_node0", "c_node0"]) is None
    assert table.recorded("a_node0", ["b_node0"]) == 0.9
    assert table.recorded("a_node0", ["d_node0"]) == 0.8


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
    store.record_action_outcomes(rid, [(1, "failed", "throttled")])
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
    requests = (("i-1", "c7i.large", 0.1), ("i-2", "c7i.large", 0.1))
    store.record_round(RoundRecord(300.0, "eva", "full", True, ""), RoundIntents(requests))
    store.transition_instance("i-2", "failed", 301.0)
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


# -- added with the SQL binding: what a binding must also keep exactly --------------------


def test_specs_with_several_families_delays_and_images_round_trip(store):
    [spec] = jobs_from_eva(
        {
            "g7": {
                "name": "gpt2[7]",
                "arrival_time": 1732262400.123456,
                "duration": 7200.5,
                "total_iters": 1e6,
                "init_delay": 47.25,
                "max_tasks_per_instance": 1,
                "tasks": {
                    "0": {
                        "name": "node0",
                        "demand": {"p3": [1, 4, 61], "any": [0, 8, 32.5]},
                        "kill_delay": 2.5,
                        "upload_delay": 0.1,
                        "image_id": "img-1",
                    },
                    "1": {"name": "node1", "demand": {"r7i": [0, 2, 16]}},
                },
            }
        }
    )
    store.submit_job(spec, owner="bo", at=1.5)
    assert store.job("g7").spec == spec
    assert [t.task_id for t in store.tasks_of("g7")] == ["g7/0", "g7/1"]
    trace = load_jobs(bundled("pai_200.json"))[:10]
    for spec in trace:
        store.submit_job(spec, owner="trace", at=spec.trace.arrival_time_s)
    assert [store.job(spec.job_id).spec for spec in trace] == list(trace)


def test_times_and_prices_round_trip_exactly(store):
    t = 1732262400.1234567  # epoch seconds below a microsecond
    submit(store, "j1", at=t)
    store.job_started("j1", t + 1e-6)
    request(store, "i-1", "c7i.large", 0.08925, at=t + 0.1)
    store.transition_instance("i-1", "pending", t + 0.3)
    store.update_tasks([TaskUpdate("j1/0", progress=1 / 3)], t + 0.7)
    record = store.job("j1")
    assert (record.submitted_at, record.started_at) == (t, t + 1e-6)
    assert store.tasks_of("j1")[0].progress == 1 / 3
    assert store.tasks_of("j1")[0].updated_at == t + 0.7
    inst = store.instance("i-1")
    assert (inst.hourly_price, inst.requested_at) == (0.08925, t + 0.1)
    assert inst.history == (("requested", t + 0.1), ("pending", t + 0.3))
    assert store.uptime()[0].start == t + 0.1


def test_jobs_and_instances_keep_submission_order(store):
    for job_id, at in (("b", 30.0), ("a", 10.0), ("c", 20.0)):
        submit(store, job_id, at=at)
    adopted_round(store, 0.0, requests=[(i, "c7i.large", 0.1) for i in ("z", "x", "y")])
    assert [j.job_id for j in store.jobs()] == ["b", "a", "c"]
    snap = store.snapshot()
    assert [j.job_id for j in snap.jobs] == ["b", "a", "c"]
    assert list(snap.tasks) == ["b/0", "b/1", "a/0", "a/1", "c/0", "c/1"]
    assert [i.instance_id for i in snap.instances] == ["z", "x", "y"]


def test_unknown_entities_are_reported(store):
    with pytest.raises(UnknownEntity):
        store.cancel_job("nope", 1.0)
    with pytest.raises(UnknownEntity):
        store.job_finished("nope", 1.0)
    with pytest.raises(UnknownEntity):
        store.update_tasks([TaskUpdate("nope/0", status="running")], 1.0)
    with pytest.raises(UnknownEntity):
        store.transition_instance("nope", "pending", 1.0)
    assert not store.job_started("nope", 1.0)
    assert store.job("nope") is None and store.instance("nope") is None
    assert store.tasks_of("nope") == []


def test_a_failed_job_fails_its_tasks_and_clears_their_targets(store):
    submit(store, "j1")
    adopted_round(store, 1.0, targets={"j1/0": "i-1", "j1/1": "i-2"})
    store.update_tasks([TaskUpdate("j1/0", status="running", instance_id="i-1")], 2.0)
    assert store.job_finished("j1", 3.0, status="failed")
    assert store.job("j1").status == "failed"
    assert [(t.status, t.instance_id, t.target_instance_id) for t in store.tasks_of("j1")] == [
        ("failed", "i-1", None),
        ("failed", None, None),
    ]


def test_draining_and_back_keeps_one_open_interval(store):
    request(store, "i-1", "c7i.large", 0.5, at=0.0)
    store.transition_instance("i-1", "running", 10.0)
    store.transition_instance("i-1", "draining", 20.0)
    store.transition_instance("i-1", "running", 30.0)
    [interval] = store.uptime()
    assert (interval.start, interval.end) == (0.0, None)
    assert store.cost_between(0.0, HOUR) == pytest.approx(0.5)
    store.transition_instance("i-1", "failed", HOUR / 2)
    assert store.cost_between(0.0, HOUR) == pytest.approx(0.25)


def test_round_numbers_and_details_round_trip_with_infinities(store):
    numbers = {"hourly_cost": 0.1 + 0.2, "d_hat_h": math.inf, "full": {"cost": 12.8, "n": 3}}
    actions = (
        ActionRecord("migrate", "j1/0", "cheaper", detail={"from": "i-1", "saving": 1e-300}),
    )
    rid = store.record_round(RoundRecord(1.0, "eva", "full", True, "why", numbers, actions))
    [rnd] = store.rounds()
    assert rnd.numbers == numbers and rnd.actions[0].detail == {"from": "i-1", "saving": 1e-300}
    assert rnd.round_id == rid


def test_rounds_limit_gives_the_latest_oldest_first(store):
    ids = [store.record_round(RoundRecord(float(i), "eva", "partial", False, "")) for i in range(4)]
    assert [r.round_id for r in store.rounds(limit=2)] == ids[2:]
    assert [r.at for r in store.rounds(limit=10)] == [0.0, 1.0, 2.0, 3.0]
    assert store.rounds(limit=0) == []


def test_an_outcome_for_an_unknown_action_is_refused(store):
    rid = store.record_round(
        RoundRecord(1.0, "eva", "full", True, "", actions=(ActionRecord("launch", "t", "r"),))
    )
    with pytest.raises(UnknownEntity):
        store.record_action_outcomes(rid, [(0, "done", "ok"), (1, "done", "")])
    with pytest.raises(UnknownEntity):
        store.record_action_outcomes(rid + 1, [(0, "done", "")])
    assert store.rounds()[0].actions[0].outcome == "planned"  # all or nothing
    store.record_action_outcomes(rid, [(0, "done", "ok")])
    assert store.rounds()[0].actions[0].outcome == "done"


def test_a_batch_of_task_updates_is_applied_at_once_and_skips_finished_jobs(store):
    submit(store, "j1", n_tasks=2, at=0.0)
    submit(store, "j2", n_tasks=1, at=0.0)
    store.cancel_job("j2", 1.0)
    done = store.update_tasks(
        [
            TaskUpdate("j1/0", status="starting", instance_id="i-1", attempt=1, gpus=(0,)),
            TaskUpdate("j1/1", progress=5.0, throughput=2.5, reason="observed"),
            TaskUpdate("j2/0", status="running"),
        ],
        at=2.0,
    )
    assert done == {"j1/0", "j1/1"}
    first, second = store.tasks_of("j1")
    assert (first.status, first.instance_id, first.attempt, first.gpus) == (
        "starting",
        "i-1",
        1,
        (0,),
    )
    assert first.status_since == 2.0  # its status changed
    assert (second.status, second.status_since, second.progress) == ("pending", 0.0, 5.0)
    assert (second.throughput, second.reason) == (2.5, "observed")
    assert store.tasks_of("j2")[0].status == "cancelled"
    with pytest.raises(UnknownEntity):
        store.update_tasks([TaskUpdate("nope/0", status="running")], at=3.0)
    # keep / clear: throughput None clears it, "keep" keeps it
    store.update_tasks([TaskUpdate("j1/1", throughput=None, failures=2)], at=4.0)
    assert (store.tasks_of("j1")[1].throughput, store.tasks_of("j1")[1].failures) == (None, 2)


def test_workers_register_and_are_lost_once_each_with_the_reason(store):
    request(store, "i-1", "small", 1.0, at=0.0)
    assert store.instance_worker("i-1", 5.0, ready=True)
    assert not store.instance_worker("i-1", 6.0, ready=True)
    assert store.instance_worker("i-1", 9.0, ready=False, reason="silent for 60 s")
    assert not store.instance_worker("i-1", 10.0, ready=False, reason="again")
    inst = store.instance("i-1")
    assert (inst.ready_at, inst.lost_at, inst.reason) == (5.0, 9.0, "silent for 60 s")
    with pytest.raises(UnknownEntity):
        store.instance_worker("nope", 1.0, ready=True)


def test_transitions_carry_their_reason(store):
    request(store, "i-1", "small", 1.0, at=0.0)
    store.transition_instance("i-1", "pending", 1.0, cloud_id="c-1", reason="launched as c-1")
    assert store.instance("i-1").reason == "launched as c-1"
    assert store.instance("i-1").entered("pending") == 1.0
    assert store.instance("i-1").entered("running") is None


def test_a_round_and_its_intents_are_recorded_together(store):
    submit(store, "j1", n_tasks=2, at=0.0)
    adopted_round(store, 0.0, requests=[("i-old", "small", 1.0), ("i-never", "small", 1.0)])
    store.transition_instance("i-old", "running", 1.0, cloud_id="c-old")
    intents = RoundIntents(
        requests=(("i-new", "big", 5.0),),
        targets={"j1/0": "i-new", "j1/1": None},
        drains=(("i-old", "the plan no longer uses it"),),
        terminations=(("i-never", "failed", "never booted"),),
    )
    record = RoundRecord(10.0, "eva", "full", True, "why", {"hourly_cost": 5.0}, job_events=1)
    round_id = store.record_round(record, intents)
    assert store.rounds()[-1].round_id == round_id and store.rounds()[-1].job_events == 1
    assert store.instance("i-new").status == "requested"
    assert store.instance("i-new").requested_at == 10.0
    assert (store.instance("i-old").status, store.instance("i-old").reason) == (
        "draining",
        "the plan no longer uses it",
    )
    assert store.instance("i-never").status == "failed"
    assert [t.target_instance_id for t in store.tasks_of("j1")] == ["i-new", None]
    # a dry run records the round alone
    store.record_round(RoundRecord(20.0, "eva", "partial", False, "dry"), None)
    assert store.instance("i-new").status == "requested"


def test_a_round_takes_back_an_instance_it_drained_with_its_reason(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    adopted_round(store, 0.0, requests=[("i-old", "small", 1.0)])
    store.transition_instance("i-old", "running", 1.0, cloud_id="c-old")
    drained = RoundIntents(drains=(("i-old", "the plan no longer uses it"),))
    store.record_round(RoundRecord(10.0, "eva", "full", True, "move"), drained)
    kept = RoundIntents(
        targets={"j1/0": "i-old"}, keeps=(("i-old", "kept: its move's target is gone"),)
    )
    store.record_round(RoundRecord(20.0, "eva", "partial", True, "keep"), kept)
    inst = store.instance("i-old")
    assert (inst.status, inst.reason) == ("running", "kept: its move's target is gone")
    assert [s for s, _ in inst.history][-2:] == ["draining", "running"]
    assert inst.entered("draining") == 10.0
    assert store.tasks_of("j1")[0].target_instance_id == "i-old"


def test_the_snapshot_counts_requests_and_job_events_for_the_next_round(store):
    first = store.snapshot()
    assert (first.instances_requested, first.job_events, first.last_round_job_events) == (
        0,
        0,
        None,
    )
    submit(store, "j1", n_tasks=1, at=0.0)
    submit(store, "j2", n_tasks=1, at=0.0)
    store.record_round(
        RoundRecord(1.0, "eva", "full", True, "", job_events=2),
        RoundIntents(requests=(("i-1", "small", 1.0),)),
    )
    store.job_finished("j1", 2.0)
    snap = store.snapshot()
    assert (snap.instances_requested, snap.job_events, snap.last_round_job_events) == (1, 3, 2)


def test_a_solo_throughput_is_learned_once(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    assert store.learn_solo_throughput("j1", 2.5)
    assert not store.learn_solo_throughput("j1", 3.0)
    assert store.job("j1").solo_throughput == 2.5
    assert store.snapshot().jobs[0].solo_throughput == 2.5


def test_a_failed_job_keeps_its_reason(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    store.job_finished("j1", 5.0, "failed", "task j1/0 failed 3 times; last: exit code 1")
    record = store.job("j1")
    assert (record.status, record.reason) == (
        "failed",
        "task j1/0 failed 3 times; last: exit code 1",
    )


def test_placements_follow_each_task_from_instance_to_instance(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    store.update_tasks([TaskUpdate("j1/0", status="starting", instance_id="i-1", attempt=1)], 10.0)
    store.update_tasks([TaskUpdate("j1/0", status="running")], 20.0)  # same instance: no change
    store.update_tasks([TaskUpdate("j1/0", status="pending", instance_id=None)], 50.0)
    store.update_tasks([TaskUpdate("j1/0", status="starting", instance_id="i-2", attempt=2)], 60.0)
    assert [(p.instance_id, p.attempt, p.start, p.end) for p in store.placements()] == [
        ("i-1", 1, 10.0, 50.0),
        ("i-2", 2, 60.0, None),
    ]
    store.job_finished("j1", 90.0)  # finishing closes what is still open
    assert store.placements()[-1].end == 90.0
    assert [p.instance_id for p in store.placements(since=55.0)] == ["i-2"]


def test_measured_phases_fold_into_a_running_mean_per_type_and_phase(store):
    submit(store, "j1", n_tasks=2, at=0.0)
    assert store.snapshot().delays.means == {}
    store.update_tasks(
        [
            TaskUpdate("j1/0", status="running", phases=(("big", "fetch", 10.0),)),
            TaskUpdate("j1/1", status="running", phases=(("small", "build", 4.0),)),
        ],
        1.0,
    )
    store.update_tasks(
        [TaskUpdate("j1/0", status="pending", phases=(("big", "fetch", 20.0),))], 2.0
    )
    delays = store.snapshot().delays
    assert delays.seconds("big", "fetch") == 15.0  # (10 + 20) / 2
    assert delays.means[("big", "fetch")].observations == 2
    assert delays.seconds("small", "build") == 4.0
    assert delays.seconds("small", "fetch") is None


def test_the_phases_of_a_finished_jobs_update_are_not_measured(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    store.cancel_job("j1", 1.0)
    late = TaskUpdate("j1/0", status="pending", phases=(("big", "upload", 30.0),))
    assert store.update_tasks([late], 2.0) == set()
    assert store.snapshot().delays.means == {}


def test_a_task_moved_twice_in_one_batch_leaves_each_placement_closed(store):
    submit(store, "j1", n_tasks=1, at=0.0)
    store.update_tasks([TaskUpdate("j1/0", status="starting", instance_id="i-1", attempt=1)], 1.0)
    store.update_tasks(
        [
            TaskUpdate("j1/0", instance_id="i-2", attempt=2),
            TaskUpdate("j1/0", status="pending", instance_id=None),
        ],
        5.0,
    )
    assert [(p.instance_id, p.start, p.end) for p in store.placements()] == [
        ("i-1", 1.0, 5.0),
        ("i-2", 5.0, 5.0),
    ]
    assert store.tasks_of("j1")[0].instance_id is None


def test_a_reclaim_marks_the_instance_and_joins_the_interruption_history_once(store):
    request(store, "i-1", "c7i.large:spot@us-east-1a", 0.03, at=0.0)
    request(store, "i-2", "c7i.large:spot@us-east-1a", 0.03, at=0.0)
    request(store, "i-3", "m7i.large:spot", 0.04, at=0.0)
    assert store.instance_notice("i-1", "reclaim", 100.0, "spot interruption notice")
    assert not store.instance_notice("i-1", "reclaim", 105.0, "again")  # once per instance
    assert store.instance_notice("i-2", "rebalance", 150.0, "rebalance recommendation")
    assert store.instance_notice("i-2", "reclaim", 200.0, "spot interruption notice")
    assert store.instance_notice("i-3", "reclaim", 300.0, "spot interruption notice")
    inst = store.instance("i-1")
    assert (inst.reclaimed_at, inst.reason) == (100.0, "spot interruption notice")
    assert store.instance("i-2").reclaimed_at == 200.0  # the rebalance did not mark it
    # Reclaims per offering: the history the observed rates come from.
    assert store.interruption_counts(0.0) == {
        "c7i.large:spot@us-east-1a": 2,
        "m7i.large:spot": 1,
    }
    assert store.interruption_counts(150.0) == {
        "c7i.large:spot@us-east-1a": 1,
        "m7i.large:spot": 1,
    }
    history = store.interruptions()
    assert [(r.instance_id, r.kind, r.at) for r in history] == [
        ("i-1", "reclaim", 100.0),
        ("i-2", "rebalance", 150.0),
        ("i-2", "reclaim", 200.0),
        ("i-3", "reclaim", 300.0),
    ]
    assert history[0].offering == "c7i.large:spot@us-east-1a"
    assert [r.instance_id for r in store.interruptions(since=250.0)] == ["i-3"]
    # The snapshot carries the mark to the round.
    marked = {i.instance_id: i.reclaimed_at for i in store.snapshot().instances}
    assert marked == {"i-1": 100.0, "i-2": 200.0, "i-3": 300.0}
    with pytest.raises(UnknownEntity):
        store.instance_notice("nope", "reclaim", 1.0)


def test_an_instance_keeps_the_on_demand_price_of_its_request(store):
    """Spot savings are measured against the on-demand price of the time of the request,
    so the store keeps it with the instance (None where the round gave none)."""
    intents = RoundIntents(
        requests=(("i-1", "c7i.large:spot", 0.03), ("i-2", "c7i.large", 0.09)),
        on_demand_prices={"i-1": 0.09},
    )
    store.record_round(RoundRecord(10.0, "test", "none", False, "set up"), intents)
    assert store.instance("i-1").on_demand_price == 0.09
    assert store.instance("i-2").on_demand_price is None
    store.transition_instance("i-1", "running", 20.0, cloud_id="c-1")
    store.transition_instance("i-1", "terminated", 30.0)
    kept = {i.instance_id: i.on_demand_price for i in store.instances(include_finished=True)}
    assert kept == {"i-1": 0.09, "i-2": None}


def test_state_counts_are_the_snapshots_counts_and_the_bill_now(store):
    submit(store, "queued", n_tasks=2)
    submit(store, "running", n_tasks=3)
    submit(store, "done", n_tasks=1)
    submit(store, "gone", n_tasks=2)
    store.update_tasks(
        [TaskUpdate(f"running/{i}", status="running", instance_id="i-1") for i in range(3)], 5.0
    )
    store.job_started("running", 5.0)
    store.job_finished("done", 6.0)
    store.cancel_job("gone", 6.0)
    request(store, "i-1", "c7i.large", 0.5, at=1.0)
    request(store, "i-2", "c7i.large", 0.25, at=1.0)
    request(store, "i-3", "p3.2xlarge", 3.0, at=1.0)  # requested: not billed yet
    request(store, "i-4", "p3.2xlarge", 3.0, at=1.0)
    store.transition_instance("i-1", "running", 2.0)
    store.transition_instance("i-2", "pending", 2.0)
    store.transition_instance("i-4", "failed", 2.0)  # not live
    counts = store.state_counts()
    assert dict(counts.jobs) == {"queued": 1, "running": 1}
    assert dict(counts.tasks) == {"pending": 2, "running": 3}
    assert dict(counts.instances) == {
        ("c7i.large", "running"): 1,
        ("c7i.large", "pending"): 1,
        ("p3.2xlarge", "requested"): 1,
    }
    assert counts.hourly_cost == 0.75
    # The same figures as counting a snapshot (what the metrics counted before).
    assert counts == StateCounts.of(store.snapshot(with_throughput=False))


def _ledger(store):
    return [(u.instance_id, u.hourly_price, u.start, u.end) for u in store.uptime()]


def test_a_spot_price_change_closes_the_stretch_and_opens_one_at_the_new_price(store):
    """A running spot instance is billed at the price in effect: each change closes its
    open stretch at the change's time and opens one at the new price; the report, the
    guardrail's sum and the instance's record follow; a replayed change writes nothing."""
    request(store, "i-1", "c7i.large:spot@use1-az1", 0.03, at=HOUR)
    store.transition_instances([InstanceChange("i-1", "running", "c-1", "us-east-1a")], HOUR + 5)
    before = store.snapshot()  # a snapshot taken before: the next one sees the new price
    assert store.reprice_instances([PriceChange("i-1", 0.04, 2 * HOUR)]) == {"i-1"}
    assert _ledger(store) == [("i-1", 0.03, HOUR, 2 * HOUR), ("i-1", 0.04, 2 * HOUR, None)]
    assert store.instance("i-1").hourly_price == 0.04
    assert [i.hourly_price for i in store.snapshot().instances] == [0.04]
    assert [i.hourly_price for i in before.instances] == [0.03]
    assert store.cost_between(0, 3 * HOUR) == pytest.approx(0.03 + 0.04)
    # The same refresh again (a restarted daemon): nothing is written twice.
    assert store.reprice_instances([PriceChange("i-1", 0.04, 2 * HOUR)]) == set()
    # A change older than the open stretch (a replay of an earlier refresh): nothing.
    assert store.reprice_instances([PriceChange("i-1", 0.05, 1.5 * HOUR)]) == set()
    # A change at the stretch's very start re-prices it in place (no empty stretch).
    assert store.reprice_instances([PriceChange("i-1", 0.045, 2 * HOUR)]) == {"i-1"}
    assert _ledger(store) == [("i-1", 0.03, HOUR, 2 * HOUR), ("i-1", 0.045, 2 * HOUR, None)]
    store.transition_instance("i-1", "terminated", 4 * HOUR)
    assert _ledger(store)[-1] == ("i-1", 0.045, 2 * HOUR, 4 * HOUR)
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(0.03 + 2 * 0.045)
    assert store.cost_between(1.5 * HOUR, 2.5 * HOUR) == pytest.approx(0.5 * 0.03 + 0.5 * 0.045)
    # A terminated instance, or one the store does not know, is left alone.
    assert store.reprice_instances([PriceChange("i-1", 1.0, 5 * HOUR)]) == set()
    assert store.reprice_instances([PriceChange("nope", 1.0, 5 * HOUR)]) == set()
    assert store.cost_between(0, 10 * HOUR) == pytest.approx(0.03 + 2 * 0.045)


def test_price_changes_apply_in_time_order_per_instance_in_one_call(store):
    request(store, "a", "p3.2xlarge:spot", 0.9, at=0.0)
    request(store, "b", "p3.2xlarge:spot", 0.9, at=0.0)
    for name in ("a", "b"):
        store.transition_instances([InstanceChange(name, "running", name, "us-east-1b")], 1.0)
    changed = store.reprice_instances(
        [
            PriceChange("a", 1.1, 3 * HOUR),  # listed first, applied second
            PriceChange("a", 1.0, 2 * HOUR),
            PriceChange("b", 0.9, 2 * HOUR),  # the price already billed
        ]
    )
    assert changed == {"a"}
    assert [row for row in _ledger(store) if row[0] == "a"] == [
        ("a", 0.9, 0.0, 2 * HOUR),
        ("a", 1.0, 2 * HOUR, 3 * HOUR),
        ("a", 1.1, 3 * HOUR, None),
    ]
    assert [row for row in _ledger(store) if row[0] == "b"] == [("b", 0.9, 0.0, None)]
    assert store.cost_between(0, 4 * HOUR) == pytest.approx(2 * 0.9 + 1.0 + 1.1 + 4 * 0.9)


def test_refreshed_spot_prices_are_kept_dated_and_only_newer_ones_replace_them(store):
    assert store.spot_prices("us-east-1") is None
    first = RefreshedPrices(
        "us-east-1",
        {"p3.2xlarge": {"use1-az1": 0.95, "use1-az2": 0.91}, "c7i.large": {"use1-az1": 0.03}},
        1000.5,
        "EC2 DescribeSpotPriceHistory",
    )
    assert store.record_spot_prices(first) is True
    assert store.spot_prices("us-east-1") == first
    assert store.spot_prices("eu-west-1") is None
    older = RefreshedPrices("us-east-1", {"p3.2xlarge": {"use1-az1": 2.0}}, 999.0, "old")
    assert store.record_spot_prices(older) is False
    assert store.record_spot_prices(first) is False  # the same refresh again
    assert store.spot_prices("us-east-1") == first
    newer = RefreshedPrices("us-east-1", {"p3.2xlarge": {"use1-az2": 0.8}}, 2000.0, "again")
    assert store.record_spot_prices(newer) is True
    assert store.spot_prices("us-east-1") == newer  # the whole table: az1's old price is gone
    other = RefreshedPrices("eu-west-1", {"c7i.large": {"euw1-az1": 0.04}}, 10.0)
    assert store.record_spot_prices(other) is True
    assert store.spot_prices("us-east-1") == newer and store.spot_prices("eu-west-1") == other
