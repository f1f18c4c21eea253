"""LP relaxation over instance types and its shadow prices (CvxCluster §3–4, solved by HiGHS).

Relax placement into an LP over instance *types* instead of instances, on
task *classes* (tasks with equal demands) with counts n_c:

    minimise   Σ_k C_k z_k
    subject to Σ_k x_ck = n_c                        (dual u_c: a task's LP price)
               Σ_c D_ck^r x_ck ≤ Q_k^r z_k   ∀k,r    (dual p_kr ≥ 0: shadow price)
               Σ_{c∈g} x_ck ≤ ℓ_g z_k        ∀g,k    (anti-affinity: ≤ ℓ_g tasks of job g
                                                      per instance, CvxCluster §3.2.1)
               x_ck ≥ 0 only where class c fits an empty instance of type k; z_k ≥ 0

Its size depends on classes × types, not on tasks or instances. The optimum is
a lower bound on the hourly cost of any feasible configuration (before
interference): every configuration is a feasible point with the same cost.
`u_c = min_k Σ_r p_kr D_ck^r` is what a task of class c costs once
complementary tasks share instances — a sharper value than RP.

`ShadowPricer` keeps its HiGHS model between rounds and, when only the counts
changed, re-solves from the previous basis (Firmament's lesson: consecutive
rounds differ little).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.resources import RESOURCE_NAMES, fits
from autoscaler.stopwatch import stopwatch

Demand = tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class LPClass:
    """Interchangeable tasks for the LP: the demand on each type (None: cannot run there)."""

    demands: tuple[Demand | None, ...]  # indexed like the catalog's types
    count: int
    group: str | None = None  # anti-affinity group (a job), if limited
    group_limit: int | None = None


@dataclass(frozen=True, slots=True)
class PriceSolution:
    """The LP's optimum and duals."""

    lower_bound: float  # $/h: no feasible configuration costs less (before interference)
    class_prices: tuple[float, ...]  # u_c per class, in input order
    shadow_prices: dict[str, tuple[float, ...]]  # per type: $/h per unit of each resource
    type_usage: dict[str, float]  # z_k: fractional instances of each type the LP uses
    assignment: dict[tuple[int, str], float]  # x_ck: tasks of class c on type k
    seconds: float
    warm_started: bool


class ShadowPricer:
    """Solves the LP with HiGHS, re-solving warm when only class counts change."""

    def __init__(self) -> None:
        self._highs: highspy.Highs | None = None
        self._structure: tuple[object, ...] | None = None
        self._layout: _Layout | None = None

    def solve(
        self, catalog: Catalog, classes: Sequence[LPClass], solver: str = "choose"
    ) -> PriceSolution:
        """The LP's optimum and duals; `solver` is HiGHS's ("choose": its dual simplex
        here; "ipm": interior point, then crossover to a vertex)."""
        elapsed = stopwatch()
        structure = (
            tuple(t.name for t in catalog.types),
            tuple(t.hourly_cost for t in catalog.types),
            tuple((c.demands, c.group, c.group_limit) for c in classes),
        )
        warm = self._highs is not None and structure == self._structure
        if warm:
            assert self._highs is not None and self._layout is not None
            highs, layout = self._highs, self._layout
            counts = np.array([float(c.count) for c in classes])
            highs.changeRowsBounds(  # type: ignore[attr-defined]  # bound, not in the stubs
                len(classes), np.arange(len(classes), dtype=np.int32), counts, counts
            )
        else:
            highs, layout = _build(catalog, classes)
            self._highs, self._structure, self._layout = highs, structure, layout
        highs.setOptionValue("solver", solver)
        highs.run()
        status = highs.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            self._highs = None  # do not warm-start from a failed solve
            raise RuntimeError(f"LP not solved to optimality: {highs.modelStatusToString(status)}")
        return _read(highs, layout, catalog, classes, elapsed(), warm)


def solve_lp(catalog: Catalog, classes: Sequence[LPClass]) -> PriceSolution:
    """One cold solve of the LP."""
    return ShadowPricer().solve(catalog, classes)


@dataclass(slots=True)
class _Layout:
    x_cols: list[tuple[int, int]]  # column j < len(x_cols): (class, type index)
    z_col0: int  # columns z_col0 + k: z_k
    cap_rows: list[tuple[int, int]]  # (type index, resource) of each capacity row
    cap_row0: int


