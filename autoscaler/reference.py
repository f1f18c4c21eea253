"""A literal, task-by-task transcription of Algorithm 1 (Eva §4.2).

It is O(types · tasks²) and exists for two reasons only: as the oracle the
class-batched implementation in `reconfiguration.py` is tested against (same
tie-breaking, so the same result), and as the baseline the benchmarks measure
speed-ups against. Planners never call it.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.pricing import JobSlowdown, PriceBook, identical_tasks, slowdown_charge, tnrp
from autoscaler.reconfiguration import VALUE_TOLERANCE, ClassKey, alignment, class_key
from autoscaler.resources import fits
from autoscaler.throughput import ThroughputTable

#: A task, its reservation price, the slowdown charge of its job and its class key.
_Task = tuple[TaskSpec, float, float | None, ClassKey]


def algorithm1(
    jobs: tuple[JobSpec, ...],
    catalog: Catalog,
    table: ThroughputTable,
    job_slowdown: JobSlowdown = "by-job",
) -> Configuration:
    """Full Reconfiguration of `jobs` onto an empty cluster, one task at a time."""
    prices = PriceBook(catalog)
    tasks: list[_Task] = []
    for job in jobs:
        jrp = prices.job_rp(job)
        charge = slowdown_charge(job, jrp, job_slowdown)
        same = identical_tasks(job)
        for t in job.tasks:
            tasks.append(
                (t, prices.task_rp(t), charge, class_key(t, job, jrp, not table.is_neutral, same))
            )
    limit = {j.job_id: j.anti_affinity for j in jobs}
    rank = {k: i for i, k in enumerate(sorted({k for *_, k in tasks}))}
    types = catalog.types

    def value(members: list[int]) -> float:
        total = 0.0
        for i in members:
            t, rp, jrp, _ = tasks[i]
            others = [tasks[j][0].workload for j in members if j != i]
            total += tnrp(rp, table.throughput(t.workload, others), jrp)
        return total

    unassigned = list(range(len(tasks)))
    result: list[Instance] = []
    for k, itype in enumerate(types):
        cap = itype.capacity.as_tuple()
        while True:
            members: list[int] = []
            free = list(cap)
            current = 0.0
            while True:
                best, best_key, best_value = -1, None, 0.0
                for i in unassigned:
                    if i in members:
                        continue
                    job_id = tasks[i][0].job_id
                    most = limit[job_id]
                    if (
                        most is not None
                        and sum(tasks[j][0].job_id == job_id for j in members) >= most
                    ):
                        continue
                    d = tasks[i][0].demand_on(itype.family)
                    if d is None:
                        continue
                    dv = d.as_tuple()
                    if not fits(dv, free):
                        continue
                    v = value([*members, i])
                    key = (
                        round(v / VALUE_TOLERANCE),
                        False,
                        alignment(dv, free, cap),
                        -rank[tasks[i][3]],
                    )
                    if best_key is None or key > best_key:
                        best, best_key, best_value = i, key, v
                if best < 0 or best_value < current - VALUE_TOLERANCE:
                    break
                members.append(best)
                d = tasks[best][0].demand_on(itype.family)
                assert d is not None
                free = [f - x for f, x in zip(free, d.as_tuple(), strict=True)]
                current = best_value
            if not members or current < itype.hourly_cost - VALUE_TOLERANCE:
                break
            for i in members:
                unassigned.remove(i)
            target = _cheapest_fitting(members, tasks, types, k)
            result.append(
                Instance(None, target, tuple(sorted(tasks[i][0].task_id for i in members)))
            )
    assert not unassigned, "every task fits its reservation-price type"
    return Configuration(tuple(result))


def _cheapest_fitting(
    members: Sequence[int], tasks: Sequence[_Task], types: Sequence[InstanceType], k: int
) -> InstanceType:
    """The cheapest type below type k that holds all of `members` (type k if none)."""
    for j in range(len(types) - 1, k, -1):
        itype = types[j]
        if itype.hourly_cost >= types[k].hourly_cost:
            break
        sums = [0.0, 0.0, 0.0]
        for i in members:
            d = tasks[i][0].demand_on(itype.family)
            if d is None:
                break
            sums = [s + x for s, x in zip(sums, d.as_tuple(), strict=True)]
        else:
            if fits(sums, itype.capacity):
                return itype
    return types[k]
