"""Honest bounds on static packing: fluid ≤ configuration LP ≤ MIP optimum ≤ any plan."""

import random

import pytest

from autoscaler.bounds import (
    configuration_bound,
    grouped_configuration_bound,
    mip_optimum,
    static_bounds,
    whole_task_bound,
)
from autoscaler.catalog import Catalog
from autoscaler.lp import LPClass, solve_lp
from autoscaler.planner import planner_by_name, task_classes
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.workloads import pai_catalog_and_jobs
from tests.builders import itype, job, table3_catalog


def test_tasks_of_six_tenths_of_an_instance_cost_one_instance_each_not_six_tenths():
    # Five tasks of 6 of an instance's 10 CPUs: two never share one. The fluid LP
    # pools the CPUs (3 instances' worth); whole tasks need 5 instances.
    catalog = Catalog([itype("one", 0, 10, 100, 1.0)])
    classes = [LPClass(((0, 6, 10),), 5)]
    assert solve_lp(catalog, classes).lower_bound == pytest.approx(3.0)
    config = configuration_bound(catalog, classes)
    assert config.converged
    assert config.lower_bound == pytest.approx(5.0)
    assert mip_optimum(catalog, classes).lower_bound == pytest.approx(5.0)
    # The fluid LP with dual-feasible-function rows counts each such task whole too.
    assert whole_task_bound(catalog, classes) == pytest.approx(5.0)


def test_the_configuration_bound_sees_what_fits_beside_what_on_two_types():
    # Tasks of 5 CPUs: a small type (8 CPUs, $0.8) holds one, a large one (16, $1.5)
    # three. Fluid: $0.09375 per CPU on the large type, $0.46875 a task. Whole: 3 on
    # a large at $0.5 a task; 4 tasks cost one large + one small = $2.3, or two
    # large $3.0: optimum $2.3; the configuration LP takes 4/3 large = $2.0.
    catalog = Catalog([itype("small", 0, 8, 64, 0.8), itype("large", 0, 16, 128, 1.5)])
    classes = [LPClass(((0, 5, 8), (0, 5, 8)), 4)]
    assert solve_lp(catalog, classes).lower_bound == pytest.approx(1.875)
    assert configuration_bound(catalog, classes).lower_bound == pytest.approx(2.0)
    mip = mip_optimum(catalog, classes)
    assert mip.optimal and mip.hourly_cost == pytest.approx(2.3)


@pytest.mark.parametrize("max_patterns", [100_000, 0])
def test_the_exact_optimum_of_eva_s_table_3_is_algorithm_1_s(max_patterns):
    # Eva §4.2, Table 3: τ1 (2, 8, 24), τ2 (1, 4, 10), τ4 (0, 4, 12) on it1, τ3
    # (0, 6, 20) on it3: $12.8/h, and nothing cheaper hosts τ1's two GPUs beside
    # the rest. max_patterns=0 takes the assignment MIP over instance slots.
    catalog = table3_catalog()
    jobs = [
        job("1", (2, 8, 24)),
        job("2", (1, 4, 10)),
        job("3", (0, 6, 20)),
        job("4", (0, 4, 12)),
    ]
    classes = task_classes(ClusterView(catalog, tuple(jobs)))
    mip = mip_optimum(catalog, classes, max_patterns=max_patterns)
    assert mip.optimal
    assert mip.hourly_cost == pytest.approx(12.8)


def test_anti_affinity_is_a_constraint_of_every_pattern():
    # Two tasks of one job, at most one per instance: two instances, though both fit one.
    catalog = Catalog([itype("one", 0, 16, 100, 1.0)])
    classes = [LPClass(((0, 4, 8),), 2, group="j", group_limit=1)]
    assert configuration_bound(catalog, classes).lower_bound == pytest.approx(2.0)
    assert mip_optimum(catalog, classes).hourly_cost == pytest.approx(2.0)
    assert mip_optimum(catalog, classes, max_patterns=0).hourly_cost == pytest.approx(2.0)


