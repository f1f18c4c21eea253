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
   take its CPUs; at full speed, where a sample shows it pays, also with the
   resources' items interleaved (`_interleaved`), so that compute-bound and
   memory-bound tasks share bins. Best fit's cost per task grows with the open
   instances, so a type's tasks are dealt at random into parts of about
   `POP_PART_BINS` bins packed apart (POP, §ALGORITHMS), the parts' half-empty
   last bins packed again together: the step is linear in the tasks.
4. **Downsize.** Each instance becomes the cheapest type that holds its tasks.

At full speed (no interference) instances already packed offer their spare room
to the later, cheaper types' items (`_PaidRoom`), and items the LP dealt to a
type selling a priced resource they do not need (CPU-only tasks dealt to a GPU
type) may wait for that room instead of sharing its bins (`_deferrable`).

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
#: LP cells (classes × types) from which the aggregated LP is solved by interior point
#: (then crossover to a vertex) rather than the dual simplex: with many classes on
#: few types (3 shapes), its optimum is highly degenerate, and the simplex pivots
#: through it for seconds (held-out `lognormal`, 100k tasks: 5.4 CPU-s against 1.2).
IPM_MIN_CELLS = 50_000


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
    solver = "ipm" if len(classes) * len(lp_types) >= IPM_MIN_CELLS else "choose"
    solution = (pricer or ShadowPricer()).solve(lp_catalog, classes, solver)
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
    paid = _PaidRoom(demand, caps, family_of_type, max_items) if throughput >= 1.0 else None
    later, later_price = None, None
    if paid is not None:
        prices_by_type = np.array([shadow[t.name] for t in types], dtype=float)
        later, later_price = _deferrable(type_of, demand, fits, family_of_type, prices_by_type)
    instances: list[tuple[int, list[int]]] = []

    def packed(
        k: int, items: np.ndarray, size: np.ndarray, interleave: bool
    ) -> tuple[float, list[np.ndarray], np.ndarray]:
        bins = _pack_parts(
            items,
            demand[:, family_of_type[k], :],
            caps[k],
            size,
            window,
            max_items,
            part_bins,
            np.random.default_rng(k),
            interleave,
        )
        targets = _downsize(demand, bins, caps, costs, family_of_type, k)
        return float(costs[targets].sum()), bins, targets

    def balance_pays(k: int, items: np.ndarray, size: np.ndarray) -> float:
        """How much cheaper the interleaved order packs a sample of `TRIAL_ITEMS` of type
        k's items than decreasing size (1.0 for fewer items; 0 where not tried: under
        interference, or items all needing one resource most)."""
        if paid is None or not _mixed(demand[items, family_of_type[k], :], caps[k], size):
            return 0.0
        if len(items) <= TRIAL_ITEMS:
            return 1.0
        trial = np.sort(np.random.default_rng(k).choice(items, TRIAL_ITEMS, replace=False))
        plain, _, _ = packed(k, trial, size, False)
        balanced, _, _ = packed(k, trial, size, True)
        return 1.0 - balanced / plain if plain > 0 else 0.0

    def pack(k: int, items: np.ndarray) -> tuple[float, list[np.ndarray], np.ndarray]:
        """`items` packed on type k by the cheapest of the orders, downsized."""
        best: tuple[float, list[np.ndarray], np.ndarray] | None = None
        sizes = _sizes(caps[k], np.array(shadow[types[k].name], dtype=float))
        orders = [(size, False) for size in sizes]
        gain = balance_pays(k, items, sizes[0])
        if gain >= BALANCE_SURE and len(items) > TRIAL_ITEMS:
            orders[0] = (sizes[0], True)  # bins balanced across resources instead
        elif gain >= BALANCE_GAIN:
            orders.append((sizes[0], True))  # bins balanced across resources, too
        for size, interleave in orders:
            cost, bins, targets = packed(k, items, size, interleave)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, bins, targets)
        assert best is not None
        return best

    for k in range(len(types)):
        items = np.flatnonzero(type_of == k)
        if paid is not None and len(items):
            items = paid.fill(items, caps[k], np.random.default_rng(k))
        if not len(items):
            continue
        cost, bins, targets = pack(k, items)
        if paid is None:
            instances += [(t, b.tolist()) for t, b in zip(targets.tolist(), bins, strict=True)]
            continue
        assert later is not None and later_price is not None
        movable = later[items] > k  # once moved there, an item stays
        if movable.any() and not movable.all():
            # the other way: k's own items alone, the movable ones in their room, the
            # rest moved on (costed at their LP price there until packed)
            own_cost, own_bins, own_targets = pack(k, items[~movable])
            room = _PaidRoom(demand, caps, family_of_type, max_items)
            room.add(own_bins, own_targets)
            rest = room.fill(items[movable], caps[k], np.random.default_rng(k))
            if own_cost + float(later_price[rest].sum()) < cost - 1e-9:
                paid.absorb(room)
                type_of[rest] = later[rest]
                continue
        paid.add(bins, targets)
    if paid is not None:
        instances = paid.instances()
    prices = replace(solution, lower_bound=lower_bound, class_prices=(), shadow_prices=shadow)
    return FluidPacking(instances, lower_bound, prices, cheapest, len(first), bits)


