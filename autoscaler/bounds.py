"""Honest bounds on static packing: the configuration LP, and the exact optimum of small inputs.

The fluid LP (`autoscaler.lp`) lets a task's demand spread over the resources
of many instances, which whole tasks cannot: where tasks are large against
their instances it is loose (tasks of 0.6 of an instance: the fluid bound pays
0.6 instance per task, any real configuration one). Tighter yardsticks:

- **The whole-task LP** (`whole_task_bound`): the fluid LP with one more row
  per type, resource and dual feasible function of bin packing; as small as
  the fluid LP, it counts tasks larger than half an instance whole.

- **The pooled LP** (`autoscaler.pooled`): the whole-task LP's rows with the
  instances of each type split in two pools, those hosting a task that fills a
  resource on every type it fits (no other task needing it shares that
  instance) and the rest; solved on aggregated tasks and its duals applied to
  the true demands, so it is computed at any size.

- **The configuration LP** (Gilmore–Gomory): a column is a pattern, an
  instance type and a multiset of task classes that fits it, of cost C_k;
  minimise Σ C_k y_p subject to Σ_p a_cp y_p ≥ n_c. Solved by column
  generation: the restricted master's duals u_c price one integer knapsack
  per type (`patterns.best_composition`, exact branch and bound), and a
  pattern with C_k − Σ_c u_c a_c < 0 enters. Stopped early (a time or
  iteration budget) it still gives a valid bound, Farley's (A. A. Farley, "A
  note on bounding a class of linear programming problems, including cutting
  stock problems", Operations Research 38(5), 1990): with K_k(u) the best
  knapsack value of type k, u / max(1, max_k K_k(u)/C_k) is feasible for the
  full master's dual, so z_master / max(1, max_k K_k(u)/C_k) is a lower
  bound; at convergence the ratio is 1 and the bound is z_master. Where a
  knapsack search is cut short, K_k is replaced by an upper bound on it (the
  knapsack's resource-rate bound), which keeps the bound valid.
- **The MIP optimum** (HiGHS branch and cut) for inputs up to a few hundred
  tasks: instance slots per type, each opened or not, integer counts of each
  class on each slot. Slots per type are capped by an upper bound on the
  optimum (a slot costing more than a known plan is never opened), dominated
  types are dropped (a type no cheaper and no larger than another the same
  tasks may use), and opened slots come first (symmetry). Stopped by its time
  limit, HiGHS' own dual bound is reported instead, with `optimal` False.

Interference is left out, as in the fluid bound: each is a bound on the
hourly cost of any configuration that hosts every task, whatever the tasks'
speed once there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.lp import LPClass, solve_optimal
from autoscaler.patterns import (
    Demand,
    Pattern,
    PatternClass,
    TypeShape,
    _cheapest,
    _fitting,
    best_composition,
    covering_model,
    integer_covering_model,
)
from autoscaler.pooled import PooledBound, pooled_bound
from autoscaler.resources import EPSILON, fits
from autoscaler.stopwatch import cpu_stopwatch, stopwatch

#: The exact MIP is attempted up to this many tasks (and within `MIP_TIME_LIMIT_S`).
MIP_MAX_TASKS = 300
MIP_TIME_LIMIT_S = 20.0
#: The exact MIP lists every composition when there are at most this many.
MIP_MAX_PATTERNS = 100_000
#: Column generation stops here and reports Farley's bound (valid, if looser).
CONFIGURATION_TIME_LIMIT_S = 10.0
CONFIGURATION_MAX_ITERATIONS = 2_000
#: Past this many task classes neither the whole-task LP nor the configuration LP is
#: computed (building them takes longer than the plans they judge): the fluid bound stands.
STATIC_BOUNDS_MAX_CLASSES = 5_000
#: One knapsack search; past it K_k is replaced by its resource-rate upper bound.
KNAPSACK_NODE_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class ConfigurationBound:
    """The configuration LP's lower bound ($/h) and how it was reached."""

    lower_bound: float  # no configuration of whole tasks costs less
    master: float  # the restricted master's optimum at the stop (≥ lower_bound)
    converged: bool  # no column could enter: lower_bound is the LP's optimum
    iterations: int
    columns: int
    seconds: float


@dataclass(frozen=True, slots=True)
class MipOptimum:
    """The exact optimum ($/h) of a small input, or HiGHS' bounds when time ran out."""

    hourly_cost: float | None  # best configuration found (None: none within the time)
    lower_bound: float  # = hourly_cost when optimal
    optimal: bool
    seconds: float


def _shapes(catalog: Catalog) -> list[TypeShape]:
    return [TypeShape(t.name, t.hourly_cost, t.capacity.as_tuple()) for t in catalog.types]


def _pattern_classes(classes: Sequence[LPClass]) -> list[PatternClass]:
    return [
        PatternClass(c.count, c.demands, 0.0, c.group, c.group_limit)
        for c in classes
        if c.count > 0
    ]


