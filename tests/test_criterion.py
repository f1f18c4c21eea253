"""The migration criterion: S·D̂ − M decides between Full and Partial (Eva §4.5)."""

import math

import pytest

from autoscaler.criterion import expected_duration_h, migration_cost
from autoscaler.planner import EvaPlanner
from autoscaler.pricing import PriceBook
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView, ReconfigurationHistory
from tests.builders import configuration, job, running, table3_catalog

HOUR = 3600.0


def test_expected_duration_follows_the_poisson_geometric_model():
    # 8 event rounds in 4 h (λ = 2/h), 2 of them adopted Full (p = 0.25)
    history = ReconfigurationHistory(elapsed_s=4 * HOUR, event_rounds=8, full_rounds=2)
    assert expected_duration_h(history) == pytest.approx(-1 / (2 * math.log(0.75)))
    assert expected_duration_h(history) == pytest.approx(1.7380, abs=1e-4)


def test_expected_duration_without_a_full_yet_is_the_elapsed_time():
    history = ReconfigurationHistory(elapsed_s=3 * HOUR, event_rounds=5, full_rounds=0)
    assert expected_duration_h(history) == pytest.approx(3.0)
    assert expected_duration_h(ReconfigurationHistory()) == 0.0


def test_expected_duration_when_every_event_triggers_full_is_the_time_between_events():
    history = ReconfigurationHistory(elapsed_s=2 * HOUR, event_rounds=4, full_rounds=4)
    assert expected_duration_h(history) == pytest.approx(0.5)


def test_history_counts_only_rounds_with_events():
    h = ReconfigurationHistory().after_round(300, had_event=True, chose_full=True)
    h = h.after_round(600, had_event=False, chose_full=True)
    assert (h.elapsed_s, h.event_rounds, h.full_rounds) == (600, 1, 1)


def two_half_empty_it1(init_delay_s: float = 36.0):
    """Two it1 instances ($12) each hosting one 2-GPU task: cost-efficient on their
    own (TNRP $12 = $12), so Partial keeps both; Full packs both onto one."""
    catalog = table3_catalog()
    jobs = (
        job("a", (2, 8, 24), init_delay_s=init_delay_s),
        job("b", (2, 8, 24), init_delay_s=init_delay_s),
    )
    current = configuration(
        running("i-1", catalog["it1"], "a/0"), running("i-2", catalog["it1"], "b/0")
    )
    return catalog, jobs, current


def test_migration_cost_charges_moved_jobs_and_new_instances():
    catalog, jobs, current = two_half_empty_it1()
    target = configuration(running("i-1", catalog["it1"], "a/0", "b/0"))
    cost = migration_cost(current, target, {j.job_id: j for j in jobs}, PriceBook(catalog))
    # job b moves: checkpoint 1 + 7 s, relaunch 36 + 1 + 10 s = 55 s at its RP of $12/h
    assert cost.moved_jobs == 1 and cost.launched_instances == 0
    assert cost.dollars == pytest.approx(55 / HOUR * 12.0)


def test_criterion_adopts_full_when_savings_over_d_hat_outweigh_migration():
    catalog, jobs, current = two_half_empty_it1()
    history = ReconfigurationHistory(elapsed_s=10 * HOUR, event_rounds=10, full_rounds=1)
    plan = EvaPlanner().plan(
        ClusterView(catalog, jobs, current, ThroughputTable(default=1.0), history)
    )
    full, partial = plan.candidates
    assert (full.saving_per_hour, partial.saving_per_hour) == (pytest.approx(12.0), 0.0)
    assert plan.expected_duration_h == pytest.approx(-1 / math.log(0.9))  # λ = 1/h, p = 0.1
    assert plan.chosen == "full"
    assert plan.hourly_cost == pytest.approx(12.0)
    assert full.score == pytest.approx(12.0 * plan.expected_duration_h - full.migration.dollars)


def test_criterion_keeps_partial_when_the_configuration_would_not_last():
    catalog, jobs, current = two_half_empty_it1()
    # 100 event rounds in 6 minutes, all Full: D̂ = 1/λ = 3.6 s. Saving $12/h for
    # 3.6 s ($0.012) does not repay moving job b ($0.18).
    history = ReconfigurationHistory(elapsed_s=360, event_rounds=100, full_rounds=100)
    plan = EvaPlanner().plan(
        ClusterView(catalog, jobs, current, ThroughputTable(default=1.0), history)
    )
    assert plan.chosen == "partial"
    assert plan.hourly_cost == pytest.approx(24.0)
    assert "does not repay" in plan.reason


def test_criterion_keeps_partial_when_migration_is_too_expensive():
    # Same history as the Full case, but relaunching a job takes 20 hours.
    catalog, jobs, current = two_half_empty_it1(init_delay_s=20 * HOUR)
    history = ReconfigurationHistory(elapsed_s=10 * HOUR, event_rounds=10, full_rounds=1)
    plan = EvaPlanner().plan(
        ClusterView(catalog, jobs, current, ThroughputTable(default=1.0), history)
    )
    assert plan.chosen == "partial"


def test_planner_modes_force_one_candidate():
    catalog, jobs, current = two_half_empty_it1(init_delay_s=20 * HOUR)
    view = ClusterView(catalog, jobs, current, ThroughputTable(default=1.0))
    assert EvaPlanner("full").plan(view).hourly_cost == pytest.approx(12.0)
    assert EvaPlanner("partial").plan(view).hourly_cost == pytest.approx(24.0)


def test_a_move_among_spot_instances_is_priced_at_the_jobs_on_demand_value():
    from dataclasses import replace

    from autoscaler.catalog import SPOT, Catalog

    catalog, jobs, _ = two_half_empty_it1()
    it1 = catalog["it1"]
    spot = replace(it1, name="it1:spot", hourly_cost=3.0, market=SPOT, ec2_type="it1")
    with_spot = Catalog([*catalog, spot])
    current = configuration(running("i-1", spot, "a/0"), running("i-2", spot, "b/0"))
    target = configuration(running("i-1", spot, "a/0", "b/0"))
    cost = migration_cost(current, target, {j.job_id: j for j in jobs}, PriceBook(with_spot))
    # the same 55 s of job b, at its on-demand RP of $12/h, not the $3/h spot RP
    assert cost.dollars == pytest.approx(55 / HOUR * 12.0)
