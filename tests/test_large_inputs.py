"""No input crashes the planner: thousands of distinct demand vectors, family-only
demands, catalogs with many instance types."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.patterns import PatternClass, TypeShape, best_composition
from autoscaler.planner import EvaPlanner
from autoscaler.resources import Resources
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from tests.test_properties import assert_valid

LARGE = settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def wide_catalog(rng: random.Random, n_types: int, families: list[str]) -> Catalog:
    """`n_types` types over `families`, sizes doubling like EC2's, prices per unit noisy."""
    types = []
    for i in range(n_types):
        family = families[i % len(families)]
        size = 2 ** rng.randint(0, 6)
        gpu = size // 8 if family.startswith("g") else 0
        cpu = size * rng.choice([1, 2])
        ram = cpu * rng.choice([2, 4, 8])
        cost = round(0.05 * cpu + 0.004 * ram + 1.5 * gpu, 4) * rng.uniform(0.9, 1.1)
        types.append(InstanceType(f"{family}.{i}", family, Resources(gpu, cpu, ram), cost))
    return Catalog(types)


def distinct_jobs(rng: random.Random, catalog: Catalog, n: int, family_only: bool) -> tuple:
    """`n` single-task jobs with (almost surely) pairwise distinct demand vectors,
    each fitting at least one type: demands are drawn under a random host's capacity,
    mostly small fractions of it (many fit together: deep pattern searches)."""
    jobs = []
    families = sorted(catalog.families)
    for i in range(n):
        host = rng.choice(catalog.types)

        def under(c: InstanceType) -> Resources:
            cp = c.capacity
            share = rng.uniform(0.002, 0.2) if rng.random() < 0.9 else rng.uniform(0.2, 1.0)
            return Resources(
                float(rng.randint(0, max(1, int(cp.gpu * share)))) if cp.gpu else 0.0,
                round(max(0.01, cp.cpu * share * rng.uniform(0.5, 1.0)), 3),
                round(cp.ram_gb * share * rng.uniform(0.0, 1.0), 3),
            )

        if family_only:
            demands = {host.family: under(host)}
            other = rng.choice(families)
            if other != host.family and rng.random() < 0.5:
                demands[other] = under(rng.choice([t for t in catalog if t.family == other]))
        else:
            demands = {"any": under(host)}
        job_id = f"j{i}"
        task = TaskSpec(
            f"{job_id}/0",
            job_id,
            "node0",
            f"w{i % 5}_node0",
            tuple(sorted(demands.items())),
        )
        jobs.append(JobSpec(job_id, f"w{i % 5}[{i}]", (task,)))
    return tuple(jobs)


@LARGE
@given(
    seed=st.integers(0, 2**16),
    n_tasks=st.integers(2_000, 5_000),
    n_types=st.integers(20, 220),
    family_only=st.booleans(),
    default=st.sampled_from([1.0, 0.95]),
)
# Inputs that overflowed the recursive branch and bound (one level per class)
# before the fluid path took rounds with this many distinct vectors:
@example(seed=2, n_tasks=3_000, n_types=200, family_only=True, default=1.0)
@example(seed=4, n_tasks=2_500, n_types=80, family_only=False, default=1.0)
@pytest.mark.long
def test_thousands_of_distinct_classes_are_planned_validly(
    seed: int, n_tasks: int, n_types: int, family_only: bool, default: float
) -> None:
    rng = random.Random(seed)
    families = ["c", "r", "m", "g", "x"][: rng.randint(2, 5)]
    catalog = wide_catalog(rng, n_types, families)
    jobs = distinct_jobs(rng, catalog, n_tasks, family_only)
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=default))
    plan = EvaPlanner().plan(view)
    assert_valid(plan.configuration, jobs)
    bound = plan.lower_bound_hourly_cost
    assert bound is not None and plan.hourly_cost >= bound - 1e-6


def test_the_pattern_search_goes_thousands_of_classes_deep_without_recursion() -> None:
    # 5,000 classes that all fit together: the depth-first search visits one
    # level per class (a RecursionError at about 1,000 when it recursed).
    shape = TypeShape("big", 1.0, (0.0, 1e6, 1e6))
    classes = [
        PatternClass(count=1, demands=((0.0, 1.0 + c * 1e-3, 1.0),), rp=1.0) for c in range(5_000)
    ]
    duals = [1.0] * len(classes)
    comp, value, _, _ = best_composition(0, shape, classes, duals, None, 20_000)
    assert comp is not None
    assert value == 5_000.0  # the first dive takes every class once: all fit