def configuration_bound(
    catalog: Catalog,
    classes: Sequence[LPClass],
    time_limit_s: float = CONFIGURATION_TIME_LIMIT_S,
    max_iterations: int = CONFIGURATION_MAX_ITERATIONS,
    node_limit: int = KNAPSACK_NODE_LIMIT,
) -> ConfigurationBound:
    """The configuration LP's bound for `classes` on `catalog`'s types (see the module).

    Every class must fit some type alone. Per iteration and type: the knapsack's
    LP relaxation bounds K_k from above (a type it shows no column can enter is
    not searched); a greedy fill by dual density, then a short branch and bound,
    look for entering columns; only when none enters anywhere do the cut-short
    searches run again with `node_limit` nodes, and those still cut short are solved
    as a small MIP (`_capped_pricing` without rows), whose optimum or dual bound
    replaces the LP relaxation's in Farley's ratio (40 tasks of a quarter to half a
    c7i.48xlarge: the master had reached the optimum, $94.25, but the relaxation's
    ratio left Farley's bound at $85.34, under the fluid one). The bound kept is the best
    Farley bound over the iterations (each is valid; the last is not always the
    best).
    """
    elapsed, spent = stopwatch(), cpu_stopwatch()
    types = _shapes(catalog)
    pclasses = _pattern_classes(classes)
    if not pclasses:
        return ConfigurationBound(0.0, 0.0, True, 0, 0, elapsed())
    highs = covering_model([c.count for c in pclasses])
    seen: set[Pattern] = set()

    def add(pattern: Pattern) -> bool:
        if pattern in seen:
            return False
        seen.add(pattern)
        comp = pattern.composition
        highs.addCol(
            types[pattern.type_index].cost,
            0.0,
            highspy.kHighsInf,
            len(comp),
            np.array([c for c, _ in comp], np.int32),
            np.array([float(n) for _, n in comp]),
        )
        return True

    for c, cls in enumerate(pclasses):
        add(Pattern(_cheapest(cls, types), ((c, 1),)))
    relaxations = [_KnapsackRelaxation(k, shape, pclasses) for k, shape in enumerate(types)]
    caps = np.array([t.capacity for t in types], dtype=float)
    demands = np.array(
        [[d if d is not None else (0.0, 0.0, 0.0) for d in c.demands] for c in pclasses],
        dtype=float,
    )  # classes x types x resources
    # the knapsack MIP leaves anti-affinity out: its value still bounds K_k from above,
    # but its composition is a column only where no class has a limit
    ungrouped = all(not (c.group and c.group_limit) for c in pclasses)
    best_bound = 0.0
    master = 0.0
    converged = False
    iterations = 0
    short = min(node_limit, 2_000)
    while iterations < max_iterations:
        iterations += 1
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError("configuration LP master not solved to optimality")
        master = highs.getObjectiveValue()
        duals = [max(0.0, u) for u in highs.getSolution().row_dual]
        ratio = 1.0
        entered = 0
        unproven: list[tuple[int, float]] = []  # (type, upper bound on K_k) cut short
        for k, shape in enumerate(types):
            relaxed = relaxations[k].upper_bound(duals)
            if relaxed <= shape.cost * (1 + 1e-9) + 1e-9:
                continue  # no pattern of this type can enter; K_k ≤ relaxed ≤ C_k
            for filled in relaxations[k].greedy(duals):
                if sum(duals[c] * n for c, n in filled) > shape.cost * (1 + 1e-9) + 1e-9:
                    entered += add(Pattern(k, filled))
            comp, value, complete, _ = best_composition(
                k, shape, pclasses, duals, None, short, None, relaxations[k].fitting
            )
            if comp and value > shape.cost * (1 + 1e-9) + 1e-9:
                entered += add(Pattern(k, comp))
            if complete:
                ratio = max(ratio, value / shape.cost)
            else:
                unproven.append((k, relaxed))
        if not entered:
            for k, relaxed in unproven:
                shape = types[k]
                comp, value, complete, _ = best_composition(
                    k, shape, pclasses, duals, None, node_limit, None, relaxations[k].fitting
                )
                if not complete:  # the knapsack as a MIP: exact, or HiGHS' dual bound
                    found, top = _capped_pricing(
                        k,
                        caps[k],
                        np.array(duals),
                        len(pclasses),
                        relaxations[k],
                        demands,
                        (),
                        (),
                    )
                    relaxed = min(relaxed, top)
                    if found and ungrouped:
                        found_value = sum(duals[c] * n for c, n in found)
                        if found_value > value:
                            comp, value = found, found_value
                if comp and value > shape.cost * (1 + 1e-9) + 1e-9:
                    entered += add(Pattern(k, comp))
                ratio = max(ratio, (value if complete else relaxed) / shape.cost)
        else:
            ratio = max([ratio] + [relaxed / types[k].cost for k, relaxed in unproven])
        best_bound = max(best_bound, master / ratio)
        if not entered:
            converged = ratio <= 1 + 1e-9
            break
        if spent() > time_limit_s:
            break
    if converged:
        best_bound = max(best_bound, master)
    return ConfigurationBound(best_bound, master, converged, iterations, len(seen), elapsed())


#: Time for one exact pricing problem of the grouped configuration LP's capped rows.
CAPPED_PRICING_TIME_S = 0.5


def _capped_pricing(
    k: int,
    cap: np.ndarray,
    duals: np.ndarray,
    n_cls: int,
    relaxation: _KnapsackRelaxation,
    down: np.ndarray,
    rows: Sequence[tuple[int, int]],
    capped: Sequence[tuple[int, int, np.ndarray]],
) -> tuple[tuple[tuple[int, int], ...] | None, float]:
    """Type k's pricing problem of the grouped configuration LP as a small MIP:
    maximise Σ u_c a_c + Σ_rows w·left_r + Σ_capped w·t, t ≤ left_r, t ≤ Σ a_c
    rest_c (`capped`: row, resource and the classes' rests that count there).
    Returns the best composition found and an upper bound on the best value (HiGHS'
    dual bound when its time runs out)."""
    fitting = relaxation.fitting
    if not fitting:
        return None, 0.0
    u = duals[:n_cls]
    w = np.zeros(3)
    for row, r in rows:
        w[r] += duals[row]
    n, m = len(fitting), len(capped)
    fit = np.array(fitting)
    # maximise as minimising the negation; columns: a_c then t_j
    cost = np.concatenate([-(u[fit] - down[fit, k] @ w), [-duals[row] for row, _, _ in capped]])
    a_rows = [down[fit, k, r] for r in range(3)]  # Σ a d↓ ≤ Q
    lower, upper = [-highspy.kHighsInf] * 3, [float(x) for x in cap]
    dense = [np.concatenate([a, np.zeros(m)]) for a in a_rows]
    for j, (_, r, rest) in enumerate(capped):
        held = np.concatenate([-rest[fit], np.zeros(m)])
        held[n + j] = 1.0  # t_j − Σ a_c rest_c ≤ 0
        within = np.concatenate([down[fit, k, r], np.zeros(m)])
        within[n + j] = 1.0  # t_j + Σ a_c d↓_c ≤ Q_r
        dense += [held, within]
        lower += [-highspy.kHighsInf] * 2
        upper += [0.0, float(cap[r])]
    matrix = np.array(dense)
    lp = highspy.HighsLp()
    lp.num_col_ = n + m
    lp.num_row_ = len(dense)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n + m)
    lp.col_upper_ = np.concatenate([np.array(relaxation.most, dtype=float), np.full(m, np.inf)])
    lp.row_lower_ = np.array(lower)
    lp.row_upper_ = np.array(upper)
    starts, index, value = [0], [], []
    for col in range(n + m):
        nz = np.flatnonzero(matrix[:, col])
        index += nz.tolist()
        value += matrix[nz, col].tolist()
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n + [highspy.HighsVarType.kContinuous] * m
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("time_limit", CAPPED_PRICING_TIME_S)
    highs.passModel(lp)
    highs.run()
    info = highs.getInfo()
    constant = float(w @ cap)
    if highs.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        top = -highs.getObjectiveValue() + constant
    else:
        dual = info.mip_dual_bound
        top = -dual + constant if math.isfinite(dual) else math.inf
    comp = None
    if info.primal_solution_status == 2:
        x = highs.getSolution().col_value
        comp = tuple((c, round(x[i])) for i, c in enumerate(fitting) if round(x[i]) > 0)
    return comp or None, top


