"""The round as a reconciler, against the simulated world: guardrails, failures, crashes,
dry runs, timeouts, and nothing the loop needs kept only in its memory.

Each test names a defect the round logic once had, and failed on it.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.catalog import Catalog, InstanceType, LaunchDelays
from autoscaler.cloud import Guardrails, LaunchRequest
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.decide import Timeouts
from autoscaler.execution import ResourceLimits, TaskLaunch
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from simulator.engine import EventLoop
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from state.memory import InMemoryStore
from tests.simulator.test_hand_computed import NO_INTERFERENCE, catalog, job
from tests.store_writes import adopted_round, request


class Recording(SimulatedExecutor):
    """The simulated executor, counting the calls the loop makes."""

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.stops: list[tuple[str, int]] = []
        self.starts: list[tuple[str, int, str]] = []

    def start(self, launch: TaskLaunch) -> None:
        self.starts.append((launch.task_id, launch.attempt, launch.instance_id))
        super().start(launch)

    def stop(self, task_id: str, attempt: int) -> None:
        self.stops.append((task_id, attempt))
        super().stop(task_id, attempt)


class Cluster:
    """A simulated world, its bindings, a store, and a way to (re)build the control loop."""

    def __init__(self, jobs, options=None, cat: Catalog | None = None) -> None:
        self.engine = EventLoop()
        self.world = World(self.engine, cat or catalog(), NO_INTERFERENCE, jobs)
        self.store = InMemoryStore()
        self.cloud = SimulatedCloud(self.world)
        self.executor = Recording(self.world)
        self.options = options or ControlOptions()
        for j in jobs:
            self.store.submit_job(j, owner="t", at=0.0)

    def loop(self) -> ControlLoop:
        """A control loop built from nothing but the bindings: as after a restart."""
        return ControlLoop(
            planner_by_name("eva", lower_bound=False),
            self.cloud,
            self.executor,
            self.store,
            self.engine,
            self.options,
        )

    def until(self, t: float) -> None:
        """Run the world's events up to time t (inclusive)."""
        self.engine.at(t, lambda: None)
        self.engine.run(until=lambda: self.engine.now() >= t)

    def drive(self, loop: ControlLoop | None = None) -> None:
        """Let the loop carry out its plan as the world moves (as the daemon's steps do)."""
        self.engine.after_batch = (loop or self.loop()).progress


# -- guardrails and launches -------------------------------------------------------------------


def test_a_launch_over_budget_is_refused_with_its_numbers_and_nothing_starts():
    # The pair wants one "big" at $5/h; the budget is $4/h.
    c = Cluster(
        [job("a", 0, 100), job("b", 0, 100)],
        ControlOptions(guardrails=Guardrails(max_hourly_spend=4.0)),
    )
    outcome = c.loop().schedule()
    [launch] = [a for a in outcome.record.actions if a.kind == "launch"]
    assert launch.outcome == "refused"
    assert "$5.00/h" in launch.message and "budget of $4.00/h" in launch.message
    assert c.world.instances == {}
    assert {t.target_instance_id for t in c.store.tasks_of("a") + c.store.tasks_of("b")} == {None}
    assert c.store.rounds()[0].actions[0].outcome == "refused"  # recorded with its reason


def test_instance_cap_lets_some_launches_through():
    # Two jobs that will not share (one needs 2 GPUs on "big", cost-efficient alone
    # at $5 = its RP) plus one on "small": cap 1 instance -> one launch refused.
    two_gpu = job("g", 0, 100, demand=(2, 8, 32))
    c = Cluster([two_gpu, job("a", 0, 100)], ControlOptions(guardrails=Guardrails(max_instances=1)))
    outcome = c.loop().schedule()
    launches = [a for a in outcome.record.actions if a.kind == "launch"]
    assert sorted(a.outcome for a in launches) == ["done", "refused"]
    assert len(c.world.instances) == 1
    assert "over the limit of 1" in next(a.message for a in launches if a.outcome == "refused")


