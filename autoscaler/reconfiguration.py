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
from collections.abc import Iterable
from dataclasses import dataclass

from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import TaskSpec
from autoscaler.pricing import PriceBook, tnrp
from autoscaler.resources import EPSILON
from autoscaler.view import ClusterView

#: Two TNRP values closer than this ($/h) are a tie.
VALUE_TOLERANCE = 1e-6


def class_key(task: TaskSpec, job_rp: float, multi_task: bool, with_workload: bool) -> tuple:
    """Tasks with equal keys are interchangeable for packing; the key also orders classes."""
    demands = tuple((family, d.as_tuple()) for family, d in task.demands)
    return (
        demands,
        task.workload if with_workload else "",
        round(job_rp, 9) if multi_task else -1.0,
    )


class Packer:
    """Reconfiguration of one snapshot: shared class structure and TNRP cache."""

    def __init__(self, view: ClusterView, prices: PriceBook | None = None) -> None:
        self.view = view
        self.types = view.catalog.types  # descending cost
        self.type_index = {t.name: k for k, t in enumerate(self.types)}
        self.table = view.throughput
        self.neutral = self.table.is_neutral
        self.prices = prices or PriceBook.build(view.jobs, view.catalog)

        keyed: dict[tuple, list[TaskSpec]] = {}
        job_of_task: dict[str, str] = {}
        for job in view.jobs:
            jrp = self.prices.job_rp[job.job_id]
            for task in job.tasks:
                key = class_key(task, jrp, job.is_multi_task, not self.neutral)
                keyed.setdefault(key, []).append(task)
                job_of_task[task.task_id] = job.job_id
        keys = sorted(keyed)
        self.job_of_task = job_of_task
        self.class_tasks: list[list[str]] = [[t.task_id for t in keyed[k]] for k in keys]
        self.task_class: dict[str, int] = {
            tid: c for c, tids in enumerate(self.class_tasks) for tid in tids
        }
        first = [keyed[k][0] for k in keys]
        self.rp = [self.prices.task_rp[t.task_id] for t in first]
        self.jrp: list[float | None] = [
            self.prices.job_rp[job_of_task[t.task_id]] if k[2] >= 0 else None
            for t, k in zip(first, keys, strict=True)
        ]
        self.workload = [t.workload for t in first]
        # Per type: each class's demand on that type's family (None: cannot run there).
        self.demand: list[list[tuple[float, float, float] | None]] = []
        self.candidates: list[list[int]] = []
        for itype in self.types:
            row: list[tuple[float, float, float] | None] = []
            for t in first:
                d = t.demand_on(itype.family)
                row.append(None if d is None else d.as_tuple())
            self.demand.append(row)
            cap = itype.capacity
            self.candidates.append(
                [
                    c
                    for c, d in enumerate(row)
                    if d is not None
                    and d[0] <= cap.gpu + EPSILON
                    and d[1] <= cap.cpu + EPSILON
                    and d[2] <= cap.ram_gb + EPSILON
                ]
            )
        self._value_cache: dict[tuple[int, ...], float] = {}
        self._downsize_cache: dict[tuple[int, tuple[int, ...]], int] = {}

    # -- valuation ---------------------------------------------------------

    def value(self, composition: tuple[int, ...]) -> float:
        """TNRP of a sorted multiset of classes sharing one instance."""
        if self.neutral:
            return sum(self.rp[c] for c in composition)
        cached = self._value_cache.get(composition)
        if cached is not None:
            return cached
        workloads = [self.workload[c] for c in composition]
        total = 0.0
        previous, previous_value = -1, 0.0
        for i, c in enumerate(composition):
            if c != previous:
                others = workloads[:i] + workloads[i + 1 :]
                tput = self.table.throughput(self.workload[c], others)
                previous, previous_value = c, tnrp(self.rp[c], tput, self.jrp[c])
            total += previous_value
        self._value_cache[composition] = total
        return total

    def tnrp_of(self, task_ids: Iterable[str]) -> float:
        """TNRP of a set of tasks on one instance (tasks of unknown jobs are ignored)."""
        return self.value(self._composition(task_ids))

    def _composition(self, task_ids: Iterable[str]) -> tuple[int, ...]:
        classes = self.task_class
        return tuple(sorted(classes[t] for t in task_ids if t in classes))

    # -- Algorithm 1 ---------------------------------------------------------

    def _fill(
        self,
        k: int,
        counts: list[int],
        residents: Counter[int] | None,
        free: list[float] | None = None,
        composition: list[int] | None = None,
    ) -> tuple[list[int], float]:
        """Fill one instance of type k greedily; decrements `counts` for what it takes."""
        itype = self.types[k]
        cap = itype.capacity.as_tuple()
        free = list(cap) if free is None else free
        comp: list[int] = [] if composition is None else composition
        current = self.value(tuple(comp)) if comp else 0.0
        demand = self.demand[k]
        rp = self.rp
        neutral = self.neutral
        inv = [1.0 / c if c > 0 else 0.0 for c in cap]
        while True:
            best = -1
            best_key: tuple | None = None
            best_value = 0.0
            for c in self.candidates[k]:
                if counts[c] <= 0:
                    continue
                d = demand[c]
                assert d is not None
                if d[0] > free[0] + EPSILON or d[1] > free[1] + EPSILON or d[2] > free[2] + EPSILON:
                    continue
                if neutral:
                    v = current + rp[c]
                else:
                    trial = list(comp)
                    insort(trial, c)
                    v = self.value(tuple(trial))
                align = (
                    d[0] * free[0] * inv[0] * inv[0]
                    + d[1] * free[1] * inv[1] * inv[1]
                    + d[2] * free[2] * inv[2] * inv[2]
                )
                key = (round(v / VALUE_TOLERANCE), bool(residents and residents[c] > 0), align, -c)
                if best_key is None or key > best_key:
                    best, best_key, best_value = c, key, v
            if best < 0 or best_value < current - VALUE_TOLERANCE:
                break  # nothing fits, or adding would lower TNRP (Algorithm 1, line 10)
            insort(comp, best)
            counts[best] -= 1
            if residents and residents[best] > 0:
                residents[best] -= 1
            d = demand[best]
            assert d is not None
            free[0] -= d[0]
            free[1] -= d[1]
            free[2] -= d[2]
            current = best_value
        return comp, current

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
                cap = itype.capacity
                if (
                    g <= cap.gpu + EPSILON
                    and cpu <= cap.cpu + EPSILON
                    and ram <= cap.ram_gb + EPSILON
                ):
                    best = j
                    break
        self._downsize_cache[key] = best
        return best

    def algorithm1(self, pools: TaskPools, existing: Iterable[Instance]) -> list[Instance]:
        """Algorithm 1 over what `pools` holds, reusing `existing` instances where it can."""
        by_type: dict[str, list[Instance]] = {}
        for inst in existing:
            by_type.setdefault(inst.type.name, []).append(inst)
        for insts in by_type.values():
            insts.sort(key=lambda i: (-self.tnrp_of(i.tasks), i.instance_id or ""))
        counts = pools.counts
        result: list[Instance] = []
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
                for _ in range(repeats):
                    result.append(Instance(None, target, pools.take_all(comp)))
        if any(counts):
            left = {self.class_tasks[c][0]: n for c, n in enumerate(counts) if n}
            raise AssertionError(f"Algorithm 1 left tasks unplaced: {left}")
        return result

    # -- the two reconfigurations ------------------------------------------------

    def full(self) -> Configuration:
        """Full Reconfiguration: every task of the snapshot re-placed (§4.2)."""
        pools = TaskPools(self)
        current = list(self.view.current)
        for inst in current:
            pools.add_resident(inst)
        placed = pools.placed_ids()
        for tid in self.task_class:
            if tid not in placed:
                pools.add_unplaced(tid)
        return Configuration(tuple(self.algorithm1(pools, current)))

    def partial(self) -> Configuration:
        """Partial Reconfiguration: keep every instance that is still cost-efficient (§4.5).

        Re-placed are only tasks not on any instance and tasks on instances whose
        TNRP fell below their cost. They first go onto kept instances where
        they add the most TNRP, then Algorithm 1 places the rest, reusing the
        released instances where that pays.
        """
        pools = TaskPools(self)
        kept: list[_KeptInstance] = []
        released: list[Instance] = []
        on_instance: set[str] = set()
        for inst in self.view.current:
            active = [t for t in inst.tasks if t in self.task_class]
            on_instance.update(active)
            entry = self._keep(inst, active) if active else None
            if entry is not None:
                kept.append(entry)
            else:
                released.append(Instance(inst.instance_id, inst.type, tuple(active)))
                pools.add_resident(released[-1])
        for tid in self.task_class:
            if tid not in on_instance:
                pools.add_unplaced(tid)

        counts = pools.counts
        if kept:
            # Larger tasks first, so they get the spare room they need.
            for c in sorted(range(len(counts)), key=lambda c: (-self.rp[c], c)):
                while counts[c] > 0:
                    host = self._best_kept_host(kept, c)
                    if host is None:
                        break  # kept instances only fill up: none will take c later
                    counts[c] -= 1
                    host.tasks.extend(pools.take_all([c]))
                    insort(host.composition, c)
                    host.value = self.value(tuple(host.composition))
                    d = self.demand[host.k][c]
                    assert d is not None
                    host.free = [host.free[0] - d[0], host.free[1] - d[1], host.free[2] - d[2]]
        result = [Instance(e.instance.instance_id, e.instance.type, tuple(e.tasks)) for e in kept]
        result.extend(self.algorithm1(pools, released))
        return Configuration(tuple(result))

    def _best_kept_host(self, kept: list[_KeptInstance], c: int) -> _KeptInstance | None:
        """The kept instance where a task of class c adds the most TNRP (None if none gains)."""
        best, best_key = None, None
        for entry in kept:
            d = self.demand[entry.k][c]
            free = entry.free
            if d is None or (
                d[0] > free[0] + EPSILON or d[1] > free[1] + EPSILON or d[2] > free[2] + EPSILON
            ):
                continue
            trial = list(entry.composition)
            insort(trial, c)
            gain = self.value(tuple(trial)) - entry.value
            if gain <= VALUE_TOLERANCE:
                continue
            # ties: the fullest instance, to keep room elsewhere for larger tasks
            key = (round(gain / VALUE_TOLERANCE), -(free[0] + free[1] + free[2]))
            if best_key is None or key > best_key:
                best, best_key = entry, key
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


