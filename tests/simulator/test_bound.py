"""The clairvoyant limits of a trace (the fluid bound is printed beside replays)."""

import random

import pytest

from autoscaler.catalog import Catalog
from autoscaler.jobs import TraceFacts
from autoscaler.throughput import ThroughputEntry, ThroughputTable
from simulator.bound import clairvoyant_bound, per_interval_limits, waiting_limit
from tests.builders import itype, job, table3_catalog


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


def _hour(job_id: str, demand: tuple[float, float, float]):
    return job(job_id, demand, trace=TraceFacts(arrival_time_s=0.0, duration_s=3600.0))


def test_whole_tasks_cost_more_than_the_fluid_bound_where_they_do_not_divide():
    # Two tasks of 5 CPUs for 1 h. Fluid: 10 CPUs at $0.1 per CPU-hour = $1.0.
    # Whole: only it3 (8 CPUs, $0.8) or it1 ($12) holds one; two need 10 CPUs, so two it3s.
    jobs = (_hour("a", (0, 5, 12)), _hour("b", (0, 5, 12)))
    limits = per_interval_limits(jobs, table3_catalog(), ThroughputTable(default=1.0))
    assert limits.fluid == pytest.approx(1.0)
    assert limits.whole_tasks == pytest.approx(1.6)
    assert limits.with_interference == pytest.approx(1.6)  # no interference
    assert (limits.intervals, limits.at_fluid) == (1, 0)


def _pair_table(theta: float) -> ThroughputTable:
    return ThroughputTable(
        {
            ("wa_node0", ("wb_node0",)): ThroughputEntry(theta),
            ("wb_node0", ("wa_node0",)): ThroughputEntry(theta),
        },
        default=1.0,
    )


@pytest.mark.parametrize(
    ("theta", "expected"),
    [
        # Together on big ($0.6/h) they deliver 2θ of work: 1/θ bigs cover both,
        # $0.6/0.8 = $0.75 < $0.8 for two smalls.
        (0.8, 0.75),
        # At 0.7 that would be $0.857: two smalls ($0.4 each) are cheaper.
        (0.7, 0.8),
    ],
)
def test_interference_makes_a_pair_pay_for_the_work_it_loses(theta, expected):
    catalog = Catalog([itype("small", 0, 4, 16, 0.4), itype("big", 0, 8, 32, 0.6)])
    jobs = (_hour("a", (0, 4, 8)), _hour("b", (0, 4, 8)))
    limits = per_interval_limits(jobs, catalog, _pair_table(theta))
    assert limits.fluid == pytest.approx(0.6)
    assert limits.whole_tasks == pytest.approx(0.6)
    assert limits.with_interference == pytest.approx(expected)


def test_too_many_compositions_count_at_the_fluid_bound():
    jobs = (_hour("a", (0, 5, 12)), _hour("b", (0, 5, 12)))
    limits = per_interval_limits(
        jobs, table3_catalog(), ThroughputTable(default=1.0), max_compositions=1
    )
    assert limits.whole_tasks == limits.with_interference == pytest.approx(limits.fluid)
    assert limits.at_fluid == limits.intervals == 1


def test_the_limits_fluid_bound_is_the_replays_whatever_the_workloads():
    # Classes split by workload for the interference step must not move the fluid bound.
    jobs = (
        job("a", (0, 4, 12), trace=TraceFacts(arrival_time_s=0.0, duration_s=7200.0)),
        job("b", (0, 4, 12), trace=TraceFacts(arrival_time_s=3600.0, duration_s=7200.0)),
        job("c", (0, 6, 20), trace=TraceFacts(arrival_time_s=1800.0, duration_s=3600.0)),
    )
    limits = per_interval_limits(jobs, table3_catalog(), _pair_table(0.9))
    assert limits.fluid == pytest.approx(clairvoyant_bound(jobs, table3_catalog()))
    assert limits.intervals == 5  # events at 0, 0.5, 1, 1.5, 2 and 3 h


@pytest.mark.parametrize(
    ("theta", "expected"),
    [
        # Held back until they overlap, the pair shares a big at θ = 0.8: $0.75 of
        # work, below the $0.8 that two smalls cost while the trace keeps them apart.
        (0.8, 0.75),
        (0.7, 0.8),  # at 0.7 sharing costs $0.857: waiting cannot help
    ],
)
def test_waiting_lets_tasks_the_trace_keeps_apart_share(theta, expected):
    catalog = Catalog([itype("small", 0, 4, 16, 0.4), itype("big", 0, 8, 32, 0.6)])
    jobs = (
        job("a", (0, 4, 8), trace=TraceFacts(arrival_time_s=0.0, duration_s=3600.0)),
        job("b", (0, 4, 8), trace=TraceFacts(arrival_time_s=7200.0, duration_s=3600.0)),
    )
    assert per_interval_limits(jobs, catalog, _pair_table(theta)).with_interference == (
        pytest.approx(0.8)
    )
    limit = waiting_limit(jobs, catalog, _pair_table(theta))
    assert limit.exact
    assert limit.dollars == pytest.approx(expected)