def test_the_budget_counts_instances_recorded_by_an_earlier_process():
    # A previous daemon requested inst-1 ($3/h) for a; it is in the state, not in this
    # process's memory. g needs "big" ($5/h): $8/h is over the $7/h budget.
    g = job("g", 0, 100, demand=(2, 8, 32))
    c = Cluster([job("a", 0, 5000), g], ControlOptions(guardrails=Guardrails(max_hourly_spend=7.0)))
    adopted_round(c.store, 0.0, requests=[("inst-1", "small", 3.0)], targets={"a/0": "inst-1"})
    record = c.loop().schedule().record
    [refused] = [a for a in record.actions if a.kind == "launch" and a.outcome == "refused"]
    assert refused.detail["type"] == "big"
    assert "from $3.00/h to $8.00/h, over the budget of $7.00/h" in refused.message
    assert set(c.world.instances) == {"inst-1"}  # adopted by token, nothing else launched


def test_a_crash_between_launch_and_record_is_adopted_not_launched_twice():
    c = Cluster([job("a", 0, 5000)])
    # The previous process recorded the request and the cloud started the
    # instance, but the process died before recording the cloud's answer.
    adopted_round(c.store, 0.0, requests=[("inst-1", "small", 3.0)], targets={"a/0": "inst-1"})
    c.world.launch(LaunchRequest("small", "inst-1"))
    c.loop().schedule()
    record = c.store.instance("inst-1")
    assert record.status == "pending" and record.cloud_id == c.world.instances["inst-1"].cloud_id
    assert len(c.world.instances) == 1


def test_a_crash_before_the_launch_call_retries_with_the_same_token():
    c = Cluster([job("a", 0, 5000)])
    adopted_round(c.store, 0.0, requests=[("inst-7", "small", 3.0)], targets={"a/0": "inst-7"})
    c.loop().schedule()
    assert "inst-7" in c.world.instances
    assert c.store.instance("inst-7").cloud_id == c.world.instances["inst-7"].cloud_id
    assert sum(1 for i in c.world.instances.values() if i.token == "inst-7") == 1


def test_launch_tokens_continue_the_stores_numbering_after_a_restart():
    c = Cluster([job("a", 0, 5000)])
    request(c.store, "inst-1", "small", 3.0, at=0.0)
    c.store.transition_instance("inst-1", "failed", 0.0)
    record = c.loop().schedule().record
    assert [a.target for a in record.actions if a.kind == "launch"] == ["inst-2"]


# -- [6] observe changes nothing; dry run -------------------------------------------------------


def test_dry_run_records_the_decision_and_changes_nothing_in_the_world():
    # A dry run used to terminate an orphan and retry an unconfirmed launch.
    c = Cluster([job("a", 0, 100)], ControlOptions(dry_run=True))
    orphan = c.world.launch(LaunchRequest("small", "not-in-the-state"))
    request(c.store, "inst-1", "small", 3.0, at=0.0)  # recorded, never launched
    c.until(400.0)  # the orphan is old enough to be terminated under the policy
    c.options = dataclasses.replace(
        c.options, orphans=dataclasses.replace(c.options.orphans, action="terminate")
    )
    loop = c.loop()
    outcome = loop.schedule()
    loop.progress()
    assert orphan.state == "running" and orphan.terminated_at is None
    assert set(c.world.instances) == {"not-in-the-state"}  # inst-1 was not launched
    kinds = [(a.kind, a.outcome) for a in outcome.record.actions]
    assert ("terminate", "planned") in kinds  # decided and recorded, not done
    assert c.store.rounds()[-1].numbers["hourly_cost"] == pytest.approx(3.0)
    assert c.executor.starts == [] and c.executor.stops == []


# -- [6] plans from the snapshot taken after sync -----------------------------------------------


def test_an_instance_that_vanished_is_not_planned_on():
    # The round used to read its snapshot before marking a vanished
    # instance terminated, and placed the task on the dead instance again.
    c = Cluster([job("a", 0, 5000)])
    c.loop().schedule()  # a -> inst-1 (ready at 100)
    c.until(50.0)
    first = c.world.instances["inst-1"]
    c.world.terminate(first.cloud_id)  # gone behind the loop's back
    c.until(60.0)
    record = c.loop().schedule().record
    assert c.store.instance("inst-1").status == "terminated"
    assert c.store.instance("inst-1").reason.startswith("the cloud no longer lists it")
    launches = [a for a in record.actions if a.kind == "launch"]
    assert [(a.target, a.outcome) for a in launches] == [("inst-2", "done")]
    assert c.store.tasks_of("a")[0].target_instance_id == "inst-2"


