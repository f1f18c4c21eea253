"""Eva's Full and Partial Reconfiguration (§4.2, §4.5), computed over task classes.

Algorithm 1 visits instance types in descending cost; for each it opens
instances and fills each with the unassigned task that maximizes TNRP(T ∪ {τ}),
stopping when nothing fits or TNRP would fall; a filled instance is kept when
TNRP(T) ≥ its cost, otherwise the algorithm moves to the next cheaper type.

Tasks with equal demand vectors (and equal workload, where interference is
modelled) are interchangeable, so this implementation works on *classes* with
counts. Once an instance is filled with a composition S, the greedy would fill
the next instances identically for as long as every class in S still has
enough tasks, so the composition is repeated ⌊count_c / S_c⌋ times at once.
A round then costs O(types · batches · classes) instead of O(types · tasks²),
with the same result as the task-by-task transcription in `reference.py`.

Additions from Eva's reference implementation: ties in TNRP are broken by
"already on this instance", then by a Tetris-style alignment score
(Σ_r demand_r/cap_r · free_r/cap_r); existing instances of a type are reused
before new ones are opened; a kept set is moved to the cheapest type that
still fits it.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import itemgetter
from typing import Any

from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import Demands, JobSpec, TaskSpec
from autoscaler.lp import LPClass, solve_lp
from autoscaler.patterns import Pattern, PatternClass, PatternPricer, TypeShape, integer_cover
from autoscaler.pricing import (
    JobSlowdown,
    PriceBook,
    identical_tasks,
    refused,
    slowdown_charge,
    tnrp,
    valued_tnrp,
)
from autoscaler.resources import EPSILON, fits
from autoscaler.view import ClusterView

#: Two TNRP values closer than this ($/h) are a tie.
VALUE_TOLERANCE = 1e-6
#: Below `pattern_min_tasks`, the pattern search runs only when Algorithm 1's plan
#: is more than this fraction above the LP bound.
PATTERN_GAP = 0.02
#: Under interference, the pattern search runs from this many tasks to place: in
#: 500-job replays of the full and a synthetic trace it beat Algorithm 1 in 30
#: of 2,692 packings of fewer tasks, and in 1,826 of 2,514 of more.
INTERFERENCE_MIN_TASKS = 10
#: Most passes of iterative rounding in `Packer.priced` (CvxCluster §6.4).
ROUNDING_PASSES = 3
#: Classes available now but not when a remembered fill was made, beyond which it is
#: filled anew rather than checked class by class (`Packer._replay`).
MAX_REPLAY_CHECKS = 64
#: Remembered fills checked for one fill (those with the fewest classes new since).
MAX_REPLAY_TRIES = 8
#: Rounds a remembered fill is kept for (`FillMemory`), the one that made it included.
#: Measured on `python -m benchmarks churn` (10,000 tasks, 1% churn): 2 rounds answered
#: 165-243 fills a round from memory (~10 MB), 4 rounds 266-342 (~16 MB).
FILL_ROUNDS = 4
#: Compositions whose TNRP `FillMemory.values` keeps across rounds before it starts over.
MAX_SHARED_VALUES = 200_000
#: Two alignment scores closer than this are a tie, broken by class order.
ALIGNMENT_GRID = 1e-9
#: Without interference and on an empty cluster, packings of up to this many tasks
#: are finished by the integer master (`Packer._integer_master`; issue 19: ≤ 1.005x
#: the MIP optimum on small held-out inputs).
INTEGER_MASTER_MAX_TASKS = 300
#: The integer master's branch-and-bound nodes: a limit on work, not on time, so a
#: plan stays a function of its snapshot. On six held-out inputs of 100-300 tasks, 500
#: took 1.3x the CPU time of 50 in all (mostly HiGHS'), cheaper on one (by 0.06%) and
#: dearer on three (by 1-2%): the search's path depends on which cover it finds first.
INTEGER_MASTER_NODES = 50
#: The integer master's neighbourhoods: the instances whose tasks' RP covers their cost
#: least, alone and in pairs, and how many improvements it looks for.
NEIGHBOURHOOD_INSTANCES = 4
NEIGHBOURHOOD_ROUNDS = 8


def alignment(d: Sequence[float], free: Sequence[float], cap: Sequence[float]) -> int:
    """Tetris alignment Σ_r d_r/cap_r · free_r/cap_r, Eva's reference tie-break, on a grid.

    Algorithm 1 (§4.2) only says "maximise TNRP"; among equal TNRPs the
    reference code prefers the task best aligned with the free room. Scores
    that are equal in exact arithmetic (34/57 and 34/57, say) can differ in
    the last bit depending on how they are computed, so they are compared on
    a grid and real ties fall through to the class order — the same in every
    implementation (`reference.py` calls this function too).
    """
    total = 0.0
    for r in range(3):
        if cap[r]:
            total += d[r] * free[r] / (cap[r] * cap[r])
    return round(total / ALIGNMENT_GRID)


#: What makes tasks interchangeable for packing (`class_key`): their demand per family,
#: their workload ("" when interference is not modelled), their job's RP and whether its
#: tasks are identical ((-1, True) for a single-task job), and their job with its
#: anti-affinity limit (("", 0) when it cannot bind).
ClassKey = tuple[
    tuple[tuple[str, tuple[float, float, float]], ...],
    str,
    tuple[float, bool],
    tuple[str, int],
]


def class_key(
    task: TaskSpec, job: JobSpec, job_rp: float, with_workload: bool, identical: bool | None = None
) -> ClassKey:
    """Tasks with equal keys are interchangeable for packing; the key also orders classes.

    Beyond demands: the workload (when interference is modelled), the job's
    reservation price for tasks of multi-task jobs (§4.4 values them by it)
    and whether their tasks are identical (`slowdown_charge` may tell them
    apart), and the job itself with its limit when anti-affinity can bind.
    `identical`: `identical_tasks(job)` when the caller knows it (it is per job).
    """
    demands = tuple((family, d.as_tuple()) for family, d in task.demands)
    limit = job.anti_affinity
    return (
        demands,
        task.workload if with_workload else "",
        (round(job_rp, 9), identical_tasks(job) if identical is None else identical)
        if job.is_multi_task
        else (-1.0, True),
        (job.job_id, limit) if limit is not None else ("", 0),
    )


class Packer:
    """Reconfiguration of one snapshot: shared class structure and TNRP cache."""

    def __init__(
        self,
        view: ClusterView,
        prices: PriceBook | None = None,
        pricer: PatternPricer | None = None,
        pattern_min_tasks: int = 400,
        price_interference: bool = True,
        job_slowdown: JobSlowdown = "by-job",
        min_throughput: float = 0.0,
        throughputs: dict[tuple[str, tuple[str, ...]], float] | None = None,
        fills: FillMemory | None = None,
    ) -> None:
        """`pricer`: pack also by column generation and keep the better packing
        (without interference, with at least `pattern_min_tasks` tasks to pack);
        None: Algorithm 1 only. `job_slowdown`: how a slowed task of a
        multi-task job is valued (`pricing.slowdown_charge`). `min_throughput`:
        no task is placed where it is expected below this share of its full
        speed (`pricing.refused`).
        `price_interference`: also when throughputs below 1 are assumed, from
        `INTERFERENCE_MIN_TASKS` tasks to place. A single plan is rarely better
        for it (pai_200 samples of 50-1,000 tasks at the default 0.95: no better
        plan, 1.3-50x the time), but replayed rounds are: starting from the
        running instances, the configuration LP re-packs with fewer moves and
        less interference than Algorithm 1's greedy fill. Replaying the full
        Alibaba trace, eva costs 0.550 of no-packing with it and 0.607 without
        (JCT 1.09x against 1.18x); pai_200 0.701 against 0.704.
        `throughputs`: lookups of `view.throughput` by (workload, co-located set) that
        the caller keeps for a table equal to this one (they are filled in here).
        `fills`: Algorithm 1's fills of earlier rounds valued the same way (the caller
        scopes it), replayed where this round's classes cannot change them."""
        self.view = view
        self.types = view.catalog.types  # descending cost
        self.type_index = {t.name: k for k, t in enumerate(self.types)}
        self.table = view.throughput
        self.neutral = self.table.is_neutral
        self.prices = prices or PriceBook(view.catalog)
        self.pricer = pricer
        self.pattern_min_tasks = pattern_min_tasks
        self.price_interference = price_interference
        self.min_throughput = min_throughput

        keyed: dict[ClassKey, list[str]] = {}
        sample: dict[ClassKey, tuple[TaskSpec, JobSpec]] = {}
        with_workload = not self.neutral
        memo: dict[tuple[Demands, str], ClassKey] = {}  # many share demands and workload
        for job in view.jobs:
            plain = len(job.tasks) == 1 and job.max_tasks_per_instance is None
            same = None
            for task in job.tasks:
                if plain:
                    memo_key = (task.demands, task.workload if with_workload else "")
                    key = memo.get(memo_key)
                    if key is None:
                        key = memo[memo_key] = class_key(
                            task, job, self.prices.job_rp(job), with_workload
                        )
                else:
                    if same is None:
                        same = identical_tasks(job)
                    key = class_key(task, job, self.prices.job_rp(job), with_workload, same)
                tasks = keyed.get(key)
                if tasks is None:
                    keyed[key] = tasks = []
                    sample[key] = (task, job)
                tasks.append(task.task_id)
        keys = sorted(keyed)
        self.class_tasks: list[list[str]] = [keyed[k] for k in keys]
        self._task_class: dict[str, int] | None = None
        first = [sample[k][0] for k in keys]
        self.rp = [self.prices.task_rp(t) for t in first]
        self.jrp: list[float | None] = [
            slowdown_charge(sample[k][1], self.prices.job_rp(sample[k][1]), job_slowdown)
            for k in keys
        ]
        # With spot offerings, what a slowdown costs is the job's time at its value
        # (`PriceBook.task_value`), not at the spot RP; None: at the RP, as Eva prices it.
        self.stake: list[float] | None = None
        if self.prices.valued:
            self.stake = [
                self.prices.task_value(sample[k][0])
                if jrp is None
                else self.prices.job_value(sample[k][1])
                for k, jrp in zip(keys, self.jrp, strict=True)
            ]
        # Each class as the fill memory knows it across rounds: everything a fill reads
        # of it besides the catalog and the table (the memory's scope).
        self._fills = None if fills is None else fills
        self.stable: list[int] = []
        self.by_stable: dict[int, int] = {}
        if fills is not None:
            self.stable = [
                fills.identify(
                    (key, self.rp[c], self.jrp[c], None if self.stake is None else self.stake[c])
                )
                for c, key in enumerate(keys)
            ]
            self.by_stable = {s: c for c, s in enumerate(self.stable)}
        self.group: list[str | None] = [k[3][0] or None for k in keys]
        self.group_limit: list[int] = [k[3][1] for k in keys]
        self.has_groups = any(self.group)
        self.workload = [t.workload for t in first]
        self._first = first
        self._value_cache: dict[tuple[int, ...], float] = {}
        # TNRPs of earlier rounds in the fill memory's scope, by the classes' stable ids.
        self._shared_values = None if fills is None else fills.values
        self._tput_cache: dict[tuple[str, tuple[str, ...]], float] = (
            {} if throughputs is None else throughputs
        )
        self._downsize_cache: dict[tuple[int, tuple[int, ...]], int] = {}
        self._holds_cache: dict[tuple[int, tuple[int, ...]], bool] = {}
        self._count_getters: dict[int, itemgetter[Any]] = {}
        self._fill_cache: dict[
            tuple[int, tuple[tuple[int, int], ...], bytes],
            tuple[tuple[int, ...], float, tuple[tuple[int, int], ...], tuple[int, ...]],
        ] = {}

    @cached_property
    def demand(self) -> list[list[tuple[float, float, float] | None]]:
        """Per type, each class's demand on that type's family (None: cannot run there).
        Built on first use: valuing a plan's instances (`tnrp_of`) never needs it, and at
        100,000 distinct vectors it is most of a valuation's time."""
        rows: list[list[tuple[float, float, float] | None]] = []
        # A class's demand depends on the type's family alone: one row per family,
        # copied for each of its types (a catalog has a few families of many sizes).
        by_family: dict[str, list[tuple[float, float, float] | None]] = {}
        for itype in self.types:
            row = by_family.get(itype.family)
            if row is None:
                row = by_family[itype.family] = []
                for t in self._first:
                    d = t.demand_on(itype.family)
                    row.append(None if d is None else d.as_tuple())
            rows.append(list(row))
        return rows

    @cached_property
    def candidates(self) -> list[list[int]]:
        """Per type, the classes one task of which fits it."""
        return [
            [c for c, d in enumerate(row) if d is not None and fits(d, itype.capacity)]
            for itype, row in zip(self.types, self.demand, strict=True)
        ]

    @cached_property
    def candidate_set(self) -> list[set[int]]:
        """`candidates` as sets."""
        return [set(cands) for cands in self.candidates]

    @property
    def task_class(self) -> dict[str, int]:
        """Task id -> class index (built on first use: an empty cluster never needs it)."""
        if self._task_class is None:
            self._task_class = {tid: c for c, tids in enumerate(self.class_tasks) for tid in tids}
        return self._task_class

    # -- valuation ---------------------------------------------------------

    def value(self, composition: tuple[int, ...]) -> float:
        """TNRP of a sorted multiset of classes sharing one instance."""
        if self.neutral:
            return sum(self.rp[c] for c in composition)
        cached = self._value_cache.get(composition)
        if cached is not None:
            return cached
        # The same classes valued in an earlier round of this scope: the same TNRP (a
        # stable id stands for all this reads of its class; the order of the ids is the
        # order of the sum below, so the very same float).
        shared = self._shared_values
        if shared is not None:
            stable = self.stable
            shared_key = tuple([stable[c] for c in composition])
            cached = shared.get(shared_key)
            if cached is not None:
                self._value_cache[composition] = cached
                return cached
        # Throughput depends on workloads only, and classes far outnumber them.
        together = tuple(sorted([self.workload[c] for c in composition]))
        tputs = self._tput_cache
        total = 0.0
        previous, previous_value = -1, 0.0
        for c in composition:
            if c != previous:
                w = self.workload[c]
                tput = tputs.get((w, together))
                if tput is None:
                    others = list(together)
                    others.remove(w)
                    tput = tputs[w, together] = self.table.throughput(w, others)
                if tput < self.min_throughput:
                    total = refused(self.rp[c] for c in composition)
                    break
                if self.stake is None:
                    previous, previous_value = c, tnrp(self.rp[c], tput, self.jrp[c])
                else:
                    previous, previous_value = c, valued_tnrp(self.rp[c], tput, self.stake[c])
            total += previous_value
        self._value_cache[composition] = total
        if shared is not None:
            if len(shared) >= MAX_SHARED_VALUES:
                shared.clear()
            shared[shared_key] = total
        return total

    def tnrp_of(self, task_ids: Iterable[str]) -> float:
        """TNRP of a set of tasks on one instance (tasks of unknown jobs are ignored)."""
        return self.value(self._composition(task_ids))

    def _composition(self, task_ids: Iterable[str]) -> tuple[int, ...]:
        classes = self.task_class
        return tuple(sorted(classes[t] for t in task_ids if t in classes))

    # -- Algorithm 1 ---------------------------------------------------------

    def _fill(
        self, k: int, counts: list[int], residents: Counter[int] | None
    ) -> tuple[list[int], float]:
        """Fill one instance of type k greedily; decrements `counts` (and `residents`) for
        what it takes.

        Memoized: a fill depends on the counts only through which classes are
        available at each step, so it is replayed from a fill of the same type, with
        the same residents and the same candidates available, whose chosen classes
        had as many tasks up to one past what it took (`_fill_key`). Instances that
        run the same composition — most of them, a plan repeats its compositions —
        are then filled once per round (a 10,000-task round: 5,945 fills, 409
        distinct).
        """
        key = self._fill_key(k, counts, residents)
        cached = self._fill_cache.get(key)
        if cached is not None:
            remembered, value, taken, clipped = cached
            if all(min(counts[c], m + 1) == n for (c, m), n in zip(taken, clipped, strict=True)):
                for c, m in taken:
                    counts[c] -= m
                    if residents and residents[c] > 0:
                        residents[c] = max(0, residents[c] - m)
                return list(remembered), value
        remembered_fill = self._fills is not None and not self.has_groups
        resume: _Resume | None = None
        if remembered_fill:
            replayed = self._replay(key, counts, residents)
            if isinstance(replayed, tuple):
                comp, value, taken, clipped = replayed
                self._fill_cache[key] = (tuple(comp), value, taken, clipped)
                return comp, value
            resume = replayed
        before = {c: counts[c] for c in self.candidates[k]}
        trace: list[_Step] | None = [] if remembered_fill else None
        start: tuple[list[int], tuple[float, float, float], float] | None = None
        if resume is not None and trace is not None:
            start = self._resume(resume, counts, residents, trace)
        comp, value = self._fill_greedy(k, counts, residents, trace, start)
        taken = tuple(sorted(Counter(comp).items()))
        clipped = tuple(min(before[c], m + 1) for c, m in taken)
        self._fill_cache[key] = (tuple(comp), value, taken, clipped)
        if trace is not None:
            self._remember(key, comp, value, taken, clipped, trace)
        return comp, value

    def _remember(
        self,
        key: tuple[int, tuple[tuple[int, int], ...], bytes],
        comp: list[int],
        value: float,
        taken: tuple[tuple[int, int], ...],
        clipped: tuple[int, ...],
        trace: list[_Step],
    ) -> None:
        """Keep a step-by-step fill in the memory across rounds, by stable class ids."""
        assert self._fills is not None
        stable = self.stable
        k, held, flags = key
        available = self._available(k, flags)
        steps = tuple(
            (
                tuple(stable[c] for c in before),
                free,
                current,
                head,
                align,
                -1 if best < 0 else stable[best],
            )
            for before, free, current, head, align, best in trace
        )
        self._fills.remember(
            (k, tuple((stable[c], n) for c, n in held)),
            _RememberedFill(
                frozenset(stable[c] for c in available),
                tuple(stable[c] for c in comp),
                value,
                tuple((stable[c], m) for c, m in taken),
                clipped,
                steps,
                self._fills.round,
            ),
        )

    def _replay(
        self,
        key: tuple[int, tuple[tuple[int, int], ...], bytes],
        counts: list[int],
        residents: Counter[int] | None,
    ) -> tuple[list[int], float, tuple[tuple[int, int], ...], tuple[int, ...]] | _Resume | None:
        """A remembered fill of the same type and residents that this one would repeat,
        applied to `counts` and `residents`; else the one whose first steps it repeats
        furthest, with how many (`_resume` takes them), or None.

        A greedy fill is the argmax, step by step, over the candidates available. A
        class that was available then but is not now changes nothing unless it won a
        step (then it was taken, and `clipped` tells) or was the best at the last step
        (the one that would have lowered TNRP). A class available now but not then
        changes the fill only if it beats, at some step, the class that won it, or
        becomes the best at the last step without lowering TNRP — which is checked
        step by step for those few classes alone.
        """
        assert self._fills is not None
        k, held, flags = key
        stable, by_stable = self.stable, self.by_stable
        entries = self._fills.candidates((k, tuple((stable[c], n) for c, n in held)))
        if not entries:
            return None
        now = frozenset(stable[c] for c in self._available(k, flags))
        # The remembered fills whose chosen classes have the tasks they had, fewest
        # classes new since first (each is checked step by step), a few of them.
        ready = []
        for order, entry in enumerate(entries):
            taken = self._taken(entry, counts, by_stable)
            if taken is not None:
                added = now - entry.available
                if len(added) <= MAX_REPLAY_CHECKS:
                    ready.append((len(added), order, entry, taken, added))
        ready.sort(key=lambda r: (r[0], r[1]))
        furthest: _Resume | None = None
        for _, _, entry, taken, added in ready[:MAX_REPLAY_TRIES]:
            replayed = self._replayed(entry, k, taken, residents, now, added, by_stable)
            if isinstance(replayed, int):
                if replayed > 0 and (furthest is None or replayed > furthest.steps):
                    furthest = _Resume(entry, replayed)
                continue
            comp, took = replayed
            for c, m in took:
                counts[c] -= m
                if residents and residents[c] > 0:
                    residents[c] = max(0, residents[c] - m)
            self._fills.replays += 1
            return comp, entry.value, took, entry.clipped
        return furthest

    def _resume(
        self,
        resume: _Resume,
        counts: list[int],
        residents: Counter[int] | None,
        trace: list[_Step],
    ) -> tuple[list[int], tuple[float, float, float], float]:
        """Take the first steps of a remembered fill that this one repeats (`_replayed`):
        their classes out of `counts` and `residents`, their steps into `trace`; the
        state the step-by-step fill goes on from (composition, free room, TNRP)."""
        assert self._fills is not None
        entry, steps = resume.entry, resume.steps
        by_stable = self.by_stable
        for before, free, current, head, align, best in entry.steps[:steps]:
            c = by_stable[best]
            counts[c] -= 1
            if residents and residents[c] > 0:
                residents[c] -= 1
            trace.append(
                (tuple(sorted(by_stable[x] for x in before)), free, current, head, align, c)
            )
        before, free, current, *_ = entry.steps[steps]
        self._fills.resumed += 1
        return sorted(by_stable[x] for x in before), free, current

    @staticmethod
    def _taken(
        entry: _RememberedFill, counts: list[int], by_stable: dict[int, int]
    ) -> list[tuple[int, int]] | None:
        """What `entry` took, in this round's class indices, if its chosen classes have
        now as many tasks as then, up to one past what it took (else None)."""
        taken = []
        for (s, m), n in zip(entry.taken, entry.clipped, strict=True):
            c = by_stable.get(s)
            if c is None or min(counts[c], m + 1) != n:
                return None
            taken.append((c, m))
        return taken

    def _replayed(
        self,
        entry: _RememberedFill,
        k: int,
        taken: list[tuple[int, int]],
        residents: Counter[int] | None,
        now: frozenset[int],
        added: frozenset[int],
        by_stable: dict[int, int],
    ) -> tuple[list[int], tuple[tuple[int, int], ...]] | int:
        """(composition, taken) in this round's class indices if `entry` is what a fill
        from here would do; else how many of its first steps it would repeat. Its
        chosen classes have the tasks they had (`_taken`): only the classes `added`
        (available now and not then) or the last step's best being gone can differ
        (see `_replay`)."""
        last = entry.steps[-1]
        # From this step on, the fill may differ from the remembered one.
        diverges = len(entry.steps)
        if last[5] >= 0 and last[5] not in now:
            diverges = len(entry.steps) - 1  # the last step's best is gone: another may be
        if added:
            demand = self.demand[k]
            cap = self.types[k].capacity.as_tuple()
            rp = self.rp
            befores: list[list[int] | None] = [None] * len(entry.steps)
            for s in sorted(added, key=by_stable.__getitem__):
                a = by_stable[s]
                d = demand[a]
                assert d is not None
                resident = bool(residents and residents[a] > 0)
                for i, (before, free, current, head, align, best) in enumerate(entry.steps):
                    if i >= diverges:
                        break
                    if not fits(d, free):
                        continue
                    if self.neutral:
                        v = current + rp[a]
                    else:
                        trial = befores[i]
                        if trial is None:
                            trial = befores[i] = sorted([by_stable[x] for x in before])
                        trial = list(trial)
                        insort(trial, a)
                        v = self.value(tuple(trial))
                    a_head = (round(v / VALUE_TOLERANCE), resident)
                    last_step = i == len(entry.steps) - 1
                    if best >= 0:
                        if a_head < head:
                            continue
                        a_align = alignment(d, free, cap)
                        if (a_head, a_align, -a) < (head, align, -by_stable[best]):
                            continue
                    # a would be the best here: it changes the fill, unless this is the
                    # last step and taking it would lower TNRP (the fill stops anyway)
                    if not last_step or v >= current - VALUE_TOLERANCE:
                        diverges = i
                        break
        if diverges < len(entry.steps):
            return diverges
        comp = sorted(by_stable[s] for s in entry.composition)
        return comp, tuple(taken)

    def _fill_key(
        self, k: int, counts: list[int], residents: Counter[int] | None
    ) -> tuple[int, tuple[tuple[int, int], ...], bytes]:
        """What a fill of type k depends on besides the chosen classes' counts: the type,
        the residents that are left and which candidate classes have tasks (one byte
        per candidate of k, in order: taken in one pass at C speed, as every fill of a
        round asks; counts are never negative)."""
        held = tuple(sorted((c, n) for c, n in residents.items() if n > 0)) if residents else ()
        return k, held, bytes(map(bool, self._candidate_counts(k, counts)))

    def _candidate_counts(self, k: int, counts: list[int]) -> Iterable[int]:
        """The counts of type k's candidates, in order."""
        getter = self._count_getters.get(k)
        if getter is None:
            cands = self.candidates[k]
            if len(cands) > 1:
                getter = self._count_getters[k] = itemgetter(*cands)
            else:
                return [counts[c] for c in cands]
        return getter(counts)  # type: ignore[no-any-return]

    def _available(self, k: int, flags: bytes) -> list[int]:
        """The candidates of type k that `_fill_key`'s flags mark as having tasks."""
        return list(compress(self.candidates[k], flags))

    def _fill_greedy(
        self,
        k: int,
        counts: list[int],
        residents: Counter[int] | None,
        trace: list[_Step] | None = None,
        start: tuple[list[int], tuple[float, float, float], float] | None = None,
    ) -> tuple[list[int], float]:
        """Algorithm 1's fill of one instance of type k (§4.2), step by step.

        `trace`: each step is appended to it — the composition so far, the free
        room, TNRP so far and the best candidate's (TNRP on its grid, resident),
        alignment and class (-1: nothing fits) — the last step being the one that
        stopped the fill. `start`: go on from this composition, free room and TNRP,
        a remembered fill's first steps already taken (`_resume`; anti-affinity
        never binds there)."""
        cap = self.types[k].capacity.as_tuple()
        free = list(cap)
        comp: list[int] = []
        current = 0.0
        if start is not None:
            comp, free, current = list(start[0]), list(start[1]), start[2]
        demand = self.demand[k]
        rp = self.rp
        neutral = self.neutral
        group, limit = self.group, self.group_limit
        in_group: Counter[str] = Counter()
        while True:
            # The best by (TNRP on its grid, resident here, alignment, lower class):
            # the alignment is computed only where the first two tie.
            best = -1
            best_head: tuple[int, bool] | None = None
            best_align = 0
            best_value = 0.0
            for c in self.candidates[k]:
                if counts[c] <= 0:
                    continue
                d = demand[c]
                assert d is not None
                # `fits(d, free)`, inlined (the fill's hot loop)
                if d[0] > free[0] + EPSILON or d[1] > free[1] + EPSILON or d[2] > free[2] + EPSILON:
                    continue
                g = group[c]
                if g is not None and in_group[g] >= limit[c]:
                    continue  # anti-affinity: this job has its limit on this instance
                if neutral:
                    v = current + rp[c]
                else:
                    trial = list(comp)
                    insort(trial, c)
                    v = self.value(tuple(trial))
                head = (round(v / VALUE_TOLERANCE), bool(residents and residents[c] > 0))
                if best_head is not None and head < best_head:
                    continue
                align = alignment(d, free, cap)
                if best_head is None or head > best_head or (align, -c) > (best_align, -best):
                    best, best_head, best_align, best_value = c, head, align, v
            if trace is not None:
                trace.append(
                    (
                        tuple(comp),
                        (free[0], free[1], free[2]),
                        current,
                        best_head or (0, False),
                        best_align,
                        best,
                    )
                )
            if best < 0 or best_value < current - VALUE_TOLERANCE:
                break  # nothing fits, or adding would lower TNRP (Algorithm 1, line 10)
            insort(comp, best)
            counts[best] -= 1
            if residents and residents[best] > 0:
                residents[best] -= 1
            if group[best] is not None:
                in_group[group[best]] += 1  # type: ignore[index]
            d = demand[best]
            assert d is not None
            free[0] -= d[0]
            free[1] -= d[1]
            free[2] -= d[2]
            current = best_value
        return comp, current

    def _holds(self, k: int, classes: Iterable[int]) -> bool:
        """Whether an instance of type k holds one task of each of `classes` (repeated
        as often as they come). A running instance can hold more than it has room for
        while a move is under way — a task that waits for its new instance still runs
        there beside the one placed in its stead — and such a composition is no column
        for the pattern LP: seeded, the LP could keep it, and the task placed there
        would wait for room that never comes."""
        key = (k, tuple(classes))
        known = self._holds_cache.get(key)
        if known is not None:
            return known
        free = self.types[k].capacity.as_tuple()
        used = [0.0, 0.0, 0.0]
        holds = True
        for c in key[1]:
            d = self.demand[k][c]
            if d is None:
                holds = False
                break
            used = [u + x for u, x in zip(used, d, strict=True)]
        else:
            holds = fits((used[0], used[1], used[2]), free)
        self._holds_cache[key] = holds
        return holds

    def _downsize(self, k: int, comp: tuple[int, ...]) -> int:
        """Index of the cheapest type that still fits `comp` (k itself if none is cheaper)."""
        key = (k, comp)
        cached = self._downsize_cache.get(key)
        if cached is not None:
            return cached
        best = k
        cost_k = self.types[k].hourly_cost
        for j in range(len(self.types) - 1, -1, -1):  # ascending cost
            itype = self.types[j]
            if itype.hourly_cost >= cost_k:
                break
            row = self.demand[j]
            g = cpu = ram = 0.0
            for c in comp:
                d = row[c]
                if d is None:
                    break
                g, cpu, ram = g + d[0], cpu + d[1], ram + d[2]
            else:
                if fits((g, cpu, ram), itype.capacity):
                    best = j
                    break
        self._downsize_cache[key] = best
        return best

    def algorithm1(self, pools: TaskPools, existing: Iterable[Instance]) -> Placement:
        """Algorithm 1 over what `pools` holds, reusing `existing` instances where it can."""
        by_type: dict[str, list[Instance]] = {}
        for inst in existing:
            by_type.setdefault(inst.type.name, []).append(inst)
        for insts in by_type.values():
            insts.sort(key=lambda i: (-self.tnrp_of(i.tasks), i.instance_id or ""))
        counts = pools.counts
        result: list[Instance] = []
        saving = 0.0
        for k, itype in enumerate(self.types):
            if not any(counts[c] > 0 for c in self.candidates[k]):
                for inst in by_type.get(itype.name, []):
                    pools.orphan(inst.instance_id)
                continue
            threshold = itype.hourly_cost - VALUE_TOLERANCE
            exhausted = False
            for inst in by_type.get(itype.name, []):
                if exhausted:
                    pools.orphan(inst.instance_id)
                    continue
                residents = pools.resident_counts(inst.instance_id)
                comp, value = self._fill(k, counts, residents)
                if comp and value >= threshold:
                    tasks = pools.take_all(comp, prefer=inst.instance_id)
                    pools.orphan(inst.instance_id)
                    j = self._downsize(k, tuple(comp))
                    result.append(
                        Instance(inst.instance_id if j == k else None, self.types[j], tasks)
                    )
                    saving += value - self.types[j].hourly_cost
                else:
                    for c in comp:
                        counts[c] += 1
                    pools.orphan(inst.instance_id)
                    exhausted = True
            if exhausted:
                continue
            while True:
                comp, value = self._fill(k, counts, None)
                if not comp or value < threshold:
                    for c in comp:
                        counts[c] += 1
                    break
                multiplicity = Counter(comp)
                # The next instances would be filled identically while every
                # class in the composition still has enough tasks.
                repeats = 1 + min(counts[c] // n for c, n in multiplicity.items())
                for c, n in multiplicity.items():
                    counts[c] -= (repeats - 1) * n
                target = self.types[self._downsize(k, tuple(comp))]
                for tasks in pools.take_copies(sorted(multiplicity.items()), repeats):
                    result.append(Instance(None, target, tasks))
                saving += repeats * (value - target.hourly_cost)
        if any(counts):
            left = {self.class_tasks[c][0]: n for c, n in enumerate(counts) if n}
            raise AssertionError(f"Algorithm 1 left tasks unplaced: {left}")
        return Placement(_reuse(result, by_type), saving)

    def pack(self, pools: TaskPools, existing: list[Instance]) -> Placement:
        """Place what `pools` holds: Algorithm 1, or price-guided packing when that is better.

        Both are computed when a pricer is set and either interference is
        priced (from `INTERFERENCE_MIN_TASKS` tasks), or there are enough tasks
        for patterns to matter, or, below that, Algorithm 1's plan is more than
        `PATTERN_GAP` above the LP bound of the same tasks (a bound that ignores
        interference, so that test is for the neutral case only); the one with
        the larger saving Σ(TNRP − cost) — the quantity Eva's criterion values
        — wins, so the result is never worse than Algorithm 1's. Without
        interference, up to `INTEGER_MASTER_MAX_TASKS` tasks on an empty cluster,
        the integer master may then replace it (`_integer_master`).
        """
        # Under interference a composition's value is not additive; when asked,
        # the pricing linearizes it per cardinality (`best_composition_by_cardinality`).
        if self.pricer is None or (not self.neutral and not self.price_interference):
            return self.algorithm1(pools, existing)
        n_tasks = sum(pools.counts)
        if self.neutral and not existing and n_tasks <= INTEGER_MASTER_MAX_TASKS:
            spare = pools.copy()
            return self._integer_master(spare, self._pack(pools, existing))
        return self._pack(pools, existing)

    def _pack(self, pools: TaskPools, existing: list[Instance]) -> Placement:
        """`pack` without the integer master: the better of Algorithm 1 and `priced`."""
        assert self.pricer is not None
        plain = self.algorithm1(pools.copy(), existing)
        n_tasks = sum(pools.counts)
        if not self.neutral and n_tasks < INTERFERENCE_MIN_TASKS:
            return plain
        if self.neutral and n_tasks < self.pattern_min_tasks:
            # Small inputs: Algorithm 1 is usually within ~1% of the bound and the
            # pattern search costs 5-20x its time (measured on pai_200 samples of
            # 20-400 tasks), but one type filled with small tasks can be far off
            # (40 tasks of (0, 0.3, 1.2): $1.428/h against $1.160/h).
            cost = sum(i.type.hourly_cost for i in plain.instances)
            if cost <= (1 + PATTERN_GAP) * self._lp_bound(pools.counts) + VALUE_TOLERANCE:
                return plain
        # Seeds: the running instances; under interference also Algorithm 1's
        # plan (see `priced`).
        seeds = existing if self.neutral else [*existing, *plain.instances]
        priced = self.priced(pools, existing, seeds)
        return priced if priced.saving > plain.saving + VALUE_TOLERANCE else plain

    def _integer_master(self, pools: TaskPools, best: Placement) -> Placement:
        """`best`, or a cheaper packing of the same tasks by the integer master.

        Rounding the configuration LP down and filling the rest greedily leaves part
        of an instance's worth on small inputs (held-out shapes of 50-300 tasks: up to
        1.05-1.09x the MIP optimum, e.g. the last of six r7i.48xlarge 71% full where a
        24xlarge and a 12xlarge hold its tasks). Three passes, each taking a packing
        only when it costs less than the one it replaces:

        - all the tasks: the configuration program in integers (`_cover`);
        - a large-neighbourhood search: the tasks of the `NEIGHBOURHOOD_INSTANCES`
          instances whose tasks' RP covers their cost least, alone and in pairs, are
          re-packed by the same program on their own (its columns there include the
          smaller types' that the whole LP never prices), up to `NEIGHBOURHOOD_ROUNDS`
          improvements;
        - instances emptied into the others' free room, and every instance re-typed
          to the cheapest type that holds it (`_empty_instances`).

        Measured on small random inputs against the MIP optimum where proven
        (`tests/test_small_optimum.py`): 21 of 37 plans within 1.005x before, 32 of 35
        with it.

        Without interference and on no running instance only: there a plan's saving
        is Σ RP − cost, which the program minimises; it is taken only when its saving
        is larger than `best`'s."""
        counts = pools.counts
        task_class = self.task_class
        packing: list[tuple[int, tuple[int, ...]]] = []
        for inst in best.instances:
            k = self.type_index.get(inst.type.name)
            comp = tuple(sorted(task_class.get(t, -1) for t in inst.tasks))
            if k is None or (comp and comp[0] < 0):
                return best  # not a packing of these tasks alone
            packing.append((k, comp))
        if Counter(c for _, comp in packing for c in comp) != Counter(
            {c: n for c, n in enumerate(counts) if n}
        ):
            return best
        packing = self._cover(packing, remember=True) or packing
        for _ in range(NEIGHBOURHOOD_ROUNDS):
            order = sorted(
                range(len(packing)),
                key=lambda i: (
                    self.value(packing[i][1]) / max(self.types[packing[i][0]].hourly_cost, 1e-12),
                    i,
                ),
            )[:NEIGHBOURHOOD_INSTANCES]
            tries = [[i] for i in order] + [
                [i, j] for a, i in enumerate(order) for j in order[a + 1 :]
            ]
            for picked in tries:
                better = self._cover([packing[i] for i in picked], remember=False)
                if better is not None:
                    packing = [p for i, p in enumerate(packing) if i not in picked] + better
                    break
            else:
                break
        packing = self._empty_instances(packing)
        if (
            sum(self.types[k].hourly_cost for k, _ in packing)
            >= sum(i.type.hourly_cost for i in best.instances) - VALUE_TOLERANCE
        ):
            return best
        result = [Instance(None, self.types[k], pools.take_all(comp)) for k, comp in packing]
        saving = sum(self.value(comp) - self.types[k].hourly_cost for k, comp in packing)
        return Placement(result, saving) if saving > best.saving + VALUE_TOLERANCE else best

    def _cover(
        self, packing: list[tuple[int, tuple[int, ...]]], remember: bool
    ) -> list[tuple[int, tuple[int, ...]]] | None:
        """A cheaper packing of the tasks of `packing` (type index, sorted classes per
        instance), or None: the configuration program of these tasks solved in integers
        (`integer_cover`) over the LP's columns, `packing`'s own compositions and each
        of those on the cheapest type that holds it. `packing` is among its solutions,
        so it can only find one as cheap or cheaper. `remember`: the LP solve may be
        answered from the pricer's memory (the same solve as `priced`'s)."""
        assert self.pricer is not None
        tally = Counter(c for _, comp in packing for c in comp)
        counts = [tally.get(c, 0) for c in range(len(self.class_tasks))]
        live, classes = self.pattern_classes(counts)
        local = {c: i for i, c in enumerate(live)}
        solution = self.pricer.solve(self.shapes(), classes, valued_as=() if remember else None)
        columns = set(solution.columns)
        for k, comp in packing:
            columns.add(Pattern(k, tuple(sorted(Counter(local[c] for c in comp).items()))))
        for pattern in list(columns):
            flat = tuple(sorted(live[c] for c, n in pattern.composition for _ in range(n)))
            columns.add(Pattern(self._downsize(pattern.type_index, flat), pattern.composition))
        # The LP's optimum is degenerate between types of one family priced in
        # proportion to size, so its columns rarely include the smaller types' that an
        # integer packing needs: each type's first-fit decreasing bins are offered.
        tasks = [c for c in live for _ in range(counts[c])]
        for k in range(len(self.types)):
            for bin_ in self._first_fit(k, tasks):
                columns.add(Pattern(k, tuple(sorted(Counter(local[c] for c in bin_).items()))))
        ordered = sorted(columns, key=lambda p: (p.type_index, p.composition))
        costs = [t.hourly_cost for t in self.types]
        copies = integer_cover(costs, [c.count for c in classes], ordered, INTEGER_MASTER_NODES)
        if copies is None:
            return None
        # The cover may hold a task twice: each copy takes what is left of its classes,
        # on the cheapest type that holds what it took.
        out: list[tuple[int, tuple[int, ...]]] = []
        for pattern, y in zip(ordered, copies, strict=True):
            for _ in range(y):
                members = []
                for i, n in pattern.composition:
                    c = live[i]
                    take = min(n, counts[c])
                    counts[c] -= take
                    members += [c] * take
                if members:
                    comp = tuple(sorted(members))
                    out.append((self._downsize(pattern.type_index, comp), comp))
        if any(counts):
            return None  # cannot happen for a cover; kept as a guard
        before = sum(costs[k] for k, _ in packing)
        return out if sum(costs[k] for k, _ in out) < before - VALUE_TOLERANCE else None

    def _empty_instances(
        self, packing: list[tuple[int, tuple[int, ...]]]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """`packing` with instances emptied where their tasks fit the others' free room
        (the least-used first; each task, largest first, onto the fullest instance with
        room for it), then every instance on the cheapest type that still holds it."""
        room: list[list[float]] = []
        for k, comp in packing:
            free = list(self.types[k].capacity.as_tuple())
            for c in comp:
                d = self.demand[k][c]
                assert d is not None
                free = [free[0] - d[0], free[1] - d[1], free[2] - d[2]]
            room.append(free)
        members = [list(comp) for _, comp in packing]
        alive = [True] * len(packing)

        def used(i: int) -> float:
            cap = self.types[packing[i][0]].capacity.as_tuple()
            return max(1 - room[i][r] / cap[r] for r in range(3) if cap[r] > 0)

        for i in sorted(range(len(packing)), key=lambda i: (used(i), i)):
            trial = [list(f) for f in room]
            added: dict[int, list[int]] = {}
            for c in sorted(members[i], key=lambda c: (-self.rp[c], c)):
                hosts = []
                for j in range(len(packing)):
                    d = self.demand[packing[j][0]][c]
                    if not alive[j] or j == i or d is None:
                        continue
                    if fits(d, (trial[j][0], trial[j][1], trial[j][2])) and not self._group_full(
                        c, members[j] + added.get(j, [])
                    ):
                        hosts.append(j)
                if not hosts:
                    break
                j = min(hosts, key=lambda j: (sum(trial[j]), j))
                d = self.demand[packing[j][0]][c]
                assert d is not None
                trial[j] = [trial[j][0] - d[0], trial[j][1] - d[1], trial[j][2] - d[2]]
                added.setdefault(j, []).append(c)
            else:
                room = trial
                alive[i] = False
                for j, cs in added.items():
                    members[j] += cs
        out = []
        for i, (k, _) in enumerate(packing):
            if alive[i]:
                comp = tuple(sorted(members[i]))
                out.append((self._downsize(k, comp), comp))
        return out

    def _group_full(self, c: int, members: Sequence[int]) -> bool:
        """Whether one more task of class c would pass its job's anti-affinity limit."""
        g, limit = self.group[c], self.group_limit[c]
        return g is not None and bool(limit) and sum(self.group[x] == g for x in members) >= limit

    def _first_fit(self, k: int, tasks: list[int]) -> list[list[int]]:
        """First-fit decreasing of `tasks` (classes, repeated) onto instances of type k,
        largest share of the type's capacity first; tasks that cannot run on k are left
        out. Anti-affinity limits are respected."""
        cap = self.types[k].capacity.as_tuple()
        row = self.demand[k]
        placeable = [c for c in tasks if c in self.candidate_set[k]]

        def share(c: int) -> float:
            d = row[c]
            assert d is not None
            return max(d[r] / cap[r] if cap[r] > 0 else 0.0 for r in range(3))

        bins: list[tuple[list[float], list[int]]] = []
        for c in sorted(placeable, key=lambda c: (-share(c), c)):
            d = row[c]
            assert d is not None
            for free, members in bins:
                if not fits(d, (free[0], free[1], free[2])) or self._group_full(c, members):
                    continue
                members.append(c)
                free[0], free[1], free[2] = free[0] - d[0], free[1] - d[1], free[2] - d[2]
                break
            else:
                bins.append(([cap[0] - d[0], cap[1] - d[1], cap[2] - d[2]], [c]))
        return [members for _, members in bins]

    def _lp_bound(self, counts: list[int]) -> float:
        """The LP bound (`lp.py`) of the tasks counted, before interference."""
        _, classes = self.pattern_classes(counts)
        if not classes:
            return 0.0
        lp_classes = [LPClass(c.demands, c.count, c.group, c.group_limit) for c in classes]
        return solve_lp(self.view.catalog, lp_classes).lower_bound

    def saving(self, instances: Iterable[Instance]) -> float:
        """S: Σ over instances of (TNRP of its tasks − its cost)."""
        return sum(self.tnrp_of(i.tasks) - i.type.hourly_cost for i in instances)

    def pattern_classes(self, counts: list[int]) -> tuple[list[int], list[PatternClass]]:
        """The classes with tasks left, as the pattern LP sees them (and their indices)."""
        live = [c for c, n in enumerate(counts) if n > 0]
        candidates = self.candidate_set
        classes = [
            PatternClass(
                count=counts[c],
                demands=tuple(
                    self.demand[k][c] if c in candidates[k] else None
                    for k in range(len(self.types))
                ),
                rp=self.rp[c],
                group=self.group[c],
                group_limit=self.group_limit[c] or None,
            )
            for c in live
        ]
        return live, classes

    def shapes(self) -> list[TypeShape]:
        return [TypeShape(t.name, t.hourly_cost, t.capacity.as_tuple()) for t in self.types]

    def priced(
        self, pools: TaskPools, existing: list[Instance], seeds: Iterable[Instance] = ()
    ) -> Placement:
        """Price-guided packing: the configuration LP's patterns, rounded down, then
        Algorithm 1 for the few tasks left over (see `patterns.py`).

        Rounding is iterative (CvxCluster §6.4): the tasks a rounding leaves over
        are priced again by the configuration LP of what is left, up to
        `ROUNDING_PASSES` passes while each places whole copies and at least
        `INTERFERENCE_MIN_TASKS` tasks remain. A fifth of the tasks was left to
        Algorithm 1 after one pass (replaying the full trace's first 300 jobs),
        which fills greedily where the LP would price the leftovers together.

        The compositions of `seeds` are columns from the start. `pack` gives
        the running instances: they stand in for a warm start from earlier
        rounds, taken from the snapshot alone; under interference also
        Algorithm 1's plan, since the pricing search is cut short there.
        Measured replaying the full trace's first 1,000 jobs: 0.630 of
        no-packing without seeds, 0.589 with them. Without interference,
        replaying 1,500 synthetic jobs in a world with no interference, seeds
        from the running instances gave $181,093 in 34 s against $181,310 in
        32 s for the in-memory pool they replace ($181,317 in 44 s with
        neither); Algorithm 1's plan as a seed there crowds the LP (40 small
        tasks: $1.428/h against $1.160/h)."""
        assert self.pricer is not None
        counts = pools.counts
        if not any(counts):
            return self.algorithm1(pools, existing)
        task_class = self.task_class
        seed_columns = []
        for inst in seeds:
            k = self.type_index.get(inst.type.name)
            hosted = Counter(c for t in inst.tasks if (c := task_class.get(t)) is not None)
            if k is not None and hosted and self._holds(k, list(hosted.elements())):
                seed_columns.append((k, hosted))
        # Iterative rounding (CvxCluster §6.4): the tasks left over after rounding
        # down are priced again, by the configuration LP of what is left, while
        # a pass still places whole copies; Algorithm 1 packs the rest.
        chosen: list[_Copies] = []
        for _ in range(ROUNDING_PASSES):
            placed = self._round_patterns(counts, seed_columns)
            chosen += placed
            if not placed or sum(counts) < INTERFERENCE_MIN_TASKS:
                break

        # Existing instances first take a copy of the pattern of their type that
        # keeps most of their tasks where they are.
        result: list[Instance] = []
        saving = 0.0
        unmatched: list[Instance] = []
        # Only a pattern of its type holding one of its residents' classes can keep
        # any of an instance's tasks: chosen's positions by (type, class).
        holding: dict[tuple[int, int], list[int]] = {}
        for position, entry in enumerate(chosen):
            for c, _ in entry.composition:
                holding.setdefault((entry.type_index, c), []).append(position)
        for inst in sorted(existing, key=lambda i: (-self.tnrp_of(i.tasks), i.instance_id or "")):
            k = self.type_index.get(inst.type.name)
            residents = pools.resident_counts(inst.instance_id)
            best, best_overlap = None, 0
            if k is None:
                unmatched.append(inst)
                continue
            # In chosen's order, as they are weighed: the first of the most overlap wins.
            positions = sorted({p for c in residents for p in holding.get((k, c), ())})
            for position in positions:
                entry = chosen[position]
                if entry.copies <= 0:
                    continue
                overlap = sum(min(residents[c], n) for c, n in entry.composition)
                if overlap > best_overlap:
                    best, best_overlap = entry, overlap
            if best is None:
                unmatched.append(inst)
                continue
            best.copies -= 1
            saving += best.margin
            members = [c for c, n in best.composition for _ in range(n)]
            result.append(
                Instance(
                    inst.instance_id, inst.type, pools.take_all(members, prefer=inst.instance_id)
                )
            )
            pools.orphan(inst.instance_id)
        for entry in chosen:
            for tasks in pools.take_copies(entry.composition, entry.copies):
                result.append(Instance(None, self.types[entry.type_index], tasks))
            saving += entry.copies * entry.margin
        return Placement(result, saving).extend(self.algorithm1(pools, unmatched))

    def _round_patterns(
        self, counts: list[int], seed_columns: list[tuple[int, Counter[int]]]
    ) -> list[_Copies]:
        """One pass of `priced`: the configuration LP of the tasks `counts` holds, its
        patterns rounded down to whole copies (taken out of `counts`)."""
        assert self.pricer is not None
        live, classes = self.pattern_classes(counts)
        if not classes:
            return []
        local = {c: i for i, c in enumerate(live)}
        columns = []
        for k, hosted in seed_columns:
            mine = Counter({local[c]: n for c, n in hosted.items() if c in local})
            if mine:
                columns.append(Pattern(k, tuple(sorted(mine.items()))))

        def loss(comp: tuple[int, ...], k: int) -> float:
            real = tuple(live[i] for i in comp)
            return sum(self.rp[c] for c in real) - self.value(real)

        if self.neutral:
            solution = self.pricer.solve(self.shapes(), classes, seeds=columns, valued_as=())
        else:
            if self.stake is None:
                at_stake = [jrp if (jrp := self.jrp[c]) is not None else self.rp[c] for c in live]
            else:
                at_stake = [self.stake[c] for c in live]
            # What `loss` reads of each class; the table and the rest are the pricer's scope.
            valued_as = tuple(
                (
                    self.workload[c],
                    self.rp[c],
                    self.jrp[c],
                    None if self.stake is None else self.stake[c],
                )
                for c in live
            )
            solution = self.pricer.solve(
                self.shapes(),
                classes,
                loss,
                (self.table.default, at_stake),
                columns,
                valued_as,
            )
        # Round down: whole copies of each pattern while its tasks last. A
        # pattern that would not be cost-efficient (TNRP < cost) is never used.
        chosen: list[_Copies] = []
        for pattern, y in sorted(solution.patterns, key=lambda py: (-py[1], py[0].type_index)):
            comp = [(live[i], n) for i, n in pattern.composition]
            copies = min([int(y + 1e-9)] + [counts[c] // n for c, n in comp])
            if copies <= 0:
                continue
            flat = tuple(sorted(c for c, n in comp for _ in range(n)))
            margin = self.value(flat) - self.types[pattern.type_index].hourly_cost
            if margin < -VALUE_TOLERANCE:
                continue
            for c, n in comp:
                counts[c] -= copies * n
            chosen.append(_Copies(pattern.type_index, comp, copies, margin))
        return chosen

    # -- the two reconfigurations ------------------------------------------------

    def full(self) -> Configuration:
        """Full Reconfiguration: every task of the snapshot re-placed (§4.2)."""
        return Configuration(tuple(self.full_placement().instances))

    def partial(self) -> Configuration:
        """Partial Reconfiguration (§4.5); see `partial_placement`."""
        return Configuration(tuple(self.partial_placement().instances))

    def full_placement(self) -> Placement:
        """Full Reconfiguration with its saving."""
        pools = TaskPools(self)
        current = list(self.view.current)
        for inst in current:
            pools.add_resident(inst)
        self._add_unplaced(pools, pools.placed_ids())
        return self.pack(pools, current)

    def partial_placement(self) -> Placement:
        """Partial Reconfiguration: keep every instance that is still cost-efficient (§4.5).

        Re-placed are only tasks not on any instance, tasks on instances whose
        TNRP fell below their cost, and tasks on provisional instances (see
        `ClusterView`). They first go onto kept instances where they add the
        most TNRP, then Algorithm 1 places the rest, reusing the released
        instances where that pays.
        """
        pools = TaskPools(self)
        kept: list[_KeptInstance] = []
        released: list[Instance] = []
        on_instance: set[str] = set()
        for inst in self.view.current:
            active = [t for t in inst.tasks if t in self.task_class]
            on_instance.update(active)
            provisional = inst.instance_id in self.view.provisional
            entry = self._keep(inst, active) if active and not provisional else None
            if entry is not None:
                kept.append(entry)
            else:
                released.append(Instance(inst.instance_id, inst.type, tuple(active)))
                pools.add_resident(released[-1])
        self._add_unplaced(pools, on_instance)

        counts = pools.counts
        if kept and any(counts):
            hosts = _KeptHosts(kept)
            # Larger tasks first, so they get the spare room they need.
            for c in sorted(range(len(counts)), key=lambda c: (-self.rp[c], c)):
                while counts[c] > 0:
                    host = self._best_kept_host(hosts, c)
                    if host is None:
                        break  # kept instances only fill up: none will take c later
                    counts[c] -= 1
                    entry = kept[host]
                    hosts.leave(host, entry)
                    entry.tasks.append(pools.take_all([c])[0])
                    insort(entry.composition, c)
                    entry.value = self.value(tuple(entry.composition))
                    d = self.demand[entry.k][c]
                    assert d is not None
                    free = entry.free
                    entry.free = [free[0] - d[0], free[1] - d[1], free[2] - d[2]]
                    hosts.join(host, entry)
        result = [Instance(e.instance.instance_id, e.instance.type, tuple(e.tasks)) for e in kept]
        saving = sum(e.value - e.instance.type.hourly_cost for e in kept)
        return Placement(result, saving).extend(self.pack(pools, released))

    def _add_unplaced(self, pools: TaskPools, on_instance: set[str]) -> None:
        for c, tids in enumerate(self.class_tasks):
            pools.add_unplaced(
                c, [t for t in tids if t not in on_instance] if on_instance else tids
            )

    def _best_kept_host(self, hosts: _KeptHosts, c: int) -> int | None:
        """The kept instance where a task of class c adds the most TNRP (its index in
        the kept list; None if none gains).

        Ties go to the fullest instance, to keep room elsewhere for larger tasks,
        then to the first kept. What a task adds to an instance depends only on its
        type, its composition and its free room, so instances alike in all three are
        weighed once, as a group (a steady round keeps thousands of instances of a
        few hundred kinds, and places its new tasks one by one)."""
        best, best_key = None, None
        for (k, composition, free), members in hosts.groups.items():
            d = self.demand[k][c]
            if d is None or not fits(d, free):
                continue
            if self._group_full(c, composition):
                continue
            trial = list(composition)
            insort(trial, c)
            gain = self.value(tuple(trial)) - self.value(composition)
            if gain <= VALUE_TOLERANCE:
                continue
            first = members[0]
            key = (round(gain / VALUE_TOLERANCE), -(free[0] + free[1] + free[2]), -first)
            if best_key is None or key > best_key:
                best, best_key = first, key
        return best

    def _keep(self, inst: Instance, active: list[str]) -> _KeptInstance | None:
        """Partial's record of an instance that stays, or None if it is released.

        Kept: its type is in the catalog, its tasks still fit it, and their TNRP
        covers its cost.
        """
        k = self.type_index.get(inst.type.name)
        if k is None:
            return None
        comp = sorted(self.task_class[t] for t in active)
        value = self.value(tuple(comp))
        if value < inst.type.hourly_cost - VALUE_TOLERANCE:
            return None
        free = list(self.types[k].capacity.as_tuple())
        for c in comp:
            d = self.demand[k][c]
            if d is None:
                return None
            free = [free[0] - d[0], free[1] - d[1], free[2] - d[2]]
        if min(free) < -EPSILON:
            return None
        return _KeptInstance(inst, k, comp, free, value, list(active))


def _reuse(result: list[Instance], by_type: dict[str, list[Instance]]) -> list[Instance]:
    """Give new instances the ids of existing ones of their type that the result left unused.

    Algorithm 1 meets an existing instance only at its type's turn; a larger
    type visited before may take its tasks and be downsized to that very type
    as a new instance. When they share a task, it is the existing one: reusing
    it keeps that task in place and launches nothing (the local daemon
    launched a second c7i.large and moved the task for nothing). The one
    sharing the most tasks is taken first, then in `by_type`'s order. One that
    shares none is not handed over: swapping its residents for others cost
    0.65% more on pai_200 without `full_throughput`.
    """
    used = {inst.instance_id for inst in result if inst.instance_id is not None}
    free: dict[str, dict[str, int]] = {}  # type -> unused existing id -> its rank
    resident: dict[str, str] = {}
    for name, insts in by_type.items():
        for rank, inst in enumerate(insts):
            if inst.instance_id is not None and inst.instance_id not in used:
                free.setdefault(name, {})[inst.instance_id] = rank
                resident.update(dict.fromkeys(inst.tasks, inst.instance_id))
    if not free:
        return result
    out = []
    for inst in result:
        spare = free.get(inst.type.name) if inst.instance_id is None else None
        if spare:
            votes = Counter(resident[t] for t in inst.tasks if resident.get(t) in spare)
            if votes:
                choice = min(votes, key=lambda i: (-votes[i], spare[i]))
                del spare[choice]
                inst = Instance(choice, inst.type, inst.tasks)
        out.append(inst)
    return out


@dataclass(slots=True)
class Placement:
    """Instances and their provisioning saving S = Σ(TNRP − cost), known while packing."""

    instances: list[Instance]
    saving: float

    def extend(self, other: Placement) -> Placement:
        return Placement(self.instances + other.instances, self.saving + other.saving)


@dataclass(slots=True)
class _Copies:
    """Whole copies of one pattern of the configuration LP, rounded down: those left to
    place, and what each saves (TNRP − cost)."""

    type_index: int
    composition: list[tuple[int, int]]  # (class, tasks of it)
    copies: int
    margin: float


@dataclass(slots=True)
class _KeptInstance:
    """An instance Partial Reconfiguration keeps, and what it is given while filling."""

    instance: Instance
    k: int  # index of its type in the catalog order
    composition: list[int]  # sorted classes of its tasks
    free: list[float]
    value: float  # TNRP of its tasks
    tasks: list[str]


#: A step of a greedy fill (`Packer._fill_greedy`'s trace): the classes taken so far,
#: the free room, TNRP so far, and the best candidate's (grid TNRP, resident),
#: alignment and class (-1: none fits).
_Step = tuple[tuple[int, ...], tuple[float, float, float], float, tuple[int, bool], int, int]


@dataclass(frozen=True, slots=True)
class _RememberedFill:
    """A greedy fill as `FillMemory` keeps it, in stable class ids: the candidates that
    were available, the composition taken and its TNRP, what each chosen class had
    (as `Packer._fill`'s memo) and the steps."""

    available: frozenset[int]
    composition: tuple[int, ...]
    value: float
    taken: tuple[tuple[int, int], ...]
    clipped: tuple[int, ...]
    steps: tuple[_Step, ...]
    round: int  # `FillMemory.round` when it was made


@dataclass(frozen=True, slots=True)
class _Resume:
    """A remembered fill whose first `steps` steps a fill repeats (`Packer._resume`)."""

    entry: _RememberedFill
    steps: int


class FillMemory:
    """Algorithm 1's fills kept from round to round (Firmament's lesson: consecutive
    rounds differ little), by the type, the residents left and the classes' stable ids.

    A class's stable id stands for everything a fill reads of it (its key, RP, job
    charge and stake); the catalog and the learned table are the `scope`, and a new
    scope forgets everything. A remembered fill is used only where `Packer._replay`
    proves the step-by-step fill would repeat it, so plans are exactly a fresh
    planner's. Fills are kept for `FILL_ROUNDS` rounds (`next_round`), at most
    `per_key` per type and residents.
    """

    def __init__(self, per_key: int = 64, most_classes: int = 200_000) -> None:
        self.per_key = per_key
        self.most_classes = most_classes
        self._scope: object = None
        self._ids: dict[object, int] = {}
        self._fills: dict[tuple[int, tuple[tuple[int, int], ...]], list[_RememberedFill]] = {}
        self._round = 0
        # TNRP by the stable ids of a composition's classes (`Packer.value`), in scope.
        self.values: dict[tuple[int, ...], float] = {}
        self.replays = 0  # fills answered from memory, over its life
        self.resumed = 0  # fills that went on step by step from a remembered one's start

    def scope(self, token: object) -> None:
        """What values a composition (see `PatternPricer.scope`); a change forgets all,
        as do more than `most_classes` classes seen in one scope."""
        if token != self._scope or len(self._ids) > self.most_classes:
            self._scope = token
            self._ids = {}
            self._fills = {}
            # A new one, not cleared: a Packer of the old scope keeps the old ids and map.
            self.values = {}

    def next_round(self) -> None:
        """A round fills anew: fills made more than `FILL_ROUNDS` − 1 rounds ago are
        forgotten."""
        self._round += 1
        oldest = self._round - FILL_ROUNDS + 1
        kept = {}
        for key, bucket in self._fills.items():
            recent = [fill for fill in bucket if fill.round >= oldest]
            if recent:
                kept[key] = recent
        self._fills = kept

    @property
    def round(self) -> int:
        return self._round

    def identify(self, cls: object) -> int:
        """The stable id of a class (its key and valuation)."""
        found = self._ids.get(cls)
        if found is None:
            found = self._ids[cls] = len(self._ids)
        return found

    def candidates(self, key: tuple[int, tuple[tuple[int, int], ...]]) -> list[_RememberedFill]:
        """The fills remembered for (type, residents), the latest first."""
        return self._fills.get(key, [])

    def remember(self, key: tuple[int, tuple[tuple[int, int], ...]], fill: _RememberedFill) -> None:
        bucket = self._fills.setdefault(key, [])
        bucket.insert(0, fill)
        if len(bucket) > self.per_key:
            bucket.pop()


class _KeptHosts:
    """Partial's kept instances grouped by (type, composition, free room), each group
    the kept indices in it, ascending: all a task needs to choose its host."""

    def __init__(self, kept: list[_KeptInstance]) -> None:
        self.groups: dict[tuple[int, tuple[int, ...], tuple[float, float, float]], list[int]] = {}
        for i, entry in enumerate(kept):
            self.groups.setdefault(self._key(entry), []).append(i)

    @staticmethod
    def _key(entry: _KeptInstance) -> tuple[int, tuple[int, ...], tuple[float, float, float]]:
        free = entry.free
        return entry.k, tuple(entry.composition), (free[0], free[1], free[2])

    def leave(self, i: int, entry: _KeptInstance) -> None:
        """Kept instance i is about to change: out of its group."""
        key = self._key(entry)
        members = self.groups[key]
        members.remove(i)
        if not members:
            del self.groups[key]

    def join(self, i: int, entry: _KeptInstance) -> None:
        """Kept instance i has changed: into the group it now belongs to."""
        insort(self.groups.setdefault(self._key(entry), []), i)


class TaskPools:
    """The tasks still to place, per class, remembering which instance each is on now.

    Taking a task of a class prefers, in order: one already on the instance
    being filled; one on no instance; one whose instance has already been
    decided on (it must move anyway); then one from an undecided instance.
    """

    def __init__(self, packer: Packer) -> None:
        n = len(packer.class_tasks)
        self.packer = packer
        self.counts = [0] * n
        self._unplaced: list[list[str]] = [[] for _ in range(n)]
        self._cursor = [0] * n  # unplaced tasks before the cursor are taken
        self._orphaned: list[deque[str]] = [deque() for _ in range(n)]
        self._resident: list[dict[str, list[str]]] = [{} for _ in range(n)]
        self._classes_on: dict[str, set[int]] = {}

    def copy(self) -> TaskPools:
        """An independent copy, so two packings can be tried on the same tasks."""
        other = TaskPools.__new__(TaskPools)
        other.packer = self.packer
        other.counts = list(self.counts)
        other._unplaced = [list(q) for q in self._unplaced]
        other._cursor = list(self._cursor)
        other._orphaned = [deque(q) for q in self._orphaned]
        other._resident = [{i: list(t) for i, t in per.items()} for per in self._resident]
        other._classes_on = {i: set(cs) for i, cs in self._classes_on.items()}
        return other

    def add_unplaced(self, c: int, task_ids: list[str]) -> None:
        """Tasks of class c that are on no instance."""
        self._unplaced[c].extend(task_ids)
        self.counts[c] += len(task_ids)

    def add_resident(self, inst: Instance) -> None:
        assert inst.instance_id is not None
        task_class = self.packer.task_class
        for task_id in inst.tasks:
            c = task_class.get(task_id)
            if c is None:
                continue
            self._resident[c].setdefault(inst.instance_id, []).append(task_id)
            self._classes_on.setdefault(inst.instance_id, set()).add(c)
            self.counts[c] += 1

    def placed_ids(self) -> set[str]:
        return {t for per in self._resident for tasks in per.values() for t in tasks}

    def resident_counts(self, instance_id: str | None) -> Counter[int]:
        counts: Counter[int] = Counter()
        for c in self._classes_on.get(instance_id or "", ()):
            counts[c] = len(self._resident[c].get(instance_id or "", ()))
        return counts

    def orphan(self, instance_id: str | None) -> None:
        """The instance is decided: tasks still listed on it must move."""
        for c in self._classes_on.pop(instance_id or "", ()):
            self._orphaned[c].extend(self._resident[c].pop(instance_id or "", ()))

    def take_all(self, composition: Iterable[int], prefer: str | None = None) -> tuple[str, ...]:
        """Task ids for one instance (counts were already decremented by the caller)."""
        return tuple([self._take(c, prefer) for c in composition])

    def take_copies(
        self, composition: Iterable[tuple[int, int]], copies: int
    ) -> list[tuple[str, ...]]:
        """Task ids for `copies` new instances of one composition of (class, count)."""
        per_class = [(self._take_many(c, n * copies), n) for c, n in composition]
        return [
            tuple(t for got, n in per_class for t in got[i * n : (i + 1) * n])
            for i in range(copies)
        ]

    def _take_many(self, c: int, n: int) -> list[str]:
        start = self._cursor[c]
        got = self._unplaced[c][start : start + n]
        self._cursor[c] = start + len(got)
        while len(got) < n:
            got.append(self._take(c, None))
        return got

    def _take(self, c: int, prefer: str | None) -> str:
        if prefer is not None:
            mine = self._resident[c].get(prefer)
            if mine:
                return mine.pop()
        if self._cursor[c] < len(self._unplaced[c]):
            self._cursor[c] += 1
            return self._unplaced[c][self._cursor[c] - 1]
        if self._orphaned[c]:
            return self._orphaned[c].popleft()
        for instance_id in sorted(self._resident[c], reverse=True):
            tasks = self._resident[c][instance_id]
            if tasks:
                return tasks.pop()
        raise AssertionError(f"no task left in class {c}")


def full_reconfiguration(view: ClusterView) -> Configuration:
    """Full Reconfiguration (Algorithm 1 with TNRP) of a snapshot."""
    return Packer(view).full()


def partial_reconfiguration(view: ClusterView) -> Configuration:
    """Partial Reconfiguration of a snapshot."""
    return Packer(view).partial()