def _build(catalog: Catalog, classes: Sequence[LPClass]) -> tuple[highspy.Highs, _Layout]:
    types = catalog.types
    n_cls = len(classes)
    # Columns: x_ck for fitting pairs, then z_k.
    x_cols: list[tuple[int, int]] = []
    for c, cls in enumerate(classes):
        for k, itype in enumerate(types):
            d = cls.demands[k]
            if d is not None and fits(d, itype.capacity):
                x_cols.append((c, k))
    z0 = len(x_cols)
    # Rows: assignment (n_c), capacity (k, r) where the type has some, anti-affinity (g, k).
    cap_rows = [
        (k, r)
        for k, itype in enumerate(types)
        for r, cap in enumerate(itype.capacity.as_tuple())
        if cap > 0
    ]
    cap_index = {kr: n_cls + i for i, kr in enumerate(cap_rows)}
    groups = sorted({c.group for c in classes if c.group is not None and c.group_limit})
    group_limit: dict[str, int] = {}
    for cls in classes:
        if cls.group is not None and cls.group in groups and cls.group_limit is not None:
            group_limit[cls.group] = cls.group_limit
    aa0 = n_cls + len(cap_rows)
    aa_index = {
        (g, k): aa0 + i * len(types) + k for i, g in enumerate(groups) for k in range(len(types))
    }
    n_rows = aa0 + len(groups) * len(types)

    columns: list[list[tuple[int, float]]] = []
    for c, k in x_cols:
        d = classes[c].demands[k]
        assert d is not None
        entries = [(c, 1.0)]
        entries += [(cap_index[(k, r)], d[r]) for r in range(3) if d[r] and (k, r) in cap_index]
        group = classes[c].group
        if group is not None and group in groups:
            entries.append((aa_index[(group, k)], 1.0))
        columns.append(entries)
    for k, itype in enumerate(types):
        cap = itype.capacity.as_tuple()
        entries = [(cap_index[(k, r)], -cap[r]) for r in range(3) if (k, r) in cap_index]
        entries += [(aa_index[(g, k)], -float(group_limit[g])) for g in groups]
        columns.append(entries)

    lp = highspy.HighsLp()
    n_cols = len(columns)
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = np.array([0.0] * z0 + [t.hourly_cost for t in types])
    lp.col_lower_ = np.zeros(n_cols)
    lp.col_upper_ = np.full(n_cols, highspy.kHighsInf)
    counts = [float(c.count) for c in classes]
    lp.row_lower_ = np.array(counts + [-highspy.kHighsInf] * (n_rows - n_cls))
    lp.row_upper_ = np.array(counts + [0.0] * (n_rows - n_cls))
    starts, index, value = [0], [], []
    for entries in columns:
        entries.sort()
        index += [i for i, _ in entries]
        value += [v for _, v in entries]
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.passModel(lp)
    return highs, _Layout(x_cols, z0, cap_rows, n_cls)


def solve_optimal(lp: highspy.HighsLp, what: str) -> highspy.Highs:
    """`lp` solved quietly by HiGHS, to optimality: a bound read from anything less would
    not be one (RuntimeError naming `what`)."""
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.passModel(lp)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"{what} not solved to optimality")
    return highs


def _read(
    highs: highspy.Highs,
    layout: _Layout,
    catalog: Catalog,
    classes: Sequence[LPClass],
    seconds: float,
    warm: bool,
) -> PriceSolution:
    solution = highs.getSolution()
    col = solution.col_value
    dual = solution.row_dual
    types = catalog.types
    shadow = {t.name: [0.0] * len(RESOURCE_NAMES) for t in types}
    for i, (k, r) in enumerate(layout.cap_rows):
        # HiGHS duals are d(objective)/d(rhs); a binding ≤ row has dual ≤ 0.
        shadow[types[k].name][r] = max(0.0, -dual[layout.cap_row0 + i])
    usage = {
        t.name: col[layout.z_col0 + k] for k, t in enumerate(types) if col[layout.z_col0 + k] > 1e-9
    }
    assignment = {
        (c, types[k].name): col[j] for j, (c, k) in enumerate(layout.x_cols) if col[j] > 1e-9
    }
    return PriceSolution(
        lower_bound=highs.getObjectiveValue(),
        class_prices=tuple(dual[c] for c in range(len(classes))),
        shadow_prices={name: tuple(v) for name, v in shadow.items()},
        type_usage=usage,
        assignment=assignment,
        seconds=seconds,
        warm_started=warm,
    )