# -- [6] one unplaceable task does not stop the round ---------------------------------------------


def test_a_task_nothing_available_can_host_waits_and_the_round_goes_on():
    # After a capacity error on the only type that fits g, the next round
    # raised "fits no instance type" and planned nobody.
    g = job("g", 0, 5000, demand=(2, 8, 32))  # only "big" fits it
    c = Cluster([g, job("a", 0, 5000)])
    c.world.no_capacity.add("big")
    first = c.loop().schedule().record
    assert [
        a.outcome for a in first.actions if a.kind == "launch" and a.detail["type"] == "big"
    ] == ["failed"]
    c.until(60.0)
    second = c.loop().schedule().record  # a new loop: the cool-down is the cloud's, not its
    waiting = second.numbers["infeasible"]
    assert set(waiting) == {"g/0"}
    assert "fits no instance type available now" in waiting["g/0"] and "big" in waiting["g/0"]
    assert c.store.tasks_of("a")[0].target_instance_id is not None
    assert c.store.tasks_of("g")[0].target_instance_id is None
    c.world.no_capacity.clear()
    c.until(60.0 + 181.0)  # the cool-down is over: g is planned again
    third = c.loop().schedule().record
    assert "infeasible" not in third.numbers
    assert c.store.tasks_of("g")[0].target_instance_id is not None


# -- [6] nothing that matters lives only in memory -------------------------------------------------


def test_the_first_round_after_a_restart_is_not_counted_as_an_event():
    c = Cluster([job("a", 0, 50_000)])
    c.loop().schedule()
    c.until(300.0)
    c.loop().schedule()  # nothing arrived or completed
    c.until(600.0)
    c.loop().schedule()  # a fresh loop: a restarted daemon
    assert [r.had_event for r in c.store.rounds()] == [True, False, False]


def test_a_task_already_checkpointing_is_not_asked_to_stop_twice_after_a_restart():
    c = Cluster([job("a", 0, 50_000)])
    loop = c.loop()
    c.drive(loop)
    loop.schedule()
    c.until(200.0)  # a runs on inst-1
    adopted_round(c.store, 200.0, targets={"a/0": None})  # a plan that no longer wants it
    loop.progress()
    assert c.executor.stops == [("a/0", 1)]
    assert c.store.tasks_of("a")[0].status == "checkpointing"
    c.loop().progress()  # restarted while the checkpoint uploads
    assert c.executor.stops == [("a/0", 1)]


def test_the_event_rate_and_full_share_come_from_recorded_rounds():
    c = Cluster([job("a", 0, 50_000), job("b", 0, 50_000)])
    c.drive()
    for t in (0.0, 300.0, 600.0):
        c.until(t)
        c.loop().schedule()
    snap = c.store.snapshot()
    history = snap.history(600.0)
    assert (history.elapsed_s, history.event_rounds) == (600.0, 1)
    assert history.full_rounds == sum(
        1 for r in c.store.rounds() if r.had_event and r.chosen == "full"
    )


def test_one_identity_per_instance_outside_the_cloud_binding():
    c = Cluster([job("a", 0, 5000)])
    c.drive()
    c.loop().schedule()
    c.until(200.0)
    [inst] = c.store.instances()
    cloud_id = c.world.instances["inst-1"].cloud_id
    assert (inst.instance_id, inst.cloud_id) == ("inst-1", cloud_id)
    assert c.executor.starts == [("a/0", 1, "inst-1")]  # the executor is told our id
    assert c.store.tasks_of("a")[0].instance_id == "inst-1"
    assert cloud_id != "inst-1"


# -- [6] timeouts, with recorded reasons -----------------------------------------------------------


def slow_catalog(acquisition_s=20.0, setup_s=80.0) -> Catalog:
    delays = LaunchDelays(acquisition_s=acquisition_s, setup_s=setup_s, terminate_s=1.0)
    return Catalog([InstanceType("small", "f", Resources(1, 4, 16), 3.0, delays)])


