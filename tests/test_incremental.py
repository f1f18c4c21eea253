"""What a planner remembers between rounds and within one never changes a plan: below
`incremental_min_tasks` (all these states), a planner carried through a churn sequence plans
each state exactly as a fresh planner does. Above it, see `test_steady_rounds.py`."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from autoscaler.patterns import PatternClass, PatternPricer, TypeShape
from autoscaler.planner import EvaPlanner, Plan
from autoscaler.reconfiguration import FILL_ROUNDS, FillMemory, Packer
from autoscaler.throughput import ThroughputEntry, ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.churn import as_running, churn_jobs, churned
from benchmarks.workloads import pai_catalog_and_jobs


def _same(a: Plan, b: Plan) -> None:
    assert a.configuration == b.configuration
    assert a.chosen == b.chosen
    assert [c.summary() for c in a.candidates] == [c.summary() for c in b.candidates]
    assert a.lower_bound_hourly_cost == b.lower_bound_hourly_cost


def _learned(rng: random.Random, default: float) -> ThroughputTable:
    """A table with a few learned pairs among the sampled workloads, drawn by `rng`."""
    _, source = pai_catalog_and_jobs()
    workloads = sorted({t.workload for j in source for t in j.tasks})
    entries = {
        (rng.choice(workloads), (rng.choice(workloads),)): ThroughputEntry(rng.uniform(0.6, 1.0))
        for _ in range(6)
    }
    return ThroughputTable(entries, default=default)


@pytest.mark.parametrize(("seed", "default"), [(1, 0.95), (2, 1.0), (3, 0.95)])
def test_a_carried_planner_plans_every_churned_state_as_a_fresh_one(seed, default):
    catalog, _ = pai_catalog_and_jobs()
    rng = random.Random(seed)
    table = ThroughputTable(default=default)
    view = ClusterView(catalog, tuple(churn_jobs(400, 0.05, seed, "j")), throughput=table)
    carried = EvaPlanner()
    for step in range(1, 7):
        plan = carried.plan(view)
        _same(plan, EvaPlanner().plan(view))
        view = churned(replace(view, current=as_running(plan, f"i{step}-")), 0.03, 0.05, step, rng)
        if default < 1.0 and step % 3 == 0:
            # the learned throughputs move: what was remembered under the old ones is not used
            view = replace(view, throughput=_learned(rng, default))
    assert carried._fills.replays > 0  # the carried planner filled instances from memory


def test_an_instance_is_filled_from_memory_exactly_as_step_by_step():
    catalog, _ = pai_catalog_and_jobs()
    jobs = churn_jobs(300, 0.1, 5, "j")
    packer = Packer(ClusterView(catalog, tuple(jobs), throughput=ThroughputTable(default=0.95)))
    rng = random.Random(11)
    n = len(packer.class_tasks)
    base = [len(tasks) for tasks in packer.class_tasks]
    calls = 0
    for _ in range(400):
        # few tasks per class, from a small set of counts: fills repeat, and a class that
        # runs short of what a remembered fill took must be filled anew
        counts = [min(c, rng.choice((1, 2, 2, 3, 3))) for c in base]
        k = rng.randrange(len(packer.types))
        residents = (
            Counter({rng.randrange(n): rng.randint(1, 2) for _ in range(rng.randint(1, 3))})
            if rng.random() < 0.5
            else None
        )
        mine_counts, mine_residents = (
            list(counts),
            None if residents is None else Counter(residents),
        )
        fresh_counts, fresh_residents = (
            list(counts),
            None if residents is None else Counter(residents),
        )
        got = packer._fill(k, mine_counts, mine_residents)
        expected = packer._fill_greedy(k, fresh_counts, fresh_residents)
        calls += 1
        assert got == expected
        assert mine_counts == fresh_counts
        if residents is not None:
            assert +mine_residents == +fresh_residents  # type: ignore[operator]
    assert len(packer._fill_cache) < calls  # some fills were answered from memory


def _small_problem() -> tuple[list[TypeShape], list[PatternClass]]:
    types = [TypeShape("big", 1.0, (0.0, 8.0, 32.0)), TypeShape("small", 0.3, (0.0, 2.0, 8.0))]
    classes = [
        PatternClass(5, ((0.0, 1.0, 4.0), (0.0, 1.0, 4.0)), 0.15),
        PatternClass(3, ((0.0, 3.0, 2.0), None), 0.6),
    ]
    return types, classes


def test_a_pattern_solve_is_remembered_only_for_the_same_inputs_and_scope():
    types, classes = _small_problem()
    pricer = PatternPricer()
    pricer.scope(1)
    first = pricer.solve(types, classes, valued_as=())
    assert pricer.solve(types, classes, valued_as=()) is first
    other = [replace(classes[0], count=4), classes[1]]
    assert pricer.solve(types, other, valued_as=()) is not first
    pricer.scope(2)  # the values may have changed: solved anew, to the same optimum
    again = pricer.solve(types, classes, valued_as=())
    assert again is not first
    assert again.objective == first.objective
    assert pricer.solve(types, classes) is not pricer.solve(types, classes)  # not remembered


def test_what_a_planner_remembers_is_scoped_by_the_learned_throughputs():
    """Pattern solves are remembered while the learned table stays equal (a new but equal
    table object each round, as the control loop builds it) and forgotten when it moves."""
    catalog, _ = pai_catalog_and_jobs()
    view = ClusterView(catalog, tuple(churn_jobs(200, 0.0, 4, "j")))
    workloads = sorted({t.workload for j in view.jobs for t in j.tasks})
    bad = {(a, (b,)): ThroughputEntry(0.3) for a in workloads for b in workloads if a != b}
    carried = EvaPlanner()
    assert carried._pricer is not None
    carried.plan(replace(view, throughput=ThroughputTable(default=0.95)))
    scope = carried._pricer._scope
    carried.plan(replace(view, throughput=ThroughputTable(default=0.95)))
    assert carried._pricer._scope == scope
    after = replace(view, throughput=ThroughputTable(bad, default=0.95))
    _same(carried.plan(after), EvaPlanner().plan(after))
    assert carried._pricer._scope != scope


@pytest.mark.parametrize(("seed", "default"), [(4, 0.95), (5, 1.0)])
def test_a_carried_planner_with_the_fluid_path_plans_every_churned_state_as_a_fresh_one(
    seed, default
):
    """As above, with many distinct shapes, so that the fluid path packs beside Algorithm 1
    and the patterns, and Partial places each round's new tasks onto kept instances."""
    catalog, _ = pai_catalog_and_jobs()
    rng = random.Random(seed)
    options = {"fluid_also_min_classes": 20}
    view = ClusterView(
        catalog,
        tuple(churn_jobs(300, 0.3, seed, "j")),
        throughput=ThroughputTable(default=default),
    )
    carried = EvaPlanner(**options)
    for step in range(1, 6):
        plan = carried.plan(view)
        _same(plan, EvaPlanner(**options).plan(view))
        view = churned(replace(view, current=as_running(plan, f"i{step}-")), 0.05, 0.3, step, rng)
    # the carried planner filled instances from memory, and went on from remembered steps
    assert carried._fills.replays > 0
    assert carried._fills.resumed > 0


