"""Price-guided packing: column generation over instance compositions (CvxCluster, beaten).

CvxCluster relaxes placement into a *fluid* LP over machine shapes and lets
its shadow prices guide a greedy. For a cost objective the fluid LP is loose
— it packs resources perfectly, which whole tasks cannot — so its prices
misjudge which tasks belong together. Here the LP's columns are *patterns*:
an instance type and an integer composition of task classes that fits it
(Gilmore–Gomory's configuration LP):

    minimise   Σ_p w_p y_p                 w_p = C_k + (value lost to interference)
    subject to Σ_p a_cp y_p ≥ n_c   ∀c     (dual u_c ≥ 0: a task's price)

Columns are generated on demand: with duals u, the best composition for type
k maximizes Σ_c a_c u_c − loss − C_k (a small integer knapsack, solved
exactly by branch and bound whose bound comes from the duals); it enters when
positive. The converged optimum is a lower bound at least as tight as the
fluid LP's; rounding its pattern counts down and packing the few leftover
tasks with Algorithm 1 lands within a fraction of a percent of it.

The loss term keeps Eva's semantics under interference: a pattern is worth
its tasks' TNRP, so w_p = C_k + Σ RP − TNRP; without interference w_p = C_k.

Patterns found in one round are kept by class *key* and offered to the next
(Firmament's lesson: consecutive rounds differ little), so later rounds
converge in a few iterations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from autoscaler.resources import EPSILON, fits
from autoscaler.stopwatch import stopwatch

Demand = tuple[float, float, float]

#: Solves a `PatternPricer` remembers (within one `scope`), oldest forgotten first.
MEMORY = 64


@dataclass(frozen=True, slots=True)
class TypeShape:
    """An instance type as the pattern LP sees it."""

    name: str
    cost: float
    capacity: Demand


@dataclass(frozen=True, slots=True)
class PatternClass:
    """A class of interchangeable tasks as the pattern LP sees it."""

    count: int
    demands: tuple[Demand | None, ...]  # per type index; None: cannot run there
    rp: float
    group: str | None = None  # anti-affinity group (a job)
    group_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Pattern:
    """An instance type and how many tasks of each class it hosts."""

    type_index: int
    composition: tuple[tuple[int, int], ...]  # (class index, count), sorted

    def classes(self) -> list[int]:
        return [c for c, n in self.composition for _ in range(n)]


@dataclass(frozen=True, slots=True)
class PatternSolution:
    """The configuration LP's optimum and its fractional pattern counts."""

    objective: float  # Σ w_p y_p at the optimum
    patterns: tuple[tuple[Pattern, float], ...]  # (pattern, y_p) with y_p > 0
    iterations: int
    exact: bool  # pricing was exact and converged: the objective is a valid bound
    seconds: float
    columns: tuple[Pattern, ...] = ()  # every column the master held (for an integer master)