def test_stopped_early_the_bound_is_farley_s_and_still_below_the_optimum():
    rng = random.Random(7)
    catalog = table3_catalog()
    classes = [
        LPClass(((0, c, r),) * 4, rng.randint(1, 3))
        for c, r in ((rng.uniform(0.5, 6), rng.uniform(1, 20)) for _ in range(25))
    ]
    full = configuration_bound(catalog, classes)
    early = configuration_bound(catalog, classes, max_iterations=1)
    assert full.converged and not early.converged
    assert early.lower_bound <= full.lower_bound * (1 + 1e-9)
    assert early.lower_bound <= early.master
    assert early.lower_bound > 0


@pytest.mark.parametrize("seed", range(6))
def test_each_bound_lies_between_the_one_below_and_any_plan(seed):
    # Fluid ≤ configuration LP ≤ MIP optimum ≤ the cost of eva's plan (no interference).
    rng = random.Random(seed)
    catalog = table3_catalog()
    jobs = tuple(
        job(
            str(i),
            (rng.choice((0, 0, 0, 1, 2)), rng.uniform(0.5, 8), rng.uniform(1, 30)),
        )
        for i in range(rng.randint(4, 14))
    )
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    plan = planner_by_name("eva").plan(view)
    fluid = plan.lower_bound_hourly_cost
    bounds = static_bounds(
        catalog, task_classes(view), fluid, exact=True, upper_bound=plan.hourly_cost
    )
    assert bounds.configuration is not None and bounds.mip is not None
    config = bounds.configuration.lower_bound
    assert bounds.mip.optimal
    optimum = bounds.mip.lower_bound
    assert fluid <= config * (1 + 1e-9) + 1e-9
    assert bounds.whole_tasks is not None
    assert fluid <= bounds.whole_tasks * (1 + 1e-9) + 1e-9
    assert bounds.whole_tasks <= optimum * (1 + 1e-6) + 1e-9
    assert config <= optimum * (1 + 1e-6) + 1e-9
    assert optimum <= plan.hourly_cost * (1 + 1e-6) + 1e-9
    assert bounds.tightest == pytest.approx(optimum)
    # The assignment MIP over slots finds the same optimum.
    slots = mip_optimum(catalog, task_classes(view), plan.hourly_cost, max_patterns=0)
    assert slots.optimal and slots.hourly_cost == pytest.approx(optimum, rel=1e-6)


def test_grouped_bound_counts_distinct_tasks_over_half_an_instance_whole():
    # 40 tasks of 6.0–6.4 of an instance's 10 CPUs, each its own class: no two share
    # an instance, so any configuration costs 40; the fluid LP pools them (≈ 24.8).
    rng = random.Random(3)
    catalog = Catalog([itype("one", 0, 10, 100, 1.0)])
    classes = [LPClass(((0, 6 + 0.4 * rng.random(), 1.0),), 1) for _ in range(40)]
    fluid = solve_lp(catalog, classes).lower_bound
    grouped = grouped_configuration_bound(catalog, classes)
    assert fluid < 26
    assert grouped.converged
    assert grouped.lower_bound == pytest.approx(40.0)


