"""The fluid path for many distinct demands: grid rounding, packing, and its bound."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.catalog import Catalog
from autoscaler.configuration import Configuration, Instance
from autoscaler.fluid import fluid_pack, grid_up
from autoscaler.lp import LPClass, solve_lp
from autoscaler.planner import EvaPlanner, Plan
from autoscaler.reconfiguration import Packer
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.workloads import distinct_jobs, pai_catalog_and_jobs
from tests.builders import job, table3_catalog, table3_jobs
from tests.test_properties import assert_valid, catalogs, job_sets, tables

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(st.floats(1e-6, 1e6), st.integers(3, 8))
def test_grid_rounds_up_by_at_most_its_stated_precision(x: float, bits: int) -> None:
    [y] = grid_up(np.array([x]), bits)
    assert x <= y <= x * (1 + 2.0 ** (1 - bits)) * (1 + 1e-12)


def test_small_integers_and_zero_stay_as_they_are() -> None:
    values = np.array([0.0, 1.0, 7.0, 24.0, 61.0, 63.0, 244.0, 1536.0])
    assert list(grid_up(values, 6)) == list(values)


@SETTINGS
@given(st.data())
def test_fluid_packing_is_valid_and_above_the_exact_lp_bound(data) -> None:
    catalog = data.draw(catalogs())
    families = sorted(catalog.families)
    n = data.draw(st.integers(1, 60))
    rows = []
    for _ in range(n):
        host = data.draw(st.sampled_from(catalog.types))
        cap = host.capacity
        d = (
            data.draw(st.integers(0, int(cap.gpu))),
            data.draw(st.floats(0.01, cap.cpu)),
            data.draw(st.floats(0.0, cap.ram_gb)),
        )
        anywhere = data.draw(st.booleans())
        rows.append([d if anywhere or f == host.family else (np.nan,) * 3 for f in families])
    demand = np.array(rows, dtype=float)
    family_of_type = np.array([families.index(t.family) for t in catalog.types])
    cells = data.draw(st.integers(1, 400))
    packing = fluid_pack(catalog, demand, family_of_type, max_lp_cells=cells)

    placed = sorted(i for _, members in packing.instances for i in members)
    assert placed == list(range(n)), "every item exactly once"
    for k, members in packing.instances:
        itype = catalog.types[k]
        used = demand[members, family_of_type[k], :].sum(axis=0)
        assert not np.isnan(used).any(), "only on a family the item may use"
        assert np.all(used <= np.array(itype.capacity.as_tuple()) + 1e-6)
    for i in range(n):  # each item's reservation-price type: the cheapest it fits alone
        alone = [
            t.hourly_cost
            for t, f in zip(catalog.types, family_of_type, strict=True)
            if np.all(demand[i, f] <= np.array(t.capacity.as_tuple()) + 1e-9)
        ]
        assert catalog.types[packing.cheapest[i]].hourly_cost == min(alone)
    cost = sum(catalog.types[k].hourly_cost for k, _ in packing.instances)
    exact = solve_lp(
        catalog,
        [
            LPClass(
                tuple(
                    None if np.isnan(row[f]).any() else tuple(float(x) for x in row[f])
                    for f in family_of_type
                ),
                1,
            )
            for row in demand
        ],
    ).lower_bound
    assert packing.lower_bound <= exact + 1e-6, "a valid bound: never above the exact LP"
    assert cost >= exact - 1e-6


def test_fluid_partial_keeps_a_cost_efficient_instance_and_full_replaces_it() -> None:
    catalog = table3_catalog()
    jobs = (*table3_jobs(), job("t5", (0, 1, 2)))
    # τ1 + τ2 on it1: RP $12 + $3 ≥ $12, still worth its cost
    running = Configuration((Instance("i-1", catalog["it1"], ("t1/0", "t2/0")),))
    view = ClusterView(catalog, jobs, running, ThroughputTable(default=1.0))
    partial = EvaPlanner("partial", fluid_min_classes=0).plan(view).configuration
    assert partial.by_id()["i-1"].tasks == ("t1/0", "t2/0")
    assert sorted(t for i in partial for t in i.tasks) == sorted(
        t.task_id for j in jobs for t in j.tasks
    )
    full = EvaPlanner("full", fluid_min_classes=0).plan(view).configuration
    assert all(i.instance_id is None for i in full)


@SETTINGS
@given(st.data())
def test_under_interference_every_shared_fluid_instance_is_worth_its_cost(data) -> None:
    catalog = data.draw(catalogs())
    jobs = tuple(j for j in data.draw(job_sets(catalog)) if j.anti_affinity is None)
    table = data.draw(tables())
    view = ClusterView(catalog, jobs, throughput=table)
    plan = EvaPlanner(fluid_min_classes=0).plan(view)
    assert_valid(plan.configuration, jobs)
    packer = Packer(view)
    for inst in plan.configuration:
        if len(inst.tasks) > 1:
            assert packer.tnrp_of(inst.tasks) >= inst.type.hourly_cost - 1e-6


def test_a_fluid_plan_does_not_depend_on_the_rounds_before() -> None:
    # The same demands in other counts give the same LP structure, which an LP
    # kept between rounds would re-solve warm, from the last round's optimal
    # vertex; the fluid path deals tasks by that vertex, so a restarted daemon
    # (a fresh planner) could deal them otherwise.
    catalog, _ = pai_catalog_and_jobs()
    base = distinct_jobs(600, seed=1)
    extra = tuple(
        job(f"c{j.job_id}", j.tasks[0].demands[0][1].as_tuple(), name=j.name) for j in base[:200]
    )
    table = ThroughputTable(default=1.0)
    before = ClusterView(catalog, base, throughput=table)
    now = ClusterView(catalog, base + extra, throughput=table)

    def shape(planner: EvaPlanner) -> list:
        return sorted(
            (i.type.name, tuple(sorted(i.tasks))) for i in planner.plan(now).configuration
        )

    seasoned = EvaPlanner(fluid_min_classes=100)
    seasoned.plan(before)
    assert shape(seasoned) == shape(EvaPlanner(fluid_min_classes=100))


def _distinct(shape: str, n: int) -> tuple[Catalog, np.ndarray, np.ndarray]:
    catalog, _ = pai_catalog_and_jobs()
    families = sorted(catalog.families)
    rows = [j.tasks[0].demands[0][1].as_tuple() for j in distinct_jobs(n, seed=1, shape=shape)]
    demand = np.repeat(np.array(rows, dtype=float)[:, None, :], len(families), axis=1)
    return catalog, demand, np.array([families.index(t.family) for t in catalog.types])


def _costs(catalog: Catalog, packing) -> tuple[float, float]:
    """Hourly cost of a packing, and of every item alone on its cheapest type."""
    costs = np.array([t.hourly_cost for t in catalog.types])
    return float(sum(costs[k] for k, _ in packing.instances)), float(costs[packing.cheapest].sum())


@pytest.mark.parametrize(
    ("shape", "options", "limit"),
    [
        # 0.1–1 CPU and 0.1–4 GB: the LP cannot tell c7i.large from c7i.48xlarge
        # (same price per unit); on the large one they balance CPU against memory.
        # Packed per type the LP happened to pick: 1.085x.
        ("small", {}, 1.015),
        # POP parts of 4 bins: every part's last bin is loose; packed again together.
        ("small", {"part_bins": 4}, 1.015),
        # Ordered by capacity shares alone, 16-CPU tasks come before 1-GPU ones and
        # fill p3s' CPUs, stranding GPUs: 1.063x. The LP's prices order GPUs first.
        ("gpu-mix", {}, 1.03),
    ],
    ids=["large-bins", "loose-ends", "dear-resources-first"],
)
def test_distinct_tasks_pack_close_to_the_bound(shape: str, options: dict, limit: float) -> None:
    catalog, demand, family_of_type = _distinct(shape, 3000)
    packing = fluid_pack(catalog, demand, family_of_type, **options)
    cost, _ = _costs(catalog, packing)
    assert cost <= limit * packing.lower_bound


def test_under_interference_bins_are_sized_to_what_still_pays() -> None:
    # At 0.95 per co-located task, 20 small tasks on a c7i.48xlarge are worth far
    # less than it costs; the bin size that saves most is a small type. Packed
    # on the LP's large type and dissolved where unworthy: 0.75 of no-packing.
    catalog, demand, family_of_type = _distinct("small", 2000)
    packing = fluid_pack(catalog, demand, family_of_type, max_items=20, throughput=0.95)
    cost, alone = _costs(catalog, packing)
    assert cost <= 0.6 * alone
    rp = np.array([t.hourly_cost for t in catalog.types])[packing.cheapest]
    for k, members in packing.instances:  # every shared bin worth its cost
        if len(members) > 1:
            worth = rp[members].sum() * 0.95 ** (len(members) - 1)
            assert worth >= catalog.types[k].hourly_cost - 1e-9


def test_one_type_per_shape_gives_the_lp_over_all_types() -> None:
    # Integer demands sit on the grid, so the aggregated LP is the exact one; the
    # LP keeps the largest type of each shape (and larger ones dearer per unit,
    # for what only they hold) and must reach the optimum over all 21 types.
    catalog, _ = pai_catalog_and_jobs()
    families = sorted(catalog.families)
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(300):  # some on c7i.48xlarge alone: 49–90 CPUs
        gpu = int(rng.integers(0, 3))
        rows.append((gpu, int(rng.integers(1, 31 if gpu else 91)), int(rng.integers(1, 60))))
    dearer = [
        replace(t, hourly_cost=t.hourly_cost * 1.5) if t.name == "c7i.48xlarge" else t
        for t in catalog.types
    ]
    for types in (catalog.types, dearer):
        cat = Catalog(types)
        fam = np.array([families.index(t.family) for t in cat.types])
        demand = np.repeat(np.array(rows, dtype=float)[:, None, :], len(families), axis=1)
        packing = fluid_pack(cat, demand, fam)
        exact = solve_lp(cat, [LPClass(tuple(r for _ in cat.types), 1) for r in rows]).lower_bound
        assert packing.lower_bound == pytest.approx(exact, rel=1e-6)


def test_between_the_thresholds_the_planner_keeps_the_better_of_both_paths() -> None:
    # 250 distinct vectors, no interference: for small tasks the fluid path is
    # cheaper (Algorithm 1 + patterns: 1.075x the bound), for the GPU mix the
    # class path is (1.017x against the fluid path's 1.023x); the default
    # planner takes the cheaper of each pair of candidates.
    catalog, _ = pai_catalog_and_jobs()
    for shape in ("small", "gpu-mix"):
        jobs = distinct_jobs(250, seed=250, shape=shape)
        view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
        both = EvaPlanner().plan(view).hourly_cost
        classes = EvaPlanner(fluid_also_min_classes=10**9).plan(view).hourly_cost
        fluid = EvaPlanner(fluid_min_classes=0).plan(view).hourly_cost
        assert classes != pytest.approx(fluid), "the two paths differ here"
        assert both == pytest.approx(min(classes, fluid))


@pytest.mark.parametrize(
    ("filler", "count"),
    [((0.0, 14.0, 50.0), 20), ((0.0, 0.1, 0.4), 2000)],
    ids=["one-by-one", "tiny-runs"],
)
def test_cpu_tasks_fill_the_room_gpu_instances_leave(filler: tuple, count: int) -> None:
    # Ten 8-GPU tasks with 4 CPUs each hold a p3.16xlarge (8 GPU, 32 CPU) alone;
    # ten 1-GPU tasks with 28 CPUs each too (two do not fit one). That is 20
    # p3.16xlarge, paid whatever they hold, with 10 × 28 CPUs left on the 8-GPU
    # ones: room for all of the CPU-only tasks (280 or 200 CPUs). The fluid LP
    # counts the 8-GPU tasks' spare CPUs as usable by the 1-GPU ones and deals
    # the CPU-only tasks to c7i; packed as dealt that cost $506–515/h.
    catalog, _ = pai_catalog_and_jobs()
    families = sorted(catalog.families)
    rows = [(8.0, 4.0, 50.0)] * 10 + [(1.0, 28.0, 50.0)] * 10 + [filler] * count
    demand = np.repeat(np.array(rows)[:, None, :], len(families), axis=1)
    family_of_type = np.array([families.index(t.family) for t in catalog.types])
    packing = fluid_pack(catalog, demand, family_of_type)
    cost, _ = _costs(catalog, packing)
    assert cost == pytest.approx(20 * catalog["p3.16xlarge"].hourly_cost)
    assert sorted(i for _, members in packing.instances for i in members) == list(range(len(rows)))
    for k, members in packing.instances:
        used = demand[members, family_of_type[k], :].sum(axis=0)
        assert np.all(used <= np.array(catalog.types[k].capacity.as_tuple()) + 1e-6)


def _plan_and_idle_gpus(shape: str, seed: int) -> tuple[Plan, float]:
    """Eva's plan of 5,000 held-out tasks of `shape` at full speed (every task placed),
    and the share of the GPUs it pays for that no task uses."""
    catalog, _ = pai_catalog_and_jobs()
    jobs = distinct_jobs(5_000, seed=seed, shape=shape)
    gpus = {t.task_id: t.demands[0][1].gpu for j in jobs for t in j.tasks}
    view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
    plan = EvaPlanner().plan(view)
    placed = [t for inst in plan.configuration.instances for t in inst.tasks]
    assert sorted(placed) == sorted(gpus)
    paid_for = sum(inst.type.capacity.gpu for inst in plan.configuration.instances)
    return plan, 1 - sum(gpus.values()) / paid_for


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cpu_only_tasks_do_not_crowd_gpu_tasks_off_a_gpu_type_s_instances(seed):
    # The held-out lognormal mix (a tenth on 1, 2 or 4 GPUs): the LP deals CPU-only
    # tasks to the GPU type in proportions that fill its CPUs beside the GPU tasks;
    # packed together, whole tasks filled the CPUs first and left 3.0–3.7% of the
    # GPUs paid for idle. Packed after the GPU tasks, in the room they leave, they
    # leave fewer than 2.5% idle.
    _, idle = _plan_and_idle_gpus("lognormal", seed)
    assert idle < 0.025


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_big_cpu_only_tasks_the_lp_put_beside_gpu_tasks_do_not_idle_its_gpus(seed):
    # The held-out bimodal mix (30% on 1–8 GPUs, the rest CPU-only at about 2 or 16
    # GB per CPU): the LP deals CPU-only tasks of 24–32 CPUs and 384–488 GB to the
    # GPU type, which no cheaper CPU type prices as low; packed beside the GPU tasks
    # they left 0.6–0.8% of the GPUs paid for idle and cost 1.021–1.023x the fluid
    # bound. Moved on when that is cheaper, and the GPU tasks packed into the bins
    # they leave least of the LP's prices free (whole GPUs), under 0.5% stays idle.
    plan, idle = _plan_and_idle_gpus("bimodal", seed)
    assert idle < 0.005
    assert plan.lower_bound_hourly_cost is not None
    assert plan.hourly_cost <= 1.02 * plan.lower_bound_hourly_cost
