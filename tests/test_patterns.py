"""Column generation over compositions: exact pricing, valid packings, never worse than Alg. 1."""

import random
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.configuration import Configuration
from autoscaler.patterns import (
    Pattern,
    PatternClass,
    PatternPricer,
    TypeShape,
    best_composition,
    best_composition_by_cardinality,
)
from autoscaler.planner import EvaPlanner, planner_by_name
from autoscaler.reconfiguration import Packer, TaskPools
from autoscaler.resources import Resources
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.workloads import pai_catalog_and_jobs, sample_jobs
from tests.builders import job
from tests.test_properties import assert_valid, catalogs, clusters, job_sets, tables


@st.composite
def knapsacks(draw):
    cap = (draw(st.integers(0, 4)), draw(st.integers(1, 16)), draw(st.integers(1, 64)))
    classes = []
    for i in range(draw(st.integers(1, 4))):
        d = (draw(st.integers(0, 2)), draw(st.integers(1, 8)), draw(st.integers(0, 32)))
        limit = draw(st.sampled_from([None, None, 1, 2]))
        classes.append(
            PatternClass(
                draw(st.integers(1, 5)),
                (d,),
                1.0,
                group=f"g{i}" if limit else None,
                group_limit=limit,
            )
        )
    duals = [draw(st.integers(0, 100)) / 10 for _ in classes]
    return TypeShape("t", draw(st.integers(1, 50)) / 10, cap), classes, duals


def brute_force(shape, classes, duals):
    best = 0.0
    ranges = [range(c.count + 1) for c in classes]
    for counts in product(*ranges):
        used = [
            sum(n * c.demands[0][r] for n, c in zip(counts, classes, strict=True)) for r in range(3)
        ]
        if any(u > cap + 1e-9 for u, cap in zip(used, shape.capacity, strict=True)):
            continue
        if any(c.group_limit and n > c.group_limit for n, c in zip(counts, classes, strict=True)):
            continue
        best = max(best, sum(n * u for n, u in zip(counts, duals, strict=True)))
    return best


@settings(max_examples=150, deadline=None)
@given(knapsacks())
def test_branch_and_bound_finds_the_best_composition(problem):
    shape, classes, duals = problem
    comp, value, complete, _ = best_composition(0, shape, classes, duals, None, 10**6)
    expected = brute_force(shape, classes, duals)
    assert complete
    if expected > shape.cost * (1 + 1e-9):
        # the search may skip a type whose best cannot beat its cost; otherwise it is exact
        assert value == pytest.approx(expected)
        used = [sum(n * classes[c].demands[0][r] for c, n in comp) for r in range(3)]
        assert all(u <= cap + 1e-9 for u, cap in zip(used, shape.capacity, strict=True))


def test_configuration_lp_is_at_least_as_tight_as_the_fluid_lp():
    # Two tasks of 3 CPU on 4-CPU instances: the fluid LP packs 6 CPU into 1.5
    # instances ($1.5); whole tasks need two instances, and so does the pattern LP.
    shape = TypeShape("cpu4", 1.0, (0, 4, 16))
    solution = PatternPricer().solve([shape], [PatternClass(2, ((0, 3, 1),), 1.0)])
    assert solution.exact
    assert solution.objective == pytest.approx(2.0)


SETTINGS = settings(max_examples=40, deadline=None)


def fresh_pools(packer: Packer) -> TaskPools:
    pools = TaskPools(packer)
    for c, tasks in enumerate(packer.class_tasks):
        pools.add_unplaced(c, tasks)
    return pools


@SETTINGS
@given(st.data())
def test_priced_packing_is_valid_and_reports_its_saving(data):
    catalog = data.draw(catalogs())
    jobs = data.draw(job_sets(catalog, max_jobs=30))
    table = data.draw(tables())
    packer = Packer(ClusterView(catalog, jobs, throughput=table), pricer=PatternPricer())
    placement = packer.priced(fresh_pools(packer), [])
    assert_valid(Configuration(tuple(placement.instances)), jobs)
    assert placement.saving == pytest.approx(packer.saving(placement.instances), abs=1e-6)


