"""The whole-task LP with exclusive pools: tasks that fill a resource of every
instance they fit cannot share it with tasks that need that resource.

The fluid LP (`autoscaler.lp`) lets any task use the spare resources of any
instance. Whole tasks cannot always: a task that needs all of a type's GPUs
(on every type it fits) shares its instance with no other GPU task, so the
CPUs and memory it leaves free there serve CPU-only tasks at most — yet the
fluid LP lets the other GPU tasks take them, and pays for their GPUs alone.
Where such tasks are many, the fluid bound (and a configuration LP whose
demands are rounded down) falls well short of what every plan pays.

**The pooled LP.** Fix a resource r. With m_kr the least positive r-demand of
any task on type k, the *exclusive* tasks B are those that, on every type k
they fit alone, need some r and leave less than m_kr of it:
d_τkr > 0 and d_τkr + m_kr > Q_kr (to the tolerance `fits` allows). Two of
them never share an instance (d_τkr + d_τ'kr ≥ d_τkr + m_kr > Q_kr). With β_k
the least r-demand of an exclusive task fitting k, a task τ ∉ B may share a
type-k instance with one only if d_τkr + β_k ≤ Q_kr ("allowed on k"). The LP:
instances of each type in two pools, A (no exclusive task) and B (one),

    minimise   Σ_k C_k (z^A_k + z^B_k)
    subject to Σ_k x^A_τk + Σ_k x^B_τk = n_τ            (x^A only for τ ∉ B,
                                                          x^B only for τ ∈ B or allowed)
               Σ_τ D_τk^r' x^P_τk ≤ Q_k^r' z^P_k         ∀ pool P, type k, resource r'
               Σ_τ f(D_τk^r'/Q_k^r') x^P_τk ≤ z^P_k      ∀ P, k, r', f
               Σ_{τ∈B} x^B_τk ≤ z^B_k                    ∀ k   (one exclusive task each)

where f ranges over dual feasible functions of bin packing (Fekete and
Schepers, "New classes of fast lower bounds for bin packing problems", Math.
Programming 91, 2001: any items whose sizes sum to at most 1 have f-values
summing to at most 1): u^(k) for k = 1, 2, 3 taken one step lower on the
multiples of 1/(k+1) (still a dual feasible function, being below one), and
U^(ε) for ε = 1/3, 1/4 — the rows of the whole-task LP
(`autoscaler.bounds.whole_task_bound`), which count tasks over half an
instance whole.

*Valid*: in any configuration of whole tasks, put each instance hosting an
exclusive task in pool B, the rest in A. An instance of B hosts exactly one
exclusive task (they never share) and besides it only tasks allowed on its type
(any other task τ there has d_τkr + β_k ≤ d_τkr + d_bkr ≤ Q_kr); capacities
hold per instance, and so do the f rows (the shares of tasks on one instance
sum to at most 1), so all hold per pool and type. Counting instances and tasks
gives a feasible point at the configuration's cost: the LP's optimum bounds
every configuration from below (before interference; anti-affinity is left
out, which only lowers it). With no exclusive task it is the whole-task LP.

**At any size.** By LP duality any prices p^P_k ≥ 0, function prices λ^P_k ≥ 0
and slot prices σ_k ≥ 0 with p^A_k·Q_k + Σλ^A_k ≤ C_k and
p^B_k·Q_k + Σλ^B_k + σ_k ≤ C_k give the bound Σ_τ n_τ·u_τ, with u_τ the least
over τ's allowed (pool, type) of p^P_k·D_τk + λ^P_k·f(D_τk/Q_k) (+ σ_k for an
exclusive task): (u, p, λ, σ) is feasible for the dual. So the LP is solved on
tasks aggregated onto a grid (each group at its members' mean demand and mean
f-values, in one role and fit pattern), and its duals, scaled down wherever
they would break a type's cost (capacities taken with the `fits` tolerance),
are applied to the true demands — the construction of the fluid packer's bound
(`autoscaler.fluid`). The bound kept is the best over the resources that have
exclusive tasks, and the unpooled LP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.fluid import grid_up
from autoscaler.lp import LPClass, solve_optimal
from autoscaler.resources import EPSILON, RESOURCE_NAMES
from autoscaler.stopwatch import stopwatch

#: Most group × type cells of the aggregated LP a pool split is solved on.
POOLED_MAX_CELLS = 60_000
#: Significant bits of the finest grid tried, and of the coarsest.
POOLED_GRID_BITS = (6, 5, 4, 3, 2, 1)


@dataclass(frozen=True, slots=True)
class PooledBound:
    """The pooled fluid LP's bound ($/h) and the split that gave it."""

    lower_bound: float
    resource: str | None  # the resource whose exclusive tasks had a pool (None: none)
    exclusive_tasks: int  # tasks in pool B
    groups: int  # aggregated groups the LP was solved on
    seconds: float


