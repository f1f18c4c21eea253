"""The clairvoyant fluid bound of a trace (the yardstick printed beside replays)."""

import pytest

from autoscaler.jobs import TraceFacts
from simulator.bound import clairvoyant_bound
from tests.builders import job, table3_catalog


def test_bound_integrates_the_lp_bound_of_the_tasks_present():
    # τ4 (0, 4, 12) alone: $0.4/h (it4 full on CPU, or half an it3); τ3 (0, 6, 20)
    # alone: $0.6/h; both: 10 CPUs at $0.1 per CPU-hour = $1.0/h.
    # τ4 runs 0–2 h, τ3 1–3 h: 1 h × 0.4 + 1 h × 1.0 + 1 h × 0.6 = $2.0.
    jobs = (
        job("a", (0, 4, 12), trace=TraceFacts(arrival_time_s=0.0, duration_s=7200.0)),
        job("b", (0, 6, 20), trace=TraceFacts(arrival_time_s=3600.0, duration_s=7200.0)),
    )
    assert clairvoyant_bound(jobs, table3_catalog()) == pytest.approx(2.0)


def test_a_gap_without_jobs_costs_nothing():
    jobs = (
        job("a", (0, 4, 12), trace=TraceFacts(arrival_time_s=0.0, duration_s=3600.0)),
        job("b", (0, 4, 12), trace=TraceFacts(arrival_time_s=7200.0, duration_s=3600.0)),
    )
    assert clairvoyant_bound(jobs, table3_catalog()) == pytest.approx(0.8)