@dataclass(slots=True)
class _KeptInstance:
    """An instance Partial Reconfiguration keeps, and what it is given while filling."""

    instance: Instance
    k: int  # index of its type in the catalog order
    composition: list[int]  # sorted classes of its tasks
    free: list[float]
    value: float  # TNRP of its tasks
    tasks: list[str]


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
        self._unplaced: list[deque[str]] = [deque() for _ in range(n)]
        self._orphaned: list[deque[str]] = [deque() for _ in range(n)]
        self._resident: list[dict[str, list[str]]] = [{} for _ in range(n)]
        self._classes_on: dict[str, set[int]] = {}

    def add_unplaced(self, task_id: str) -> None:
        c = self.packer.task_class[task_id]
        self._unplaced[c].append(task_id)
        self.counts[c] += 1

    def add_resident(self, inst: Instance) -> None:
        assert inst.instance_id is not None
        for task_id in inst.tasks:
            c = self.packer.task_class.get(task_id)
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
        """Task ids for a composition (counts were already decremented by the caller)."""
        return tuple(sorted(self._take(c, prefer) for c in composition))

    def _take(self, c: int, prefer: str | None) -> str:
        if prefer is not None:
            mine = self._resident[c].get(prefer)
            if mine:
                return mine.pop()
        if self._unplaced[c]:
            return self._unplaced[c].popleft()
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
