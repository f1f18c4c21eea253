"""Packing many distinct tasks: the fluid LP picks the type mix, best fit packs the tasks.

Algorithm 1 and the pattern search work on classes of identical tasks; their
cost grows with the number of distinct demand vectors (quadratically and
worse), so 100k tasks with 100k distinct vectors were out of reach. This is
CvxCluster's two stages (§3–4) made to scale with what is distinct:

1. **Aggregate.** Demands are rounded *up* onto a relative grid — the next
   value m·2^e with `bits` significant bits, so at most 2^(1−bits) over and
   integers below 2^bits exact — and equal rounded vectors merge into one
   class. The grid is coarsened until the LP has at most `max_lp_cells` class ×
   type pairs (8,000 classes on the 21 EC2 types).
2. **Type mix.** The LP over instance types (`lp.py`) on those classes says
   how many tasks of each class go to each type; each class's tasks are dealt
   out in those proportions (largest remainder).
3. **Pack.** Per type, tasks (with their *true* demands: a task always fits)
   go largest first into the open instance they fill best. Best fit's cost per
   task grows with the open instances, so a type's tasks are dealt at random
   into parts of at most `POP_PART_SIZE` packed apart (POP, §ALGORITHMS): the
   step is linear in the tasks.
4. **Downsize.** Each instance becomes the cheapest type that holds its tasks.

**The bound.** Any shadow prices p ≥ 0 with Σ_r p_kr Q_kr ≤ C_k (true of the
LP's duals for every type) give a lower bound Σ_τ min_k Σ_r p_kr D_τk^r on the
cost of any configuration (LP duality, with u_τ set to that minimum). So the
prices of the aggregated LP, applied to the true demands, bound the true
problem — measured within 10⁻⁶ of the exact LP on 10k distinct vectors —
at the cost of one matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.lp import LPClass, PriceSolution, ShadowPricer
from autoscaler.resources import EPSILON

#: Significant bits of the finest grid demands are rounded up onto (≤ 3.2% over).
GRID_BITS = 6
#: Coarsest grid tried (≤ 25% over) before the class limit is given up on.
MIN_GRID_BITS = 3
#: Most items packed together onto one type; more are dealt at random into equal
#: parts packed apart (POP: random parts are alike, so each packs as well as the
#: whole, and best fit's cost, growing with the open bins, stays linear overall).
POP_PART_SIZE = 2000


def grid_up(values: np.ndarray, bits: int) -> np.ndarray:
    """Round positive values up to the next m·2^e, m < 2^bits; 0 and NaN stay as they are."""
    mantissa, exponent = np.frexp(values)
    scale = float(1 << bits)
    # the tolerance keeps values already on the grid where they are
    up = np.ceil(mantissa * scale - 1e-9)
    return np.where(values > 0, np.ldexp(up / scale, exponent), values)


@dataclass(frozen=True, slots=True)
class FluidPacking:
    """Instances as (type index, item indices), and the LP's valid lower bound."""

    instances: list[tuple[int, list[int]]]
    lower_bound: float
    prices: PriceSolution | None  # the aggregated LP, its lower bound the valid one
    cheapest: np.ndarray  # per item: index of the cheapest type it fits alone (its RP's)
    classes: int  # aggregated classes the LP was solved on
    bits: int  # grid precision used


