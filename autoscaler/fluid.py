"""Packing many distinct tasks: the fluid LP picks the type mix, best fit packs the tasks.

Algorithm 1 and the pattern search work on classes of identical tasks; their
cost grows with the number of distinct demand vectors (quadratically and
worse), so 100k tasks with 100k distinct vectors were out of reach. This is
CvxCluster's two stages (§3–4) made to scale with what is distinct:

1. **Aggregate.** Demands are rounded *up* onto a relative grid — the next
   value m·2^e with `bits` significant bits, so at most 2^(1−bits) over and
   integers below 2^bits exact — and equal rounded vectors merge into one
   class. The grid is coarsened until the LP has at most `max_lp_cells` class ×
   type pairs.
2. **Type mix.** The LP over instance types (`lp.py`) on those classes says
   how many tasks of each class go to each type; each class's tasks are dealt
   out in those proportions (largest remainder). Types of one *shape* (c7i.large
   … c7i.48xlarge: capacity and price in proportion) are one column to the LP:
   the largest no dearer per unit (`_Shapes`), which also keeps it small.
3. **Pack.** Per type, tasks (with their *true* demands: a task always fits)
   go largest first into the open instance they fill best. The large type of
   a shape is the bin: whole tasks waste less of a large bin, and tasks of
   unlike shapes balance there (under interference, the size of bin that
   saves most on a sample of the tasks). "Largest" is measured twice, by
   shares of the capacity and by the LP's prices, and the cheaper packing
   kept: prices put a GPU type's dear GPUs first, before cheap CPU-only tasks
   take its CPUs. Best fit's cost per task grows with the open instances, so a
   type's tasks are dealt at random into parts of about `POP_PART_BINS` bins
   packed apart (POP, §ALGORITHMS), the parts' half-empty last bins packed
   again together: the step is linear in the tasks.
4. **Downsize.** Each instance becomes the cheapest type that holds its tasks.

Measured by `python -m benchmarks scale` on 100k distinct vectors of five
shapes, without interference: 1.006–1.021× the bound, against 1.013–1.092×
when each type the LP chose was packed apart, by shares alone (at Eva's
default 0.95: 1.016–1.039× against 1.032–1.525×).

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
#: Most bins (as the items' summed shares of one type's capacity count them) packed
#: together onto one type; more are dealt at random into equal parts packed apart
#: (POP: random parts are alike, so each packs as well as the whole, and best
#: fit's cost, growing with the open bins, stays linear overall).
POP_PART_BINS = 512


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
    part_bins: int = POP_PART_BINS,
    pricer: ShadowPricer | None = None,
    max_items: int | None = None,
    throughput: float = 1.0,
) -> FluidPacking:
    """Pack items whose demand on family f is `demand[:, f, :]` (NaN: cannot run there)
    onto the catalog's types, type k being of family `family_of_type[k]`.

    Every item must fit at least one type alone (ValueError naming the first that
    does not). `max_items` caps the items on one instance; `throughput` is what each
    of m items sharing one is expected to run at, throughput^(m−1) (it sizes bins).
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

    # of each shape the LP needs only the types no larger one undercuts per unit
    shapes = _Shapes(caps, costs, family_of_type)
    lp_types = shapes.lp_types
    lp_catalog = Catalog([types[k] for k in lp_types], catalog.region)

    # 1. aggregate on the finest grid that keeps the LP small
    flat = np.ascontiguousarray(np.nan_to_num(demand.reshape(n, -1), nan=-1.0))
    for bits in range(GRID_BITS, MIN_GRID_BITS - 1, -1):
        rounded = np.ascontiguousarray(grid_up(flat, bits))
        keys = rounded.view(np.dtype((np.void, rounded.dtype.itemsize * rounded.shape[1])))
        _, first, inverse, counts = np.unique(
            keys.ravel(), return_index=True, return_inverse=True, return_counts=True
        )
        if len(first) * len(lp_types) <= max_lp_cells:
            break
    inverse = inverse.reshape(-1)
    reps = rounded[first].reshape(len(first), -1, 3)[:, family_of_type[lp_types], :]
    caps_lp = caps[lp_types]
    # a class rounded over a capacity its tasks fit is not offered that type: the
    # LP only guides, items whose type it left out get their own cheapest one
    rep_fits = np.all(reps <= caps_lp[None, :, :] + EPSILON, axis=2) & (reps[:, :, 1] >= 0)
    orphan = ~rep_fits.any(axis=1)
    reps[orphan] = np.nan_to_num(demand[first[orphan]][:, family_of_type[lp_types], :], nan=-1.0)
    rep_fits[orphan] = fits[first[orphan]][:, lp_types]
    classes = [
        LPClass(
            tuple(
                (float(reps[c, k, 0]), float(reps[c, k, 1]), float(reps[c, k, 2]))
                if rep_fits[c, k]
                else None
                for k in range(len(lp_types))
            ),
            int(counts[c]),
        )
        for c in range(len(first))
    ]
    solution = (pricer or ShadowPricer()).solve(lp_catalog, classes)
    # Every other type takes the prices of an LP type of its shape at least as
    # large, scaled down where it is cheaper per unit: Σ_r p_r·Q_r scales with the
    # capacity, so they respect its cost too, and the bound below stays valid.
    shadow = {
        t.name: tuple(
            float(p * shapes.discount[k])
            for p in solution.shadow_prices[types[shapes.lp_type[k]].name]
        )
        for k, t in enumerate(types)
    }

    # the bound: the LP's shadow prices on the true demands
    least = np.full(n, np.inf)
    for k, f in enumerate(family_of_type):
        p = np.array(shadow[types[k].name])
        least = np.minimum(least, np.where(fits[:, k], np.nan_to_num(demand[:, f, :]) @ p, np.inf))
    lower_bound = float(least.sum())

    # 2. deal each class's items to types in the LP's proportions
    type_of = _deal(solution, inverse, counts, catalog, fits, costs)

    # 3. pack per host type, in POP parts, largest first by two measures, keeping
    # the cheaper; 4. downsize. Types run by descending cost, then name: the first
    # of the cheapest fitting ones has the first name, as `pricing.cheapest_type`
    # breaks ties.
    cheapest = np.argmin(np.where(fits, costs[None, :], np.inf), axis=1)
    type_of = shapes.hosts(type_of, demand, fits, costs[cheapest], max_items, throughput)
    instances: list[tuple[int, list[int]]] = []
    for k, f in enumerate(family_of_type):
        items = np.flatnonzero(type_of == k)
        if not len(items):
            continue
        best: tuple[float, list[np.ndarray], np.ndarray] | None = None
        for size in _sizes(caps[k], np.array(shadow[types[k].name], dtype=float)):
            rng = np.random.default_rng(k)
            bins = _pack_parts(
                items, demand[:, f, :], caps[k], size, window, max_items, part_bins, rng
            )
            targets = _downsize(demand, bins, caps, costs, family_of_type, k)
            cost = float(costs[targets].sum())
            if best is None or cost < best[0] - 1e-9:
                best = (cost, bins, targets)
        assert best is not None
        _, bins, targets = best
        instances += [(t, b.tolist()) for t, b in zip(targets.tolist(), bins, strict=True)]
    prices = replace(solution, lower_bound=lower_bound, class_prices=(), shadow_prices=shadow)
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


