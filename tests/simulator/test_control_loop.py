"""The control loop against the simulated world: guardrails, failures, crashes, dry runs."""

from __future__ import annotations

import pytest

from autoscaler.cloud import Guardrails, InsufficientCapacity, LaunchRequest
from autoscaler.control import ControlLoop, ControlOptions, counter_ids
from autoscaler.planner import planner_by_name
from autoscaler.store import InMemoryStore
from simulator.engine import EventLoop
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from tests.simulator.test_hand_computed import NO_INTERFERENCE, catalog, job


def setup(jobs, options=None, cloud_class=SimulatedCloud):
    engine = EventLoop()
    world = World(engine, catalog(), NO_INTERFERENCE, jobs)
    store = InMemoryStore()
    cloud = cloud_class(world)
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        cloud,
        SimulatedExecutor(world),
        store,
        engine,
        options,
        counter_ids(),
    )
    for j in jobs:
        store.submit_job(j, owner="t", at=0.0)
    return engine, world, store, loop


def test_a_launch_over_budget_is_refused_with_its_numbers_and_nothing_starts():
    # The pair wants one "big" at $5/h; the budget is $4/h.
    _, world, store, loop = setup(
        [job("a", 0, 100), job("b", 0, 100)],
        ControlOptions(guardrails=Guardrails(max_hourly_spend=4.0)),
    )
    outcome = loop.schedule()
    [launch] = [a for a in outcome.record.actions if a.kind == "launch"]
    assert launch.outcome == "refused"
    assert "$5.00/h" in launch.message and "budget of $4.00/h" in launch.message
    assert world.instances == {}
    assert {t.target_instance_id for t in store.tasks_of("a") + store.tasks_of("b")} == {None}
    assert store.rounds()[0].actions[0].outcome == "refused"  # recorded with its reason


def test_instance_cap_lets_some_launches_through():
    # Two jobs that will not share (one needs 2 GPUs on "big", cost-efficient alone
    # at $5 = its RP) plus one on "small": cap 1 instance -> one launch refused.
    two_gpu = job("g", 0, 100, demand=(2, 8, 32))
    _, world, _, loop = setup(
        [two_gpu, job("a", 0, 100)], ControlOptions(guardrails=Guardrails(max_instances=1))
    )
    outcome = loop.schedule()
    launches = [a for a in outcome.record.actions if a.kind == "launch"]
    assert sorted(a.outcome for a in launches) == ["done", "refused"]
    assert len(world.instances) == 1
    assert "over the limit of 1" in next(a.message for a in launches if a.outcome == "refused")


class NoCapacityForBig(SimulatedCloud):
    def launch(self, request: LaunchRequest):
        if request.instance_type == "big":
            raise InsufficientCapacity("big", ["us-east-1a"], "InsufficientInstanceCapacity")
        return super().launch(request)


def test_no_capacity_fails_the_launch_and_plans_around_the_type_for_a_while():
    engine, world, store, loop = setup(
        [job("a", 0, 5000), job("b", 0, 5000)], cloud_class=NoCapacityForBig
    )
    first = loop.schedule()
    [launch] = [a for a in first.record.actions if a.kind == "launch"]
    assert launch.outcome == "failed"
    assert store.rounds()[0].actions[0].outcome == "failed"  # the store has the outcome too
    assert "InsufficientCapacity" in store.rounds()[0].actions[0].message
    assert [i.status for i in store.instances(include_finished=True)] == ["failed"]
    # 60 s later "big" is still cooling down: the plan uses two "small" instead
    engine.at(60.0, lambda: None)
    engine.run()
    second = loop.schedule()
    types = sorted(a.detail["type"] for a in second.record.actions if a.kind == "launch")
    assert types == ["small", "small"]
    assert len(world.instances) == 2


def test_a_crash_between_launch_and_record_is_adopted_not_launched_twice():
    _, world, store, loop = setup([job("a", 0, 5000)])
    # The previous process recorded the request and the cloud started the
    # instance, but the process died before recording the cloud's answer.
    store.request_instance("inst-1", "small", 3.0, at=0.0)
    world.launch(LaunchRequest("small", "inst-1"))
    store.assign_tasks({"a/0": "inst-1"}, 0.0)
    loop.schedule()
    record = store.instance("inst-1")
    assert record.status == "pending" and record.cloud_id == world.instances["inst-1"].cloud_id
    assert len(world.instances) == 1


def test_a_crash_before_the_launch_call_retries_with_the_same_token():
    _, world, store, loop = setup([job("a", 0, 5000)])
    store.request_instance("inst-7", "small", 3.0, at=0.0)
    store.assign_tasks({"a/0": "inst-7"}, 0.0)
    loop.schedule()
    assert "inst-7" in world.instances
    assert store.instance("inst-7").cloud_id == world.instances["inst-7"].cloud_id
    assert sum(1 for i in world.instances.values() if i.token == "inst-7") == 1


def test_dry_run_decides_and_records_but_changes_nothing():
    _, world, store, loop = setup([job("a", 0, 100)], ControlOptions(dry_run=True))
    outcome = loop.schedule()
    assert [a.kind for a in outcome.record.actions] == ["launch", "start"]
    assert world.instances == {} and store.instances() == []
    assert store.rounds()[0].numbers["hourly_cost"] == pytest.approx(3.0)


def test_a_cancelled_job_is_stopped_and_its_instance_released():
    engine, world, store, loop = setup([job("a", 0, 50_000)])
    engine.after_batch = loop.progress
    engine.at(0.0, loop.schedule)
    engine.at(600.0, lambda: store.cancel_job("a", 600.0))
    engine.at(900.0, loop.schedule)
    engine.run()
    assert store.job("a").status == "cancelled"
    assert world.tasks["a/0"].state == "stopped"
    assert [i.state for i in world.instances.values()] == ["terminated"]
    # billed from 0 until the round at 900 drained it and it terminated 1 s later
    assert store.cost_between(0, 10_000) == pytest.approx(901 / 3600 * 3.0)
