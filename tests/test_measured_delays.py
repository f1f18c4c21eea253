"""Measured phase delays feed the migration criterion, per instance type (Eva §4.5, Table 1).

Workers time each attempt's phases; `sync` records them with the task update that
starts or ends the attempt, each once; the snapshot carries them; the migration
cost M prices a move with them where a type has them, and with the job's assumed
delays elsewhere. Everything here is fabricated plain data: a listing, a report.
"""

from __future__ import annotations

import pytest

from autoscaler.cloud import CloudInstance
from autoscaler.control import sync
from autoscaler.criterion import migration_cost, move_delay_s
from autoscaler.decide import ControlOptions
from autoscaler.execution import ExecutorReport, TaskReport
from autoscaler.planner import EvaPlanner
from autoscaler.pricing import PriceBook
from autoscaler.store import TaskUpdate
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView, MeasuredDelays, ReconfigurationHistory
from state.memory import InMemoryStore
from tests.builders import NullExecutor, configuration, job, running, table3_catalog
from tests.store_writes import adopted_round

HOUR = 3600.0

#: Every phase of an attempt, as a worker reports them (seconds).
PHASES = {
    "fetch": 4.0,
    "build": 60.0,
    "start": 2.0,
    "init": 50.0,
    "checkpoint": 3.0,
    "upload": 20.0,
}


class Listed:
    """A cloud that lists the given instances (sync asks it nothing else)."""

    def __init__(self, *instances: CloudInstance) -> None:
        self.instances = list(instances)

    def list(self) -> list[CloudInstance]:
        return self.instances


class Reporting(NullExecutor):
    """An executor whose report is set by the test."""

    def report_tasks(self, *tasks: TaskReport) -> None:
        self._report = ExecutorReport(
            {t.task_id: t for t in tasks}, frozenset(t.instance_id or "" for t in tasks)
        )


def a_task_starting_on_a_big_instance() -> InMemoryStore:
    """Job j's one task, recorded starting (attempt 1) on i-1, a running "big" instance."""
    store = InMemoryStore()
    store.submit_job(job("j", (1, 4, 8)), owner="ana", at=0.0)
    adopted_round(store, 0.0, requests=[("i-1", "big", 3.0)], targets={"j/0": "i-1"})
    store.transition_instance("i-1", "running", 1.0, cloud_id="c-1")
    store.update_tasks([TaskUpdate("j/0", status="starting", instance_id="i-1", attempt=1)], 2.0)
    return store


def synced(store: InMemoryStore, executor: Reporting, now: float) -> None:
    cloud = Listed(CloudInstance("c-1", "big", "running", instance_id="i-1"))
    sync(cloud, executor, store, now=now, options=ControlOptions())  # type: ignore[arg-type]


def report(state, phases) -> TaskReport:
    return TaskReport("j/0", state, "i-1", attempt=1, phases=phases)


def test_sync_measures_an_attempts_launch_phases_once_it_runs():
    store, executor = a_task_starting_on_a_big_instance(), Reporting()
    executor.report_tasks(report("running", PHASES))  # init is not measured yet
    synced(store, executor, 10.0)
    delays = store.snapshot().delays
    assert {phase for _, phase in delays.means} == {"fetch", "build", "start"}
    assert delays.seconds("big", "build") == 60.0
    synced(store, executor, 20.0)  # the same report again: nothing counted twice
    assert store.snapshot().delays.means[("big", "build")].observations == 1


def test_sync_measures_the_rest_of_an_attempt_when_it_ends():
    store, executor = a_task_starting_on_a_big_instance(), Reporting()
    executor.report_tasks(report("running", {"fetch": 4.0}))
    synced(store, executor, 10.0)
    executor.report_tasks(report("stopped", PHASES))
    synced(store, executor, 30.0)
    synced(store, executor, 40.0)  # reported until acknowledged: counted once
    delays = store.snapshot().delays
    assert [
        (phase, d.mean_s, d.observations) for (_, phase), d in sorted(delays.means.items())
    ] == [
        ("checkpoint", 3.0, 1),
        ("fetch", 4.0, 1),  # from the launch, not again from the end
        ("init", 50.0, 1),
        ("upload", 20.0, 1),
    ]


