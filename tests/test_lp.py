"""The LP relaxation over instance types: bound, duals, warm start, anti-affinity."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from autoscaler.catalog import Catalog
from autoscaler.lp import LPClass, ShadowPricer, solve_lp
from autoscaler.planner import planner_by_name
from autoscaler.resources import EPSILON
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from tests.builders import itype, job, table3_catalog, table3_jobs

NO_INTERFERENCE = ThroughputTable(default=1.0)


def lp_class(catalog: Catalog, demand, count=1, group=None, limit=None) -> LPClass:
    fits = tuple(
        demand if all(d <= c + EPSILON for d, c in zip(demand, t.capacity, strict=True)) else None
        for t in catalog.types
    )
    return LPClass(fits, count, group, limit)


def test_table3_lp_bound_and_task_prices():
    catalog = table3_catalog()
    demands = [(2, 8, 24), (1, 4, 10), (0, 6, 20), (0, 4, 12)]
    solution = solve_lp(catalog, [lp_class(catalog, d) for d in demands])
    assert solution.lower_bound == pytest.approx(10.0)
    # τ1 $6, τ2 $3, τ3 $0.6, τ4 $0.4: what each costs once they share instances
    assert solution.class_prices == pytest.approx((6.0, 3.0, 0.6, 0.4))
    assert set(solution.type_usage) <= {"it1", "it2", "it3", "it4"}


def test_planner_reports_the_table3_bound():
    plan = planner_by_name("eva").plan(
        ClusterView(table3_catalog(), table3_jobs(), throughput=NO_INTERFERENCE)
    )
    assert plan.lower_bound_hourly_cost == pytest.approx(10.0)
    assert plan.hourly_cost == pytest.approx(12.8)


def test_pai_200_bound_agrees_with_an_independent_highs_solve():
    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = load_jobs(bundled("pai_200.json"), catalog)
    plan = planner_by_name("eva").plan(ClusterView(catalog, jobs, throughput=NO_INTERFERENCE))
    # figures given by the issue, from a separate HiGHS model of all 200 tasks
    assert plan.lower_bound_hourly_cost == pytest.approx(1421.46, rel=0.005)
    assert plan.no_packing_hourly_cost == pytest.approx(2135.68, abs=0.01)
    assert plan.lower_bound_hourly_cost <= plan.hourly_cost


@st.composite
def lp_problems(draw):
    types = [
        itype(
            f"t{i}",
            draw(st.sampled_from([0, 1, 2, 4])),
            draw(st.integers(1, 32)),
            draw(st.integers(4, 256)),
            draw(st.integers(10, 3000)) / 100,
        )
        for i in range(draw(st.integers(1, 6)))
    ]
    catalog = Catalog(types)
    classes = []
    for _ in range(draw(st.integers(1, 8))):
        host = draw(st.sampled_from(types)).capacity
        demand = (
            draw(st.integers(0, int(host.gpu))),
            draw(st.integers(1, int(host.cpu))),
            draw(st.integers(0, int(host.ram_gb))),
        )
        classes.append(lp_class(catalog, demand, draw(st.integers(1, 50))))
    return catalog, classes


@settings(max_examples=60, deadline=None)
@given(lp_problems())
def test_duals_are_feasible_and_strong_duality_holds(problem):
    catalog, classes = problem
    solution = solve_lp(catalog, classes)
    # Σ n_c u_c equals the optimum (strong duality) ...
    assert sum(c.count * u for c, u in zip(classes, solution.class_prices, strict=True)) == (
        pytest.approx(solution.lower_bound, rel=1e-6, abs=1e-6)
    )
    # ... and no task is priced above what its resources cost on any type it fits
    for c, u in zip(classes, solution.class_prices, strict=True):
        for t in catalog.types:
            d = c.demands[catalog.types.index(t)]
            if d is None:
                continue
            price = sum(p * x for p, x in zip(solution.shadow_prices[t.name], d, strict=True))
            assert u <= price + 1e-6
    # every type's resources at shadow prices are worth no more than the type costs
    for t in catalog.types:
        worth = sum(p * q for p, q in zip(solution.shadow_prices[t.name], t.capacity, strict=True))
        assert worth <= t.hourly_cost + 1e-6


@settings(max_examples=40, deadline=None)
@given(lp_problems())
def test_interior_point_gives_the_simplex_optimum_and_a_feasible_assignment(problem):
    # the fluid packer solves its large LPs by interior point (then crossover): the
    # bound must be the simplex's, and the assignment it deals tasks by a feasible one
    catalog, classes = problem
    simplex = solve_lp(catalog, classes)
    ipm = ShadowPricer().solve(catalog, classes, "ipm")
    assert ipm.lower_bound == pytest.approx(simplex.lower_bound, rel=1e-6, abs=1e-6)
    for c, cls in enumerate(classes):
        dealt = sum(x for (cc, _), x in ipm.assignment.items() if cc == c)
        assert dealt == pytest.approx(cls.count, rel=1e-6)
    for k, t in enumerate(catalog.types):
        z = ipm.type_usage.get(t.name, 0.0)
        for r, cap in enumerate(t.capacity.as_tuple()):
            used = sum(
                x * classes[c].demands[k][r]
                for (c, name), x in ipm.assignment.items()
                if name == t.name
            )
            assert used <= cap * z + 1e-6


def test_warm_start_gives_the_cold_answer_when_only_counts_change():
    catalog = table3_catalog()
    demands = [(2, 8, 24), (1, 4, 10), (0, 6, 20), (0, 4, 12)]
    pricer = ShadowPricer()
    first = pricer.solve(catalog, [lp_class(catalog, d, 3) for d in demands])
    changed = [lp_class(catalog, d, n) for d, n in zip(demands, [1, 7, 2, 9], strict=True)]
    warm = pricer.solve(catalog, changed)
    cold = solve_lp(catalog, changed)
    assert not first.warm_started and warm.warm_started and not cold.warm_started
    assert warm.lower_bound == pytest.approx(cold.lower_bound)


def spread_catalog() -> Catalog:
    return Catalog([itype("big", 4, 16, 64, 10.0), itype("small", 1, 4, 16, 3.0)])


def test_anti_affinity_adds_a_capacity_column_to_the_lp():
    catalog = spread_catalog()
    packed = solve_lp(catalog, [lp_class(catalog, (1, 4, 16), 4)])
    spread = solve_lp(catalog, [lp_class(catalog, (1, 4, 16), 4, group="j", limit=1)])
    assert packed.lower_bound == pytest.approx(10.0)  # one "big" holds all four
    assert spread.lower_bound == pytest.approx(12.0)  # one task per instance: four "small"


@pytest.mark.parametrize("name", ["eva", "eva-plain"])
def test_anti_affinity_spreads_a_jobs_tasks_across_instances(name):
    catalog = spread_catalog()
    replicas = job("r", *[(1, 4, 16)] * 4, max_tasks_per_instance=1)
    other = job("o", (1, 4, 16))
    plan = planner_by_name(name, pattern_min_tasks=0).plan(
        ClusterView(catalog, (replicas, other), throughput=NO_INTERFERENCE)
    )
    for inst in plan.configuration:
        assert sum(t.startswith("r/") for t in inst.tasks) <= 1
    assert sorted(t for i in plan.configuration for t in i.tasks) == sorted(
        ["r/0", "r/1", "r/2", "r/3", "o/0"]
    )
    # A "big" could host one replica and o: worth $6 < $10. So five "small": 5 × $3.
    assert plan.hourly_cost == pytest.approx(15.0)
    assert plan.lower_bound_hourly_cost <= plan.hourly_cost + 1e-9


def test_anti_affinity_limit_that_cannot_bind_is_ignored():
    one = job("s", (1, 4, 16), max_tasks_per_instance=1)
    assert one.anti_affinity is None
    assert job("s", (1, 4, 16), (1, 4, 16), max_tasks_per_instance=1).anti_affinity == 1