def pooled_bound(
    catalog: Catalog, classes: Sequence[LPClass], max_cells: int = POOLED_MAX_CELLS
) -> PooledBound:
    """The best pooled fluid bound over the resources (see the module)."""
    elapsed = stopwatch()
    live = [c for c in classes if c.count > 0]
    types = catalog.types
    if not live:
        return PooledBound(0.0, None, 0, 0, elapsed())
    caps = np.array([t.capacity.as_tuple() for t in types], dtype=float)
    costs = np.array([t.hourly_cost for t in types], dtype=float)
    nan = (np.nan, np.nan, np.nan)
    demand = np.array([[d if d is not None else nan for d in c.demands] for c in live], float)
    counts = np.array([c.count for c in live], dtype=float)
    fit = np.all(demand <= caps[None] + EPSILON, axis=2)  # NaN compares False
    if not fit.any(axis=1).all():
        raise ValueError("a class fits no instance type")
    base = np.where(fit[:, :, None], np.nan_to_num(demand, nan=0.0), 0.0)
    weights = dff_weights(base, caps)
    no = np.zeros(len(live), dtype=bool)
    value, groups = _split_bound(
        caps, costs, base, weights, counts, fit, no, no[:, None] & fit, max_cells
    )
    best = PooledBound(value, None, 0, groups, 0.0)
    for r in range(3):
        exclusive, allowed = exclusive_tasks(caps, base, fit, r)
        if not exclusive.any():
            continue
        value, groups = _split_bound(
            caps, costs, base, weights, counts, fit, exclusive, allowed, max_cells
        )
        if value > best.lower_bound:
            best = PooledBound(value, RESOURCE_NAMES[r], int(counts[exclusive].sum()), groups, 0.0)
    return PooledBound(
        best.lower_bound, best.resource, best.exclusive_tasks, best.groups, elapsed()
    )


def exclusive_tasks(
    caps: np.ndarray, base: np.ndarray, fit: np.ndarray, r: int
) -> tuple[np.ndarray, np.ndarray]:
    """The exclusive classes for resource r (no two share an instance, none shares
    one with a task needing r), and per class and type whether a class outside them
    may share a type-k instance with one (see the module)."""
    need = base[:, :, r]
    positive = fit & (need > EPSILON)
    least = np.where(positive, need, np.inf).min(axis=0)  # m_kr per type
    fills = positive & (need + least[None, :] > caps[None, :, r] + EPSILON)
    exclusive = np.all(fills | ~fit, axis=1) & fit.any(axis=1)
    beta = np.where(fit & exclusive[:, None], need, np.inf).min(axis=0)  # per type
    allowed = fit & ~exclusive[:, None] & (need + beta[None, :] <= caps[None, :, r] + EPSILON)
    return exclusive, allowed