class _Shapes:
    """Instance types grouped by shape: same family and capacity up to a factor
    (c7i.large to c7i.48xlarge: 96 times the capacity for 96 times the price).

    For the fluid LP a type is redundant when a type of its shape at least as
    large is no dearer per unit: any fraction of it is a fraction of that one at
    no higher cost, and whatever fits it fits that one. For whole tasks size
    matters the other way: a bin of one core wastes half a task on average, a
    bin of 96 a fraction of a percent, and small tasks of unlike shapes balance
    each other only in a large bin; downsizing then gives each bin the cheapest
    type that holds it.
    """

    def __init__(self, caps: np.ndarray, costs: np.ndarray, family_of_type: np.ndarray) -> None:
        self.caps, self.costs, self.family_of_type = caps, costs, family_of_type
        scale = np.array([c[c > 0][0] if np.any(c > 0) else 1.0 for c in caps])
        unit = costs / scale
        groups: dict[tuple[int, tuple[float, ...]], list[int]] = {}
        for k, c in enumerate(caps):
            shape = tuple(float(x) for x in np.round(c / scale[k], 9))
            groups.setdefault((int(family_of_type[k]), shape), []).append(k)
        self.lp_type = np.arange(len(caps))  # the LP type whose prices a type takes
        self.discount = np.ones(len(caps))  # ... scaled by this (≤ 1) to respect its cost
        # per LP type: the types of its shape no larger and no dearer per unit, largest first
        self.smaller: dict[int, list[int]] = {}
        lp: list[int] = []
        for members in groups.values():
            frontier: list[int] = []  # largest first, each cheaper per unit than all before
            for k in sorted(members, key=lambda k: (-scale[k], unit[k], k)):
                if not frontier or unit[k] < unit[frontier[-1]] * (1 - 1e-9):
                    frontier.append(k)
            lp += frontier
            for k in members:
                j = min(
                    (j for j in frontier if scale[j] >= scale[k] * (1 - 1e-9)),
                    key=lambda j: (unit[j], -scale[j]),
                )
                self.lp_type[k] = j
                self.discount[k] = min(1.0, unit[k] / unit[j])
            for j in frontier:
                self.smaller[j] = sorted(
                    (k for k in members if scale[k] <= scale[j] and unit[k] <= unit[j]),
                    key=lambda k: (-scale[k], k),
                )
        self.lp_types = sorted(lp)

    def hosts(
        self,
        type_of: np.ndarray,
        demand: np.ndarray,
        fits: np.ndarray,
        rp: np.ndarray,
        max_items: int | None,
        throughput: float,
    ) -> np.ndarray:
        """Each item's host type: its LP type (the largest of its shape), unless
        interference or `max_items` make smaller bins pay. Then each type of the
        shape no dearer per unit is tried on a sample of the items: packed, each
        bin of m items worth Σ rp·throughput^(m−1) or, below its cost, dissolved
        into the items alone at their reservation prices `rp`; the cheapest wins,
        the largest on a tie. Items that do not fit it stay on the LP type."""
        hosts = type_of.copy()
        if max_items is None and throughput >= 1.0:
            return hosts
        for j in np.unique(type_of).tolist():
            items = np.flatnonzero(type_of == j)
            choices = self.smaller.get(j, [j])
            if len(choices) < 2:
                continue
            trial = items
            if len(items) > TRIAL_ITEMS:
                trial = np.sort(np.random.default_rng(j).choice(items, TRIAL_ITEMS, replace=False))
            best, host = np.inf, j
            for k in choices:  # largest first
                on_k = fits[trial, k]
                cost = self._trial(trial[on_k], k, demand, rp, max_items, throughput)
                cost += self._trial(trial[~on_k], j, demand, rp, max_items, throughput)
                if cost < best * (1 - 1e-9):
                    best, host = cost, k
            hosts[items[fits[items, host]]] = host
        return hosts

    def _trial(
        self,
        items: np.ndarray,
        k: int,
        demand: np.ndarray,
        rp: np.ndarray,
        max_items: int | None,
        throughput: float,
    ) -> float:
        """Hourly cost of `items` packed on type k, unworthy bins dissolved."""
        if not len(items):
            return 0.0
        cap = self.caps[k]
        inv = _per_unit(cap)
        f = self.family_of_type[k]
        bins = [items[b] for b in _best_fit(demand[items, f, :], cap, inv, len(items), max_items)]
        targets = _downsize(demand, bins, self.caps, self.costs, self.family_of_type, k)
        total = 0.0
        for members, target in zip(bins, targets.tolist(), strict=True):
            alone = float(rp[members].sum())
            worth = alone * throughput ** (len(members) - 1)
            total += self.costs[target] if worth >= self.costs[target] else alone
        return total