@SETTINGS
@given(st.data())
def test_default_packing_is_never_worse_than_algorithm1(data):
    catalog = data.draw(catalogs())
    jobs = data.draw(job_sets(catalog, max_jobs=30))
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    plain = Packer(view).full_placement()
    best = Packer(view, pricer=PatternPricer(), pattern_min_tasks=0).full_placement()
    assert best.saving >= plain.saving - 1e-9
    assert Configuration(tuple(best.instances)).hourly_cost <= (
        Configuration(tuple(plain.instances)).hourly_cost + 1e-9
    )


@SETTINGS
@given(clusters())
def test_priced_planner_plans_a_running_cluster_validly(cluster):
    catalog, jobs, current, table = cluster
    plan = planner_by_name("eva", pattern_min_tasks=0).plan(
        ClusterView(catalog, jobs, current, table)
    )
    for candidate in plan.candidates:
        assert_valid(candidate.configuration, jobs)
    if table.is_neutral and plan.lower_bound is not None:
        assert plan.lower_bound_hourly_cost <= plan.hourly_cost + 1e-6


def test_pop_split_plans_every_task_once_at_the_same_cost():
    catalog, source = pai_catalog_and_jobs()
    jobs = sample_jobs(source, 3000, seed=7)
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    whole = planner_by_name("eva").plan(view)
    split = planner_by_name("eva", pop_threshold=1000, pop_parts=3).plan(view)
    assert split.partitions == 3 and whole.partitions == 1
    assert_valid(split.configuration, jobs)
    assert split.lower_bound_hourly_cost == pytest.approx(whole.lower_bound_hourly_cost)
    assert split.hourly_cost <= whole.hourly_cost * 1.01


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_pricing_per_cardinality_finds_the_best_composition_under_the_default(data):
    # With every pair at the default t, m tasks together each run at t^(m-1): the
    # exact value of a composition is Σ a_c u_c − (1 − t^(m−1)) Σ a_c RP_c.
    t = data.draw(st.sampled_from([0.8, 0.9, 0.95]))
    n = data.draw(st.integers(1, 4))
    classes = [
        PatternClass(
            count=data.draw(st.integers(1, 3)),
            demands=(
                (0.0, float(data.draw(st.integers(1, 4))), float(data.draw(st.integers(0, 8)))),
            ),
            rp=data.draw(st.integers(1, 20)) / 10,
        )
        for _ in range(n)
    ]
    duals = [cls.rp * data.draw(st.integers(0, 10)) / 10 for cls in classes]
    shape = TypeShape("k", data.draw(st.integers(0, 30)) / 10, (0.0, 8.0, 16.0))

    def loss(comp: tuple[int, ...], k: int) -> float:
        return (1 - t ** (len(comp) - 1)) * sum(classes[c].rp for c in comp)

    best = 0.0
    for counts in product(*[range(cls.count + 1) for cls in classes]):
        cpu = sum(a * cls.demands[0][1] for a, cls in zip(counts, classes, strict=True))
        ram = sum(a * cls.demands[0][2] for a, cls in zip(counts, classes, strict=True))
        if not any(counts) or cpu > 8 or ram > 16:
            continue
        comp = tuple(c for c, a in enumerate(counts) for _ in range(a))
        best = max(best, sum(duals[c] for c in comp) - loss(comp, 0))
    comp, value, complete, _ = best_composition_by_cardinality(
        0, shape, classes, duals, loss, 10**6, t, [cls.rp for cls in classes]
    )
    assert complete
    if best > shape.cost + 1e-9:  # a column only matters when it beats the instance's cost
        assert value == pytest.approx(best, abs=1e-9)
    else:
        assert comp is None or value <= shape.cost + 1e-9


def wide_catalog() -> Catalog:
    """The 21 EC2 types and 200 variants of them with other sizes and prices."""
    base, _ = pai_catalog_and_jobs()
    rng = random.Random(5)
    types = list(base.types)
    for i in range(200):
        t = rng.choice(base.types)
        grow = rng.uniform(0.5, 1.5)
        capacity = Resources(
            t.capacity.gpu,
            max(1, round(t.capacity.cpu * grow)),
            round(t.capacity.ram_gb * rng.uniform(0.5, 1.5)),
        )
        cost = round(t.hourly_cost * grow * rng.uniform(0.97, 1.1), 4)
        types.append(InstanceType(f"{t.name}-v{i}", t.family, capacity, cost))
    return Catalog(types)


