"""Spot in `status`, `job` and `cost-report`: the share of instance-hours on spot, the spot
spend and what it saved against on-demand, interruptions and the work they cost — from
the ledger, the placements and the interruption history alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.commands.cluster import render_cost_report, render_status
from app.reports import cluster_status, cost_report, job_detail, spot_summary
from app.table import money
from autoscaler.catalog import SPOT, Catalog, InstanceType
from autoscaler.decide import ControlOptions, decide
from autoscaler.planner import EvaPlanner
from autoscaler.resources import Resources
from autoscaler.spot import SpotPolicy
from autoscaler.store import RoundIntents, RoundRecord, TaskUpdate
from state.memory import InMemoryStore
from tests.builders import job
from tests.store_writes import request

ON_DEMAND = InstanceType("c7i.large", "c7i", Resources(0, 1, 4), 0.09)
SPOT_A = InstanceType(
    "c7i.large:spot@us-east-1a",
    "c7i",
    Resources(0, 1, 4),
    0.03,
    market=SPOT,
    zone="us-east-1a",
    ec2_type="c7i.large",
)
CATALOG = Catalog([ON_DEMAND, SPOT_A])
HOUR = 3600.0


@pytest.fixture
def store():
    """One job: its task on a spot instance for 2 h until a reclaim notice, 60 s to leave,
    then 1 h on an on-demand instance."""
    store = InMemoryStore()
    store.submit_job(job("a", (0, 1, 2)), owner="ana", at=0.0)
    request(store, "s-1", SPOT_A.name, 0.03, 0.0)  # bought at the spot price
    store.transition_instance("s-1", "running", 0.0, cloud_id="c-1")
    store.update_tasks([TaskUpdate("a/0", status="running", instance_id="s-1", attempt=1)], 0.0)
    store.instance_notice("s-1", "reclaim", 2 * HOUR, "spot interruption notice")
    store.update_tasks([TaskUpdate("a/0", status="pending", instance_id=None)], 2 * HOUR + 60)
    store.transition_instance("s-1", "terminated", 2 * HOUR + 60)
    request(store, "d-1", ON_DEMAND.name, 0.09, 2 * HOUR + 60)
    store.transition_instance("d-1", "running", 2 * HOUR + 60, cloud_id="c-2")
    store.update_tasks(
        [TaskUpdate("a/0", status="running", instance_id="d-1", attempt=2)], 2 * HOUR + 60
    )
    return store


NOW = 3 * HOUR + 60


def test_the_spot_summary_of_the_ledger(store):
    summary = spot_summary(store, CATALOG, 0.0, NOW)
    spot_hours = (2 * HOUR + 60) / HOUR
    assert summary["spot_instance_hours"] == pytest.approx(spot_hours)
    assert summary["spot_share"] == pytest.approx(spot_hours / (spot_hours + 1.0))
    assert summary["spot_spend"] == pytest.approx(0.03 * spot_hours)
    # Each spot hour at the on-demand price of its type, less what it was bought at.
    assert summary["savings_vs_on_demand"] == pytest.approx((0.09 - 0.03) * spot_hours)
    assert summary["interruptions"] == 1
    assert summary["interruptions_by_offering"] == {SPOT_A.name: 1}
    assert summary["work_lost_task_hours"] == pytest.approx(60 / HOUR, abs=1e-6)  # rounded
    # A window after the reclaim sees no spot at all.
    later = spot_summary(store, CATALOG, 2.5 * HOUR, NOW)
    assert (later["spot_share"], later["interruptions"], later["work_lost_task_hours"]) == (
        0.0,
        0,
        0.0,
    )


def test_cost_report_carries_the_spot_summary_and_prints_it(store):
    report = cost_report(store, CATALOG, NOW)
    assert report["spot"] == spot_summary(store, CATALOG, 0.0, NOW)
    text = render_cost_report(report)
    assert (
        "Spot share" in text and "Interruptions            1 (1 c7i.large:spot@us-east-1a)" in text
    )
    assert "Saved against on-demand" in text


def test_a_jobs_detail_counts_its_interruptions_and_spot_share(store):
    detail = job_detail(store, "a", CATALOG, NOW)
    assert detail["interruptions"] == 1
    assert detail["work_lost_s"] == pytest.approx(60.0)
    assert detail["spot_share"] == pytest.approx((2 * HOUR + 60) / NOW)
    [task] = detail["task_list"]
    assert (task["interruptions"], task["work_lost_s"]) == (1, 60.0)


def test_status_shows_spot_instances_and_the_ones_being_reclaimed():
    store = InMemoryStore()
    request(store, "s-1", SPOT_A.name, 0.03, 0.0)
    store.transition_instance("s-1", "running", 0.0, cloud_id="c-1")
    request(store, "d-1", ON_DEMAND.name, 0.09, 0.0)
    store.transition_instance("d-1", "running", 0.0, cloud_id="c-2")
    store.instance_notice("s-1", "reclaim", 100.0, "spot interruption notice")
    status = cluster_status(store, 200.0)
    assert status["spot"] == {
        "instances": 1,
        "hourly_cost": 0.03,
        "reclaimed_now": ["s-1"],
        "interruptions_last_day": 1,
    }
    markets = {i["instance"]: (i["market"], i["reclaimed_at"]) for i in status["instances"]}
    assert markets == {"s-1": ("spot", 100.0), "d-1": ("on-demand", None)}
    assert "being reclaimed: s-1" in render_status(status)


def test_a_price_change_after_launch_leaves_past_savings_as_they_were():
    """The on-demand price kept with the request is what a spot hour is compared with:
    a later catalog price does not rewrite what was saved."""
    store = InMemoryStore()
    adopted = RoundIntents(
        requests=(("s-1", SPOT_A.name, 0.03),), on_demand_prices={"s-1": ON_DEMAND.hourly_cost}
    )
    store.record_round(RoundRecord(0.0, "test", "none", False, "launch"), adopted)
    store.transition_instance("s-1", "running", 0.0, cloud_id="c-1")
    before = spot_summary(store, CATALOG, 0.0, 2 * HOUR)
    dearer = Catalog([replace(ON_DEMAND, hourly_cost=0.20), SPOT_A])
    after = spot_summary(store, dearer, 0.0, 2 * HOUR)
    assert before["savings_vs_on_demand"] == pytest.approx((0.09 - 0.03) * 2)
    assert after["savings_vs_on_demand"] == before["savings_vs_on_demand"]
    assert after["savings_at_current_price"] == []


def test_an_instance_without_a_launch_price_is_compared_with_todays_and_the_report_says_so():
    store = InMemoryStore()
    request(store, "s-1", SPOT_A.name, 0.03, 0.0)  # an older row: no on-demand price kept
    store.transition_instance("s-1", "running", 0.0, cloud_id="c-1")
    dearer = Catalog([replace(ON_DEMAND, hourly_cost=0.20), SPOT_A])
    summary = spot_summary(store, dearer, 0.0, HOUR)
    assert summary["savings_vs_on_demand"] == pytest.approx(0.20 - 0.03)
    assert summary["savings_at_current_price"] == ["s-1"]
    text = render_cost_report(cost_report(store, dearer, HOUR))
    assert "1 spot instance(s) requested before launch prices were kept" in text


def test_a_round_keeps_the_on_demand_price_of_a_spot_launch():
    """decide() hands the store the on-demand price of each launch's EC2 type."""
    store = InMemoryStore()
    store.submit_job(job("a", (0, 1, 2), capacity="spot"), owner="ana", at=0.0)
    decision = decide(
        store.snapshot(),
        CATALOG,
        (),
        ControlOptions(spot=SpotPolicy()),
        planner=EvaPlanner(),
        now=0.0,
    )
    [launch] = decision.launches
    assert launch.instance_type == SPOT_A.name
    intents = decision.intents()
    assert intents.on_demand_prices == {launch.instance_id: ON_DEMAND.hourly_cost}
    store.record_round(decision.record(), intents)
    assert store.instance(launch.instance_id).on_demand_price == ON_DEMAND.hourly_cost