def test_an_instance_that_never_boots_is_given_up_with_its_reason():
    c = Cluster(
        [job("a", 0, 5000)],
        ControlOptions(timeouts=Timeouts(boot_s=600.0)),
        slow_catalog(acquisition_s=10_000.0),
    )
    c.drive()
    c.loop().schedule()
    c.until(700.0)
    c.loop().progress()
    inst = c.store.instance("inst-1")
    assert inst.status in ("terminating", "terminated")
    assert "after its launch request (limit 600 s)" in inst.reason
    c.until(900.0)
    c.loop().schedule()  # the task is planned anew
    assert c.store.tasks_of("a")[0].target_instance_id == "inst-2"


def test_an_instance_whose_worker_never_registers_is_given_up():
    c = Cluster(
        [job("a", 0, 5000)],
        ControlOptions(timeouts=Timeouts(register_s=300.0)),
        slow_catalog(setup_s=10_000.0),
    )
    c.drive()
    c.loop().schedule()
    c.until(400.0)  # running since 20 s, no worker
    c.loop().progress()
    inst = c.store.instance("inst-1")
    assert inst.status in ("terminating", "terminated")
    assert "did not register within 300 s" in inst.reason


def slow_build_job(job_id: str):
    base = job(job_id, 0, 5000)
    task = dataclasses.replace(base.tasks[0], build_image_s=10_000.0)
    return dataclasses.replace(base, tasks=(task,))


def test_a_task_stuck_starting_is_retried_then_fails_its_job_with_the_last_reason():
    c = Cluster(
        [slow_build_job("a")],
        ControlOptions(timeouts=Timeouts(start_s=600.0), max_attempts=3),
    )
    c.drive()
    c.loop().schedule()
    # Each attempt gives up 600 s after it started; the next starts after its back-off
    # (10 s, then 20 s).
    for t in (800.0, 811.0, 1500.0, 1521.0, 2200.0):
        c.until(t)
        c.loop().progress()
    assert [attempt for _, attempt, _ in c.executor.starts] == [1, 2, 3]
    assert ("a/0", 1) in c.executor.stops
    record = c.store.job("a")
    assert record.status == "failed"
    assert "failed 3 times" in record.reason and "still starting after" in record.reason


def test_a_task_that_keeps_crashing_fails_its_job_instead_of_retrying_forever():
    c = Cluster([job("a", 0, 50_000)], ControlOptions(max_attempts=3))
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    for n in range(3):
        c.world.crash("a/0", f"exit code 1 (crash {n + 1})")
        c.until(c.engine.now() + 1)
        c.until(c.engine.now() + 50)  # past its back-off (10 s, then 20 s)
        c.loop().progress()  # the daemon's periodic step
        c.until(c.engine.now() + 10)
    record = c.store.job("a")
    assert record.status == "failed"
    assert record.reason == (
        "task a/0 failed 3 times; last: attempt 3 failed (transient): exit code 1 (crash 3)"
    )
    assert [attempt for _, attempt, _ in c.executor.starts] == [1, 2, 3]


def test_a_crashed_attempt_is_restarted_and_counted_once():
    c = Cluster([job("a", 0, 50_000)])
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    c.world.crash("a/0", "out of memory")
    c.until(151.0)
    [task] = c.store.tasks_of("a")
    assert task.failures == 1 and task.attempt == 1 and task.status == "pending"
    assert task.retry_at == 151.0 + 10.0  # seen at 151: 10 s of back-off, recorded
    c.until(161.0)
    c.loop().progress()  # the daemon's periodic step, once the back-off is over
    [task] = c.store.tasks_of("a")
    assert task.failures == 1 and task.attempt == 2 and task.status == "starting"
    c.loop().progress()  # a second look at the same report changes nothing
    assert c.store.tasks_of("a")[0].failures == 1


def test_an_infrastructure_failure_is_retried_at_once_and_never_counted():
    c = Cluster([job("a", 0, 50_000)], ControlOptions(max_attempts=1))
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    c.world.crash("a/0", "the agent went down", failure="infrastructure")
    c.until(151.0)
    [task] = c.store.tasks_of("a")
    assert (task.failures, task.retries, task.failure) == (0, 1, "infrastructure")
    assert task.attempt == 2 and task.status == "starting"  # no back-off
    assert c.store.job("a").status != "failed"  # even with max_attempts 1