def _deferrable(
    type_of: np.ndarray,
    demand: np.ndarray,
    fits: np.ndarray,
    family_of_type: np.ndarray,
    prices: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per item dealt to a type that sells a priced resource it does not need (a
    CPU-only task dealt to a GPU type): the later (cheaper) type that prices it
    lowest, where one fits it (else −1), and that price.

    The LP deals such items to a GPU type in proportions that fill its CPUs exactly
    beside the GPU tasks; packed together with them, whole tasks cannot fill both,
    and GPUs are left idle on instances whose CPUs are full (the held-out
    `lognormal` mix: 6% of its GPU instances). The packer may instead pack the GPU
    tasks alone, put these items in the room they leave, and move the rest on to
    that later type; the LP is indifferent where they go at equal prices, and
    where the later type prices an item higher (a CPU-only task with more memory
    than any cheaper CPU type sells at the GPU type's price), the packer weighs
    that price against the GPUs it would leave idle (the held-out `bimodal` mix:
    CPU-only tasks of 24–32 CPUs and 384–488 GB that the LP put beside GPU tasks
    cost 4% more GPU instances than the GPU tasks alone).
    """
    n, n_types = fits.shape
    price = np.full((n, n_types), np.inf)
    for k, f in enumerate(family_of_type):
        price[:, k] = np.where(fits[:, k], np.nan_to_num(demand[:, f, :]) @ prices[k], np.inf)
    rows = np.arange(n)
    unneeded = (np.nan_to_num(demand[rows, family_of_type[type_of], :]) <= 0) & (
        prices[type_of] > 0
    )
    later = np.where(np.arange(n_types)[None, :] > type_of[:, None], price, np.inf)
    target = np.argmin(later, axis=1)  # ties: the first, the dearest (largest of a shape)
    move = unneeded.any(axis=1) & np.isfinite(later[rows, target])
    return np.where(move, target, -1), np.where(move, later[rows, target], 0.0)


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


#: Most open instances one item is offered to when filling paid room (`_PaidRoom.fill`):
#: the instances are dealt at random into parts of this size, as POP deals a problem.
FILL_PART_BINS = 256
#: Items below this share of every capacity in reach are filled a run at a time
#: (`_PaidRoom._next_fit`), not one by one.
FILL_TINY = 1 / 32


class _PaidRoom:
    """Instances already packed, and the room left on them, which later (cheaper)
    types' items fill before any of their own instances is opened.

    An instance's price is paid whatever it holds, so a task placed in its spare
    room costs nothing, while the fluid LP deals every task to one type in
    proportions that ignore the room whole tasks leave: a p3.16xlarge holding one
    8-GPU task has no GPU left but most of its CPUs and memory, which CPU-only
    tasks dealt to c7i/r7i can use (the held-out `uniform-gpu` mix: 2.5% of the
    cost). Types are packed in descending cost, so room is always offered by a
    dearer instance to a cheaper type's items. The room is measured against each
    instance's final (downsized) type, so filling never changes its type or price.
    """

    def __init__(
        self,
        demand: np.ndarray,
        caps: np.ndarray,
        family_of_type: np.ndarray,
        max_items: int | None,
    ) -> None:
        self.demand, self.caps, self.family_of_type = demand, caps, family_of_type
        self.max_items = max_items
        self.bins: list[list[int]] = []
        self.targets: list[int] = []
        self.free = np.zeros((0, 3))

    def add(self, bins: list[np.ndarray], targets: np.ndarray) -> None:
        if not bins:
            return
        fam = self.family_of_type[targets]
        used = _totals(self.demand, bins)[np.arange(len(bins)), fam, :]
        self.free = np.concatenate([self.free, self.caps[targets] - used])
        self.bins += [b.tolist() for b in bins]
        self.targets += targets.tolist()

    def absorb(self, other: _PaidRoom) -> None:
        """Take over `other`'s instances and their room."""
        self.free = np.concatenate([self.free, other.free])
        self.bins += other.bins
        self.targets += other.targets

    def instances(self) -> list[tuple[int, list[int]]]:
        return list(zip(self.targets, self.bins, strict=True))

    def fill(self, items: np.ndarray, cap: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Put what fits of `items` (largest first, in shares of `cap`, the capacity
        of the type they were dealt to) into the open room, each into the instance
        it leaves least free; returns the items left over."""
        if not self.bins:
            return items
        inv = _per_unit(cap)
        left = np.ones(len(items), dtype=bool)
        targets = np.array(self.targets)
        for g in np.unique(self.family_of_type[targets]).tolist():
            on_g = self.demand[items, g, :]
            able = left & ~np.isnan(on_g).any(axis=1)
            if not able.any():
                continue
            least = np.nanmin(on_g[able], axis=0)
            tol = EPSILON
            open_ = np.flatnonzero(
                (self.family_of_type[targets] == g) & np.all(self.free >= least - tol, axis=1)
            )
            if self.max_items is not None:
                sizes = np.array([len(self.bins[b]) for b in open_], dtype=np.int64)
                open_ = open_[sizes < self.max_items]
            if not len(open_):
                continue
            parts = max(1, -(-len(open_) // FILL_PART_BINS))
            open_ = rng.permutation(open_)
            candidates = np.flatnonzero(able)
            candidates = candidates[np.argsort(-(on_g[candidates] @ inv), kind="stable")]
            deal = rng.integers(0, parts, len(candidates)) if parts > 1 else None
            for p, bins in enumerate(np.array_split(open_, parts)):
                mine = candidates if deal is None else candidates[deal == p]
                placed = self._fill_part(bins, items[mine], on_g[mine], inv)
                left[mine[placed]] = False
        return items[left]

    def _fill_part(
        self, bins: np.ndarray, items: np.ndarray, need: np.ndarray, inv: np.ndarray
    ) -> np.ndarray:
        """Best fit of `items` (demands `need`, in order) into `bins`; which were placed."""
        placed = np.zeros(len(items), dtype=bool)
        if not len(items) or not len(bins):
            return placed
        free = self.free[bins].copy()
        room = free @ inv
        count = np.array([len(self.bins[b]) for b in bins.tolist()])
        least = np.minimum.accumulate(need[::-1], axis=0)[::-1]
        most = np.maximum.accumulate(need[::-1], axis=0)[::-1]
        tiny = self.caps[np.array(self.targets)[bins]].min(axis=0) * FILL_TINY
        alive = np.ones(len(bins), dtype=bool)
        for pos in range(len(items)):
            if pos % 32 == 0:
                alive &= np.all(free >= least[pos] - EPSILON, axis=1)
                if self.max_items is not None:
                    alive &= count < self.max_items
                if not alive.any():
                    break
                if self.max_items is None and np.all(most[pos] <= tiny):
                    self._next_fit(bins, free, alive, items[pos:], need[pos:], placed[pos:])
                    break
            ok = alive & np.all(free >= need[pos] - EPSILON, axis=1)
            if not ok.any():
                continue
            b = int(np.argmin(np.where(ok, room, np.inf)))
            free[b] -= need[pos]
            room[b] = free[b] @ inv
            count[b] += 1
            if self.max_items is not None and count[b] >= self.max_items:
                alive[b] = False
            self.bins[int(bins[b])].append(int(items[pos]))
            placed[pos] = True
        self.free[bins] = free
        return placed

    def _next_fit(
        self,
        bins: np.ndarray,
        free: np.ndarray,
        alive: np.ndarray,
        items: np.ndarray,
        need: np.ndarray,
        placed: np.ndarray,
    ) -> None:
        """Items tiny against every bin: each open bin, fullest first, takes the longest
        run of the next items that fits (a run found by bisection on their running
        sums, so the cost is per bin, not per item); at most one tiny item's room is
        lost per bin. Updates `free` and `placed` in place."""
        total = np.vstack([np.zeros((1, 3)), np.cumsum(need, axis=0)])
        start = 0
        order = np.flatnonzero(alive)
        order = order[np.argsort(free[order].sum(axis=1), kind="stable")]
        for b in order.tolist():
            if start >= len(items):
                break
            limit = total[start] + free[b] + EPSILON
            end = min(int(np.searchsorted(total[:, r], limit[r], side="right")) for r in range(3))
            end -= 1  # total[end] is the last running sum within the limit
            if end <= start:
                continue
            free[b] -= total[end] - total[start]
            self.bins[int(bins[b])].extend(items[start:end].tolist())
            placed[start:end] = True
            start = end


#: Bins filled below this share (in their fullest resource) are loose ends: the
#: last bins of each POP part, packed again together.
LOOSE_FILL = 0.9
#: Most times the loose ends are packed again. Items of a quarter to half a bin (an
#: outsider's FFD worst case, 100k tasks) leave a fifth of the bins loose, and each
#: round saved a few: 20 rounds, 40% of the planning time, the last 12 saving 0.2%.
LOOSE_ROUNDS = 8


def _pack_parts(
    items: np.ndarray,
    demand: np.ndarray,
    cap: np.ndarray,
    size: np.ndarray,
    window: int,
    max_items: int | None,
    part_bins: int,
    rng: np.random.Generator,
    interleave: bool = False,
) -> list[np.ndarray]:
    """Bins (arrays of item indices) for `items` on one type: best fit decreasing by
    `size` per POP part of about `part_bins` bins (`interleave`: in `_interleaved`
    order), then the parts' loose ends together while that saves bins (at most
    `LOOSE_ROUNDS` times)."""
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
            for members in _best_fit(demand[part], cap, size, window, max_items, interleave)
        ]

    bins = pack(items)
    for _ in range(LOOSE_ROUNDS):
        fill = np.max(_totals(demand, bins) * inv, axis=1)
        loose = fill < LOOSE_FILL
        if loose.sum() < 2:
            return bins
        again = pack(np.concatenate([b for b, x in zip(bins, loose, strict=True) if x]))
        if len(again) >= loose.sum():
            return bins
        bins = [b for b, x in zip(bins, loose, strict=True) if not x] + again
    return bins


def _best_fit(
    demand: np.ndarray,
    cap: np.ndarray,
    size: np.ndarray,
    window: int,
    max_items: int | None = None,
    interleave: bool = False,
) -> list[list[int]]:
    """Bins of capacity `cap` for items (rows of `demand`), largest first (by `size`,
    per unit of each resource), each into the open bin it leaves least free, measured
    by `size` too (best fit decreasing): by shares of the capacity, or by the LP's
    prices, which leave a GPU type's dear GPUs idle last (whole GPU tasks of 5 and 3
    GPUs pair up where the shares' sum pairs by CPUs and memory as much). A bin
    that no remaining item can enter (its free room below every remaining item's
    demand in some resource) is closed; with `window` open, the fullest is closed
    to open another. With `interleave`, items come in `_interleaved` order instead."""
    order = (
        _interleaved(demand, cap, size)
        if interleave
        else np.argsort(-(demand @ size), kind="stable")
    )
    # smallest demand per resource among the items from position i on
    least = np.minimum.accumulate(demand[order][::-1], axis=0)[::-1]
    tol = cap * 1e-12 + EPSILON
    need = demand - tol  # a bin with at least this much free room takes the item
    share = demand @ size
    free = np.empty((min(window, len(order)), 3))
    room = np.empty(len(free))  # free @ size: best fit takes the least roomy that fits
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
        room[m] = free[m] @ size
        members.append([i])
        if max_items is not None and max_items <= 1:
            close(m)
    return closed + members


def _interleaved(demand: np.ndarray, cap: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Items grouped by the resource they need most (as a share of `cap`), each group
    largest first by `size`, the groups merged by the share of the group's volume
    already dealt: every resource's items come in proportion, not all the large ones
    of one kind first.

    Decreasing size alone fills bins with the large items of one kind (16-CPU tasks
    with little memory) until one resource is full, and leaves the other resource
    of those bins to items that cannot use it (their CPU is taken): the bins of
    compute-bound and of memory-bound tasks end up apart, each wasting the resource
    the other has too much of (an outsider's mix of half compute-bound and half
    memory-bound tasks, 5k: 1.17x the fluid bound; in this order, 1.05x). Merging
    the groups is the idea of Leinberger, Karypis and Kumar's permutation pack
    ("Multi-capacity bin packing algorithms with applications to job scheduling
    under multiple constraints", ICPP 1999): fill each bin with the items that need
    most what it has most left."""
    share = demand * _per_unit(cap)
    key = demand @ size
    dominant = np.argmax(share, axis=1)
    dealt = np.empty(len(demand))
    for g in np.unique(dominant).tolist():
        members = np.flatnonzero(dominant == g)
        members = members[np.argsort(-key[members], kind="stable")]
        volume = np.cumsum(key[members])
        total = float(volume[-1])
        dealt[members] = (volume - key[members]) / total if total > 0 else 0.0
    return np.lexsort((-key, dealt))


#: The interleaved order is packed in full only where a sample of `TRIAL_ITEMS` of the
#: type's items shows it this much cheaper than decreasing size.
BALANCE_GAIN = 0.002
#: ... and in place of decreasing size where the sample shows it this much cheaper (a
#: pass saved: 100k tasks just over or under half an instance, on types of at most 32
#: CPUs, 10.6 CPU-s with both, 1.08x the fluid bound; 1.13x in 7.2 by decreasing size
#: alone).
BALANCE_SURE = 0.02
#: The interleaved order is tried on a type only where the items needing some other
#: resource most than the largest group hold at least this share of the volume.
MIXED_SHARE = 0.05


def _mixed(demand: np.ndarray, cap: np.ndarray, size: np.ndarray) -> bool:
    """Whether items needing different resources most are both there in volume (else
    `_interleaved` order is decreasing size with few exceptions: not worth a pass)."""
    dominant = np.argmax(demand * _per_unit(cap), axis=1)
    volume = np.bincount(dominant, weights=demand @ size, minlength=3)
    total = float(volume.sum())
    return total > 0 and float(np.sort(volume)[-2]) >= MIXED_SHARE * total


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
