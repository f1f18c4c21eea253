"""The daemon's state metrics counted by the database show the figures that counting a
full snapshot showed, on SQLite and PostgreSQL."""

from __future__ import annotations

from app.metrics import Metrics
from app.reports import hourly_cost_now
from autoscaler.store import TaskUpdate
from state.store import SqlStore
from tests.builders import job
from tests.store_writes import adopted_round

GAUGES = (
    "autoscaler_hourly_cost_dollars",
    "autoscaler_instances",
    "autoscaler_jobs",
    "autoscaler_tasks",
)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        if family.name in GAUGES
        for s in family.samples
    }


def test_the_counted_metrics_equal_the_snapshots(sql_store: SqlStore) -> None:
    store = sql_store
    for n in range(5):
        store.submit_job(job(f"j{n}", (1, 2, 4), (0, 2, 4)), owner="ana", at=0.0)
    adopted_round(
        store,
        1.0,
        requests=[
            ("i1", "c7i.large", 0.1),
            ("i2", "c7i.large:spot@us-east-1a", 0.03),
            ("i3", "p3.2xlarge", 3.06),
        ],
    )
    store.transition_instance("i1", "running", 2.0, cloud_id="c-1")
    store.transition_instance("i2", "pending", 2.0, cloud_id="c-2")
    store.transition_instance("i3", "failed", 2.0)
    store.update_tasks([TaskUpdate("j0/0", status="running", instance_id="i1")], 3.0)
    store.cancel_job("j1", 3.0)
    store.job_finished("j2", 3.0)
    before, after = Metrics(), Metrics()
    before.observe_state(store.snapshot(with_throughput=False), hourly_cost_now(store))
    after.observe_counts(store.state_counts())
    shown = samples(after)
    assert shown == samples(before)
    assert shown[("autoscaler_jobs", (("status", "queued"),))] == 3.0
    assert shown[("autoscaler_tasks", (("status", "running"),))] == 1.0
    spot = (("capacity_type", "spot"), ("status", "pending"), ("type", "c7i.large:spot@us-east-1a"))
    assert shown[("autoscaler_instances", spot)] == 1.0
    assert shown[("autoscaler_hourly_cost_dollars", ())] == 0.1 + 0.03