class PatternPricer:
    """Column generation for the configuration LP.

    It keeps no columns between solves: a plan must depend on the snapshot alone
    (a restarted daemon decides the same), so columns found in earlier rounds
    come back only as `seeds` taken from the snapshot (the running instances).
    What it does remember is whole solves by their exact inputs (`valued_as`,
    `scope`): the same inputs give the same solve, so that changes no plan.
    A pool kept in memory did not: a planner that had packed 26 small tasks
    before packed 40 on one c7i.8xlarge ($1.428/h) where a fresh one found
    $1.160/h."""

    def __init__(
        self,
        node_limit: int = 20_000,
        node_budget: int = 10_000,
        max_iterations: int = 100,
        interference_node_limit: int = 300,
        interference_node_budget: int = 100,
    ) -> None:
        """`node_limit` bounds one pricing search, `node_budget` per instance type
        all searches of one solve: past it, column generation stops with the
        columns it has (the packing stays valid; only the bound is no longer
        proven). Per type, because each iteration prices every type: measured on
        10k pai_200-sampled tasks over a 221-type catalog, a fixed 150k nodes
        stopped after one iteration at 1.063x the LP bound, while 600k converged
        at 1.048x in 1.0 s (0.5 s before); 21 types get 210k.
        The `interference_` pair replaces them when compositions are priced per
        cardinality (one search per size, run every round of a replay).
        Measured replaying the full trace's first 1,000 jobs (cost ÷ no-packing,
        wall time, two runs at once): 100/300 nodes 0.589 in 46 s, 200/500
        0.589 in 56 s, 100/500 0.593 in 41 s; with a warm start from earlier
        rounds (since removed), 200/500 0.583 in 47 s against 10,000/20,000
        0.585 in 185 s — more nodes buy nothing."""
        self.node_limit = node_limit
        self.node_budget = node_budget
        self.interference_node_limit = interference_node_limit
        self.interference_node_budget = interference_node_budget
        self.max_iterations = max_iterations
        self._solved: dict[Hashable, PatternSolution] = {}
        self._scope: Hashable = None

    def scope(self, token: Hashable) -> None:
        """Declare what `loss` depends on beyond the `valued_as` of `solve` (the learned
        throughputs, the catalog's prices): solves remembered under another token are
        forgotten, so a remembered solve is reused only for the very same inputs."""
        if token != self._scope:
            self._solved.clear()
            self._scope = token

    def solve(
        self,
        types: Sequence[TypeShape],
        classes: Sequence[PatternClass],
        loss: Callable[[tuple[int, ...], int], float] | None = None,
        linear: tuple[float, Sequence[float]] | None = None,
        seeds: Iterable[Pattern] = (),
        valued_as: Hashable = None,
    ) -> PatternSolution:
        """Solve the configuration LP for `classes` (counts > 0) over the given types.

        `loss(sorted class indices, type index)` is the value a composition loses
        to interference (Σ RP − TNRP); None means no interference. `linear` =
        (default throughput t, value at stake per class): price compositions per
        cardinality (see `best_composition_by_cardinality`), which finds the
        columns the loss-bounded search misses under interference.
        `seeds`: columns to start from besides the singletons (compositions the
        caller already knows good, such as the instances running now).
        `valued_as`: what `loss` depends on per class (None: do not remember this
        solve). Consecutive rounds often pack the same tasks beside the same
        running instances (a Partial Reconfiguration re-places only what arrived):
        a solve of the same types, classes, seeds, linearization and `valued_as`
        in the same `scope` is the same solve, and is answered from memory.
        """
        key: Hashable = None
        if valued_as is not None:
            seeds = tuple(seeds)
            key = (
                tuple(types),
                tuple(classes),
                None if linear is None else (linear[0], tuple(linear[1])),
                loss is None,
                seeds,
                valued_as,
            )
            known = self._solved.get(key)
            if known is not None:
                return known
        solution = self._solve(types, classes, loss, linear, seeds)
        if key is not None:
            if len(self._solved) >= MEMORY:
                self._solved.pop(next(iter(self._solved)))  # the oldest
            self._solved[key] = solution
        return solution

    def _solve(
        self,
        types: Sequence[TypeShape],
        classes: Sequence[PatternClass],
        loss: Callable[[tuple[int, ...], int], float] | None,
        linear: tuple[float, Sequence[float]] | None,
        seeds: Iterable[Pattern],
    ) -> PatternSolution:
        elapsed = stopwatch()
        if loss is not None:
            loss = _remembered(loss)
        highs = covering_model([c.count for c in classes])
        columns: list[Pattern] = []
        seen: set[Pattern] = set()

        def add(pattern: Pattern) -> None:
            if pattern in seen:
                return
            seen.add(pattern)
            comp = pattern.composition
            weight = types[pattern.type_index].cost
            if loss is not None:
                weight += loss(tuple(pattern.classes()), pattern.type_index)
            highs.addCol(
                weight,
                0.0,
                highspy.kHighsInf,
                len(comp),
                np.array([c for c, _ in comp], np.int32),
                np.array([float(n) for _, n in comp]),
            )
            columns.append(pattern)

        # Singletons on each class's cheapest type keep the LP feasible.
        for c, cls in enumerate(classes):
            add(Pattern(_cheapest(cls, types), ((c, 1),)))
        for pattern in seeds:
            if all(classes[c].count >= n for c, n in pattern.composition) and _within_groups(
                pattern.composition, classes
            ):
                add(pattern)
        by_cardinality = linear is not None and loss is not None

        exact = True
        converged = False
        iterations = 0
        node_limit = self.interference_node_limit if by_cardinality else self.node_limit
        budget = len(types) * (
            self.interference_node_budget if by_cardinality else self.node_budget
        )
        fitting = [_fitting(k, shape, classes) for k, shape in enumerate(types)]
        # What the searches read of the classes on each type, computed once per solve.
        on_types: list[_OnType | None] = [None] * len(types)
        # Per cardinality (a search cut short anyway), a type whose search found
        # no column is not searched again in this solve: a heuristic — columns
        # coming in mostly lower the duals — that halves the searches.
        active = list(range(len(types)))
        solved = False  # the model is solved as it stands
        while iterations < self.max_iterations and budget > 0:
            iterations += 1
            highs.run()
            solved = True
            duals = list(highs.getSolution().row_dual)
            added = 0
            found: list[int] = []  # types whose search added a column
            values_by_m: dict[int, list[float]] = {}  # at these duals, for every type
            for k in active:
                limit = min(node_limit, max(budget, 1))
                on_type = on_types[k]
                if on_type is None:
                    on_type = on_types[k] = _OnType(k, types[k], classes)
                if by_cardinality:
                    assert linear is not None and loss is not None
                    comp, value, complete, nodes = best_composition_by_cardinality(
                        k,
                        types[k],
                        classes,
                        duals,
                        loss,
                        limit,
                        *linear,
                        fitting[k],
                        on_type,
                        values_by_m,
                    )
                else:
                    comp, value, complete, nodes = best_composition(
                        k, types[k], classes, duals, loss, limit, None, fitting[k], on_type
                    )
                budget -= nodes
                exact = exact and complete
                if comp and value > types[k].cost * (1 + 1e-9) + 1e-9:
                    before = len(columns)
                    add(Pattern(k, comp))
                    added += len(columns) - before
                    found.append(k)
            if not added:
                converged = len(active) == len(types)  # else unproven: types were skipped
                break
            solved = False
            if by_cardinality:
                active = found
        exact = exact and converged
        if not solved:
            highs.run()
        y = highs.getSolution().col_value
        used = tuple((p, y[j]) for j, p in enumerate(columns) if y[j] > 1e-9)
        return PatternSolution(
            highs.getObjectiveValue(), used, iterations, exact, elapsed(), tuple(columns)
        )