def test_a_deterministic_failure_fails_its_job_at_once_with_the_reason():
    c = Cluster([job("a", 0, 50_000)], ControlOptions(max_attempts=3))
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    c.world.crash("a/0", "image not found: job:1", failure="deterministic")
    c.until(151.0)
    record = c.store.job("a")
    assert record.status == "failed"
    assert record.reason == "task a/0 failed with a deterministic error: image not found: job:1"
    assert [attempt for _, attempt, _ in c.executor.starts] == [1]


# -- the executor contract, in the simulated binding ------------------------------------------


def test_starting_the_same_attempt_twice_starts_one_container():
    c = Cluster([job("a", 0, 5000)])
    c.drive()
    c.loop().schedule()
    c.until(101.0)
    assert c.executor.starts == [("a/0", 1, "inst-1")]
    spec = c.store.job("a").spec.tasks[0]
    again = TaskLaunch("a/0", "a", 1, "inst-1", spec.workload, spec.run, ResourceLimits(4, 16))
    c.executor.start(again)  # as after a crash between recording the start and hearing back
    assert c.world.tasks["a/0"].starts == 1
    c.executor.stop("a/0", 7)  # an attempt it never saw: nothing happens
    assert c.world.tasks["a/0"].state in ("starting", "running")


def test_a_cancelled_job_is_stopped_and_its_instance_released():
    c = Cluster([job("a", 0, 50_000)])
    c.drive()
    c.engine.at(0.0, lambda: c.loop().schedule())
    c.engine.at(600.0, lambda: c.store.cancel_job("a", 600.0))
    c.engine.at(900.0, lambda: c.loop().schedule())
    c.engine.run()
    assert c.store.job("a").status == "cancelled"
    assert c.world.tasks["a/0"].state == "stopped"
    assert [i.state for i in c.world.instances.values()] == ["terminated"]
    # the cancellation stops the task at once; the round at 900 drains the instance,
    # which terminates 1 s later
    assert c.store.cost_between(0, 10_000) == pytest.approx(901 / 3600 * 3.0)


# -- tasks of one job that end apart ------------------------------------------------------------


class OneTaskDone(Recording):
    """Reports one task of a job completed while its sibling still runs (a real worker's
    tasks end one by one; the simulated world ends a job's tasks together)."""

    done: str | None = None

    def report(self):
        report = super().report()
        if self.done is not None:
            seen = report.tasks.get(self.done)
            if seen is not None:
                report.tasks[self.done] = dataclasses.replace(
                    seen, state="completed", throughput=None, progress=seen.progress + 7
                )
        return report

    def acknowledge(self, task_id: str, attempt: int) -> None:
        if task_id != self.done:
            super().acknowledge(task_id, attempt)


def two_task_job(job_id: str, seconds: float):
    base = job(job_id, 0.0, seconds, demand=(0, 1, 2))
    second = dataclasses.replace(base.tasks[0], task_id=f"{job_id}/1", name="node1")
    return dataclasses.replace(base, tasks=(base.tasks[0], second))


def test_a_task_done_before_its_sibling_is_not_started_again_nor_planned():
    c = Cluster([two_task_job("a", 50_000)])
    c.executor = OneTaskDone(c.world)
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    assert sorted(c.executor.starts) == [("a/0", 1, "inst-1"), ("a/1", 1, "inst-1")]
    reached = c.executor.report().tasks["a/0"].progress  # the store has the round's count
    assert reached > c.store.tasks_of("a")[0].progress
    c.executor.done = "a/0"
    c.loop().progress()  # a step: no round, yet the end is recorded with its final count
    done = c.store.tasks_of("a")[0]
    assert (done.status, done.progress) == ("completed", reached + 7)
    c.until(200.0)
    c.loop().schedule()  # a round: plans the job without its finished task
    c.until(400.0)
    done, running = c.store.tasks_of("a")
    assert (done.status, done.attempt, done.instance_id) == ("completed", 1, None)
    assert done.target_instance_id is None
    assert running.status == "running" and c.store.job("a").status == "running"
    assert sorted(c.executor.starts) == [("a/0", 1, "inst-1"), ("a/1", 1, "inst-1")]


