"""The clairvoyant limits of a trace: how far every scheduler is from them.

Integrate over time the LP bound (`autoscaler.lp`) for the tasks present at
each moment, job j being present during [arrival, arrival + its work alone at full speed]
(`autoscaler.work`: the same work the simulator runs) — no
start-up delays, no interference, no migrations, perfect packing of resources
across instances of a type. No scheduler can cost less. The classes are the
trace's distinct demand vectors, fixed for the whole trace, so every solve
after the first is a warm re-solve with new counts. Anti-affinity limits are
left out: the bound only gets lower, and stays valid.

`per_interval_limits` climbs two steps above it, per interval between
arrivals and departures: whole tasks on (fractionally many) instances — the
configuration LP over every composition of the tasks present — and then the
same with each task paid for at the throughput its companions leave it (the
ground-truth interference table): every task present must progress at full
speed, so a composition whose tasks run at θ_i delivers Σ θ_i of work. The
last step is what a clairvoyant scheduler pays that packs the tasks present
optimally at every moment, migrates for free, starts instantly and runs each
task while the trace says it is present. It is not a bound on schedulers that
hold work back to pair it better later; replaying pai_200 with arrivals
batched into 0.5–3 h windows (JCT up to 1.13x) changed eva's cost by under
0.2%.

`waiting_limit` is one: it pools the whole trace's work into one configuration
LP, as if every task were present at once, so it bounds every schedule the
simulator can run, whatever it lets jobs wait (and whatever JCT it accepts).
Any schedule is a sequence of (instance type, set of tasks, duration)
segments; each task must accumulate its full-speed duration of work at the
rate its companions leave it, and a multi-task job moves at its slowest
task's rate, so it pays at least what the LP pays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import highspy
import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec
from autoscaler.lp import LPClass, ShadowPricer
from autoscaler.patterns import covering_model
from autoscaler.throughput import ThroughputTable
from autoscaler.work import solo_seconds

#: Past this many compositions of one interval's tasks on one type, the
#: interval counts at its fluid bound in `per_interval_limits` (and is counted).
MAX_COMPOSITIONS = 200_000

Row = tuple[tuple[float, float, float] | None, ...]  # a class's demand per type; None: not there


def clairvoyant_bound(jobs: Sequence[JobSpec], catalog: Catalog) -> float:
    """Dollars: ∫ LP bound(tasks present at t) dt over the trace."""
    rows, _, per_job = _classes(jobs, catalog, by_workload=False)
    pricer = ShadowPricer()
    total = 0.0
    for hours, present in _intervals(jobs, per_job, len(rows)):
        classes = [LPClass(d, n) for d, n in zip(rows, present, strict=True)]
        total += pricer.solve(catalog, classes).lower_bound * hours
    return total


@dataclass(frozen=True, slots=True)
class Limits:
    """Dollars over the trace, lowest first (see the module docstring)."""

    fluid: float
    whole_tasks: float
    with_interference: float
    intervals: int  # with a task present
    at_fluid: int  # intervals with too many compositions, counted at the fluid bound


def per_interval_limits(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    truth: ThroughputTable,
    max_compositions: int = MAX_COMPOSITIONS,
    on_interval: Callable[[int, int], None] | None = None,
) -> Limits:
    """The fluid bound, the whole-task limit and the limit under `truth`'s interference.

    Classes are (demands, workload); every composition of the tasks present
    that fits a type is a column. `on_interval(done, total)` reports progress.
    """
    rows, workloads, per_job = _classes(jobs, catalog, by_workload=True)
    intervals = list(_intervals(jobs, per_job, len(rows)))
    shadow = ShadowPricer()
    solved: dict[tuple[int, ...], tuple[float, float, float, bool]] = {}
    totals = [0.0, 0.0, 0.0]
    at_fluid = 0
    for i, (hours, present) in enumerate(intervals):
        state = tuple(present)
        if state not in solved:
            fluid = shadow.solve(
                catalog, [LPClass(r, n) for r, n in zip(rows, present, strict=True)]
            )
            rate = fluid.lower_bound
            try:
                whole, slowed = _composition_lps(
                    catalog, rows, workloads, present, truth, max_compositions
                )
                solved[state] = (rate, max(rate, whole), max(rate, slowed), True)
            except _TooMany:
                solved[state] = (rate, rate, rate, False)
        rates = solved[state]
        for j in range(3):
            totals[j] += rates[j] * hours
        at_fluid += not rates[3]
        if on_interval is not None:
            on_interval(i + 1, len(intervals))
    return Limits(totals[0], totals[1], totals[2], len(intervals), at_fluid)


@dataclass(frozen=True, slots=True)
class WaitingLimit:
    """Dollars no schedule goes below, however long it lets work wait."""

    dollars: float
    #: False: too many compositions, and `dollars` is the pooled fluid bound (lower still).
    exact: bool


def waiting_limit(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    truth: ThroughputTable,
    max_compositions: int = MAX_COMPOSITIONS,
) -> WaitingLimit:
    """The configuration LP of the whole trace's work under `truth`'s interference:
    class k needs Σ task-hours of its tasks, a composition on a type delivers
    Σ θ_i per hour, and holds at most as many tasks of a class as the trace has."""
    rows, workloads, per_job = _classes(jobs, catalog, by_workload=True)
    counts = [0] * len(rows)
    work = [0.0] * len(rows)
    for spec, classes in zip(jobs, per_job, strict=True):
        hours = solo_seconds(spec) / 3600.0
        for c, n in classes.items():
            counts[c] += n
            work[c] += n * hours
    try:
        _, slowed = _composition_lps(
            catalog, rows, workloads, counts, truth, max_compositions, need=work
        )
        return WaitingLimit(slowed, True)
    except _TooMany:
        # The pooled LP's right-hand sides are task-hours, not task counts: `LPClass.count`
        # is an int for the planner, and the pricer reads it as a float.
        pooled = ShadowPricer().solve(
            catalog,
            [LPClass(r, w) for r, w in zip(rows, work, strict=True)],  # type: ignore[arg-type]
        )
        return WaitingLimit(pooled.lower_bound, False)


class _TooMany(Exception):
    """An interval past the composition limit (or whose LP has no optimum)."""


def _classes(
    jobs: Sequence[JobSpec], catalog: Catalog, by_workload: bool
) -> tuple[list[Row], list[str], list[dict[int, int]]]:
    """The trace's distinct demand vectors (with the workload, if asked) as rows
    per type, each class's workload, and each job's count of each class."""
    keys: dict[tuple, int] = {}
    rows: list[Row] = []
    workloads: list[str] = []
    per_job: list[dict[int, int]] = []
    for job in jobs:
        counts: dict[int, int] = {}
        for task in job.tasks:
            key = (task.demands, task.workload if by_workload else "")
            c = keys.get(key)
            if c is None:
                c = keys[key] = len(rows)
                rows.append(
                    tuple(
                        None if (d := task.demand_on(t.family)) is None else d.as_tuple()
                        for t in catalog.types
                    )
                )
                workloads.append(task.workload)
            counts[c] = counts.get(c, 0) + 1
        per_job.append(counts)
    return rows, workloads, per_job


def _intervals(
    jobs: Sequence[JobSpec], per_job: Sequence[dict[int, int]], n_classes: int
) -> Iterator[tuple[float, list[int]]]:
    """(hours, tasks present per class) for each interval with a task present."""
    events: dict[float, list[tuple[int, int]]] = {}  # time -> (job index, +1 or -1)
    for j, job in enumerate(jobs):
        start = job.trace.arrival_time_s
        events.setdefault(start, []).append((j, 1))
        events.setdefault(start + solo_seconds(job), []).append((j, -1))
    present = [0] * n_classes
    for now, after in pairwise(sorted(events)):
        for j, sign in events[now]:
            for c, n in per_job[j].items():
                present[c] += sign * n
        if any(present):
            yield (after - now) / 3600.0, list(present)


def _compositions(
    capacity: tuple[float, float, float],
    rows: Sequence[tuple[float, float, float] | None],
    present: Sequence[int],
    limit: int,
) -> list[tuple[int, ...]]:
    """Every non-empty multiset of the tasks present that fits `capacity`, as class lists."""
    fitting = [c for c, n in enumerate(present) if n and rows[c] is not None]
    out: list[tuple[int, ...]] = []

    def visit(i: int, free: tuple[float, ...], chosen: list[int]) -> None:
        if i == len(fitting):
            if chosen:
                if len(out) >= limit:
                    raise _TooMany
                out.append(tuple(chosen))
            return
        c = fitting[i]
        d = rows[c]
        assert d is not None
        added = 0
        while True:
            visit(i + 1, free, chosen)
            if added == present[c] or any(d[r] > free[r] + 1e-9 for r in range(3)):
                break
            free = tuple(free[r] - d[r] for r in range(3))
            chosen.append(c)
            added += 1
        del chosen[len(chosen) - added :]

    visit(0, capacity, [])
    return out


def _composition_lps(
    catalog: Catalog,
    rows: Sequence[Row],
    workloads: Sequence[str],
    present: Sequence[int],
    truth: ThroughputTable,
    limit: int,
    need: Sequence[float] | None = None,
) -> tuple[float, float]:
    """$/h: the configuration LP of the tasks present, without and with interference.

    Each class must be covered `need` times (default: its count present; in
    task-hours, the value is in dollars), and a composition holds at most
    `present` tasks of it.
    """
    need = present if need is None else need
    index = [c for c, n in enumerate(present) if n]
    row_of = {c: i for i, c in enumerate(index)}
    models = [covering_model([need[c] for c in index]) for _ in range(2)]
    for k, itype in enumerate(catalog.types):
        on_k = [None if r is None else r[k] for r in rows]
        for members in _compositions(itype.capacity.as_tuple(), on_k, present, limit):
            plain: dict[int, float] = {}
            slowed: dict[int, float] = {}
            for m, c in enumerate(members):
                others = [workloads[o] for n, o in enumerate(members) if n != m]
                plain[row_of[c]] = plain.get(row_of[c], 0.0) + 1.0
                slowed[row_of[c]] = slowed.get(row_of[c], 0.0) + truth.throughput(
                    workloads[c], others
                )
            for model, column in zip(models, (plain, slowed), strict=True):
                if any(column.values()):
                    model.addCol(
                        itype.hourly_cost,
                        0.0,
                        highspy.kHighsInf,
                        len(column),
                        np.array(list(column), np.int32),
                        np.array(list(column.values())),
                    )
    values = []
    for model in models:
        model.run()
        if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise _TooMany  # cannot happen for tasks that fit some type; stay valid anyway
        values.append(model.getObjectiveValue())
    return values[0], values[1]