def test_grouped_bound_keeps_small_tasks_fluid():
    # 1,000 distinct tasks of 0.01–0.02 CPU round down to nothing: only their rest is
    # counted, fluidly, so the bound is the fluid one (their CPUs over 10 per instance).
    rng = random.Random(4)
    catalog = Catalog([itype("one", 0, 10, 1000, 1.0)])
    classes = [LPClass(((0, 0.01 + 0.01 * rng.random(), 0.1),), 1) for _ in range(1000)]
    fluid = solve_lp(catalog, classes).lower_bound
    grouped = grouped_configuration_bound(catalog, classes)
    assert grouped.lower_bound == pytest.approx(fluid, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_grouped_bound_is_below_the_optimum(seed):
    # Demands rounded down onto grids this coarse still never bound above the MIP
    # optimum, whatever the grid the class limit forces.
    rng = random.Random(seed)
    catalog = table3_catalog()
    jobs = tuple(
        job(str(i), (rng.choice((0, 0, 1, 2)), rng.uniform(0.5, 8), rng.uniform(1, 30)))
        for i in range(rng.randint(6, 14))
    )
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    classes = task_classes(view)
    mip = mip_optimum(catalog, classes)
    assert mip.optimal
    for max_classes in (2, 5, 50):
        grouped = grouped_configuration_bound(catalog, classes, max_classes=max_classes)
        assert grouped.lower_bound <= mip.lower_bound * (1 + 1e-6) + 1e-9
        assert grouped.lower_bound > 0


def test_grouped_bound_keeps_each_task_s_rest_on_its_own_instance():
    # Six 8-GPU tasks (3–4 CPUs) and six 1-GPU tasks of 17–20 CPUs on an 8-GPU,
    # 32-CPU type: no two share an instance (9 GPUs, or 34+ CPUs), so any
    # configuration costs 12. Two classes force a grid of 8 CPUs: each 1-GPU task
    # rounds down to 16, two per instance, their 1–4 CPUs of rest left over. If
    # that rest may sit in any leftover room, the 8-GPU tasks' spare CPUs take it
    # and the bound is 6 + 3 = 9; a task's rest sits where the task does, so an
    # instance holds no more rest than its own tasks bring.
    rng = random.Random(5)
    catalog = Catalog([itype("p", 8, 32, 488, 1.0), itype("c", 0, 96, 384, 0.35)])
    classes = [LPClass(((8, 3 + rng.random(), 10.0), None), 1) for _ in range(6)]
    classes += [LPClass(((1, 17 + 3 * rng.random(), 10.0), None), 1) for _ in range(6)]
    grouped = grouped_configuration_bound(catalog, classes, max_classes=2)
    assert grouped.lower_bound > 10.0
    assert grouped.lower_bound <= 12.0 + 1e-9


@pytest.mark.parametrize("max_patterns", [100_000, 0])
def test_a_mip_stopped_at_once_keeps_the_bound_it_was_given(max_patterns):
    # Stopped before HiGHS proves anything, the MIP's bound is the one known before it
    # (the pattern MIP reported 0 here), never above the true optimum.
    catalog = table3_catalog()
    rng = random.Random(3)
    classes = [LPClass(((0, rng.randint(1, 6), rng.randint(2, 20)),) * 4, 3) for _ in range(6)]
    optimum = mip_optimum(catalog, classes)
    assert optimum.optimal
    known = configuration_bound(catalog, classes).lower_bound
    assert 0 < known <= optimum.hourly_cost + 1e-9
    stopped = mip_optimum(
        catalog, classes, time_limit_s=0.0, lower_bound=known, max_patterns=max_patterns
    )
    assert known - 1e-9 <= stopped.lower_bound <= optimum.hourly_cost + 1e-9
    if stopped.hourly_cost is not None:
        assert stopped.hourly_cost >= optimum.hourly_cost - 1e-9


def test_a_knapsack_the_search_cuts_short_is_solved_as_a_mip_and_the_lp_converges():
    # 40 tasks of a quarter to half of a c7i.48xlarge's 96 CPUs (Johnson's FFD worst
    # case, each with its own ε): pricing a 48xlarge is a knapsack over 40 classes
    # that the branch and bound, given few nodes, leaves open, and its LP relaxation
    # put Farley's bound under the fluid one although the master was at the optimum.
    rng = random.Random(7)
    catalog, _ = pai_catalog_and_jobs()
    classes = []
    for share, k in ((0.5, 1), (0.25, 2), (0.25, 1), (0.25, -2)):
        for _ in range(8 if k != -2 else 16):
            cpu = 96 * (share + k * rng.uniform(0.001, 0.02))
            ram = cpu * rng.uniform(0.9, 1.1)
            classes.append(LPClass(tuple((0.0, cpu, ram) for _ in catalog.types), 1))
    fluid = solve_lp(catalog, classes).lower_bound
    config = configuration_bound(catalog, classes)
    assert config.converged
    assert config.lower_bound == pytest.approx(config.master)
    assert config.lower_bound >= fluid - 1e-9