def test_with_progress_at_steps_what_is_recorded_is_one_step_old_and_idle_steps_write_nothing():
    c = Cluster([job("a", 0, 50_000)], ControlOptions(progress_at_steps=True))
    c.drive()
    c.loop().schedule()
    c.until(150.0)
    c.loop().progress()
    reached = c.executor.report().tasks["a/0"].progress
    assert reached > 0 and c.store.tasks_of("a")[0].progress == reached  # no round since
    written = c.store.tasks_of("a")[0].updated_at
    c.loop().progress()  # the same instant: nothing changed, nothing written
    assert c.store.tasks_of("a")[0].updated_at == written


# -- a job with no solo speed is measured alone before it is packed -------------------------------


def unmeasured(job_id: str, seconds: float):
    """A job whose spec gives no solo speed (`full_throughput`): it must be learned."""
    return dataclasses.replace(job(job_id, 0.0, seconds), full_throughput=None)


def same_instance(c: Cluster, *job_ids: str) -> bool:
    targets = {c.store.tasks_of(j)[0].target_instance_id for j in job_ids}
    return len(targets) == 1 and None not in targets


def test_a_job_with_no_solo_speed_runs_alone_until_measured_then_is_packed():
    # Packed together on "big" ($5) the two are worth 2 x 3 x 0.95 = $5.70: a job
    # whose solo speed is given is packed at once (test_hand_computed). Here neither
    # has one, and a throughput observed beside another job could not be normalized.
    c = Cluster([unmeasured("a", 50_000), unmeasured("b", 50_000)])
    c.drive()
    first = c.loop().schedule().record
    assert "2 job(s) alone until their solo speed is measured: a, b" in first.reason
    launched = [a.detail["type"] for a in first.actions if a.kind == "launch"]
    assert launched == ["small", "small"] and not same_instance(c, "a", "b")
    c.until(300.0)  # both ran alone from 120 s, at one iteration per second
    second = c.loop().schedule().record
    assert (c.store.job("a").solo_throughput, c.store.job("b").solo_throughput) == (1.0, 1.0)
    assert "alone until" not in second.reason
    assert same_instance(c, "a", "b")  # re-placed like new jobs: together on a "big"


class Silent(Recording):
    """Reports no throughput for the tasks in `silent`, as a job without a reporter."""

    silent: frozenset[str] = frozenset()

    def report(self):
        report = super().report()
        for task_id in self.silent & report.tasks.keys():
            report.tasks[task_id] = dataclasses.replace(report.tasks[task_id], throughput=None)
        return report


def test_a_job_that_never_reports_throughput_is_packed_after_the_probe_window():
    from autoscaler.decide import SOLO_PROBE_S

    c = Cluster([unmeasured("a", 50_000), job("b", 0.0, 50_000)])
    c.executor = Silent(c.world)
    c.executor.silent = frozenset({"a/0"})
    c.drive()
    c.loop().schedule()
    assert not same_instance(c, "a", "b")
    c.until(299.0)
    probe = c.store.tasks_of("a")[0]
    assert probe.status == "running" and probe.status_since is not None
    running_since = probe.status_since
    t = 300.0
    while t < running_since + SOLO_PROBE_S:  # not measured yet: still alone
        c.until(t)
        assert "alone until their solo speed is measured: a" in c.loop().schedule().record.reason
        assert not same_instance(c, "a", "b")
        t += 300.0
    c.until(t)
    given_up = c.loop().schedule().record
    assert "alone until" not in given_up.reason and c.store.job("a").solo_throughput is None
    # Packed on the default throughput from now on: over the D̂ of 2,100 s (no Full
    # yet: the time elapsed), "big" saves $0.70/h x 0.583 h = $0.41, more than its
    # start-up (100 s at $5/h: $0.14) and the two moves (26 s each at $3/h: $0.04).
    assert given_up.chosen == "full" and same_instance(c, "a", "b")
