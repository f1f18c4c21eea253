"""The planner against the exact optimum on small random inputs: the MIP of
`autoscaler.bounds` (every composition, solved by HiGHS) is an independent check of
the packing, which never calls it."""

from __future__ import annotations

import random

import pytest

from autoscaler.bounds import mip_optimum
from autoscaler.planner import planner_by_name, task_classes
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.feasibility import infeasibilities
from benchmarks.workloads import HELD_OUT, SHAPES, distinct_jobs, pai_catalog_and_jobs

SHAPE_NAMES = sorted(HELD_OUT) + sorted(SHAPES)
SEEDS = range(40)


@pytest.fixture(scope="module")
def ratios() -> list[tuple[int, str, int, float]]:
    """(seed, shape, tasks, plan ÷ MIP optimum) where the MIP proved its optimum."""
    catalog, _ = pai_catalog_and_jobs()
    out = []
    for seed in SEEDS:
        rng = random.Random(seed)
        shape = SHAPE_NAMES[seed % len(SHAPE_NAMES)]
        n = rng.randint(4, 24)
        jobs = distinct_jobs(n, seed=seed, shape=shape)
        view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
        plan = planner_by_name("eva").plan(view)
        assert infeasibilities(plan, jobs, catalog) == [], (seed, shape, n)
        mip = mip_optimum(catalog, task_classes(view), plan.hourly_cost, 10.0)
        assert mip.lower_bound <= plan.hourly_cost * (1 + 1e-9), (seed, shape, n)
        if mip.optimal:
            assert mip.hourly_cost is not None
            out.append((seed, shape, n, plan.hourly_cost / mip.hourly_cost))
    return out


def test_most_small_plans_are_within_half_a_percent_of_the_optimum(ratios) -> None:
    # issue 19's 1.005x: 872b866's packer met it on 21 of 37 proven inputs here, the
    # integer master (`Packer._integer_master`) on 32 of 35. Which inputs the MIP proves
    # within its 10 s depends on the machine's load: 23 of the 40 take it under 0.2 CPU-s,
    # so a busy machine proves at least those. Only three plans are above 1.005x (1.006,
    # 1.020, 1.027), so these verdicts hold on any 20 proven, those three among them.
    assert len(ratios) >= 20
    within = [r for r in ratios if r[3] <= 1.005 + 1e-9]
    assert len(within) >= 0.85 * len(ratios), [r for r in ratios if r[3] > 1.005 + 1e-9]


def test_no_small_plan_is_far_from_the_optimum(ratios) -> None:
    # 872b866's packer: up to 1.33x, 1.031x on average; with the integer master
    # 1.027x and 1.0015x (at 50 nodes, on a busy machine)
    worst = max(ratios, key=lambda r: r[3])
    assert worst[3] <= 1.05, worst
    mean = sum(r[3] for r in ratios) / len(ratios)
    assert mean <= 1.005, mean
