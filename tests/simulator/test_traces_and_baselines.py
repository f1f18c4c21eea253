"""Trace synthesis (seeded, Gavel-style) and the baselines' placement rules."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from app.bundled import bundled
from app.files import jobs_from_eva, load_catalog, load_jobs
from autoscaler.configuration import Configuration, Instance
from autoscaler.errors import InputError
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from simulator.baselines import NoPackingPlanner, OwlPlanner, StratusPlanner, SynergyPlanner
from simulator.traces import check_replay_span, synthesize
from tests.simulator.test_hand_computed import catalog, job


@pytest.fixture(scope="module")
def pai_jobs():
    return load_jobs(bundled("pai_200.json"), load_catalog(bundled("ec2_config.json")))


@pytest.mark.parametrize(("duration", "shown"), [(9e10, "1e+06 days"), (4e7, "463 days")])
def test_a_trace_too_long_to_replay_is_refused_in_a_readable_line(duration, shown):
    trace = {"0": {"duration": duration, "tasks": {"0": {"demand": {"any": [1, 4, 8]}}}}}
    with pytest.raises(InputError) as refused:
        check_replay_span(jobs_from_eva(trace), "t.json")
    message = str(refused.value)
    assert f"field 'duration' = {duration!r}: is {shown}; a replay covers at most a year" in message
    assert len(message) < 200


def test_a_duration_no_trace_could_mean_is_refused_by_the_trace_schema():
    trace = {"0": {"duration": 1e300, "tasks": {"0": {"demand": {"any": [1, 4, 8]}}}}}
    with pytest.raises(InputError, match=r"job '0': field 'duration' = 1e\+300: must be a number"):
        jobs_from_eva(trace)


def test_the_span_is_checked_on_the_work_the_world_will_run_not_the_duration_beside_it():
    # The world runs total_iters at full_throughput when both are given (1e18 s
    # here); a plausible duration beside them let the replay start and never end.
    # Now the two disagreeing is refused, naming the work the world would run;
    # without the duration, the span check names it.
    spec = {"duration": 1000, "full_throughput": 1e-9, "total_iters": 1e9}
    trace = {"0": spec | {"tasks": {"0": {"demand": {"any": [0, 1, 2]}}}}}
    with pytest.raises(InputError, match=r"'total_iters' / 'full_throughput' = .* = 1e\+18 s"):
        check_replay_span(jobs_from_eva(trace), "t.json")
    del trace["0"]["duration"]
    with pytest.raises(InputError, match=r"field 'total_iters / full_throughput' = 1e\+18"):
        check_replay_span(jobs_from_eva(trace), "t.json")


def test_a_synthetic_trace_draws_multi_task_jobs_from_the_counts_asked(pai_jobs):
    trace = synthesize(pai_jobs, 200, seed=1, multi_task_share=0.5, task_counts=(3, 16))
    assert {len(j["tasks"]) for j in trace.values()} == {1, 3, 16}


def test_synthesis_is_reproducible_and_seed_dependent(pai_jobs):
    assert synthesize(pai_jobs, 50, seed=1) == synthesize(pai_jobs, 50, seed=1)
    assert synthesize(pai_jobs, 50, seed=1) != synthesize(pai_jobs, 50, seed=2)


def test_synthetic_durations_and_arrivals_follow_gavel_and_poisson(pai_jobs):
    jobs = jobs_from_eva(synthesize(pai_jobs, 4000, seed=7, arrivals_per_hour=3.0))
    minutes = [j.trace.duration_s / 60 for j in jobs]
    exponents = [math.log10(m) for m in minutes]
    assert min(exponents) >= 1.5 - 1e-3 and max(exponents) <= 4 + 1e-3
    long_share = sum(x > 3 for x in exponents) / len(exponents)
    assert long_share == pytest.approx(0.2, abs=0.03)  # x in [3, 4] w.p. 0.2
    gaps = [b.trace.arrival_time_s - a.trace.arrival_time_s for a, b in itertools.pairwise(jobs)]
    assert min(gaps) >= 0
    assert statistics.mean(gaps) == pytest.approx(1200, rel=0.06)  # 3 per hour
    # demands and workloads come from the source trace
    source = {(t.demands, t.workload.split("_")[0]) for j in pai_jobs for t in j.tasks}
    assert all((t.demands, t.workload.split("_")[0]) in source for j in jobs for t in j.tasks)
    assert all(
        j.trace.total_iters == pytest.approx(j.trace.duration_s * j.full_throughput) for j in jobs
    )


def test_multi_task_share_duplicates_tasks_into_2_or_4(pai_jobs):
    jobs = jobs_from_eva(synthesize(pai_jobs, 1000, seed=3, multi_task_share=0.5))
    sizes = [len(j.tasks) for j in jobs]
    assert set(sizes) == {1, 2, 4}
    assert sum(s > 1 for s in sizes) / len(sizes) == pytest.approx(0.5, abs=0.05)
    multi = next(j for j in jobs if len(j.tasks) > 1)
    assert len({(t.demands, t.workload) for t in multi.tasks}) == 1


def view(jobs, current=(), table=None, progress=None):
    return ClusterView(
        catalog(),
        tuple(jobs),
        Configuration(tuple(current)),
        table if table is not None else ThroughputTable(default=1.0),
        progress=progress or {},
    )


def test_no_packing_puts_every_new_task_alone_and_keeps_running_ones():
    running = Instance("i-1", catalog()["big"], ("a/0",))
    plan = NoPackingPlanner().plan(
        view([job("a", 0, 10), job("b", 0, 10), job("c", 0, 10)], [running])
    )
    by_id = {i.instance_id: i.tasks for i in plan.configuration}
    assert by_id["i-1"] == ("a/0",)
    new = [i for i in plan.configuration if i.instance_id is None]
    assert sorted((i.type.name, i.tasks) for i in new) == [("small", ("b/0",)), ("small", ("c/0",))]


def test_synergy_fills_an_existing_instance_when_it_breaks_even():
    running = Instance("i-1", catalog()["big"], ("a/0",))
    plan = SynergyPlanner().plan(view([job("a", 0, 10), job("b", 0, 10)], [running]))
    assert [(i.instance_id, sorted(i.tasks)) for i in plan.configuration] == [
        ("i-1", ["a/0", "b/0"])
    ]


def test_synergy_does_not_share_when_interference_makes_it_a_loss():
    running = Instance("i-1", catalog()["big"], ("a/0",))
    table = ThroughputTable(default=0.7)  # learned: pairs run at 0.7 -> $4.20 < $5
    plan = SynergyPlanner().plan(view([job("a", 0, 10), job("b", 0, 10)], [running], table))
    assert sorted((i.instance_id, i.type.name) for i in plan.configuration if "b/0" in i.tasks) == [
        (None, "small")
    ]


def test_owl_pairs_only_what_the_profile_says_is_worth_it_and_never_more_than_two():
    jobs = [job(x, 0, 10, demand=(1, 2, 8)) for x in "abcd"]
    good = ThroughputTable(default=1.0)
    plan = OwlPlanner(good).plan(view(jobs))
    assert [len(i.tasks) for i in plan.configuration] == [2, 2]
    assert {i.type.name for i in plan.configuration} == {"big"}
    bad = ThroughputTable(default=0.8)  # every pair at 0.8: $4.80 on a $5 instance
    plan = OwlPlanner(bad).plan(view(jobs))
    assert [len(i.tasks) for i in plan.configuration] == [1, 1, 1, 1]


def test_stratus_keeps_tasks_with_similar_remaining_runtime_together():
    # "big" hosts a job with ~10,000 s left; new jobs: one with ~10,000 s and one
    # with ~100 s left. The similar one joins "big"; the short one does not.
    running = Instance("i-1", catalog()["big"], ("a/0",))
    jobs = [job("a", 0, 20_000), job("b", 0, 10_500), job("c", 0, 100, demand=(0, 1, 1))]
    plan = StratusPlanner().plan(view(jobs, [running], progress={"a": 10_000.0}))
    by_task = {t: i for i in plan.configuration for t in i.tasks}
    assert by_task["b/0"].instance_id == "i-1"
    assert by_task["c/0"].instance_id is None