def _scanned_host(packer: Packer, kept: list, c: int) -> int | None:
    """Partial's host for a task of class c, weighed instance by instance in kept order:
    the most TNRP gained, then the least free room, then the first."""
    best, best_key = None, None
    for i, entry in enumerate(kept):
        d = packer.demand[entry.k][c]
        if d is None or any(x > f + 1e-9 for x, f in zip(d, entry.free, strict=True)):
            continue
        g = packer.group[c]
        if (
            g is not None
            and sum(packer.group[x] == g for x in entry.composition) >= (packer.group_limit[c])
        ):
            continue
        gain = packer.value(tuple(sorted([*entry.composition, c]))) - entry.value
        if gain <= 1e-6:
            continue
        key = (round(gain / 1e-6), -sum(entry.free))
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


@pytest.mark.parametrize("default", [0.95, 1.0])
def test_partial_weighs_kept_instances_by_kind_as_it_would_one_by_one(default):
    """Kept instances alike in type, composition and free room are weighed once: the host
    chosen is the one a scan of every kept instance in turn chooses, as tasks go in."""
    from autoscaler.reconfiguration import _KeptHosts

    catalog, _ = pai_catalog_and_jobs()
    table = ThroughputTable(default=default)
    view = ClusterView(catalog, tuple(churn_jobs(600, 0.1, 6, "j")), throughput=table)
    plan = EvaPlanner().plan(view)
    packer = Packer(replace(view, current=as_running(plan, "i-")))
    kept = [
        e
        for inst in packer.view.current
        if (e := packer._keep(inst, [t for t in inst.tasks if t in packer.task_class]))
    ]
    assert len(kept) > 50
    hosts = _KeptHosts(kept)
    assert len(hosts.groups) < len(kept)  # some instances are alike
    rng = random.Random(8)
    placed = 0
    for _ in range(300):
        c = rng.randrange(len(packer.class_tasks))
        host = packer._best_kept_host(hosts, c)
        assert host == _scanned_host(packer, kept, c)
        if host is None:
            continue
        placed += 1
        entry = kept[host]
        hosts.leave(host, entry)
        entry.composition = sorted([*entry.composition, c])
        entry.value = packer.value(tuple(entry.composition))
        d = packer.demand[entry.k][c]
        entry.free = [f - x for f, x in zip(entry.free, d, strict=True)]
        hosts.join(host, entry)
    assert placed > 20  # the hosts filled up as tasks went in


