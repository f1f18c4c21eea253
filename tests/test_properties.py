"""Properties of the reconfiguration algorithms on random catalogs, jobs and clusters."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.planner import EvaPlanner
from autoscaler.pricing import JOB_SLOWDOWNS, PriceBook
from autoscaler.reconfiguration import VALUE_TOLERANCE, Packer, class_key
from autoscaler.reference import algorithm1
from autoscaler.resources import EPSILON, Resources
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView, ReconfigurationHistory

FAMILIES = ("a", "b")
WORKLOADS = ("w0", "w1", "w2")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def catalogs(draw) -> Catalog:
    n = draw(st.integers(1, 6))
    types = []
    for i in range(n):
        family = draw(st.sampled_from(FAMILIES))
        gpu = draw(st.sampled_from([0, 0, 1, 2, 4, 8]))
        cpu = draw(st.integers(1, 32))
        ram = draw(st.integers(1, 128))
        cost = draw(st.integers(1, 3000)) / 100
        types.append(InstanceType(f"t{i}", family, Resources(gpu, cpu, ram), cost))
    return Catalog(types)


@st.composite
def demand_within(draw, catalog: Catalog) -> tuple[tuple[str, Resources], ...]:
    """Demands of one task, guaranteed to fit at least one type of the catalog."""
    host = draw(st.sampled_from(catalog.types))
    cap = host.capacity

    def part(limit: float) -> float:
        return draw(st.integers(0, int(limit)))

    # at least one core: a zero demand vector is refused on input
    main = Resources(part(cap.gpu), max(1, part(cap.cpu)), part(cap.ram_gb))
    key = draw(st.sampled_from(["any", host.family]))
    demands = {key: main}
    if draw(st.booleans()):
        other = next(f for f in FAMILIES if f != host.family)
        demands.setdefault(
            other,
            Resources(draw(st.integers(0, 2)), draw(st.integers(1, 16)), draw(st.integers(0, 64))),
        )
    # a family no type of the catalog has is rejected on input; don't generate it
    return tuple(sorted((f, d) for f, d in demands.items() if f == "any" or f in catalog.families))


@st.composite
def job_sets(draw, catalog: Catalog, prefix: str = "j", max_jobs: int = 18) -> tuple:
    jobs = []
    for n in range(draw(st.integers(1, max_jobs))):
        job_id = f"{prefix}{n}"
        n_tasks = draw(st.sampled_from([1, 1, 1, 2, 3]))
        kind = draw(st.sampled_from(WORKLOADS))
        tasks = tuple(
            TaskSpec(
                f"{job_id}/{i}", job_id, f"node{i}", f"{kind}_node{i}", draw(demand_within(catalog))
            )
            for i in range(n_tasks)
        )
        jobs.append(JobSpec(job_id, f"{kind}[{n}]", tasks))
    return tuple(jobs)


@st.composite
def tables(draw) -> ThroughputTable:
    if draw(st.booleans()):
        return ThroughputTable(default=1.0)
    table = ThroughputTable(default=draw(st.sampled_from([0.8, 0.9, 0.95, 1.0])))
    keys = [f"{w}_node{i}" for w in WORKLOADS for i in range(3)]
    for _ in range(draw(st.integers(0, 8))):
        table = table.observe(
            draw(st.sampled_from(keys)),
            [draw(st.sampled_from(keys))],
            draw(st.integers(50, 100)) / 100,
        )
    return table


def assert_valid(config: Configuration, jobs: tuple[JobSpec, ...]) -> None:
    """Every task placed exactly once, on a family it may use, within capacity."""
    tasks = {t.task_id: t for j in jobs for t in j.tasks}
    placed = [t for inst in config for t in inst.tasks]
    assert sorted(placed) == sorted(tasks), "every task exactly once"
    for inst in config:
        used = [0.0, 0.0, 0.0]
        for tid in inst.tasks:
            d = tasks[tid].demand_on(inst.type.family)
            assert d is not None, f"{tid} cannot run on family {inst.type.family}"
            used = [u + x for u, x in zip(used, d.as_tuple(), strict=True)]
        cap = inst.type.capacity.as_tuple()
        assert all(u <= c + EPSILON for u, c in zip(used, cap, strict=True)), (inst, used)


@SETTINGS
@given(st.data())
def test_full_places_every_task_once_within_capacity(data):
    catalog = data.draw(catalogs())
    jobs = data.draw(job_sets(catalog))
    table = data.draw(tables())
    plan = Packer(ClusterView(catalog, jobs, throughput=table)).full()
    assert_valid(plan, jobs)


@SETTINGS
@given(st.data())
def test_without_interference_packing_never_costs_more_than_no_packing(data):
    catalog = data.draw(catalogs())
    jobs = data.draw(job_sets(catalog))
    plan = EvaPlanner().plan(ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0)))
    assert plan.hourly_cost <= PriceBook(catalog).no_packing_hourly_cost(jobs) + 1e-9


@SETTINGS
@given(st.data())
def test_class_batched_algorithm1_equals_the_task_by_task_transcription(data):
    catalog = data.draw(catalogs())
    jobs = data.draw(job_sets(catalog, max_jobs=24))
    table = data.draw(tables())
    rule = data.draw(st.sampled_from(JOB_SLOWDOWNS))
    batched = Packer(ClusterView(catalog, jobs, throughput=table), job_slowdown=rule).full()
    literal = algorithm1(jobs, catalog, table, rule)
    prices = PriceBook(catalog)
    key_of = {
        t.task_id: class_key(t, j, prices.job_rp(j), not table.is_neutral)
        for j in jobs
        for t in j.tasks
    }

    def shape(config: Configuration) -> list:
        return sorted((i.type.name, sorted(key_of[t] for t in i.tasks)) for i in config)

    assert shape(batched) == shape(literal)
    assert abs(batched.hourly_cost - literal.hourly_cost) < 1e-9


@st.composite
def clusters(draw):
    """A running cluster (planned earlier for older jobs) and the jobs active now."""
    catalog = draw(catalogs())
    old = draw(job_sets(catalog, "old"))
    earlier_table = draw(tables())
    earlier = Packer(ClusterView(catalog, old, throughput=earlier_table)).full()
    current = Configuration(
        tuple(Instance(f"i-{n}", inst.type, inst.tasks) for n, inst in enumerate(earlier))
    )
    finished = draw(st.sets(st.sampled_from([j.job_id for j in old])))
    new = draw(job_sets(catalog, "new", max_jobs=8)) if draw(st.booleans()) else ()
    jobs = tuple(j for j in old if j.job_id not in finished) + new
    return catalog, jobs, current, draw(tables())


@SETTINGS
@given(clusters())
def test_partial_never_moves_a_task_off_a_cost_efficient_instance(cluster):
    catalog, jobs, current, table = cluster
    view = ClusterView(catalog, jobs, current, table)
    packer = Packer(view)
    plan = packer.partial()
    assert_valid(plan, jobs)
    after = plan.by_id()
    active = {t.task_id for j in jobs for t in j.tasks}
    for inst in current:
        tasks = [t for t in inst.tasks if t in active]
        if tasks and packer.tnrp_of(tasks) >= inst.type.hourly_cost - VALUE_TOLERANCE:
            assert inst.instance_id in after, f"cost-efficient {inst.instance_id} released"
            assert set(tasks) <= set(after[inst.instance_id].tasks)


@SETTINGS
@given(clusters(), st.integers(0, 20), st.integers(0, 20))
def test_every_plan_from_a_running_cluster_is_valid(cluster, events, fulls):
    catalog, jobs, current, table = cluster
    history = ReconfigurationHistory(
        elapsed_s=3600.0 * (1 + events), event_rounds=events, full_rounds=min(fulls, events)
    )
    plan = EvaPlanner().plan(ClusterView(catalog, jobs, current, table, history))
    assert_valid(plan.configuration, jobs)
    for candidate in plan.candidates:
        assert_valid(candidate.configuration, jobs)
    # kept instances keep their id and type
    for inst in plan.configuration:
        if inst.instance_id is not None:
            assert current.by_id()[inst.instance_id].type == inst.type


@SETTINGS
@given(clusters(), st.integers(50, 100), st.booleans())
def test_no_plan_co_locates_a_task_below_the_users_minimum_throughput(cluster, percent, fluid):
    # The running cluster was planned with no minimum: it may hold such co-locations,
    # and every candidate — Full, Partial, Algorithm 1, LP-priced or fluid — must undo them.
    catalog, jobs, current, table = cluster
    floor = percent / 100
    planner = EvaPlanner(
        min_throughput=floor, pattern_min_tasks=0, fluid_min_classes=0 if fluid else 10**6
    )
    plan = planner.plan(ClusterView(catalog, jobs, current, table))
    workload = {t.task_id: t.workload for j in jobs for t in j.tasks}
    for candidate in plan.candidates:
        assert_valid(candidate.configuration, jobs)
        for inst in candidate.configuration:
            together = [workload[t] for t in inst.tasks]
            for i, w in enumerate(together):
                tput = table.throughput(w, together[:i] + together[i + 1 :])
                assert tput >= floor, (candidate.name, inst, w, tput)