def dff_weights(base: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Per class, type and (resource, function): the dual feasible function's value of
    the class's share of the type's resource (see the module). Shares are
    taken of the capacity plus the `fits` tolerance and a hair below, so tasks that fit
    one instance have shares summing to at most 1 and rounding never counts one larger
    than it is (each function is non-decreasing)."""
    room = caps + EPSILON
    share = np.where(caps[None] > 0, base / room[None], 0.0) * (1 - 1e-9)
    share = np.clip(share, 0.0, 1.0)
    out = []
    for r in range(3):
        x = share[:, :, r]
        for k in (1, 2, 3):  # u^(k), on multiples of 1/(k+1) one step lower (≤ u^(k))
            out.append(np.maximum(0.0, np.ceil((k + 1) * x) - 1) / k)
        for eps in (1 / 3, 1 / 4):  # U^(eps)
            out.append(np.where(x > 1 - eps, 1.0, np.where(x >= eps, x, 0.0)))
    return np.stack(out, axis=2)


def _split_bound(
    caps: np.ndarray,
    costs: np.ndarray,
    base: np.ndarray,
    weights: np.ndarray,
    counts: np.ndarray,
    fit: np.ndarray,
    exclusive: np.ndarray,
    allowed: np.ndarray,
    max_cells: int,
) -> tuple[float, int]:
    """The pooled LP's duals on aggregated groups, applied to the true demands: a
    valid bound (the module's duality argument) and the number of groups."""
    n, n_types = fit.shape
    flat = np.where(fit[:, :, None], base, -1.0).reshape(n, -1)
    flags = np.concatenate([fit, allowed, exclusive[:, None]], axis=1).astype(float)
    for bits in POOLED_GRID_BITS:
        keys = np.ascontiguousarray(np.concatenate([grid_up(flat, bits), flags], axis=1))
        void = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
        _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
        cells = int(fit[first].sum() + allowed[first].sum())
        if cells <= max_cells:
            break
    inverse = inverse.reshape(-1)
    g = len(first)
    weight = np.bincount(inverse, weights=counts, minlength=g)
    mean = np.zeros((g, n_types, 3))
    np.add.at(mean, inverse, base * counts[:, None, None])
    mean /= weight[:, None, None]
    mean_w = np.zeros((g, n_types, weights.shape[2]))
    np.add.at(mean_w, inverse, weights * counts[:, None, None])
    mean_w /= weight[:, None, None]
    p_a, l_a, p_b, l_b, sigma = _solve_pooled(
        caps, costs, mean, mean_w, weight, fit[first], exclusive[first], allowed[first]
    )
    # scale each (pool, type)'s prices down where they would break its cost
    room = caps + EPSILON
    zero = np.zeros(n_types)
    for p, lam, slot in ((p_a, l_a, zero), (p_b, l_b, sigma)):
        total = (p * room).sum(axis=1) + lam.sum(axis=1) + slot
        scale = np.where(total > costs, costs / np.maximum(total, 1e-300), 1.0)
        p *= scale[:, None]
        lam *= scale[:, None]
        slot *= scale
    in_a = np.einsum("nkr,kr->nk", base, p_a) + np.einsum("nkj,kj->nk", weights, l_a)
    in_b = (
        np.einsum("nkr,kr->nk", base, p_b)
        + np.einsum("nkj,kj->nk", weights, l_b)
        + np.where(exclusive[:, None], sigma[None, :], 0.0)
    )
    u = np.minimum(
        np.where(fit & ~exclusive[:, None], in_a, np.inf),
        np.where((fit & exclusive[:, None]) | allowed, in_b, np.inf),
    ).min(axis=1)
    return float((counts * u).sum()), g


def _solve_pooled(
    caps: np.ndarray,
    costs: np.ndarray,
    demand: np.ndarray,
    weights: np.ndarray,
    counts: np.ndarray,
    fit: np.ndarray,
    exclusive: np.ndarray,
    allowed: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pooled LP on groups; its duals (all ≥ 0, not yet checked against the
    costs): per type, pool A's resource prices and function prices, pool B's, and
    pool B's slot prices."""
    g, n_types = fit.shape
    n_f = weights.shape[2]
    per = 3 + n_f + 1  # rows of one (pool, type): resources, functions, slot
    pool_row = [g, g + per * n_types]  # first row of pool A's, pool B's types
    n_rows = g + 2 * per * n_types
    b_types = (fit & exclusive[:, None]).any(axis=0)
    parts_cost: list[np.ndarray] = []
    parts_rows: list[np.ndarray] = []
    parts_vals: list[np.ndarray] = []
    # instance columns z^P_k: −Q on the resource rows, −1 on the function and slot rows
    for pool, kinds in ((0, np.arange(n_types)), (1, np.flatnonzero(b_types))):
        rows = pool_row[pool] + per * kinds[:, None] + np.arange(per)[None, :]
        vals = np.concatenate(
            [-caps[kinds], -np.ones((len(kinds), n_f)), -np.full((len(kinds), 1), float(pool))],
            axis=1,
        )
        parts_cost.append(costs[kinds])
        parts_rows.append(rows)
        parts_vals.append(vals)
    # task columns x^P_ck: 1 on the class row, D and W on its (pool, type)'s rows
    for pool, where in (
        (0, fit & ~exclusive[:, None]),
        (1, ((fit & exclusive[:, None]) | allowed) & b_types[None, :]),
    ):
        c, k = np.nonzero(where)
        if not len(c):
            continue
        rows = np.concatenate(
            [c[:, None], pool_row[pool] + per * k[:, None] + np.arange(per)[None, :]], axis=1
        )
        vals = np.concatenate(
            [
                np.ones((len(c), 1)),
                demand[c, k],
                weights[c, k],
                exclusive[c, None].astype(float) * pool,
            ],
            axis=1,
        )
        parts_cost.append(np.zeros(len(c)))
        parts_rows.append(rows)
        parts_vals.append(vals)
    width = per + 1
    rows = np.concatenate(
        [np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1) for r in parts_rows]
    )
    vals = np.concatenate(
        [np.pad(v, ((0, 0), (0, width - v.shape[1])), constant_values=0.0) for v in parts_vals]
    )
    keep = (vals != 0) & (rows >= 0)
    lp = highspy.HighsLp()
    n_cols = len(rows)
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = np.concatenate(parts_cost).astype(float)
    lp.col_lower_ = np.zeros(n_cols)
    lp.col_upper_ = np.full(n_cols, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([counts, np.full(n_rows - g, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([counts, np.zeros(n_rows - g)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    lp.a_matrix_.index_ = rows[keep].astype(np.int32)
    lp.a_matrix_.value_ = vals[keep].astype(np.float64)
    highs = solve_optimal(lp, "pooled LP")
    dual = np.maximum(0.0, -np.array(highs.getSolution().row_dual))
    a, b = (dual[start : start + per * n_types].reshape(n_types, per) for start in pool_row)
    return a[:, :3], a[:, 3:-1], b[:, :3], b[:, 3:-1], b[:, -1]
