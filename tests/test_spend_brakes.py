"""The round's spend brakes, one rule a test on fabricated state: orphans count against the
guardrails, the daily budget, the launch rate per type, and the back-off then hold of a
type whose instances boot but never register a worker.

The issue these guard against: an instance whose worker never registers is given up after
`register_s` and relaunched, for ever (a replay of that case launched 19 instances in 6
hours for one task, its job still queued and no failure counted).
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.cloud import CloudInstance, Guardrails
from autoscaler.configuration import Configuration, Instance
from autoscaler.decide import BootBackoff, ControlOptions, boot_failed, boot_holds, decide
from autoscaler.planner import Plan
from autoscaler.store import InstanceRecord
from tests.builders import KeepPlanner
from tests.test_decide import (
    CATALOG,
    TIMEOUTS,
    Placing,
    instance,
    job,
    record,
    round_at,
    snapshot,
)

BACKOFF = BootBackoff(base_s=300.0, hold_after=3, hold_s=6 * 3600.0)


def never_registered(
    instance_id: str, requested_at: float, ended_at: float, *, reason: str = "boot failed"
) -> InstanceRecord:
    """An instance that ran and was terminated before its worker ever registered."""
    return InstanceRecord(
        instance_id,
        "cpu4",
        "terminated",
        CATALOG["cpu4"].hourly_cost,
        requested_at,
        cloud_id=f"i-{instance_id}",
        history=(
            ("requested", requested_at),
            ("pending", requested_at + 1),
            ("running", requested_at + 60),
            ("terminating", ended_at),
            ("terminated", ended_at + 30),
        ),
        reason=reason,
    )


def registered(instance_id: str, requested_at: float) -> InstanceRecord:
    return InstanceRecord(
        instance_id,
        "cpu4",
        "terminated",
        CATALOG["cpu4"].hourly_cost,
        requested_at,
        cloud_id=f"i-{instance_id}",
        history=(("requested", requested_at), ("running", requested_at + 60)),
        ready_at=requested_at + 120,
    )


class OnePerTask:
    """A planner that puts every task on a new cpu4 of its own."""

    name = "one-per-task"

    def plan(self, view):
        instances = tuple(
            Instance(None, CATALOG["cpu4"], (t.task_id,)) for j in view.jobs for t in j.tasks
        )
        return Plan(Configuration(instances), "full", (), 1.0, 0.0, "one per task")


# -- orphans, daily budget, launch rate -------------------------------------------------------


def test_an_orphan_counts_against_the_instance_cap_and_the_hourly_budget():
    snap = snapshot([record(job("a", (0, 2, 8)))])
    orphan = CloudInstance("i-orphan", "cpu8", "running", launched_at_s=0.0)
    options = ControlOptions(timeouts=TIMEOUTS, guardrails=Guardrails(max_instances=1))
    capped = round_at(
        snap, 100.0, planner=Placing(lambda t: "cpu4"), options=options, orphans=[orphan]
    )
    assert not capped.launches and capped.refused[0].rule == "max_instances"
    # $0.40/h of orphan + $0.20/h of the launch > $0.50/h.
    budget = ControlOptions(timeouts=TIMEOUTS, guardrails=Guardrails(max_hourly_spend=0.5))
    refused = round_at(
        snap, 100.0, planner=Placing(lambda t: "cpu4"), options=budget, orphans=[orphan]
    )
    assert [r.rule for r in refused.refused] == ["max_hourly_spend"]
    assert "from $0.40/h to $0.60/h" in refused.refused[0].message
    # Without the orphan the same launch is within the budget.
    assert round_at(snap, 100.0, planner=Placing(lambda t: "cpu4"), options=budget).launches


def test_a_launch_that_would_pass_the_daily_budget_within_the_hour_is_refused():
    snap = snapshot([record(job("a", (0, 2, 8)))], instances=[instance("inst-1")])
    options = ControlOptions(timeouts=TIMEOUTS, guardrails=Guardrails(max_daily_spend=10.0))

    def launch_with(spent: float):
        return decide(
            snap,
            CATALOG,
            (),
            options,
            planner=Placing(lambda t: "cpu4"),
            now=100.0,
            spent_last_day=spent,
        )

    # inst-1 (cpu8, $0.40/h) and the new cpu4 ($0.20/h): $0.60 in the next hour.
    assert launch_with(9.40).launches
    refused = launch_with(9.41)
    assert not refused.launches and refused.refused[0].rule == "max_daily_spend"
    assert "$9.41 spent in the last 24 h" in refused.refused[0].message
    assert "daily budget of $10.00" in refused.refused[0].message


def test_launches_of_one_type_are_bounded_per_hour_whatever_the_plan_asks():
    jobs = [record(job(name, (0, 2, 8))) for name in ("a", "b", "c")]
    earlier = [never_registered("old-1", 1000.0, 1500.0), never_registered("old-2", 3000.0, 3500.0)]
    rails = Guardrails(max_launches_per_type_hour=3)
    options = ControlOptions(timeouts=TIMEOUTS, guardrails=rails)
    decision = decide(
        snapshot(jobs, requested=2),
        CATALOG,
        (),
        options,
        planner=OnePerTask(),
        now=4000.0,
        ended=earlier,
    )
    # Both earlier launches fall in the last hour (requested after t=400): one more only.
    assert [launch.instance_type for launch in decision.launches] == ["cpu4"]
    assert [r.rule for r in decision.refused] == ["max_launches_per_type_hour"] * 2
    assert "2 instance(s) of cpu4 were launched in the last hour" not in decision.refused[0].message
    assert "3 instance(s) of cpu4 were launched in the last hour" in decision.refused[0].message
    later = decide(
        snapshot(jobs, requested=2),
        CATALOG,
        (),
        options,
        planner=OnePerTask(),
        now=4700.0,  # old-1 (requested at 1000) is more than an hour ago now
        ended=earlier,
    )
    assert len(later.launches) == 2


# -- boots that never register ------------------------------------------------------------------


def test_a_boot_failure_is_a_launched_instance_ended_before_its_worker_registered():
    assert boot_failed(never_registered("x", 0.0, 900.0))
    assert not boot_failed(registered("y", 0.0))
    drained = instance("z", "cpu4", "terminated", ready=False)
    drained = InstanceRecord(
        **{**{f: getattr(drained, f) for f in drained.__slots__}, "history": (("draining", 5.0),)}
    )
    assert not boot_failed(drained)  # the plan stopped needing it before it was a worker
    never_launched = instance("w", "cpu4", "failed", ready=False, cloud_id=None)
    assert not boot_failed(never_launched)


def test_each_failed_boot_backs_the_type_off_twice_as_long_then_holds_it():
    one = [never_registered("i1", 0.0, 1000.0, reason="bootstrap: nvidia-smi failed")]
    [hold] = boot_holds(one, 1100.0, BACKOFF)
    assert (hold.instance_type, hold.zone, hold.until_s) == ("cpu4", None, 1300.0)
    assert "backing off: 1 launch(es) in a row" in hold.reason
    assert "last i1: bootstrap: nvidia-smi failed" in hold.reason
    assert boot_holds(one, 1300.0, BACKOFF) == []  # the back-off is over
    two = [*one, never_registered("i2", 1400.0, 2400.0)]
    assert boot_holds(two, 2500.0, BACKOFF)[0].until_s == 2400.0 + 600.0
    three = [*two, never_registered("i3", 3100.0, 4100.0)]
    [held] = boot_holds(three, 4200.0, BACKOFF)
    assert held.until_s == 4100.0 + 6 * 3600.0 and "held: 3 launches in a row" in held.reason


def test_a_worker_of_the_type_registering_ends_the_streak():
    history = [
        never_registered("i1", 0.0, 1000.0),
        never_registered("i2", 1400.0, 2400.0),
        registered("i3", 3000.0),
        never_registered("i4", 4000.0, 5000.0),
    ]
    [hold] = boot_holds(history, 5100.0, BACKOFF)
    assert hold.until_s == 5300.0 and "1 launch(es) in a row" in hold.reason


def test_boots_failing_in_a_row_across_types_hold_every_type_of_the_catalog():
    # Two boots each of three types, one after the other: no type reached its own three,
    # but six in a row, whatever the type, is a cause common to all of them.
    history = [
        replace(never_registered(f"i{n}", n * 1000.0, n * 1000.0 + 900), instance_type=t)
        for n, t in enumerate(["cpu4", "cpu8", "gpu4", "cpu4", "cpu8", "gpu4"])
    ]
    names = [t.name for t in CATALOG]
    holds = boot_holds(history, 6000.0, BACKOFF, names)
    assert sorted(h.instance_type for h in holds) == sorted(names)
    assert all(h.until_s == 5900.0 + BACKOFF.hold_s for h in holds)
    assert "6 launches in a row, of 3 type(s)" in holds[0].reason
    # A worker registering anywhere ends the streak: each type is judged alone again.
    history.insert(3, replace(registered("ok", 3500.0), instance_type="cpu8"))
    alone = boot_holds(history, 6000.0, BACKOFF, names)
    assert alone and all("launch(es) in a row" in h.reason for h in alone)


def held_gpu_decision():
    """A round after three gpu4 boots in a row failed at the NVIDIA driver check, with a
    job only gpu4 hosts."""
    gpu_job = record(job("g", (1, 2, 8)))  # only gpu4 hosts it
    failures = [
        InstanceRecord(
            f"g{n}",
            "gpu4",
            "terminated",
            3.0,
            n * 2000.0,
            cloud_id=f"i-g{n}",
            history=(("running", n * 2000.0 + 60), ("terminating", n * 2000.0 + 1000)),
            reason="the cloud reports it shutting-down before its worker registered: "
            "bootstrap: FAILED while checking the NVIDIA driver",
        )
        for n in range(3)
    ]
    options = ControlOptions(timeouts=TIMEOUTS, boot_backoff=BACKOFF)
    return decide(
        snapshot([gpu_job], requested=3),
        CATALOG,
        (),
        options,
        planner=KeepPlanner(),
        now=6000.0,
        ended=failures,
    )


def test_a_job_whose_only_type_is_held_waits_with_the_cause_and_nothing_is_launched():
    decision = held_gpu_decision()
    assert decision.launches == ()
    assert "held: 3 launches in a row never registered a worker" in decision.infeasible["g/0"]
    assert "FAILED while checking the NVIDIA driver" in decision.infeasible["g/0"]
    assert "gpu4" in decision.numbers["held"]
    assert decision.record().numbers["held"] == decision.numbers["held"]


def test_without_a_back_off_policy_a_round_reads_no_history():
    # Replay runs without one: its figures cannot depend on what ended before.
    failures = [never_registered(f"i{n}", n * 2000.0, n * 2000.0 + 1000) for n in range(3)]
    snap = snapshot([record(job("a", (0, 2, 8)))])
    options = ControlOptions(timeouts=TIMEOUTS)
    with_history = decide(
        snap, CATALOG, (), options, planner=Placing(lambda t: "cpu4"), now=7000.0, ended=failures
    )
    assert [launch.instance_type for launch in with_history.launches] == ["cpu4"]
    assert "held" not in with_history.numbers