def _figure(text: str, label: str) -> str:
    """The figure a table prints after `label` (up to the next space)."""
    [line] = [line for line in text.splitlines() if line.strip().startswith(label)]
    return line.strip()[len(label) :].split()[0]


def test_the_tables_print_the_json_figures_and_the_reports_agree_with_each_other(store):
    """`status`, `job` and `cost-report` print what their JSON says, and where two of
    them give one figure (a job's cost, the $/h now, spot instance-hours) it is the same."""
    report = cost_report(store, CATALOG, NOW)
    text = render_cost_report(report)
    assert _figure(text, "Hourly cost now") == money(report["hourly_cost_now"]) + "/h"
    assert _figure(text, "No packing now") == money(report["no_packing_hourly_cost_now"]) + "/h"
    assert _figure(text, "= saved") == money(report["savings"])
    spot = report["spot"]
    assert _figure(text, "Saved against on-demand") == money(spot["savings_vs_on_demand"])
    assert _figure(text, "Spot share") == f"{spot['spot_share']:.1%}"
    assert _figure(text, "Interruptions") == str(spot["interruptions"])
    status = cluster_status(store, NOW)
    shown = render_status(status)
    assert shown.splitlines()[0].endswith(f"{money(status['hourly_cost'])}/h now")
    assert status["hourly_cost"] == report["hourly_cost_now"]
    detail = job_detail(store, "a", CATALOG, NOW)
    assert detail["cost"] == report["spend_by_job"]["a"]
    assert detail["interruptions"] == spot["interruptions"]
    # One task, always on an instance: its spot task-time is the spot instance-hours
    # (the reclaimed instance billed until the task left it).
    assert detail["spot_share"] * NOW / HOUR == pytest.approx(spot["spot_instance_hours"])


def test_the_dashboard_reads_markets_as_status_does_even_for_an_offering_gone_from_the_catalog():
    from app.dashboard.views import now_document
    from autoscaler.cloud import Guardrails

    store = InMemoryStore()
    request(store, "s-1", "c7i.large:spot@us-east-1b", 0.03, 0.0)  # not in CATALOG
    store.transition_instance("s-1", "running", 0.0, cloud_id="c-1")
    request(store, "s-2", SPOT_A.name, 0.03, 0.0)
    store.transition_instance("s-2", "running", 0.0, cloud_id="c-2")
    status = cluster_status(store, 100.0)
    page = now_document(status, store, CATALOG, Guardrails(), 100.0)
    assert {i["instance"]: (i["market"], i["ec2_type"]) for i in page["instances"]} == {
        "s-1": ("spot", "c7i.large"),
        "s-2": ("spot", "c7i.large"),
    }
    assert page["instances_by_type"] == [{"type": "c7i.large", "market": "spot", "count": 2}]
    assert status["spot"]["instances"] == 2