def test_a_catalog_of_221_types_gets_the_plan_a_larger_search_budget_finds():
    catalog = wide_catalog()
    _, source = pai_catalog_and_jobs()
    view = ClusterView(
        catalog, sample_jobs(source, 3000, seed=3), throughput=ThroughputTable(default=1.0)
    )
    default = EvaPlanner().plan(view)
    generous = EvaPlanner()
    generous._pricer = PatternPricer(node_budget=1_000_000)
    assert default.hourly_cost <= generous.plan(view).hourly_cost + 1e-6


def test_seeds_are_columns_from_the_start():
    # One type ($1, 2 CPUs) and two tasks of 1 CPU, 0.95 each beside the other:
    # together they cost $1 and lose 2 · 0.05 · RP = $0.10; apart, $2. A search
    # cut at its first node finds no pair, so only a seeded pair gets the LP to $1.10.
    shape = TypeShape("t", 1.0, (0.0, 2.0, 2.0))
    classes = [PatternClass(2, ((0.0, 1.0, 1.0),), 1.0)]

    def loss(comp, k):
        return 0.05 * len(comp) if len(comp) > 1 else 0.0

    def pricer():
        return PatternPricer(interference_node_limit=1, interference_node_budget=1)

    cut = pricer().solve([shape], classes, loss, (0.95, [1.0]))
    assert cut.objective == pytest.approx(2.0)
    seeded = pricer().solve([shape], classes, loss, (0.95, [1.0]), [Pattern(0, ((0, 2),))])
    assert seeded.objective == pytest.approx(1.10)


def test_under_interference_the_configuration_lp_packs_better_than_algorithm1():
    # 16 tasks of (1 GPU, 8 cores, 30 GB), RP $12.24 (a p3.8xlarge of 16 cores),
    # 0.95 a pair by default. Algorithm 1 fills the dearest type first: four on a
    # p3.16xlarge ($24.48) at 0.95³, saving 4 · 12.24 · 0.857 − 24.48 = $17.50
    # each, $69.99/h in all. Two on a p3.8xlarge save 2 · 12.24 · 0.95 − 12.24 =
    # $11.02 for half as many tasks, $22.03 per four: the priced packing finds
    # these, up to $88.13/h with all eight pairs, for the same $97.92/h.
    catalog, _ = pai_catalog_and_jobs()
    view = ClusterView(catalog, (job("ddp", *[(1, 8, 30)] * 16),), throughput=ThroughputTable())
    greedy = EvaPlanner(price_interference=False).plan(view)
    priced = EvaPlanner().plan(view)
    assert greedy.candidates[0].saving_per_hour == pytest.approx(4 * (12.24 * 4 * 0.95**3 - 24.48))
    assert greedy.hourly_cost == priced.hourly_cost == pytest.approx(97.92)
    saving = priced.candidates[0].saving_per_hour
    assert greedy.candidates[0].saving_per_hour + 1 < saving <= 8 * (2 * 12.24 * 0.95 - 12.24)


def test_a_seed_that_breaks_anti_affinity_is_not_a_column():
    # Two tasks of one job allowed once per instance: a seeded pair would pack
    # them together, so the LP must keep them apart ($2.00, not $1.10).
    shape = TypeShape("t", 1.0, (0.0, 2.0, 2.0))
    classes = [PatternClass(2, ((0.0, 1.0, 1.0),), 1.0, group="job", group_limit=1)]

    def loss(comp, k):
        return 0.05 * len(comp) if len(comp) > 1 else 0.0

    pricer = PatternPricer(interference_node_limit=1, interference_node_budget=1)
    seeded = pricer.solve([shape], classes, loss, (0.95, [1.0]), [Pattern(0, ((0, 2),))])
    assert seeded.objective == pytest.approx(2.0)