#: Items of one LP type tried on each smaller host type (`_Shapes.hosts`).
TRIAL_ITEMS = 1000


def _per_unit(cap: np.ndarray) -> np.ndarray:
    """1 / capacity per resource (0 where a type has none): weights that turn a demand
    into shares of the capacity."""
    return np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), 0.0)


def _sizes(cap: np.ndarray, prices: np.ndarray) -> list[np.ndarray]:
    """Weights per resource to order items by, largest first: shares of the capacity
    (balances resources), and the LP's prices on this type (what is dear first: a
    type's scarce GPUs before the CPUs cheap tasks could take), when it has any."""
    inv = _per_unit(cap)
    total = float(prices @ cap)
    if total <= 0 or np.allclose(prices / total, inv / inv.sum(), rtol=1e-6):
        return [inv]
    return [inv, prices / total + 0.01 * inv]


#: Bins filled below this share (in their fullest resource) are loose ends: the
#: last bins of each POP part, packed again together.
LOOSE_FILL = 0.9


def _pack_parts(
    items: np.ndarray,
    demand: np.ndarray,
    cap: np.ndarray,
    size: np.ndarray,
    window: int,
    max_items: int | None,
    part_bins: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Bins (arrays of item indices) for `items` on one type: best fit decreasing by
    `size` per POP part of about `part_bins` bins, then the parts' loose ends
    together while that saves bins."""
    inv = _per_unit(cap)

    def pack(pool: np.ndarray) -> list[np.ndarray]:
        at_least = float(np.max(demand[pool].sum(axis=0) * inv))  # bins the pool needs
        if max_items is not None:
            at_least = max(at_least, len(pool) / max_items)
        parts = max(1, int(at_least // part_bins))
        if parts > 1:
            pool = rng.permutation(pool)
        return [
            part[members]
            for part in np.array_split(pool, parts)
            for members in _best_fit(demand[part], cap, size, window, max_items)
        ]

    bins = pack(items)
    while True:
        fill = np.max(_totals(demand, bins) * inv, axis=1)
        loose = fill < LOOSE_FILL
        if loose.sum() < 2:
            return bins
        again = pack(np.concatenate([b for b, x in zip(bins, loose, strict=True) if x]))
        if len(again) >= loose.sum():
            return bins
        bins = [b for b, x in zip(bins, loose, strict=True) if not x] + again


def _best_fit(
    demand: np.ndarray,
    cap: np.ndarray,
    size: np.ndarray,
    window: int,
    max_items: int | None = None,
) -> list[list[int]]:
    """Bins of capacity `cap` for items (rows of `demand`), largest first (by `size`,
    per unit of each resource), each into the open bin it leaves least free, in
    shares of the capacity (best fit decreasing). A bin that no remaining item can
    enter (its free room below every remaining item's demand in some resource) is
    closed; with `window` open, the fullest is closed to open another."""
    inv = _per_unit(cap)
    order = np.argsort(-(demand @ size), kind="stable")
    # smallest demand per resource among the items from position i on
    least = np.minimum.accumulate(demand[order][::-1], axis=0)[::-1]
    tol = cap * 1e-12 + EPSILON
    need = demand - tol  # a bin with at least this much free room takes the item
    share = demand @ inv
    free = np.empty((min(window, len(order)), 3))
    room = np.empty(len(free))  # free @ inv: best fit takes the least roomy that fits
    members: list[list[int]] = []  # open bins, row b of `free` is bin b's room
    closed: list[list[int]] = []

    def close(b: int) -> None:
        last = len(members) - 1
        closed.append(members[b])
        members[b] = members[last]
        members.pop()
        free[b] = free[last]
        room[b] = room[last]

    for pos, i in enumerate(order.tolist()):
        m = len(members)
        if m and pos % 32 == 0:
            for b in np.flatnonzero(np.any(free[:m] < least[pos] - tol, axis=1))[::-1]:
                close(int(b))
            m = len(members)
        if m:
            score = np.where((free[:m] >= need[i]).all(axis=1), room[:m], np.inf)
            b = int(score.argmin())
            if score[b] < np.inf:
                free[b] -= demand[i]
                room[b] -= share[i]
                members[b].append(i)
                if max_items is not None and len(members[b]) >= max_items:
                    close(b)
                continue
            if m == len(free):
                close(int(np.argmin(room[:m])))
                m -= 1
        free[m] = cap - demand[i]
        room[m] = free[m] @ inv
        members.append([i])
        if max_items is not None and max_items <= 1:
            close(m)
    return closed + members


def _totals(demand: np.ndarray, bins: list[np.ndarray]) -> np.ndarray:
    """Summed demand of each bin's items (bins x the trailing dimensions of `demand`)."""
    starts = np.cumsum([0] + [len(b) for b in bins[:-1]])
    return np.add.reduceat(demand[np.concatenate(bins)], starts, axis=0)


def _downsize(
    demand: np.ndarray,
    bins: list[np.ndarray],
    caps: np.ndarray,
    costs: np.ndarray,
    family_of_type: np.ndarray,
    k: int,
) -> np.ndarray:
    """Per bin of type k, the cheapest type that holds all its items (demand: items x
    families x resources, NaN where an item cannot run); k if none is cheaper."""
    total = _totals(demand, bins)[:, family_of_type, :]  # bins x types x resources
    ok = np.all(total <= caps[None] + EPSILON, axis=2)  # NaN compares False
    priced = np.where(ok, costs[None, :], np.inf)
    best = np.argmin(priced, axis=1)
    return np.where(priced[np.arange(len(bins)), best] < costs[k], best, k)