def _remembered(
    loss: Callable[[tuple[int, ...], int], float],
) -> Callable[[tuple[int, ...], int], float]:
    """`loss`, each composition valued once per solve (the searches of every type and
    iteration value the same few compositions again and again)."""
    known: dict[tuple[tuple[int, ...], int], float] = {}

    def remembered(comp: tuple[int, ...], k: int) -> float:
        key = (comp, k)
        found = known.get(key)
        if found is None:
            found = known[key] = loss(comp, k)
        return found

    return remembered


def covering_model(counts: Sequence[float]) -> highspy.Highs:
    """A silent HiGHS model with one row per class, Σ columns ≥ its count, and no
    columns yet: the master of a configuration LP."""
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.addRows(
        len(counts),
        np.array([float(n) for n in counts]),
        np.full(len(counts), highspy.kHighsInf),
        0,
        np.array([], np.int32),
        np.array([], np.int32),
        np.array([], float),
    )
    return highs


def integer_covering_model(
    costs: Sequence[float], counts: Sequence[float], patterns: Sequence[Pattern]
) -> highspy.Highs:
    """min Σ C_k y_p, Σ_p a_cp y_p ≥ n_c, y ≥ 0 integer: the configuration program over
    `patterns` in whole copies (`costs`: per type index), to be given its limits and run."""
    highs = covering_model(counts)
    for p in patterns:
        comp = p.composition
        highs.addCol(
            costs[p.type_index],
            0.0,
            highspy.kHighsInf,
            len(comp),
            np.array([c for c, _ in comp], np.int32),
            np.array([float(n) for _, n in comp]),
        )
    highs.changeColsIntegrality(
        len(patterns),
        np.arange(len(patterns), dtype=np.int32),
        np.array([highspy.HighsVarType.kInteger] * len(patterns)),
    )
    return highs