def test_tasks_left_after_rounding_down_are_priced_again(monkeypatch):
    # 7 tasks of 5 CPU and 11 of 2 CPU, every pair at the default 0.95: the
    # configuration LP's patterns round down to whole copies that leave tasks
    # over; packing those by Algorithm 1 alone costs more than pricing them again
    # (iterative rounding, CvxCluster §6.4).
    import autoscaler.reconfiguration as reconfiguration

    catalog = Catalog(
        [
            InstanceType("t0", "any", Resources(0, 12, 48), 1.612),
            InstanceType("t1", "any", Resources(0, 8, 32), 0.899),
            InstanceType("t2", "any", Resources(0, 6, 24), 0.814),
        ]
    )
    jobs = tuple(job(f"j{i}", (0, 5, 5)) for i in range(7)) + tuple(
        job(f"j{i}", (0, 2, 2)) for i in range(7, 18)
    )
    view = ClusterView(catalog, jobs, throughput=ThroughputTable())

    def packed() -> tuple[float, float]:
        packer = Packer(view, pricer=PatternPricer())
        placement = packer.priced(fresh_pools(packer), [])
        config = Configuration(tuple(placement.instances))
        assert_valid(config, jobs)
        return placement.saving, config.hourly_cost

    saving, cost = packed()
    monkeypatch.setattr(reconfiguration, "ROUNDING_PASSES", 1)
    once_saving, once_cost = packed()
    assert saving > once_saving + 0.1
    assert cost < once_cost - 0.1


@st.composite
def multi_type_knapsacks(draw):
    """Classes over two types, with anti-affinity limits, values and stakes drawn."""
    shapes = [
        TypeShape(
            f"t{k}",
            draw(st.integers(1, 50)) / 10,
            (draw(st.integers(0, 4)), draw(st.integers(1, 16)), draw(st.integers(1, 64))),
        )
        for k in range(2)
    ]
    classes = []
    for i in range(draw(st.integers(1, 6))):
        demands = tuple(
            (draw(st.integers(0, 2)), draw(st.integers(1, 8)), draw(st.integers(0, 32)))
            for _ in shapes
        )
        limit = draw(st.sampled_from([None, None, 1, 2]))
        classes.append(
            PatternClass(
                draw(st.integers(1, 5)),
                demands,
                1.0,
                group=f"g{i % 2}" if limit else None,
                group_limit=limit,
            )
        )
    duals = [draw(st.integers(0, 100)) / 10 for _ in classes]
    stakes = [draw(st.integers(0, 50)) / 10 for _ in classes]
    return shapes, classes, duals, stakes, draw(st.integers(1, 40))


@settings(max_examples=150, deadline=None)
@given(multi_type_knapsacks())
def test_searches_sharing_a_solves_cache_find_what_fresh_searches_find(problem):
    # A solve computes once what its searches read of the classes on each type, and the
    # per-cardinality values once per iteration for every type: each search must return
    # exactly what it returns alone, nodes included (the node budget stops a solve).
    from autoscaler.patterns import _fitting, _OnType

    shapes, classes, duals, stakes, limit = problem

    def loss(comp, k):
        return 0.1 * (len(comp) - 1) * sum(stakes[c] for c in comp)

    shared: dict = {}
    for k, shape in enumerate(shapes):
        fitting = _fitting(k, shape, classes)
        on_type = _OnType(k, shape, classes)
        alone = best_composition(k, shape, classes, duals, None, limit, None, fitting)
        cached = best_composition(k, shape, classes, duals, None, limit, None, fitting, on_type)
        assert cached == alone
        for m in (2, 3):
            alone = best_composition(k, shape, classes, duals, None, limit, m, fitting)
            cached = best_composition(k, shape, classes, duals, None, limit, m, fitting, on_type)
            assert cached == alone
        alone = best_composition_by_cardinality(
            k, shape, classes, duals, loss, limit, 0.9, stakes, fitting
        )
        cached = best_composition_by_cardinality(
            k, shape, classes, duals, loss, limit, 0.9, stakes, fitting, on_type, shared
        )
        again = best_composition_by_cardinality(  # `most` now remembered by on_type
            k, shape, classes, duals, loss, limit, 0.9, stakes, fitting, on_type, shared
        )
        assert cached == alone == again