class _KnapsackRelaxation:
    """Type k's pricing knapsack relaxed to an LP (an upper bound on K_k(u)), and greedy
    fills by dual density that find entering columns without a search."""

    def __init__(self, k: int, shape: TypeShape, classes: Sequence[PatternClass]) -> None:
        self.shape = shape
        self.fitting = _fitting(k, shape, classes)
        self.classes = classes
        self.k = k
        self.most: list[int] = []
        for c in self.fitting:
            d = classes[c].demands[k]
            assert d is not None
            most = classes[c].count
            for r in range(3):
                if d[r] > EPSILON:
                    most = min(most, int((shape.capacity[r] + EPSILON) // d[r]))
            self.most.append(most)
        self.highs: highspy.Highs | None = None
        if self.fitting:
            self.highs = self._build()

    def _build(self) -> highspy.Highs:
        k, classes, cap = self.k, self.classes, self.shape.capacity
        groups = sorted(
            {g for c in self.fitting if (g := classes[c].group) and classes[c].group_limit}
        )
        lp = highspy.HighsLp()
        n = len(self.fitting)
        lp.num_col_ = n
        lp.num_row_ = 3 + len(groups)
        lp.col_cost_ = np.zeros(n)
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.array([float(m) for m in self.most])
        limits = [
            float(next(classes[c].group_limit or 0 for c in self.fitting if classes[c].group == g))
            for g in groups
        ]
        lp.row_lower_ = np.full(3 + len(groups), -highspy.kHighsInf)
        lp.row_upper_ = np.array([*cap, *limits])
        starts, index, value = [0], [], []
        for c in self.fitting:
            d = classes[c].demands[k]
            assert d is not None
            for r in range(3):
                if d[r] > 0:
                    index.append(r)
                    value.append(d[r])
            g = classes[c].group
            if g in groups:
                index.append(3 + groups.index(g))
                value.append(1.0)
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        highs.passModel(lp)
        return highs

    def upper_bound(self, duals: Sequence[float]) -> float:
        """Max Σ u_c a_c over the relaxed knapsack (0 ≤ a_c ≤ what fits): ≥ K_k(u)."""
        if self.highs is None:
            return 0.0
        n = len(self.fitting)
        self.highs.changeColsCost(
            n, np.arange(n, dtype=np.int32), np.array([-duals[c] for c in self.fitting])
        )
        self.highs.run()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return math.inf  # stays valid: no bound claimed from this type
        return -self.highs.getObjectiveValue()

    def greedy(self, duals: Sequence[float]) -> list[tuple[tuple[int, int], ...]]:
        """Fills in order of dual value per unit of the type's capacity, summed and per
        resource (ties: class order)."""
        cap = self.shape.capacity
        items = [(c, m) for c, m in zip(self.fitting, self.most, strict=True) if duals[c] > 1e-12]
        if not items:
            return []
        weights = [
            (1 / cap[0] if cap[0] > 0 else 0.0, 1 / cap[1], 1 / cap[2]),
            (0.0, 1 / cap[1], 0.0),
            (0.0, 0.0, 1 / cap[2]),
        ]
        out = []
        for w in weights:

            def density(item: tuple[int, int], w: tuple[float, float, float] = w) -> float:
                d = self.classes[item[0]].demands[self.k]
                assert d is not None
                size = d[0] * w[0] + d[1] * w[1] + d[2] * w[2]
                return duals[item[0]] / size if size > 0 else math.inf

            free = list(cap)
            used: dict[str, int] = {}
            comp = []
            for c, most in sorted(items, key=lambda it: (-density(it), it[0])):
                d = self.classes[c].demands[self.k]
                assert d is not None
                n = most
                for r in range(3):
                    if d[r] > EPSILON:
                        n = min(n, int((free[r] + EPSILON) // d[r]))
                g, limit = self.classes[c].group, self.classes[c].group_limit
                if g is not None and limit:
                    n = min(n, limit - used.get(g, 0))
                if n > 0:
                    comp.append((c, n))
                    free = [free[r] - n * d[r] for r in range(3)]
                    if g is not None and limit:
                        used[g] = used.get(g, 0) + n
            if comp:
                out.append(tuple(sorted(comp)))
        return out


def _dual_feasible_functions() -> list[Callable[[float], float]]:
    """Dual feasible functions f of bin packing: any items whose sizes sum to at most 1
    have f-values summing to at most 1 (Fekete and Schepers, "New classes of fast
    lower bounds for bin packing problems", Math. Programming 91, 2001): u^(k) for
    k = 1, 2, 3 (whole multiples of 1/(k+1) keep their size, the rest round down to
    a multiple of 1/k) and U^(ε) for ε = 1/3, 1/4 (items above 1 − ε count whole,
    below ε nothing)."""

    def rounding(k: int) -> Callable[[float], float]:
        def f(x: float) -> float:
            scaled = (k + 1) * x
            if abs(scaled - round(scaled)) < 1e-9:
                return x
            return math.floor(scaled) / k

        return f

    def threshold(eps: float) -> Callable[[float], float]:
        def f(x: float) -> float:
            if x > 1 - eps + 1e-12:
                return 1.0
            return x if x >= eps - 1e-12 else 0.0

        return f

    return [rounding(1), rounding(2), rounding(3), threshold(1 / 3), threshold(1 / 4)]


def whole_task_bound(catalog: Catalog, classes: Sequence[LPClass]) -> float:
    """The fluid LP strengthened by the rows Σ_c f(D_ck^r / Q_k^r) x_ck ≤ z_k, one per
    type, resource and dual feasible function f: an instance of type k holds tasks
    whose r-demands fit Q_k^r, so their f-values sum to at most 1. Valid for whole
    tasks, as small as the fluid LP, and much tighter where tasks are large against
    their instances (tasks of 0.6 of an instance: one instance each). Anti-affinity
    is left out (the bound only gets lower)."""
    types = catalog.types
    functions = _dual_feasible_functions()
    cols: list[tuple[float, list[tuple[int, float]]]] = []
    n_cls = len(classes)
    rows = n_cls
    cap_row: dict[tuple[int, int], int] = {}
    for k, itype in enumerate(types):
        for r, q in enumerate(itype.capacity.as_tuple()):
            if q > 0:
                cap_row[k, r] = rows
                rows += 1 + len(functions)
    for c, cls in enumerate(classes):
        for k, itype in enumerate(types):
            d = cls.demands[k]
            if d is None or not fits(d, itype.capacity.as_tuple()):
                continue
            entries = [(c, 1.0)]
            for r in range(3):
                if (k, r) in cap_row and d[r] > 0:
                    row = cap_row[k, r]
                    q = itype.capacity.as_tuple()[r]
                    entries.append((row, d[r]))
                    for i, f in enumerate(functions):
                        value = f(min(1.0, d[r] / q))
                        if value > 0:
                            entries.append((row + 1 + i, value))
            cols.append((0.0, entries))
    for k, itype in enumerate(types):
        entries = []
        for r, q in enumerate(itype.capacity.as_tuple()):
            if (k, r) in cap_row:
                row = cap_row[k, r]
                entries.append((row, -q))
                entries += [(row + 1 + i, -1.0) for i in range(len(functions))]
        cols.append((itype.hourly_cost, entries))
    lp = highspy.HighsLp()
    lp.num_col_ = len(cols)
    lp.num_row_ = rows
    lp.col_cost_ = np.array([cost for cost, _ in cols])
    lp.col_lower_ = np.zeros(len(cols))
    lp.col_upper_ = np.full(len(cols), highspy.kHighsInf)
    counts = [float(c.count) for c in classes]
    lp.row_lower_ = np.array(counts + [-highspy.kHighsInf] * (rows - n_cls))
    lp.row_upper_ = np.array(counts + [0.0] * (rows - n_cls))
    starts: list[int] = [0]
    index: list[int] = []
    values: list[float] = []
    for _, entries in cols:
        index += [i for i, _ in entries]
        values += [v for _, v in entries]
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(values, dtype=np.float64)
    highs = solve_optimal(lp, "whole-task LP")
    return float(highs.getObjectiveValue())


def _dominated(k: int, types: Sequence[TypeShape], classes: Sequence[PatternClass]) -> bool:
    """True when another type hosts every class type k hosts, at the same demands, is at
    least as large in every resource and no dearer (ties: the lower index is kept)."""
    mine = types[k]
    for j, other in enumerate(types):
        if j == k or other.cost > mine.cost + 1e-12:
            continue
        if not all(o + EPSILON >= m for o, m in zip(other.capacity, mine.capacity, strict=True)):
            continue
        if other.cost == mine.cost and other.capacity == mine.capacity and j > k:
            continue
        if all(cls.demands[k] is None or cls.demands[j] == cls.demands[k] for cls in classes):
            return True
    return False


def mip_optimum(
    catalog: Catalog,
    classes: Sequence[LPClass],
    upper_bound: float | None = None,
    time_limit_s: float = MIP_TIME_LIMIT_S,
    lower_bound: float = 0.0,
    max_patterns: int = MIP_MAX_PATTERNS,
) -> MipOptimum:
    """The cheapest configuration hosting every task of `classes`, by MIP (HiGHS).

    Where every composition of the tasks on every (undominated) type can be listed
    (at most `max_patterns`), the integer configuration program over all of them is
    solved: exact, and its relaxation is the configuration LP, so it closes fast.
    Otherwise an assignment MIP over instance slots. `upper_bound`: the cost of a
    known configuration (caps the slots per type and prunes; default: one cheapest
    instance per task). `lower_bound`: a known bound (the configuration LP's).
    """
    elapsed = stopwatch()
    types = _shapes(catalog)
    pclasses = _pattern_classes(classes)
    if not pclasses:
        return MipOptimum(0.0, 0.0, True, elapsed())
    if upper_bound is None:
        upper_bound = sum(types[_cheapest(c, types)].cost * c.count for c in pclasses)
    kept = [k for k in range(len(types)) if not _dominated(k, types, pclasses)]
    # Listing compositions is ours to time: half the budget at most, then the slot MIP.
    enough = time_limit_s / 2
    patterns = _all_patterns(types, pclasses, kept, max_patterns, lambda: elapsed() > enough)
    if patterns is not None:
        return _pattern_mip(
            types,
            pclasses,
            patterns,
            upper_bound,
            max(0.0, time_limit_s - elapsed()),
            elapsed,
            lower_bound,
        )
    # Slots: (type index, the classes that fit it, how many tasks of each at most).
    slots: list[tuple[int, list[tuple[int, int]]]] = []
    for k in kept:
        shape = types[k]
        fit = []
        for c in _fitting(k, shape, pclasses):
            d = pclasses[c].demands[k]
            assert d is not None
            most = pclasses[c].count
            for r in range(3):
                if d[r] > EPSILON:
                    most = min(most, int((shape.capacity[r] + EPSILON) // d[r]))
            fit.append((c, most))
        if not fit or shape.cost <= 0:
            continue
        tasks = sum(pclasses[c].count for c, _ in fit)
        count = min(tasks, math.floor(upper_bound / shape.cost + 1e-9))
        slots += [(k, fit)] * count
    groups = sorted({c.group for c in pclasses if c.group is not None and c.group_limit})
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("time_limit", max(0.0, time_limit_s - elapsed()))
    inf = highspy.kHighsInf
    # Rows: one per class (= n_c), then per slot its capacity rows and group rows.
    counts = [float(c.count) for c in pclasses]
    row_lower: list[float] = list(counts)
    row_upper: list[float] = list(counts)
    columns: list[tuple[float, float, float, bool, list[tuple[int, float]]]] = []
    z_of_slot: list[int] = []
    previous_z: dict[int, int] = {}  # type -> row of "z_prev - z ≥ 0" to add the next z
    for k, fit in slots:
        shape = types[k]
        cap_rows = {}
        for r in range(3):
            cap_rows[r] = len(row_lower)
            row_lower.append(-inf)
            row_upper.append(0.0)
        group_rows = {}
        for g in groups:
            if any(pclasses[c].group == g for c, _ in fit):
                group_rows[g] = len(row_lower)
                row_lower.append(-inf)
                row_upper.append(0.0)
        link_row = len(row_lower)  # Σ x ≤ (most tasks) z: ties zero-demand classes to z
        row_lower.append(-inf)
        row_upper.append(0.0)
        z_entries = [(cap_rows[r], -shape.capacity[r]) for r in range(3)]
        for g, row in group_rows.items():
            limit = next(c.group_limit for c in pclasses if c.group == g)
            assert limit is not None
            z_entries.append((row, -float(limit)))
        z_entries.append((link_row, -float(sum(m for _, m in fit))))
        if k in previous_z:  # this slot opens only after the one before it (symmetry)
            z_entries.append((previous_z[k], -1.0))
        order_row = len(row_lower)  # z_this − z_next ≥ 0, completed by the next slot
        row_lower.append(0.0)
        row_upper.append(inf)
        z_entries.append((order_row, 1.0))
        previous_z[k] = order_row
        z_of_slot.append(len(columns))
        columns.append((shape.cost, 0.0, 1.0, True, z_entries))
        for c, most in fit:
            d = pclasses[c].demands[k]
            assert d is not None
            entries = [(c, 1.0), (link_row, 1.0)]
            entries += [(cap_rows[r], d[r]) for r in range(3) if d[r] > 0]
            group = pclasses[c].group
            if group is not None and group in group_rows:
                entries.append((group_rows[group], 1.0))
            columns.append((0.0, 0.0, float(most), True, entries))
    if lower_bound > 0:  # Σ C z ≥ a known bound: prunes the search, changes no optimum
        row = len(row_lower)
        row_lower.append(lower_bound * (1 - 1e-9))
        row_upper.append(inf)
        for j in z_of_slot:
            columns[j][4].append((row, columns[j][0]))

    lp = highspy.HighsLp()
    lp.num_col_ = len(columns)
    lp.num_row_ = len(row_lower)
    lp.col_cost_ = np.array([col[0] for col in columns])
    lp.col_lower_ = np.array([col[1] for col in columns])
    lp.col_upper_ = np.array([col[2] for col in columns])
    lp.row_lower_ = np.array(row_lower)
    lp.row_upper_ = np.array(row_upper)
    starts, index, value = [0], [], []
    for col in columns:
        entries = sorted(col[4])
        index += [i for i, _ in entries]
        value += [v for _, v in entries]
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(columns)
    highs.passModel(lp)
    highs.setOptionValue("objective_bound", upper_bound * (1 + 1e-9))
    highs.run()
    return _outcome(highs, lower_bound, elapsed)


def _outcome(highs: highspy.Highs, lower_bound: float, elapsed: Callable[[], float]) -> MipOptimum:
    status = highs.getModelStatus()
    info = highs.getInfo()
    optimal = status == highspy.HighsModelStatus.kOptimal
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    cost = highs.getObjectiveValue() if has_solution else None
    if optimal:
        assert cost is not None
        return MipOptimum(cost, cost, True, elapsed())
    dual = info.mip_dual_bound
    bound = max(lower_bound, dual if math.isfinite(dual) else 0.0)
    return MipOptimum(cost, bound, False, elapsed())


def _all_patterns(
    types: Sequence[TypeShape],
    classes: Sequence[PatternClass],
    kept: Sequence[int],
    limit: int,
    late: Callable[[], bool] = lambda: False,
) -> list[Pattern] | None:
    """Every non-empty composition of the tasks on each type in `kept`, or None past
    `limit` of them or once `late()` says the time for listing them is spent."""
    out: list[Pattern] = []
    for k in kept:
        fitting = _fitting(k, types[k], classes)
        if not _compositions(k, types[k].capacity, classes, fitting, limit, out, late):
            return None
    return out


def _compositions(
    k: int,
    capacity: Demand,
    classes: Sequence[PatternClass],
    fitting: Sequence[int],
    limit: int,
    out: list[Pattern],
    late: Callable[[], bool] = lambda: False,
) -> bool:
    """Append type k's compositions to `out` (depth first over `fitting`, each class
    0..count times); False once `out` would pass `limit` or `late()` (asked every 1,024
    compositions) is true."""
    chosen: list[tuple[int, int]] = []
    used: dict[str, int] = {}

    def visit(i: int, free: tuple[float, ...]) -> bool:
        if i == len(fitting):
            if chosen:
                if len(out) >= limit or (out and len(out) % 1024 == 0 and late()):
                    return False
                out.append(Pattern(k, tuple(chosen)))
            return True
        if not visit(i + 1, free):
            return False
        c = fitting[i]
        d = classes[c].demands[k]
        assert d is not None
        g, cap = classes[c].group, classes[c].group_limit
        limited = g is not None and bool(cap)
        n = 0
        ok = True
        while n < classes[c].count:
            if any(d[r] > free[r] + EPSILON for r in range(3)):
                break
            if limited and used.get(g, 0) >= cap:  # type: ignore[arg-type, operator]
                break
            free = tuple(free[r] - d[r] for r in range(3))
            n += 1
            if limited:
                used[g] = used.get(g, 0) + 1  # type: ignore[index, arg-type]
            chosen.append((c, n))
            ok = visit(i + 1, free)
            chosen.pop()
            if not ok:
                break
        if limited:
            used[g] -= n  # type: ignore[index]
        return ok

    return visit(0, capacity)


def _pattern_mip(
    types: Sequence[TypeShape],
    classes: Sequence[PatternClass],
    patterns: Sequence[Pattern],
    upper_bound: float,
    time_limit_s: float,
    elapsed: Callable[[], float],
    lower_bound: float = 0.0,
) -> MipOptimum:
    """min Σ C_k y_p, Σ_p a_cp y_p ≥ n_c, y integer: exact over every composition
    (`lower_bound`: a known bound, kept when stopped before HiGHS proves a better one)."""
    highs = integer_covering_model([t.cost for t in types], [c.count for c in classes], patterns)
    highs.setOptionValue("time_limit", float(time_limit_s))
    highs.setOptionValue("objective_bound", upper_bound * (1 + 1e-9))
    highs.run()
    return _outcome(highs, lower_bound, elapsed)


@dataclass(frozen=True, slots=True)
class StaticBounds:
    """The bounds computed for one static packing problem, loosest first ($/h)."""

    fluid: float
    configuration: ConfigurationBound | None = None
    mip: MipOptimum | None = None
    whole_tasks: float | None = None  # the fluid LP with dual-feasible-function rows
    grouped: ConfigurationBound | None = None  # demands rounded down, the rest fluid
    pooled: PooledBound | None = None  # the fluid LP with exclusive pools and DFF rows

    @property
    def tightest(self) -> float:
        """The highest valid lower bound computed (the configuration LP's optimum is at
        least the fluid one, so the fluid bound also bounds it from below)."""
        values = [self.fluid]
        if self.whole_tasks is not None:
            values.append(self.whole_tasks)
        if self.configuration is not None:
            values.append(self.configuration.lower_bound)
        if self.grouped is not None:
            values.append(self.grouped.lower_bound)
        if self.pooled is not None:
            values.append(self.pooled.lower_bound)
        if self.mip is not None:
            values.append(self.mip.lower_bound)
        return max(values)

    def document(self) -> dict[str, object]:
        """The figures as `autoscaler plan --json` writes them."""
        config, mip = self.configuration, self.mip
        return {
            "fluid": self.fluid,
            "whole_tasks": self.whole_tasks,
            "configuration": None
            if config is None
            else {
                "lower_bound": max(self.fluid, config.lower_bound),
                "farley": config.lower_bound,
                "master": config.master,
                "converged": config.converged,
                "iterations": config.iterations,
                "columns": config.columns,
                "seconds": config.seconds,
            },
            "grouped_configuration": None
            if self.grouped is None
            else {
                "lower_bound": self.grouped.lower_bound,
                "converged": self.grouped.converged,
                "seconds": self.grouped.seconds,
            },
            "pooled": None
            if self.pooled is None
            else {
                "lower_bound": self.pooled.lower_bound,
                "exclusive_resource": self.pooled.resource,
                "exclusive_tasks": self.pooled.exclusive_tasks,
                "groups": self.pooled.groups,
                "seconds": self.pooled.seconds,
            },
            "mip": None
            if mip is None
            else {
                "hourly_cost": mip.hourly_cost,
                "lower_bound": mip.lower_bound,
                "optimal": mip.optimal,
                "seconds": mip.seconds,
            },
            "tightest": self.tightest,
        }


def static_bounds(
    catalog: Catalog,
    classes: Sequence[LPClass],
    fluid: float,
    configuration: bool = True,
    exact: bool = False,
    upper_bound: float | None = None,
    time_limit_s: float = CONFIGURATION_TIME_LIMIT_S,
    mip_time_limit_s: float = MIP_TIME_LIMIT_S,
    mip_max_tasks: int = MIP_MAX_TASKS,
    grouped_time_limit_s: float | None = None,
    pooled: bool = True,
) -> StaticBounds:
    """Beside the `fluid` bound: with `pooled`, at any size, the pooled LP's
    (`autoscaler.pooled`: exclusive pools and dual-feasible-function rows); up to
    `STATIC_BOUNDS_MAX_CLASSES` classes, the whole-task LP's and (with
    `configuration`) the configuration LP's; with `exact` and at most `mip_max_tasks`
    tasks, the MIP optimum (`upper_bound`: a known plan's cost). Above the class
    limit, or where the configuration LP did not converge (with `configuration`), the
    grouped configuration LP's too (`grouped_configuration_bound`), whose size does
    not grow with the classes (`grouped_time_limit_s`: its column generation's time,
    `GROUPED_TIME_LIMIT_S` unless given)."""
    grouped_s = GROUPED_TIME_LIMIT_S if grouped_time_limit_s is None else grouped_time_limit_s
    pool = pooled_bound(catalog, classes) if pooled else None
    if len(classes) > STATIC_BOUNDS_MAX_CLASSES:
        if not configuration:
            return StaticBounds(fluid, pooled=pool)
        return StaticBounds(
            fluid,
            grouped=grouped_configuration_bound(catalog, classes, time_limit_s=grouped_s),
            pooled=pool,
        )
    whole = whole_task_bound(catalog, classes)
    config = configuration_bound(catalog, classes, time_limit_s) if configuration else None
    grouped = None
    if config is not None and not config.converged:  # Farley's bound may be weak: group
        grouped = grouped_configuration_bound(catalog, classes, time_limit_s=grouped_s)
    mip = None
    if exact and sum(c.count for c in classes) <= mip_max_tasks:
        known = max(
            fluid,
            whole,
            config.lower_bound if config is not None else 0.0,
            grouped.lower_bound if grouped is not None else 0.0,
            pool.lower_bound if pool is not None else 0.0,
        )
        mip = mip_optimum(catalog, classes, upper_bound, mip_time_limit_s, known)
    return StaticBounds(fluid, config, mip, whole, grouped, pool)


#: The grouped configuration LP: finest grid tried (steps per largest capacity of a
#: resource) and the most classes its column generation is given.
GROUPED_GRID_STEPS = (64, 32, 16, 8, 4)
GROUPED_MAX_CLASSES = 150
GROUPED_TIME_LIMIT_S = 5.0


def grouped_configuration_bound(
    catalog: Catalog,
    classes: Sequence[LPClass],
    max_classes: int = GROUPED_MAX_CLASSES,
    time_limit_s: float = GROUPED_TIME_LIMIT_S,
    node_limit: int = 20_000,
) -> ConfigurationBound:
    """A configuration LP bound for any number of classes: demands rounded *down*, the
    rounded-off rest counted as fluid.

    Each task's demand d on type k is split into d↓ (rounded down onto a grid of
    `G` steps per resource, the step the largest capacity of that resource in the
    smallest-capped family over G) and the rest d − d↓ ≥ 0. Tasks with equal d↓ on
    every type and the same set S(τ) of types they fit alone form a class (a task
    whose d↓ is zero everywhere is rest only); G is coarsened until at most
    `max_classes` remain. The master over patterns p = (type k, class counts a):

        minimise Σ_p C_k y_p  s.t.  Σ_p a_cp y_p ≥ n_c                (every class)
                 Σ_{p: k(p) ∈ S} y_p (Q_k − Σ_c a_cp d↓_ck)_r ≥ R_S,r   (every S, r)

    where R_S,r = Σ over tasks τ with S(τ) ⊆ S of min_{k ∈ S(τ)} (d_τk − d↓_τk)_r;
    and, since a task's rest sits on the instance that hosts the task, the same rows
    over the tasks in classes only (R'_S,r) with each pattern counting at most the
    rest its own tasks can bring, min(left_r, Σ_c a_cp ρ_ckr) (ρ: the most rest of a
    member of c on k) — else the rest of tasks rounded down two to an instance could
    sit in the spare CPUs of instances whose GPUs one 8-GPU task fills.
    *Valid*: take any configuration of whole tasks and let y count its instances by
    (type, classes of the tasks on them). Class rows hold with equality. An instance
    of type k holds tasks whose true demands fit Q_k, so its leftover after their d↓
    is at least the sum of their rests; tasks with S(τ) ⊆ S all sit on instances of
    types in S; summing, the rest rows hold. So the configuration is feasible for
    this LP at its own cost, and any lower bound on the LP bounds every
    configuration. Column generation prices one knapsack per type with values
    u_c − w_k·d↓_ck (w_k: the rest rows' duals of the sets containing k) against
    C_k − w_k·Q_k; it is stopped with Farley's bound (see the module): any pattern's
    ratio of dual value to cost is at most (w_k·Q_k + K'_k)/C_k, with K'_k the
    knapsack's optimum or, where the search was cut short, its LP relaxation's. The
    capped rows' min is priced by its two linear upper bounds (each a knapsack, the
    lesser bounding K) and, where they cannot settle it, by a small MIP
    (`_capped_pricing`).
    Anti-affinity is left out (the bound only gets lower).
    """
    elapsed = stopwatch()
    types = _shapes(catalog)
    n_types = len(types)
    live = [c for c in classes if c.count > 0]
    if not live:
        return ConfigurationBound(0.0, 0.0, True, 0, 0, elapsed())
    caps = np.array([t.capacity for t in types], dtype=float)
    costs = np.array([t.cost for t in types])
    nan = (math.nan, math.nan, math.nan)
    demand = np.array(
        [[d if d is not None else nan for d in c.demands] for c in live], dtype=float
    )  # classes x types x resources
    counts = np.array([c.count for c in live], dtype=float)
    fit = np.all(demand <= caps[None] + EPSILON, axis=2)  # NaN: False
    if not fit.any(axis=1).all():
        raise ValueError("a class fits no instance type")
    families = sorted({t.family for t in catalog.types})
    fam = np.array([families.index(t.family) for t in catalog.types])
    largest = np.array(
        [[caps[fam == f, r].max() for r in range(3)] for f in range(len(families))]
    )  # family x resource
    span = np.array(
        [min((x for x in largest[:, r] if x > 0), default=1.0) for r in range(3)]
    )  # per resource: the largest capacity of the family where it is least
    base = np.nan_to_num(demand, nan=0.0)
    first_of_family = [int(np.flatnonzero(fam == f)[0]) for f in range(len(families))]
    # per resource its own grid: the finest triple (fewest steps summed in log) that
    # leaves at most `max_classes`; a resource no task needs takes no part
    used = [bool((base[:, :, r] > 0).any()) for r in range(3)]
    grids = sorted(
        itertools.product(*[GROUPED_GRID_STEPS if used[r] else (1,) for r in range(3)]),
        key=lambda g: (-sum(math.log(x) for x in g), g),
    )
    for steps in grids:
        step = span / np.array(steps, dtype=float)
        down = np.minimum(np.floor(base / step * (1 + 1e-12)) * step, base)
        down[~fit] = -1.0
        nonzero = (down > 0).any(axis=(1, 2))
        # demands are per family: one type of each family stands for the rest
        keys = np.ascontiguousarray(
            np.concatenate([down[:, first_of_family].reshape(len(live), -1), fit], axis=1)[nonzero]
        )
        void = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
        _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
        if len(first) <= max_classes:
            break
    first = np.flatnonzero(nonzero)[first]
    inverse = inverse.reshape(-1)
    rest = np.where(fit[:, :, None], np.nan_to_num(demand, nan=0.0) - down, np.inf).min(axis=1)
    rest = np.maximum(rest, 0.0)  # classes x resources: the least rest over fitting types
    # the rest rows, one per distinct set S of fitting types (and resource)
    sets, set_of = np.unique(fit, axis=0, return_inverse=True)
    set_of = set_of.reshape(-1)
    inside = np.all(sets[:, None, :] <= sets[None, :, :], axis=2)  # inside[a, b]: a ⊆ b
    need = inside.T.astype(float) @ np.stack(
        [np.bincount(set_of, weights=counts * rest[:, r], minlength=len(sets)) for r in range(3)],
        axis=1,
    )  # sets x resources
    rows = [(s, r) for s in range(len(sets)) for r in range(3) if need[s, r] > 1e-9]
    # the capped rows: the same rests, of the tasks in classes only, each instance
    # holding no more of them than its class tasks can have (see the docstring)
    in_class = np.where(nonzero, counts, 0.0)
    class_need = inside.T.astype(float) @ np.stack(
        [np.bincount(set_of, weights=in_class * rest[:, r], minlength=len(sets)) for r in range(3)],
        axis=1,
    )
    capped = [(s, r) for s in range(len(sets)) for r in range(3) if class_need[s, r] > 1e-9]

    n_cls = len(first)
    grouped_counts = np.bincount(inverse, weights=counts[nonzero], minlength=n_cls)
    grouped_down = down[first]
    grouped_fit = fit[first]
    # per grouped class, type and resource: the most any member's rest is there
    own_rest = np.where(fit[:, :, None], np.nan_to_num(demand, nan=0.0) - down, 0.0)
    most_rest = np.zeros((n_cls, n_types, 3))
    np.maximum.at(most_rest, inverse, np.maximum(own_rest[nonzero], 0.0))
    grouped_set = set_of[first]
    pclasses = [
        PatternClass(
            int(grouped_counts[c] + 0.5),
            tuple(
                (
                    float(grouped_down[c, k, 0]),
                    float(grouped_down[c, k, 1]),
                    float(grouped_down[c, k, 2]),
                )
                if grouped_fit[c, k]
                else None
                for k in range(n_types)
            ),
            0.0,
        )
        for c in range(n_cls)
    ]
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    lower = (
        [float(c.count) for c in pclasses]
        + [float(need[s, r]) for s, r in rows]
        + [float(class_need[s, r]) for s, r in capped]
    )
    highs.addRows(
        len(lower),
        np.array(lower),
        np.full(len(lower), highspy.kHighsInf),
        0,
        np.array([], np.int32),
        np.array([], np.int32),
        np.array([], float),
    )
    rows_of_type = [
        [(n_cls + i, r) for i, (s, r) in enumerate(rows) if sets[s, k]] for k in range(n_types)
    ]
    first_capped = n_cls + len(rows)
    capped_of_type = [
        [(first_capped + i, s, r) for i, (s, r) in enumerate(capped) if sets[s, k]]
        for k in range(n_types)
    ]
    seen: set[Pattern] = set()

    def add(pattern: Pattern) -> bool:
        if pattern in seen:
            return False
        seen.add(pattern)
        k = pattern.type_index
        left = caps[k].copy()
        for c, n in pattern.composition:
            left -= n * grouped_down[c, k]
        index = [c for c, _ in pattern.composition]
        value = [float(n) for _, n in pattern.composition]
        for row, r in rows_of_type[k]:
            if left[r] > 0:
                index.append(row)
                value.append(float(left[r]))
        for row, s, r in capped_of_type[k]:
            held = sum(
                n * most_rest[c, k, r] for c, n in pattern.composition if inside[grouped_set[c], s]
            )
            if min(left[r], held) > 0:
                index.append(row)
                value.append(float(min(left[r], held)))
        highs.addCol(
            float(costs[k]),
            0.0,
            highspy.kHighsInf,
            len(index),
            np.array(index, np.int32),
            np.array(value),
        )
        return True

    for k in range(n_types):
        add(Pattern(k, ()))
    for c, cls in enumerate(pclasses):
        add(Pattern(_cheapest(cls, types), ((c, 1),)))
    relaxations = [_KnapsackRelaxation(k, shape, pclasses) for k, shape in enumerate(types)]
    best_bound, master, converged, iterations = 0.0, 0.0, False, 0
    short = min(node_limit, 500)
    spent = cpu_stopwatch()  # the budget is the column generation's; grouping is linear
    while True:
        iterations += 1
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError("grouped configuration LP master not solved to optimality")
        master = highs.getObjectiveValue()
        duals = np.maximum(0.0, np.array(highs.getSolution().row_dual))
        u = duals[:n_cls]
        entered = 0

        def exact_value(
            k: int, comp: tuple[tuple[int, int], ...], duals: np.ndarray = duals
        ) -> float:
            """Σ u_c a_c plus the rest rows' duals times the column's coefficients."""
            u = duals[:n_cls]
            left = caps[k].copy()
            total = 0.0
            for c, n in comp:
                left -= n * grouped_down[c, k]
                total += u[c] * n
            for row, r in rows_of_type[k]:
                total += duals[row] * max(0.0, float(left[r]))
            for row, s_, r in capped_of_type[k]:
                held = sum(n * most_rest[c, k, r] for c, n in comp if inside[grouped_set[c], s_])
                total += duals[row] * max(0.0, min(float(left[r]), held))
            return total

        def offer(k: int, comp: tuple[tuple[int, int], ...]) -> int:
            if exact_value(k, comp) > types[k].cost * (1 + 1e-9) + 1e-9:
                return int(add(Pattern(k, comp)))
            return 0

        # per type, one entry per linearization of the capped rows' min(left, held):
        # [w·Q_k, values, reduced shape, upper bound on K'_k, proven]; the column's
        # value is at most each linearization's, so each bounds K_k
        priced: list[list[list[Any]]] = []
        for k, shape in enumerate(types):
            w_left = np.zeros(3)  # duals of the rows a column enters with its leftover
            for row, r in rows_of_type[k]:
                w_left[r] += duals[row]
            w_all = w_left.copy()
            extra = np.zeros(n_cls)  # the capped rows' duals times the classes' rests
            for row, s_, r in capped_of_type[k]:
                w_all[r] += duals[row]
                extra += duals[row] * most_rest[:, k, r] * inside[grouped_set, s_]
            linearizations = [w_all] if not capped_of_type[k] else [w_all, w_left]
            states = []
            for w in linearizations:
                wq = float(w @ caps[k])
                raw = u - grouped_down[:, k] @ w
                if w is w_left:
                    raw = raw + extra
                values_list = np.where(grouped_fit[:, k], np.maximum(0.0, raw), 0.0).tolist()
                reduced = TypeShape(shape.name, max(0.0, shape.cost - wq), shape.capacity)
                relaxed = relaxations[k].upper_bound(values_list)
                threshold = reduced.cost * (1 + 1e-9) + 1e-9
                if relaxed <= threshold:
                    states.append([wq, values_list, reduced, max(relaxed, reduced.cost), True])
                    continue
                for filled in relaxations[k].greedy(values_list):
                    if sum(values_list[c] * n for c, n in filled) > threshold:
                        entered += offer(k, filled)
                comp, value, complete, _ = best_composition(
                    k, reduced, pclasses, values_list, None, short, None, relaxations[k].fitting
                )
                if comp and value > threshold:
                    entered += offer(k, comp)
                top = max(value, reduced.cost) if complete else relaxed
                states.append([wq, values_list, reduced, top, complete])
            priced.append(states)
        if not entered:  # search the cut-short knapsacks through before concluding
            for k, states in enumerate(priced):
                for state in states:
                    wq, values_list, reduced, _, proven = state
                    if proven:
                        continue
                    comp, value, complete, _ = best_composition(
                        k,
                        reduced,
                        pclasses,
                        values_list,
                        None,
                        node_limit,
                        None,
                        relaxations[k].fitting,
                    )
                    if comp and value > reduced.cost * (1 + 1e-9) + 1e-9:
                        entered += offer(k, comp)
                    if complete:
                        state[3], state[4] = max(value, reduced.cost), True
        tops = [min(p[0] + p[3] for p in states) for states in priced]
        if not entered:  # the min(left, held) terms exactly, where the two lines disagree
            for k, states in enumerate(priced):
                if len(states) < 2 or tops[k] <= types[k].cost * (1 + 1e-9) + 1e-9:
                    continue
                comp, top = _capped_pricing(
                    k,
                    caps[k],
                    duals,
                    n_cls,
                    relaxations[k],
                    grouped_down,
                    rows_of_type[k],
                    [
                        (row, r, most_rest[:, k, r] * inside[grouped_set, s_])
                        for row, s_, r in capped_of_type[k]
                    ],
                )
                if comp:
                    entered += offer(k, comp)
                tops[k] = min(tops[k], top)
        ratio = max([1.0] + [top / types[k].cost for k, top in enumerate(tops)])

        best_bound = max(best_bound, master / ratio)
        if not entered:
            converged = ratio <= 1 + 1e-9
            break
        if spent() > time_limit_s:
            break
    if converged:
        best_bound = max(best_bound, master)
    return ConfigurationBound(best_bound, master, converged, iterations, len(seen), elapsed())