def integer_cover(
    costs: Sequence[float],
    counts: Sequence[int],
    patterns: Sequence[Pattern],
    node_limit: int,
) -> list[int] | None:
    """Whole copies of `patterns` covering every class's count at least cost (`costs`:
    per type index): the configuration program restricted to these columns, solved as
    an integer program by HiGHS within `node_limit` branch-and-bound nodes (a limit on
    work, not on time, so the answer depends on the input alone). None: no integer
    solution was found within the limit."""
    if not patterns:
        return None
    highs = integer_covering_model(costs, counts, patterns)
    highs.setOptionValue("mip_max_nodes", node_limit)
    highs.run()
    if highs.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
        return None
    return [round(v) for v in highs.getSolution().col_value]


def _within_groups(
    composition: tuple[tuple[int, int], ...], classes: Sequence[PatternClass]
) -> bool:
    """True if no anti-affinity group has more tasks in `composition` than its limit."""
    used: dict[Hashable, int] = {}
    for c, n in composition:
        cls = classes[c]
        if cls.group is not None and cls.group_limit:
            used[cls.group] = used.get(cls.group, 0) + n
            if used[cls.group] > cls.group_limit:
                return False
    return True


def _fitting(k: int, shape: TypeShape, classes: Sequence[PatternClass]) -> list[int]:
    """The classes with tasks left that fit type k alone."""
    return [
        c
        for c, cls in enumerate(classes)
        if cls.count > 0 and (d := cls.demands[k]) is not None and fits(d, shape.capacity)
    ]


def _cheapest(cls: PatternClass, types: Sequence[TypeShape]) -> int:
    """Index of the cheapest type a task of `cls` fits alone."""
    return min(
        (k for k, d in enumerate(cls.demands) if d is not None and fits(d, types[k].capacity)),
        key=lambda k: (types[k].cost, k),
    )


class _OnType:
    """What a solve computes once of its classes on one type k, for every search there:
    each class's demand on k, its size (Σ_r d_r / capacity_r: `best_composition` orders
    items by value per size), and, once known, the most tasks k can hold (`most`). The same
    numbers the searches computed themselves, by the same operations."""

    __slots__ = ("demands", "grouped", "most", "sizes")

    def __init__(
        self, k: int, shape: TypeShape, classes: Sequence[PatternClass], only: Iterable[int] = ()
    ) -> None:
        capacity = shape.capacity
        inv = [1.0 / x if x > 0 else 0.0 for x in capacity]
        demands = [cls.demands[k] for cls in classes]
        self.demands = demands
        # `only`: the classes a lone search needs (its items), so that a caller without a
        # solve's cache does no more than the search did before.
        which = only or range(len(demands))
        self.sizes: dict[int, float] = {}
        for c in which:
            d = demands[c]
            if d is None:
                continue
            self.sizes[c] = d[0] * inv[0] + d[1] * inv[1] + d[2] * inv[2]
        self.most: int | None = None
        # Whether any class has an anti-affinity limit (most have none).
        self.grouped = any(cls.group is not None and cls.group_limit for cls in classes)


def _root_bound(
    capacity: Demand,
    demands: Sequence[Demand | None],
    values: Sequence[float],
    items: Sequence[int],
) -> float:
    """Most that `items` (values > 0) can be worth in `capacity`: per resource r,
    the capacity of r times the best value per unit of r (no bound from r if an
    item needs none of it)."""
    bound = math.inf
    for r in range(3):
        best = 0.0
        for c in items:
            d = demands[c][r]  # type: ignore[index]
            if d <= EPSILON:
                break
            if (rate := values[c] / d) > best:  # max(), as comparisons
                best = rate
        else:
            if (room := capacity[r] * best) < bound:
                bound = room
    return bound