@pytest.mark.parametrize("default", [0.95, 1.0])
def test_a_fill_remembered_from_an_earlier_round_is_replayed_only_where_it_repeats(default):
    """Rounds of churned views share one fill memory: every fill, answered from memory,
    resumed from a remembered one's first steps or not, is the step-by-step one, while
    classes come and go between rounds and run out within them (a class available now
    and not then may change the fill)."""
    catalog, _ = pai_catalog_and_jobs()
    table = ThroughputTable(default=default)
    memory = FillMemory()
    memory.scope(1)
    rng = random.Random(12)
    view = ClusterView(catalog, tuple(churn_jobs(300, 0.2, 7, "j")), throughput=table)
    for step in range(4):
        memory.next_round()
        packer = Packer(view, fills=memory)
        plain = Packer(view)
        assert [len(t) for t in packer.class_tasks] == [len(t) for t in plain.class_tasks]
        n = len(packer.class_tasks)
        base = [len(tasks) for tasks in packer.class_tasks]
        for _ in range(150):
            # few tasks per class, some classes out: what was available differs
            counts = [0 if rng.random() < 0.1 else min(c, rng.choice((1, 2, 3))) for c in base]
            k = rng.randrange(len(packer.types))
            residents = (
                Counter({rng.randrange(n): 1 for _ in range(rng.randint(1, 2))})
                if rng.random() < 0.3
                else None
            )
            if residents:
                for c in residents:
                    counts[c] = max(counts[c], 1)
            mine_counts = list(counts)
            mine_residents = None if residents is None else Counter(residents)
            fresh_counts = list(counts)
            fresh_residents = None if residents is None else Counter(residents)
            got = packer._fill(k, mine_counts, mine_residents)
            assert got == plain._fill_greedy(k, fresh_counts, fresh_residents)
            assert mine_counts == fresh_counts
            if residents is not None:
                assert +mine_residents == +fresh_residents  # type: ignore[operator]
        view = churned(view, 0.2, 0.2, step + 1, rng)
    assert memory.replays > 50  # fills answered from memory, also across rounds
    assert memory.resumed > 10  # and fills that went on from a remembered one's first steps


def test_a_fill_memory_keeps_two_rounds_and_forgets_when_its_scope_changes():
    catalog, _ = pai_catalog_and_jobs()
    view = ClusterView(catalog, tuple(churn_jobs(100, 0.2, 9, "j")))
    memory = FillMemory()
    memory.scope(1)
    memory.next_round()
    packer = Packer(view, fills=memory)
    packer.full_placement()
    made = sum(len(b) for b in memory._fills.values())
    assert made > 0
    for _ in range(FILL_ROUNDS - 1):  # kept for the next rounds
        memory.next_round()
        assert sum(len(b) for b in memory._fills.values()) == made
    memory.next_round()
    assert memory._fills == {}
    first = memory.identify(("class", 1.0))
    assert memory.identify(("class", 1.0)) == first
    memory.scope(2)
    assert memory.identify(("other", 2.0)) == 0  # ids start over
