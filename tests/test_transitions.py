"""The state's transition and ledger rules, one rule a test, on fabricated records
(as Ray autoscaler v2's reconciler tests build instances and assert each new status)."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler import transitions
from autoscaler.store import (
    IllegalTransition,
    InstanceChange,
    InstanceRecord,
    JobRecord,
    Placement,
    TaskRecord,
    TaskUpdate,
    UptimeInterval,
)
from autoscaler.view import MAX_DELAY_OBSERVATIONS, MeasuredDelay, MeasuredDelays
from tests.builders import job


def a_job(status="queued", **fields) -> JobRecord:
    return JobRecord(job("j", (0, 1, 1), (0, 1, 1)), status, "ana", 0.0, **fields)


def a_task(task_id="j/0", **fields) -> TaskRecord:
    return TaskRecord(task_id, "j", **fields)


def an_instance(status="requested", **fields) -> InstanceRecord:
    return InstanceRecord("i-1", "big", status, 2.0, 10.0, history=(("requested", 10.0),), **fields)


# -- jobs -------------------------------------------------------------------------------------


def test_a_submitted_job_is_queued_with_its_tasks_pending_since_then():
    record, tasks = transitions.submitted_job(job("j", (0, 1, 1), (0, 1, 1)), "ana", 5.0)
    assert (record.status, record.owner, record.submitted_at) == ("queued", "ana", 5.0)
    assert [(t.task_id, t.status, t.status_since, t.updated_at) for t in tasks] == [
        ("j/0", "pending", 5.0, 5.0),
        ("j/1", "pending", 5.0, 5.0),
    ]


def test_a_job_starts_once():
    started = transitions.start_job(a_job(), 7.0)
    assert started is not None and (started.status, started.started_at) == ("running", 7.0)
    assert transitions.start_job(started, 9.0) is None


def test_a_finished_job_does_not_start():
    assert transitions.start_job(a_job("cancelled"), 7.0) is None


@pytest.mark.parametrize(
    ("status", "task_status"),
    [("completed", "completed"), ("failed", "failed"), ("cancelled", "cancelled")],
)
def test_a_job_that_ends_ends_its_tasks_and_clears_their_targets(status, task_status):
    tasks = (a_task("j/0", status="running", target_instance_id="i-1"), a_task("j/1"))
    end = transitions.finish_job(a_job("running"), tasks, status, "why", 50.0)
    assert end is not None
    assert (end.job.status, end.job.finished_at, end.job.reason) == (status, 50.0, "why")
    assert [(t.status, t.target_instance_id, t.status_since) for t in end.tasks] == [
        (task_status, None, 50.0),
        (task_status, None, 50.0),
    ]


def test_a_job_that_ends_closes_the_placements_of_the_tasks_on_an_instance():
    tasks = (a_task("j/0", status="running", instance_id="i-1"), a_task("j/1"))
    end = transitions.finish_job(a_job("running"), tasks, "completed", "", 50.0)
    assert end is not None and end.leaves == ("j/0",)
    assert end.tasks[0].instance_id == "i-1"  # it still names where it ran


def test_finished_is_final_for_a_job():
    assert transitions.finish_job(a_job("completed"), (), "failed", "late", 60.0) is None


def test_a_solo_throughput_is_learned_once():
    learned = transitions.learn_solo_throughput(a_job(), 2.5)
    assert learned is not None and learned.solo_throughput == 2.5
    assert transitions.learn_solo_throughput(learned, 3.0) is None


# -- tasks ------------------------------------------------------------------------------------


def test_a_plan_retargets_a_task():
    new = transitions.retarget_task("running", a_task(target_instance_id="i-1"), "i-2", 4.0)
    assert new is not None and (new.target_instance_id, new.updated_at) == ("i-2", 4.0)


def test_a_target_already_as_asked_leaves_the_task_as_it_is():
    task = a_task(target_instance_id="i-1", updated_at=1.0)
    assert transitions.retarget_task("running", task, "i-1", 4.0) == task


def test_finished_is_final_for_a_tasks_target():
    assert transitions.retarget_task("cancelled", a_task(), "i-1", 4.0) is None


def test_an_update_keeps_what_it_does_not_name():
    task = a_task(status="running", instance_id="i-1", progress=5.0, checkpoint="c", throughput=2.0)
    step = transitions.update_task("running", task, TaskUpdate("j/0", reason="observed"), 3.0)
    assert step is not None
    new = step.task
    assert (new.status, new.instance_id, new.progress, new.checkpoint, new.throughput) == (
        "running",
        "i-1",
        5.0,
        "c",
        2.0,
    )
    assert (new.reason, new.updated_at) == ("observed", 3.0)


def test_an_update_clears_what_it_sets_to_none():
    task = a_task(status="running", instance_id="i-1", throughput=2.0)
    change = TaskUpdate("j/0", status="pending", instance_id=None, throughput=None)
    step = transitions.update_task("running", task, change, 3.0)
    assert step is not None and (step.task.instance_id, step.task.throughput) == (None, None)


def test_a_change_of_status_resets_status_since_and_no_other_change_does():
    task = a_task(status="running", status_since=1.0)
    same = transitions.update_task("running", task, TaskUpdate("j/0", progress=9.0), 5.0)
    moved = transitions.update_task("running", task, TaskUpdate("j/0", status="pending"), 5.0)
    assert same is not None and same.task.status_since == 1.0
    assert moved is not None and moved.task.status_since == 5.0


def test_a_task_that_moves_leaves_its_placement_and_enters_the_next():
    task = a_task(status="running", instance_id="i-1", attempt=1)
    change = TaskUpdate("j/0", status="starting", instance_id="i-2", attempt=2)
    step = transitions.update_task("running", task, change, 8.0)
    assert step is not None and step.leaves
    assert step.enters == Placement("j/0", "j", "i-2", 2, 8.0)


def test_a_task_that_stays_on_its_instance_writes_no_placement():
    task = a_task(status="starting", instance_id="i-1", attempt=1)
    step = transitions.update_task("running", task, TaskUpdate("j/0", status="running"), 8.0)
    assert step is not None and (step.leaves, step.enters) == (False, None)


def test_a_task_placed_for_the_first_time_leaves_nothing():
    change = TaskUpdate("j/0", status="starting", instance_id="i-1", attempt=1)
    step = transitions.update_task("queued", a_task(), change, 8.0)
    assert step is not None and not step.leaves and step.enters is not None


def test_finished_is_final_for_a_tasks_update():
    change = TaskUpdate("j/0", status="running", phases=(("big", "fetch", 3.0),))
    assert transitions.update_task("failed", a_task(), change, 8.0) is None


def test_an_update_carries_its_measured_phases():
    change = TaskUpdate("j/0", status="running", phases=(("big", "fetch", 3.0),))
    step = transitions.update_task("running", a_task(status="starting"), change, 8.0)
    assert step is not None and step.measured == (("big", "fetch", 3.0),)


# -- instances --------------------------------------------------------------------------------


def test_a_requested_instance_starts_its_history_at_the_price_of_the_time():
    inst = transitions.request_instance("i-1", "big", 2.0, 10.0)
    assert (inst.status, inst.hourly_price, inst.requested_at) == ("requested", 2.0, 10.0)
    assert inst.history == (("requested", 10.0),)


def test_a_transition_appends_to_the_history_with_its_reason():
    step = transitions.transition_instance(
        an_instance(), InstanceChange("i-1", "pending", "c-1", "z-a", "launched"), 11.0
    )
    assert step is not None
    inst = step.instance
    assert (inst.status, inst.cloud_id, inst.zone, inst.reason) == (
        "pending",
        "c-1",
        "z-a",
        "launched",
    )
    assert inst.history == (("requested", 10.0), ("pending", 11.0))


def test_a_transition_keeps_the_cloud_id_and_zone_it_does_not_give():
    inst = an_instance("pending", cloud_id="c-1", zone="z-a")
    step = transitions.transition_instance(inst, InstanceChange("i-1", "running"), 12.0)
    assert step is not None and (step.instance.cloud_id, step.instance.zone) == ("c-1", "z-a")


def test_a_transition_keeps_every_field_it_does_not_set():
    # The record is built field by field (a first round answers thousands of launches):
    # a field added to InstanceRecord and forgotten there would silently fall back to
    # its default. Every field gets a value unlike its default; only the ones a
    # transition sets may change.
    sets = {"status", "history", "reason", "hourly_price"}
    values = {
        "cloud_id": "c-1",
        "zone": "z-a",
        "ready_at": 12.5,
        "lost_at": 13.5,
        "private_address": "10.0.0.7",
        "reclaimed_at": 14.5,
        "on_demand_price": 3.25,
    }
    unset = {
        f.name
        for f in dataclasses.fields(InstanceRecord)
        if f.default is not dataclasses.MISSING and f.name not in sets | {"history"}
    }
    assert unset <= set(values), f"give the new field(s) {unset - set(values)} a value here"
    inst = an_instance("running", **values)
    step = transitions.transition_instance(inst, InstanceChange("i-1", "draining"), 20.0)
    assert step is not None
    for f in dataclasses.fields(InstanceRecord):
        if f.name not in sets:
            assert getattr(step.instance, f.name) == getattr(inst, f.name), f.name


def test_a_transition_to_the_current_status_is_no_transition():
    assert (
        transitions.transition_instance(an_instance(), InstanceChange("i-1", "requested"), 11.0)
        is None
    )


def test_a_transition_the_status_machine_forbids_is_refused():
    with pytest.raises(IllegalTransition) as refused:
        transitions.transition_instance(
            an_instance("terminated"), InstanceChange("i-1", "running"), 11.0
        )
    assert (refused.value.current, refused.value.wanted) == ("terminated", "running")


def test_billing_starts_from_the_request_at_the_price_of_the_request():
    step = transitions.transition_instance(an_instance(), InstanceChange("i-1", "pending"), 30.0)
    assert step is not None and step.opens == UptimeInterval("i-1", "big", 2.0, 10.0)
    assert not step.closes


def test_billing_stops_when_the_instance_is_gone():
    inst = an_instance("terminating")
    step = transitions.transition_instance(inst, InstanceChange("i-1", "terminated"), 90.0)
    assert step is not None and step.closes and step.opens is None


def test_a_launch_the_cloud_refused_is_never_billed():
    step = transitions.transition_instance(an_instance(), InstanceChange("i-1", "failed"), 11.0)
    assert step is not None and (step.opens, step.closes) == (None, False)


def test_draining_and_back_neither_opens_nor_closes_billing():
    for status, to in (("running", "draining"), ("draining", "running")):
        step = transitions.transition_instance(an_instance(status), InstanceChange("i-1", to), 50.0)
        assert step is not None and (step.opens, step.closes) == (None, False)


def test_a_worker_registers_once_and_is_lost_once_with_the_reason():
    ready = transitions.instance_worker(an_instance("running"), 20.0, ready=True)
    assert ready is not None and ready.ready_at == 20.0
    assert transitions.instance_worker(ready, 21.0, ready=True) is None
    lost = transitions.instance_worker(ready, 30.0, ready=False, reason="silent")
    assert lost is not None and (lost.lost_at, lost.reason) == (30.0, "silent")
    assert transitions.instance_worker(lost, 31.0, ready=False, reason="again") is None


# -- measured delays --------------------------------------------------------------------------


def test_measured_delays_are_a_running_mean_per_type_and_phase():
    delays = MeasuredDelays().observed(
        [("big", "fetch", 10.0), ("big", "fetch", 20.0), ("small", "fetch", 1.0)]
    )
    assert delays.seconds("big", "fetch") == 15.0
    assert delays.seconds("small", "fetch") == 1.0
    assert delays.seconds("big", "build") is None and delays.seconds(None, "fetch") is None


def test_a_measured_delays_mean_counts_a_bounded_number_of_observations():
    full = MeasuredDelay(10.0, MAX_DELAY_OBSERVATIONS)
    after = full.observed(10.0 + MAX_DELAY_OBSERVATIONS)
    assert after.observations == MAX_DELAY_OBSERVATIONS
    assert after.mean_s == pytest.approx(11.0)  # the new one weighs 1/MAX


@pytest.mark.parametrize("job_status", ["queued", "running", "completed", "cancelled"])
@pytest.mark.parametrize("current", [None, "i-1"])
@pytest.mark.parametrize("target", [None, "i-1", "i-2"])
def test_retargets_says_exactly_when_retarget_task_writes(job_status, current, target):
    """The SQL store decides a plan's moves from two columns (`retargets`); the rule on the
    whole task must agree, and change only the target and `updated_at`."""
    before = a_task(target_instance_id=current, updated_at=1.0)
    after = transitions.retarget_task(job_status, before, target, 5.0)
    writes = after is not None and after != before
    assert transitions.retargets(job_status, current, target) == writes
    if writes:
        assert after == a_task(target_instance_id=target, updated_at=5.0)