def best_composition_by_cardinality(
    k: int,
    shape: TypeShape,
    classes: Sequence[PatternClass],
    duals: Sequence[float],
    loss: Callable[[tuple[int, ...], int], float],
    node_limit: int,
    default: float,
    at_stake: Sequence[float],
    fitting: Sequence[int] | None = None,
    on_type: _OnType | None = None,
    values_by_m: dict[int, list[float]] | None = None,
) -> tuple[tuple[tuple[int, int], ...] | None, float, bool, int]:
    """`best_composition` under interference, linearized per cardinality.

    With every co-located pair at the default throughput t, a task among m on
    one instance runs at t^(m−1), so it loses (1 − t^(m−1)) of what is at stake
    for it (its RP, or its job's RP for a task of a multi-task job, §4.4): for
    a fixed m the value of a composition is *linear*, Σ a_c (u_c − (1 −
    t^(m−1)) w_c), and the knapsack bound is tight again. So for m = 1, 2, …
    the best composition of at most m tasks is searched with those values, and
    each candidate is then valued exactly (Σ a_c u_c − loss: learned pairs and
    sets count as recorded); the best exact value wins. Larger m stop paying
    once no class has a positive value left. `fitting`: the classes with tasks
    that fit type k alone, when the caller already knows them; `on_type`: what its
    solve computed once of the classes on type k; `values_by_m`: the values per m
    at these duals, shared by the searches of every type at them (filled here).
    """
    capacity = shape.capacity
    if fitting is None:
        fitting = _fitting(k, shape, classes)
    if not fitting:
        return None, 0.0, True, 0
    if on_type is None:
        on_type = _OnType(k, shape, classes)
    demands = on_type.demands
    # No composition is worth more than Σ a_c u_c (the loss is never negative).
    positive = [c for c in fitting if duals[c] > 1e-12]
    if _root_bound(capacity, demands, duals, positive) <= shape.cost * (1 + 1e-9):
        return None, 0.0, True, 0
    most = on_type.most
    if most is None:
        most = sum(classes[c].count for c in fitting)
        for r in range(3):
            smallest = min(demands[c][r] for c in fitting)  # type: ignore[index]
            if smallest > EPSILON:
                most = min(most, int((capacity[r] + EPSILON) // smallest))
        on_type.most = most
    if values_by_m is None:
        values_by_m = {}
    best: tuple[tuple[int, int], ...] | None = None
    comp: tuple[tuple[int, int], ...] | None
    best_value, complete, nodes = 0.0, True, 0
    for m in range(1, most + 1):
        values = values_by_m.get(m)
        if values is None:
            penalty = 1.0 - default ** (m - 1)
            values = [u - penalty * w for u, w in zip(duals, at_stake, strict=True)]
            values_by_m[m] = values
        if max([values[c] for c in fitting]) <= 1e-12:
            break
        if m == 1:  # no search: the single most valuable task
            top = max(fitting, key=lambda c: (values[c], -c))
            comp, done, used = ((top, 1),), True, 1
        else:
            comp, _, done, used = best_composition(
                k, shape, classes, values, None, max(node_limit - nodes, 1), m, fitting, on_type
            )
        nodes += used
        complete = complete and done
        if comp:
            flat = tuple(c for c, a in comp for _ in range(a))
            exact = sum(duals[c] * a for c, a in comp) - loss(flat, k)
            if exact > best_value + 1e-12:
                best, best_value = comp, exact
        if nodes >= node_limit:
            complete = False
            break
    return best, best_value, complete, nodes


def best_composition(
    k: int,
    shape: TypeShape,
    classes: Sequence[PatternClass],
    duals: Sequence[float],
    loss: Callable[[tuple[int, ...], int], float] | None,
    node_limit: int,
    max_items: int | None = None,
    fitting: Sequence[int] | None = None,
    on_type: _OnType | None = None,
) -> tuple[tuple[tuple[int, int], ...] | None, float, bool, int]:
    """The composition of type k maximizing Σ a_c u_c − loss (branch and bound).

    Returns (composition, value, complete, nodes searched); `complete` is False
    when the node limit cut the search short (the result is then only a good
    composition).
    The bound for the remaining classes is, per resource r, the free amount of
    r times the best price per unit of r among them — valid because no class
    is worth more than its r-demand at that rate, and the loss is never negative.
    With `max_items`, at most that many tasks: the bound is also the free slots
    times the best value left. `fitting`: the classes with tasks that fit type k
    alone, when the caller already knows them; `on_type`: what a solve computed once
    of the classes on type k (`_OnType`), the same numbers as computed here.
    """
    capacity = shape.capacity
    cost = shape.cost
    if fitting is None:
        fitting = _fitting(k, shape, classes)
    items = [c for c in fitting if duals[c] > 1e-12]
    if not items:
        return None, 0.0, True, 0
    if on_type is None:
        on_type = _OnType(k, shape, classes, items)
    # The root's bound (see `bound` below) in one pass, before sorting: most
    # searches of a column generation end here.
    demands = on_type.demands
    root = _root_bound(capacity, demands, duals, items)
    if max_items is not None:
        root = min(root, max_items * max(duals[c] for c in items))
    if root <= cost * (1 + 1e-9):
        return None, 0.0, True, 0
    sizes = on_type.sizes
    inf = math.inf
    # Best value per size first (ties by class); decorated rather than a key function.
    order = [(-(duals[c] / sizes[c]) if sizes[c] > 0 else -inf, c) for c in items]
    order.sort()
    items = [c for _, c in order]
    n = len(items)
    demand = [demands[c] for c in items]
    value = [duals[c] for c in items]
    slots = math.inf if max_items is None else max_items
    # Per position i, the bound of items[i:]: `rate_r[i]` for each resource r that
    # every one of them needs, the best value per unit of r among them (None: some
    # item needs none of r, so r bounds nothing); `best_after[i]`, the best single
    # value among them. One list per resource rather than a list per position: the
    # search below reads them as plain numbers.
    rate0: list[float | None] = [None] * (n + 1)
    rate1: list[float | None] = [None] * (n + 1)
    rate2: list[float | None] = [None] * (n + 1)
    best_after = [0.0] * (n + 1)
    # The best value per unit of each resource (None once an item needs none of it).
    gpu: float | None = 0.0
    cpu: float | None = 0.0
    ram: float | None = 0.0
    top = 0.0
    # (`max` spelt as comparisons: this loop runs for every search, the same values.)
    for i in range(n - 1, -1, -1):
        d = demand[i]
        v = value[i]
        assert d is not None
        if gpu is not None:
            if d[0] <= EPSILON:
                gpu = None
            elif (x := v / d[0]) > gpu:
                gpu = x
        if cpu is not None:
            if d[1] <= EPSILON:
                cpu = None
            elif (x := v / d[1]) > cpu:
                cpu = x
        if ram is not None:
            if d[2] <= EPSILON:
                ram = None
            elif (x := v / d[2]) > ram:
                ram = x
        rate0[i] = gpu
        rate1[i] = cpu
        rate2[i] = ram
        if v > top:
            top = v
        best_after[i] = top
    limits: dict[Hashable, int] = {}
    if on_type.grouped:
        limits = {
            classes[c].group: classes[c].group_limit  # type: ignore[misc]
            for c in items
            if classes[c].group is not None and classes[c].group_limit
        }
    has_groups = bool(limits)
    groups = [classes[c].group for c in items] if has_groups else []
    # Its anti-affinity group's limit (None: no limit).
    limited = [limits.get(g) if g is not None else None for g in groups]
    bounded_slots = max_items is not None
    count_of = [classes[c].count for c in items]
    # What bounds how many tasks of item i fit: its demand of each resource it needs,
    # 0.0 for one it does not need.
    need0 = [d[0] if d[0] > EPSILON else 0.0 for d in demand]  # type: ignore[index]
    need1 = [d[1] if d[1] > EPSILON else 0.0 for d in demand]  # type: ignore[index]
    need2 = [d[2] if d[2] > EPSILON else 0.0 for d in demand]  # type: ignore[index]

    best_value = 0.0
    best: list[int] | None = None
    chosen = [0] * n
    used_in_group: dict[Hashable, int] = {}
    complete = True

    def score(raw: float) -> float:
        if loss is None:
            return raw
        comp = tuple(sorted(items[j] for j in range(n) for _ in range(chosen[j])))
        return raw - loss(comp, k) if comp else raw

    # Depth first over items, most copies first; an explicit stack, not recursion,
    # since the depth is the number of classes (thousands on distinct demands).
    # Each node (i, free, raw) is counted, recorded if best (the loss is never
    # negative: only a raw value above the best can improve it), and expanded
    # if its bound can beat the best.
    # The frame of item i is always at depth i (a frame's child is the next item), so
    # the stack is kept as arrays by item: the free room of each resource, the raw
    # value, and the next count to try; `depth` is the item of the deepest frame.
    room0 = [0.0] * n
    room1 = [0.0] * n
    room2 = [0.0] * n
    raw_at = [0.0] * n
    next_a = [0] * n
    depth = -1
    count = 0  # tasks chosen on the current path
    nodes = 1
    if nodes > node_limit:
        return None, 0.0, False, nodes
    c0, c1, c2 = capacity
    b = slots * best_after[0] if bounded_slots else inf  # items is not empty
    if (rx := rate0[0]) is not None and c0 * rx < b:
        b = c0 * rx
    if (rx := rate1[0]) is not None and c1 * rx < b:
        b = c1 * rx
    if (rx := rate2[0]) is not None and c2 * rx < b:
        b = c2 * rx
    no_loss = loss is None
    bar = best_value + 1e-12  # what a value must beat to be better than the best
    j = 0
    child_raw = 0.0
    expand = b > bar
    while True:
        if expand:
            # Push the frame of item j at (c0, c1, c2, child_raw), trying first the most
            # tasks of it that fit there (and its group's limit and the slots allow).
            most = count_of[j]
            if dr := need0[j]:
                fit = int((c0 + EPSILON) // dr)
                if fit < most:
                    most = fit
            if dr := need1[j]:
                fit = int((c1 + EPSILON) // dr)
                if fit < most:
                    most = fit
            if dr := need2[j]:
                fit = int((c2 + EPSILON) // dr)
                if fit < most:
                    most = fit
            if has_groups:
                limit = limited[j]
                if limit is not None:
                    most = min(most, limit - used_in_group.get(groups[j], 0))
            if bounded_slots and max_items - count < most:  # type: ignore[operator]
                most = max_items - count  # type: ignore[operator]
            room0[j] = c0
            room1[j] = c1
            room2[j] = c2
            raw_at[j] = child_raw
            next_a[j] = most
            depth = j
        elif depth < 0:
            break
        i = depth
        a = next_a[i]
        if a < 0 or nodes > node_limit:
            if has_groups and limited[i] is not None:
                used_in_group[groups[i]] -= chosen[i]
            count -= chosen[i]
            chosen[i] = 0
            depth -= 1
            expand = False
            continue
        next_a[i] = a - 1
        if has_groups and limited[i] is not None:
            g = groups[i]
            used_in_group[g] = used_in_group.get(g, 0) + a - chosen[i]
        count += a - chosen[i]
        chosen[i] = a
        # Visit the child node (i + 1, its room, child_raw); its room is computed only
        # when it has children to bound (none of item i: the parent's, exactly).
        raw = raw_at[i]
        child_raw = raw + a * value[i] if a else raw
        nodes += 1
        expand = False
        if nodes > node_limit:
            complete = False
            continue
        if child_raw > bar:
            current = child_raw if no_loss else score(child_raw)
            if current > bar:
                best_value, best = current, list(chosen)
                bar = best_value + 1e-12
        j = i + 1
        if j < n:
            if a:
                d = demand[i]
                c0 = room0[i] - a * d[0]  # type: ignore[index]
                c1 = room1[i] - a * d[1]  # type: ignore[index]
                c2 = room2[i] - a * d[2]  # type: ignore[index]
            else:
                c0, c1, c2 = room0[i], room1[i], room2[i]
            b = (slots - count) * best_after[j] if bounded_slots else inf
            if (rx := rate0[j]) is not None and c0 * rx < b:
                b = c0 * rx
            if (rx := rate1[j]) is not None and c1 * rx < b:
                b = c1 * rx
            if (rx := rate2[j]) is not None and c2 * rx < b:
                b = c2 * rx
            expand = child_raw + b > bar

    if best is None:
        return None, 0.0, complete, nodes
    comp = tuple(sorted((items[j], a) for j, a in enumerate(best) if a))
    return comp, best_value, complete, nodes