def fluid_pack(
    catalog: Catalog,
    demand: np.ndarray,
    family_of_type: np.ndarray,
    window: int = 1 << 16,
    max_lp_cells: int = 168_000,
    part_size: int = POP_PART_SIZE,
    pricer: ShadowPricer | None = None,
    max_items: int | None = None,
) -> FluidPacking:
    """Pack items whose demand on family f is `demand[:, f, :]` (NaN: cannot run there)
    onto the catalog's types, type k being of family `family_of_type[k]`.

    Every item must fit at least one type alone (ValueError naming the first that
    does not). `max_items` caps the items on one instance.
    """
    types = catalog.types
    n = len(demand)
    caps = np.array([t.capacity.as_tuple() for t in types], dtype=float)
    costs = np.array([t.hourly_cost for t in types])
    if n == 0:
        return FluidPacking([], 0.0, None, np.zeros(0, dtype=np.int64), 0, GRID_BITS)
    columns = enumerate(family_of_type)
    fits = np.stack(
        [np.all(demand[:, f, :] <= caps[k] + EPSILON, axis=1) for k, f in columns],
        axis=1,
    )  # items x types; NaN compares False
    unfit = np.flatnonzero(~fits.any(axis=1))
    if len(unfit):
        raise ValueError(f"item {int(unfit[0])} fits no instance type")

    # 1. aggregate on the finest grid that keeps the LP small
    flat = np.ascontiguousarray(np.nan_to_num(demand.reshape(n, -1), nan=-1.0))
    for bits in range(GRID_BITS, MIN_GRID_BITS - 1, -1):
        rounded = np.ascontiguousarray(grid_up(flat, bits))
        keys = rounded.view(np.dtype((np.void, rounded.dtype.itemsize * rounded.shape[1])))
        _, first, inverse, counts = np.unique(
            keys.ravel(), return_index=True, return_inverse=True, return_counts=True
        )
        if len(first) * len(types) <= max_lp_cells:
            break
    inverse = inverse.reshape(-1)
    reps = rounded[first].reshape(len(first), -1, 3)[:, family_of_type, :]  # classes x types
    # a class rounded over a capacity its tasks fit is not offered that type: the
    # LP only guides, items whose type it left out get their own cheapest one
    rep_fits = np.all(reps <= caps[None, :, :] + EPSILON, axis=2) & (reps[:, :, 1] >= 0)
    orphan = ~rep_fits.any(axis=1)
    reps[orphan] = np.nan_to_num(demand[first[orphan]][:, family_of_type, :], nan=-1.0)
    rep_fits[orphan] = fits[first[orphan]]
    classes = [
        LPClass(
            tuple(
                (float(reps[c, k, 0]), float(reps[c, k, 1]), float(reps[c, k, 2]))
                if rep_fits[c, k]
                else None
                for k in range(len(types))
            ),
            int(counts[c]),
        )
        for c in range(len(first))
    ]
    solution = (pricer or ShadowPricer()).solve(catalog, classes)

    # the bound: the LP's shadow prices on the true demands
    least = np.full(n, np.inf)
    for k, f in enumerate(family_of_type):
        p = np.array(solution.shadow_prices[types[k].name])
        least = np.minimum(least, np.where(fits[:, k], np.nan_to_num(demand[:, f, :]) @ p, np.inf))
    lower_bound = float(least.sum())

    # 2. deal each class's items to types in the LP's proportions
    type_of = _deal(solution, inverse, counts, catalog, fits, costs)

    # 3. pack per type, in POP parts of at most `part_size` items; 4. downsize
    instances: list[tuple[int, list[int]]] = []
    rng = np.random.default_rng(0)
    for k, f in enumerate(family_of_type):
        items = np.flatnonzero(type_of == k)
        parts = -(-len(items) // part_size)
        if parts > 1:
            items = rng.permutation(items)
        for part in np.array_split(items, parts) if parts else []:
            for members in _best_fit(demand[part, f, :], caps[k], window, max_items):
                chosen = part[members]
                target = _cheapest_fitting(demand[chosen], caps, costs, family_of_type, k)
                instances.append((target, chosen.tolist()))
    prices = replace(solution, lower_bound=lower_bound, class_prices=())
    # types run by descending cost, then name: the first of the cheapest fitting
    # ones has the first name, as `pricing.cheapest_type` breaks ties
    cheapest = np.argmin(np.where(fits, costs[None, :], np.inf), axis=1)
    return FluidPacking(instances, lower_bound, prices, cheapest, len(first), bits)


def _deal(
    solution: PriceSolution,
    inverse: np.ndarray,
    counts: np.ndarray,
    catalog: Catalog,
    fits: np.ndarray,
    costs: np.ndarray,
) -> np.ndarray:
    """Type index per item: each class split over types as the LP assigns it."""
    index = {t.name: k for k, t in enumerate(catalog.types)}
    shares: dict[int, list[tuple[int, float]]] = {}
    for (c, name), x in solution.assignment.items():
        shares.setdefault(c, []).append((index[name], x))
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    type_of = np.full(len(inverse), -1, dtype=np.int64)
    for c in range(len(counts)):
        members = order[starts[c] : starts[c + 1]]
        parts = sorted(shares.get(c, []), key=lambda kx: (-kx[1], kx[0]))
        total = sum(x for _, x in parts)
        if total <= 0:
            continue
        quotas = [x / total * len(members) for _, x in parts]
        whole = [int(q) for q in quotas]
        by_remainder = sorted(range(len(parts)), key=lambda j: (whole[j] - quotas[j], j))
        for j in by_remainder[: len(members) - sum(whole)]:
            whole[j] += 1
        at = 0
        for (k, _), q in zip(parts, whole, strict=True):
            type_of[members[at : at + q]] = k
            at += q
    # Items the rounded class could not place on a type they fit (or unassigned):
    # their own cheapest fitting type.
    bad = (type_of < 0) | ~fits[np.arange(len(type_of)), np.maximum(type_of, 0)]
    if bad.any():
        priced = np.where(fits[bad], costs[None, :], np.inf)
        type_of[bad] = np.argmin(priced, axis=1)
    return type_of


def _best_fit(
    demand: np.ndarray, cap: np.ndarray, window: int, max_items: int | None = None
) -> list[list[int]]:
    """Bins of capacity `cap` for items (rows of `demand`), largest first, each into the
    open bin it leaves least free (best fit decreasing). A bin that no remaining item
    can enter (its free room below every remaining item's demand in some resource)
    is closed; with `window` open, the fullest is closed to open another."""
    inv = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), 0.0)
    # Largest first by the sum of the shares of the capacity it takes (measured on
    # 100k distinct vectors: 1.026x the bound, against 1.031x by the largest share)
    order = np.argsort(-(demand * inv).sum(axis=1), kind="stable")
    # smallest demand per resource among the items from position i on
    least = np.minimum.accumulate(demand[order][::-1], axis=0)[::-1]
    tol = cap * 1e-12 + EPSILON
    free = np.empty((min(window, len(order)), 3))
    members: list[list[int]] = []  # open bins, row b of `free` is bin b's room
    closed: list[list[int]] = []

    def close(b: int) -> None:
        last = len(members) - 1
        closed.append(members[b])
        members[b] = members[last]
        members.pop()
        free[b] = free[last]

    for pos, i in enumerate(order.tolist()):
        d = demand[i]
        m = len(members)
        if m and pos % 32 == 0:
            for b in np.flatnonzero(np.any(free[:m] < least[pos] - tol, axis=1))[::-1]:
                close(int(b))
            m = len(members)
        if m:
            left = free[:m] - d
            score = left @ inv
            score[np.any(left < -tol, axis=1)] = np.inf
            b = int(np.argmin(score))
            if score[b] < np.inf:
                free[b] = left[b]
                members[b].append(i)
                if max_items is not None and len(members[b]) >= max_items:
                    close(b)
                continue
            if m == len(free):
                close(int(np.argmin(free[:m] @ inv)))
        free[len(members)] = cap - d
        members.append([i])
        if max_items is not None and max_items <= 1:
            close(len(members) - 1)
    return closed + members


def _cheapest_fitting(
    demand: np.ndarray, caps: np.ndarray, costs: np.ndarray, family_of_type: np.ndarray, k: int
) -> int:
    """The cheapest type that holds all these items (items x families x resources; NaN:
    they cannot run on that family); k if none is cheaper."""
    total = demand.sum(axis=0)[family_of_type]  # types x resources, NaN where one cannot run
    ok = np.all(total <= caps + EPSILON, axis=1)
    priced = np.where(ok, costs, np.inf)
    best = int(np.argmin(priced))
    return best if priced[best] < costs[k] else k
