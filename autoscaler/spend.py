"""Who spent what: the ledger's dollars split among jobs, and what budgets read of it.

**Who pays for a shared instance.** Each second of an instance's billed uptime
(the ledger) is split among the tasks on it at that second (the placements
ledger) in proportion to their dominant share — the largest of their GPU, CPU
and RAM demand over the instance type's capacity, as in DRF (Ghodsi et al.,
*Dominant Resource Fairness*, NSDI 2011, §4). Seconds with no task on the
instance (booting, draining, idle) are charged to no job. Job costs plus idle
equal the ledger's total.

One rule for every reader: `cost-report --by job|user|team`, a team's daily
budget and a job's `max_cost` all read the same split (`Spending`), so what a
budget stops a team at is what the report shows it spent.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec
from autoscaler.store import Placement, UptimeInterval

DAY_S = 86400.0


def day_start(now: float) -> float:
    """00:00 UTC of the day `now` (epoch seconds) falls in: when daily budgets reset."""
    return now - now % DAY_S


def attribute(
    uptime: Iterable[UptimeInterval],
    placements: Iterable[Placement],
    weight: Callable[[Placement, str], float],
    t0: float,
    t1: float,
) -> tuple[dict[str, float], float]:
    """Dollars billed within [t0, t1], split among jobs: ({job: $}, idle $).

    `weight(placement, instance_type)` is a task's share weight on its instance
    (`dominant_share`); each stretch of uptime is split among the placements
    overlapping it, pro rata.
    """
    by_instance: dict[str, list[Placement]] = defaultdict(list)
    for p in placements:
        by_instance[p.instance_id].append(p)
    jobs: dict[str, float] = defaultdict(float)
    idle = 0.0
    for interval in uptime:
        start = max(interval.start, t0)
        end = min(t1 if interval.end is None else interval.end, t1)
        if end <= start:
            continue
        here = [
            p
            for p in by_instance.get(interval.instance_id, ())
            if p.start < end and (p.end is None or p.end > start)
        ]
        cuts = sorted(
            {start, end, *(max(p.start, start) for p in here)}
            | {min(p.end, end) for p in here if p.end is not None}
        )
        rate = interval.hourly_price / 3600.0
        for a, b in itertools.pairwise(cuts):
            if b <= a:
                continue
            present = [p for p in here if p.start <= a and (p.end is None or p.end >= b)]
            dollars = (b - a) * rate
            weights = [max(weight(p, interval.instance_type), 0.0) for p in present]
            total = sum(weights)
            if not present or total <= 0:
                idle += dollars
                continue
            for p, w in zip(present, weights, strict=True):
                jobs[p.job_id] += dollars * w / total
    return dict(jobs), idle


def dominant_share(
    specs: Mapping[str, JobSpec], catalog: Catalog
) -> Callable[[Placement, str], float]:
    """The DRF weight of a placement: its largest demand over its instance's capacity."""
    tasks = {t.task_id: t for job in specs.values() for t in job.tasks}

    def weight(p: Placement, instance_type: str) -> float:
        task = tasks.get(p.task_id)
        if task is None or instance_type not in catalog:
            return 1.0
        itype = catalog[instance_type]
        demand = task.demand_on(itype.family)
        if demand is None:
            return 1.0
        shares = [d / c for d, c in zip(demand, itype.capacity, strict=True) if c > 0]
        return max(shares, default=1.0) or 1.0

    return weight


@dataclass(frozen=True, slots=True)
class Spending:
    """What the budgets of a round read: each team's attributed spend since 00:00 UTC
    (daily budgets) and each job's since it was submitted (`max_cost`), in dollars."""

    team_today: Mapping[str, float] = field(default_factory=dict)
    job_total: Mapping[str, float] = field(default_factory=dict)


def spending(
    uptime: Iterable[UptimeInterval],
    placements: Iterable[Placement],
    specs: Mapping[str, JobSpec],
    teams: Mapping[str, str],
    catalog: Catalog,
    now: float,
) -> Spending:
    """`Spending` as of `now` from the two ledgers: `specs` the jobs whose tasks are in
    `placements`, `teams` each job's team at submission. A job's total is right when
    `placements` holds every placement since it was submitted (those since any earlier
    time do); a team's spend today, when it holds those since 00:00 UTC."""
    uptime, placements = list(uptime), list(placements)
    weight = dominant_share(specs, catalog)
    total, _ = attribute(uptime, placements, weight, 0.0, now)
    today, _ = attribute(uptime, placements, weight, day_start(now), now)
    by_team: dict[str, float] = defaultdict(float)
    for job_id, dollars in today.items():
        by_team[teams.get(job_id, "")] += dollars
    return Spending(dict(by_team), total)
