"""The no-packing baseline of `cost-report` follows each job's capacity as the planner
does (its `capacity`, or on-demand once pinned there): the LP bound relaxes the same
problem, so the baseline is never below it and what packing saved never negative."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.reports import cost_report
from autoscaler.catalog import SPOT, Catalog, InstanceType
from autoscaler.decide import ControlOptions
from autoscaler.planner import EvaPlanner
from autoscaler.resources import Resources
from autoscaler.spot import SpotPolicy
from autoscaler.store import TaskUpdate
from state.memory import InMemoryStore
from tests.builders import job
from tests.store_writes import request

ON_DEMAND = InstanceType("c7i.large", "c7i", Resources(0, 2, 4), 0.09)
BIG = InstanceType("c7i.xlarge", "c7i", Resources(0, 4, 8), 0.18)
SPOT_A = InstanceType(
    "c7i.large:spot@us-east-1a",
    "c7i",
    Resources(0, 2, 4),
    0.03,
    market=SPOT,
    zone="us-east-1a",
    ec2_type="c7i.large",
    interruption_per_hour=0.01,
)
SPOT_BIG = InstanceType(
    "c7i.xlarge:spot@us-east-1a",
    "c7i",
    Resources(0, 4, 8),
    0.06,
    market=SPOT,
    zone="us-east-1a",
    ec2_type="c7i.xlarge",
    interruption_per_hour=0.02,
)
CATALOG = Catalog([ON_DEMAND, BIG, SPOT_A, SPOT_BIG])
OPTIONS = ControlOptions(spot=SpotPolicy())
HOUR = 3600.0


def _running_on_demand(store: InMemoryStore, spec, at: float = 0.0) -> None:
    """`spec`'s tasks, one an on-demand instance each, running since `at`."""
    store.submit_job(spec, owner="ana", at=at)
    for n, task in enumerate(spec.tasks):
        iid = f"{spec.job_id}-d{n}"
        request(store, iid, ON_DEMAND.name, ON_DEMAND.hourly_cost, at)
        store.transition_instance(iid, "running", at, cloud_id=f"c-{iid}")
        store.update_tasks(
            [TaskUpdate(task.task_id, status="running", instance_id=iid, attempt=1)], at
        )


def _report(store: InMemoryStore, now: float, options: ControlOptions = OPTIONS) -> dict:
    return cost_report(store, CATALOG, now, planner=EvaPlanner(), options=options)


def test_an_on_demand_job_is_priced_on_demand_and_packing_saves_nothing_negative():
    store = InMemoryStore()
    _running_on_demand(store, job("a", (0, 1, 2), capacity="on-demand"))
    report = _report(store, HOUR)
    bound = report["lower_bound_hourly_cost_now"]
    assert bound is not None
    # Alone on the cheapest offering its capacity allows: the on-demand one, not spot.
    assert report["no_packing_hourly_cost_now"] == pytest.approx(ON_DEMAND.hourly_cost)
    assert report["no_packing_hourly_cost_now"] >= bound - 1e-9
    assert report["savings"] >= -1e-9
    assert report["savings_hourly_now"] >= -1e-9


def test_a_job_pinned_by_its_reclaims_is_priced_on_demand():
    store = InMemoryStore()
    _running_on_demand(store, job("a", (0, 1, 2)))  # capacity "auto"
    # Two attempts lost to the infrastructure (retries not counted as failures) in its
    # first hour, planned at 0.02/h: P(X ≥ 2) ≈ 0.0002, far more than the rate explains.
    store.update_tasks([TaskUpdate("a/0", retries=2)], 10.0)
    report = _report(store, HOUR)
    assert report["no_packing_hourly_cost_now"] == pytest.approx(ON_DEMAND.hourly_cost)
    assert report["no_packing_hourly_cost_now"] >= report["lower_bound_hourly_cost_now"] - 1e-9
    assert report["savings"] >= -1e-9
    # Unpinned, the same job's baseline is its cheapest spot offering at its effective
    # price (the planner's footing): below on-demand.
    fresh = InMemoryStore()
    _running_on_demand(fresh, job("a", (0, 1, 2)))
    unpinned = _report(fresh, HOUR)["no_packing_hourly_cost_now"]
    assert SPOT_A.hourly_cost < unpinned < ON_DEMAND.hourly_cost


def test_a_deadline_job_out_of_slack_is_priced_on_demand():
    store = InMemoryStore()
    # A deadline whose size is unknown cannot be promised on spot: pinned at once.
    _running_on_demand(store, job("a", (0, 1, 2), deadline_s=2 * HOUR))
    report = _report(store, HOUR)
    assert report["no_packing_hourly_cost_now"] == pytest.approx(ON_DEMAND.hourly_cost)
    assert report["savings"] >= -1e-9


CAPACITIES = st.sampled_from(["auto", "spot", "on-demand"])
DEMANDS = st.sampled_from([(0, 1, 1), (0, 1, 2), (0, 2, 4), (0, 3, 6), (0, 1, 6)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(CAPACITIES, st.lists(DEMANDS, min_size=1, max_size=3), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_the_baseline_is_never_below_the_lp_bound_whatever_the_capacities(jobs):
    store = InMemoryStore()
    for n, (capacity, demands, pinned) in enumerate(jobs):
        spec = job(f"j{n}", *demands, capacity=capacity)
        store.submit_job(spec, owner="ana", at=0.0)
        if pinned:  # two reclaims by the first hour: pinned (`spot.reclaims_pin`)
            store.update_tasks([TaskUpdate(spec.tasks[0].task_id, retries=2)], 1.0)
    # Planned as they are (not first alone, until their speed is measured, which puts
    # the same reservation prices in the bound and the baseline).
    report = _report(store, HOUR, ControlOptions(spot=SpotPolicy(), learn=False))
    bound = report["lower_bound_hourly_cost_now"]
    assert bound is not None
    assert report["no_packing_hourly_cost_now"] >= bound - 1e-6


def test_a_finished_job_that_ran_pinned_is_priced_on_demand_for_its_on_demand_hours():
    """Its past placements on on-demand instances are taken to have run pinned (its
    reclaims pinned it), so no packing is not priced at spot for them."""
    store = InMemoryStore()
    _running_on_demand(store, job("a", (0, 1, 2)))
    store.update_tasks([TaskUpdate("a/0", retries=2)], 10.0)
    store.update_tasks([TaskUpdate("a/0", status="completed")], HOUR)
    store.job_finished("a", HOUR)
    store.transition_instance("a-d0", "terminated", HOUR)
    report = _report(store, 2 * HOUR)
    assert report["no_packing_spend"] == pytest.approx(ON_DEMAND.hourly_cost, rel=1e-3)
    assert report["savings"] >= -1e-6
