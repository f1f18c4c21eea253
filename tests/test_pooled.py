"""The pooled LP bound: never above the exact optimum, and tighter where tasks that fill
a resource keep others off their instances."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.bounds import mip_optimum, static_bounds, whole_task_bound
from autoscaler.catalog import Catalog
from autoscaler.lp import LPClass, solve_lp
from autoscaler.planner import planner_by_name, task_classes
from autoscaler.pooled import pooled_bound
from autoscaler.resources import fits
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.workloads import distinct_jobs, pai_catalog_and_jobs
from tests.builders import itype

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_gpu_tasks_cannot_use_the_spare_cpus_of_instances_an_8_gpu_task_fills():
    # Two 8-GPU tasks (2 CPUs) each fill a p alone; four 1-GPU tasks of 16 CPUs need
    # two more p's (two per 32 CPUs): $32. Two CPU-only tasks of 15 CPUs fit beside
    # the 8-GPU ones at no cost. The fluid LP lets the 1-GPU tasks' CPUs sit in the
    # CPUs the 8-GPU tasks leave: 98 CPUs, 3.06 instances, $24.50; the whole-task rows
    # see nothing over half an instance.
    catalog = Catalog([itype("p", 8, 32, 488, 8.0)])
    classes = [
        LPClass(((8, 2, 10),), 2),
        LPClass(((1, 16, 10),), 4),
        LPClass(((0, 15, 10),), 2),
    ]
    assert solve_lp(catalog, classes).lower_bound == pytest.approx(24.5)
    assert whole_task_bound(catalog, classes) < 26.0
    mip = mip_optimum(catalog, classes)
    assert mip.optimal and mip.hourly_cost == pytest.approx(32.0)
    pooled = pooled_bound(catalog, classes)
    assert pooled.resource == "gpu" and pooled.exclusive_tasks == 2
    assert pooled.lower_bound == pytest.approx(32.0)


def test_a_task_filling_a_resource_on_one_type_only_is_not_pooled_apart():
    # A 4-GPU task fills a 4-GPU type but leaves half of an 8-GPU one, where a 1-GPU
    # task may join it: no exclusive pool, and the bound stays the fluid one.
    catalog = Catalog([itype("big", 8, 32, 488, 8.0), itype("small", 4, 16, 244, 4.0)])
    classes = [LPClass(((4, 2, 10), (4, 2, 10)), 3), LPClass(((1, 2, 10), (1, 2, 10)), 4)]
    pooled = pooled_bound(catalog, classes)
    assert pooled.resource is None
    assert pooled.lower_bound == pytest.approx(solve_lp(catalog, classes).lower_bound)


@st.composite
def instances(draw):
    """Small catalogs and classes where tasks often fill a type's GPUs (or CPUs)."""
    n_types = draw(st.integers(1, 3))
    types = []
    for k in range(n_types):
        gpu = draw(st.sampled_from((0, 0, 1, 2, 4, 8)))
        cpu = draw(st.sampled_from((4, 8, 16, 32)))
        ram = draw(st.sampled_from((16, 64, 244)))
        cost = draw(st.floats(0.1, 10.0)) * (1 + gpu)
        types.append(itype(f"t{k}", gpu, cpu, ram, round(cost, 3), family=f"f{k % 2}"))
    catalog = Catalog(types)
    caps = [t.capacity.as_tuple() for t in catalog.types]
    classes = []
    total = 0
    for _ in range(draw(st.integers(1, 5))):
        k = draw(st.integers(0, len(caps) - 1))
        gpu_cap, cpu_cap, ram_cap = caps[k]
        gpu = draw(st.sampled_from(sorted({0, gpu_cap, gpu_cap / 2, 1}) if gpu_cap else (0,)))
        cpu = draw(st.sampled_from((cpu_cap, cpu_cap / 2, cpu_cap / 3, 1.0)))
        cpu = min(cpu_cap, cpu * draw(st.sampled_from((1.0, 0.9, 1.1))))
        ram = min(ram_cap, draw(st.floats(0.5, ram_cap)))
        demand = (float(gpu), float(cpu), float(ram))
        # another family may ask for other demands, or none (not allowed there)
        other = draw(st.sampled_from(("same", "none", "double")))
        demands = []
        for j, t in enumerate(catalog.types):
            if j == k or t.family == catalog.types[k].family or other == "same":
                mine = demand
            elif other == "none":
                mine = None
            else:
                mine = (demand[0], demand[1] * 2, demand[2])
            demands.append(mine if mine is not None and fits(mine, caps[j]) else None)
        count = draw(st.integers(1, 3))
        total += count
        classes.append(LPClass(tuple(demands), count))
        if total >= 9:
            break
    return catalog, classes


@SETTINGS
@given(instances(), st.sampled_from((1, 3, 60_000)))
def test_the_pooled_bound_never_exceeds_the_exact_optimum(instance, max_cells):
    # Whatever the catalog, the demands per family and however coarse the groups the
    # LP is solved on (max_cells 1 forces the coarsest grid), the bound stays at or
    # below the MIP optimum.
    catalog, classes = instance
    mip = mip_optimum(catalog, classes)
    assert mip.optimal
    pooled = pooled_bound(catalog, classes, max_cells=max_cells)
    assert 0 <= pooled.lower_bound <= mip.hourly_cost * (1 + 1e-6) + 1e-9


def test_uniform_gpu_bound_matches_the_argument_by_hand():
    # On the held-out uniform-gpu distribution (GPUs 0/1/2/4/8): every 8-GPU task holds
    # the only 8-GPU type's GPUs alone, and every other GPU task sits on a GPU type, no
    # cheaper than the least price per core, per GPU and per GB among them. So no plan
    # costs less than (8-GPU tasks) × that type's price + the most of those three
    # prices times the other GPU tasks' totals. Computed here from the catalog.
    catalog, _ = pai_catalog_and_jobs()
    jobs = distinct_jobs(5_000, seed=5, shape="uniform-gpu")
    gpu_types = [t for t in catalog.types if t.capacity.gpu > 0]
    widest = max(t.capacity.gpu for t in gpu_types)
    holders = [t for t in gpu_types if t.capacity.gpu == widest]
    assert len(holders) == 1
    demands = [t.demands[0][1] for j in jobs for t in j.tasks]
    full = sum(1 for d in demands if d.gpu == widest)
    others = [d for d in demands if 0 < d.gpu < widest]
    per_core = min(t.hourly_cost / t.capacity.cpu for t in gpu_types)
    per_gpu = min(t.hourly_cost / t.capacity.gpu for t in gpu_types)
    per_gb = min(t.hourly_cost / t.capacity.ram_gb for t in gpu_types)
    by_hand = full * holders[0].hourly_cost + max(
        per_core * sum(d.cpu for d in others),
        per_gpu * sum(d.gpu for d in others),
        per_gb * sum(d.ram_gb for d in others),
    )
    assert by_hand == pytest.approx(61_171, abs=1)
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    plan = planner_by_name("eva").plan(view)
    fluid = plan.lower_bound_hourly_cost
    assert fluid is not None and fluid < 0.9 * by_hand
    bounds = static_bounds(catalog, task_classes(view), fluid, configuration=False)
    assert bounds.pooled is not None and bounds.pooled.resource == "gpu"
    assert bounds.pooled.exclusive_tasks == full
    assert by_hand * (1 - 1e-9) <= bounds.tightest <= plan.hourly_cost
    assert bounds.document()["tightest"] == bounds.tightest