def test_a_task_cannot_share_an_instance_with_itself():
    # One 2-hour task that fills half of the only type: 2 h of it, $1.2, not
    # one hour of the task running twice over.
    catalog = Catalog([itype("big", 0, 8, 32, 0.6)])
    jobs = (job("a", (0, 4, 8), trace=TraceFacts(arrival_time_s=0.0, duration_s=7200.0)),)
    assert waiting_limit(jobs, catalog, ThroughputTable(default=1.0)).dollars == (
        pytest.approx(1.2)
    )


@pytest.mark.parametrize("seed", range(4))
def test_waiting_never_costs_more_than_the_trace_s_own_timing(seed):
    # Every per-interval solution, summed over the trace, is a solution of the pooled
    # LP: the waiting limit is at most the per-interval limit, and at least the
    # fluid bound of the pooled work.
    rng = random.Random(seed)
    demands = [(0, 2, 4), (0, 3, 8), (0, 4, 12), (0, 6, 20)]
    jobs = tuple(
        job(
            f"j{i}",
            rng.choice(demands),
            trace=TraceFacts(
                arrival_time_s=rng.uniform(0, 20_000), duration_s=rng.uniform(600, 20_000)
            ),
            name=rng.choice(["wa", "wb"]),
        )
        for i in range(8)
    )
    truth = _pair_table(0.85)
    limits = per_interval_limits(jobs, table3_catalog(), truth)
    waiting = waiting_limit(jobs, table3_catalog(), truth)
    assert waiting.exact
    assert waiting.dollars <= limits.with_interference * (1 + 1e-9)
    pooled = waiting_limit(jobs, table3_catalog(), truth, max_compositions=1)
    assert not pooled.exact
    assert pooled.dollars <= waiting.dollars * (1 + 1e-9)


def test_no_scheduler_replays_a_trace_below_any_of_its_limits():
    # The limits claim to bound what the simulator can run: each of our schedulers,
    # replayed under the same interference, must pay at least every one of them (on
    # pai_200's first 40 jobs eva comes within 5% of the waiting limit). Each of these
    # jobs gives its work twice (duration, and total_iters at full_throughput), so the
    # bounds and the world must read the same one.
    from app.bundled import bundled
    from app.files import load_catalog, load_contention_matrix, load_jobs
    from simulator.replay import SCHEDULERS, replay
    from simulator.traces import start_at_first_arrival
    from simulator.world import ground_truth

    catalog = load_catalog(bundled("ec2_config.json"))
    jobs, _ = start_at_first_arrival(load_jobs(bundled("pai_200.json"), catalog))
    jobs = tuple(sorted(jobs, key=lambda j: j.trace.arrival_time_s)[:40])
    assert all(j.trace.duration_s and j.trace.total_iters and j.full_throughput for j in jobs)
    truth = ground_truth(load_contention_matrix(bundled("contention_matrix.csv")))
    limit = waiting_limit(jobs, catalog, truth)
    per_interval = per_interval_limits(jobs, catalog, truth)
    assert limit.exact and per_interval.at_fluid == 0
    assert limit.dollars <= per_interval.with_interference
    bounds = {
        "fluid": clairvoyant_bound(jobs, catalog),
        "whole tasks": per_interval.whole_tasks,
        "with interference": per_interval.with_interference,
        "waiting": limit.dollars,
    }
    assert bounds["fluid"] == pytest.approx(per_interval.fluid)
    for name in SCHEDULERS:
        cost = replay(jobs, catalog, truth, name).total_cost
        for bound, dollars in bounds.items():
            assert cost >= dollars, (name, bound, cost, dollars)


def test_a_trace_whose_duration_disagrees_with_its_iterations_is_neither_bounded_nor_replayed():
    # Its duration twice its iterations: the bound once read the duration ($1.26 on
    # such a trace) while the world ran the iterations, and every scheduler "beat" it.
    from autoscaler.errors import InputError
    from simulator.replay import replay

    jobs = (
        job(
            "a",
            (0, 4, 12),
            full_throughput=1.0,
            trace=TraceFacts(arrival_time_s=0.0, duration_s=7200.0, total_iters=3600.0),
        ),
    )
    truth = ThroughputTable(default=1.0)
    for compute in (
        lambda: clairvoyant_bound(jobs, table3_catalog()),
        lambda: waiting_limit(jobs, table3_catalog(), truth),
        lambda: per_interval_limits(jobs, table3_catalog(), truth),
        lambda: replay(jobs, table3_catalog(), truth, "eva"),
    ):
        with pytest.raises(InputError, match="job 'a': 'duration' = 7200 s but"):
            compute()
