"""The clairvoyant fluid bound of a trace: how far every scheduler is from the limit.

Integrate over time the LP bound (`autoscaler.lp`) for the tasks present at
each moment, job j being present during [arrival, arrival + duration] — no
start-up delays, no interference, no migrations, perfect packing of resources
across instances of a type. No scheduler can cost less. The classes are the
trace's distinct demand vectors, fixed for the whole trace, so every solve
after the first is a warm re-solve with new counts. Anti-affinity limits are
left out: the bound only gets lower, and stays valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec
from autoscaler.lp import LPClass, ShadowPricer


def job_duration_s(job: JobSpec) -> float:
    """The job's running time alone at full speed, as the trace gives it."""
    facts = job.trace
    if facts.duration_s is not None:
        return facts.duration_s
    if facts.total_iters is not None and job.full_throughput:
        return facts.total_iters / job.full_throughput
    raise ValueError(f"job {job.job_id!r} has neither a duration nor total_iters")


def clairvoyant_bound(jobs: Sequence[JobSpec], catalog: Catalog) -> float:
    """Dollars: ∫ LP bound(tasks present at t) dt over the trace."""
    keys: dict[tuple, int] = {}
    per_job: list[dict[int, int]] = []
    for job in jobs:
        counts: dict[int, int] = {}
        for task in job.tasks:
            c = keys.setdefault(task.demands, len(keys))
            counts[c] = counts.get(c, 0) + 1
        per_job.append(counts)
    first_task = {}
    for job in jobs:
        for task in job.tasks:
            first_task.setdefault(task.demands, task)
    demands = []
    for key in keys:
        task = first_task[key]
        row = []
        for itype in catalog.types:
            d = task.demand_on(itype.family)
            row.append(None if d is None else d.as_tuple())
        demands.append(tuple(row))

    events: dict[float, list[tuple[int, int]]] = {}  # time -> (job index, +1 or -1)
    for j, job in enumerate(jobs):
        start = job.trace.arrival_time_s
        events.setdefault(start, []).append((j, 1))
        events.setdefault(start + job_duration_s(job), []).append((j, -1))

    pricer = ShadowPricer()
    present = [0] * len(keys)
    total = 0.0
    times = sorted(events)
    for now, after in pairwise(times):
        for j, sign in events[now]:
            for c, n in per_job[j].items():
                present[c] += sign * n
        if any(present):
            classes = [LPClass(d, n) for d, n in zip(demands, present, strict=True)]
            total += pricer.solve(catalog, classes).lower_bound * (after - now) / 3600.0
    return total
