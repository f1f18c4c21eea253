"""A reclaimed spot instance in the round and the step, one rule a test, on fabricated state.

From its notice on (`InstanceRecord.reclaimed_at`) nothing is planned or started
on it; it is terminated once its tasks have left it, or once the provider's
two-minute window is over, whichever comes first; the round records it with
its offering.
"""

from __future__ import annotations

import dataclasses

from autoscaler.decide import RECLAIM_WINDOW_S, InstanceAction
from tests.builders import KeepPlanner
from tests.test_decide import (
    Placing,
    instance,
    job,
    record,
    round_at,
    snapshot,
    step_at,
    task,
)

NOTICE = "spot interruption notice (terminate at 2026-11-26T19:02:00Z) for cpu8"


def reclaimed(instance_id: str, at: float = 100.0):
    return dataclasses.replace(instance(instance_id), reclaimed_at=at, reason=NOTICE)


def test_a_reclaimed_instance_is_not_planned_on_and_its_tasks_are_placed_anew():
    spec = job("a", (0, 2, 8))
    leaving = task("a/0", "checkpointing", on="inst-1", target="inst-1", attempt=1)
    planner = Placing(lambda t: "cpu4")  # a new instance for it
    decision = round_at(
        snapshot([record(spec)], [leaving], [reclaimed("inst-1")]), 110.0, planner=planner
    )
    [view] = planner.views
    assert [i.instance_id for i in view.current] == []  # the planner does not see it
    assert decision.targets["a/0"] != "inst-1"
    assert [launch.instance_type for launch in decision.launches] == ["cpu4"]
    assert decision.numbers["reclaimed"] == {
        "inst-1": {"offering": "cpu8", "at": 100.0, "reason": NOTICE}
    }


def test_a_reclaimed_instance_waits_for_its_tasks_to_leave_within_the_window():
    spec = job("a", (0, 2, 8))
    leaving = task("a/0", "checkpointing", on="inst-1", target="inst-1", attempt=1)
    snap = snapshot([record(spec)], [leaving], [reclaimed("inst-1")])
    assert step_at(snap, 100.0 + RECLAIM_WINDOW_S).terminations == ()
    [action] = step_at(snap, 100.0 + RECLAIM_WINDOW_S + 1).terminations
    assert action == InstanceAction("inst-1", f"reclaimed by its provider (cpu8): {NOTICE}")


def test_an_emptied_reclaimed_instance_is_terminated_at_once():
    spec = job("a", (0, 2, 8))
    left = task("a/0", "pending", attempt=1, checkpoint="jobs/a/a/0/1/checkpoint-5.tar.gz")
    snap = snapshot([record(spec)], [left], [reclaimed("inst-1"), instance("inst-2")])
    [action] = step_at(snap, 101.0).terminations
    assert action.instance_id == "inst-1" and action.status == "terminating"
    decision = round_at(snap, 101.0, planner=KeepPlanner())
    assert [t.instance_id for t in decision.terminations] == ["inst-1"]


def test_a_step_starts_nothing_on_a_reclaimed_instance():
    spec = job("a", (0, 2, 8))
    pending = task("a/0", "pending", target="inst-1")
    snap = snapshot([record(spec)], [pending], [reclaimed("inst-1")])
    assert step_at(snap, 101.0).starts == ()
    # The same instance without a notice takes it.
    fine = snapshot([record(spec)], [pending], [instance("inst-1")])
    assert [s.instance_id for s in step_at(fine, 101.0).starts] == ["inst-1"]