def test_sync_measures_nothing_of_a_failed_attempt():
    store, executor = a_task_starting_on_a_big_instance(), Reporting()
    executor.report_tasks(
        TaskReport("j/0", "failed", "i-1", attempt=1, reason="build failed", phases=PHASES)
    )
    synced(store, executor, 10.0)
    assert store.tasks_of("j")[0].failures == 1
    assert store.snapshot().delays.means == {}


def two_half_empty_it1():
    """Two it1 instances ($12/h) with one 2-GPU job each; Full moves b onto a's."""
    catalog = table3_catalog()
    jobs = (job("a", (2, 8, 24)), job("b", (2, 8, 24)))
    current = configuration(
        running("i-1", catalog["it1"], "a/0"), running("i-2", catalog["it1"], "b/0")
    )
    target = configuration(running("i-1", catalog["it1"], "a/0", "b/0"))
    return catalog, {j.job_id: j for j in jobs}, current, target


def test_measured_delays_replace_the_assumed_ones_in_m():
    catalog, jobs, current, target = two_half_empty_it1()
    measured = MeasuredDelays().observed(("it1", phase, s) for phase, s in PHASES.items())
    cost = migration_cost(current, target, jobs, PriceBook(catalog), measured)
    # b stalls: checkpoint 3 + upload 20, then fetch 4 + build 60 + start 2, then init 50:
    # 139 s at its RP of $12/h (assumed: 1 + 7, 1 + 10 + 0, 36 = 55 s).
    assert cost.migration_dollars == pytest.approx(139 / HOUR * 12.0)


def test_delays_measured_on_another_type_leave_the_assumed_ones():
    catalog, jobs, current, target = two_half_empty_it1()
    elsewhere = MeasuredDelays().observed(("it2", phase, s) for phase, s in PHASES.items())
    cost = migration_cost(current, target, jobs, PriceBook(catalog), elsewhere)
    assert cost.migration_dollars == pytest.approx(55 / HOUR * 12.0)


def test_a_move_checkpoints_on_the_type_it_leaves_and_relaunches_on_the_one_it_lands_on():
    b = job("b", (0, 4, 8))
    measured = MeasuredDelays().observed(
        [("from", "upload", 100.0), ("to", "upload", 1000.0), ("to", "build", 30.0)]
    )
    # checkpoint: kill 1 (assumed) + upload 100 on "from"; relaunch: fetch 1 (assumed)
    # + build 30 on "to"; init 36 (assumed).
    assert move_delay_s(b, [(b.tasks[0], "from", "to")], measured) == 1 + 100 + 1 + 30 + 36


def test_a_snapshot_with_measured_phases_changes_m_as_computed_by_hand():
    catalog, jobs, current, _ = two_half_empty_it1()
    store = InMemoryStore()
    store.submit_job(jobs["a"], owner="ana", at=0.0)
    phases = tuple(("it1", phase, s) for phase, s in PHASES.items())
    store.update_tasks([TaskUpdate("a/0", status="running", phases=phases)], 1.0)
    snapshot = store.snapshot()
    history = ReconfigurationHistory(elapsed_s=10 * HOUR, event_rounds=10, full_rounds=1)
    view = ClusterView(
        catalog,
        tuple(jobs.values()),
        current,
        ThroughputTable(default=1.0),
        history,
        delays=snapshot.delays,
    )
    plan = EvaPlanner().plan(view)
    full = next(c for c in plan.candidates if c.name == "full")
    assert full.migration.moved_jobs == 1
    assert full.migration.dollars == pytest.approx(139 / HOUR * 12.0)  # not 55 s: measured
