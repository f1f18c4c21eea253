"""What users read about a running cluster: status, jobs, one job, and costs.

Every report is a JSON-ready document computed from the `Store` alone (and an
offline catalog for prices): it works whether the daemon runs or not, and
makes no cloud call. The command line prints the same documents as tables,
or writes them with `--json`; the submission API returns them as they are.

**Who pays for a shared instance.** Each second of an instance's billed uptime
(the ledger) is split among the tasks on it at that second (the placements
ledger) in proportion to their dominant share — the largest of their GPU,
CPU and RAM demand over the instance type's capacity, as in DRF. Seconds with
no task on the instance (booting, draining, idle) are charged to no job: the
report shows them as idle. Job costs plus idle equal the ledger's total.

**What no packing would have cost** is each task's reservation price (its
cheapest instance type alone, Eva §4.2) for as long as it occupied an
instance — the bill of one instance per task, start-up delays aside.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoscaler.catalog import Catalog
from autoscaler.decide import ControlOptions, Planner, decide
from autoscaler.jobs import JobSpec
from autoscaler.pricing import PriceBook
from autoscaler.store import (
    BILLED_STATUSES,
    JobRecord,
    Placement,
    StateSnapshot,
    Store,
    TaskRecord,
    UptimeInterval,
)


def hourly_cost_now(store: Store) -> float:
    """$/h of every instance billed now, at the prices recorded with their requests."""
    return sum(i.hourly_price for i in store.instances() if i.status in BILLED_STATUSES)


# -- cost attribution -------------------------------------------------------------------------


def attribute(
    uptime: Iterable[UptimeInterval],
    placements: Iterable[Placement],
    weight: Callable[[Placement, str], float],
    t0: float,
    t1: float,
) -> tuple[dict[str, float], float]:
    """Dollars billed within [t0, t1], split among jobs: ({job: $}, idle $).

    `weight(placement, instance_type)` is a task's share weight on its instance
    (see the module docstring); each stretch of uptime is split among the
    placements overlapping it, pro rata.
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


def cost_report(
    store: Store,
    catalog: Catalog,
    now: float,
    *,
    since: float = 0.0,
    planner: Planner | None = None,
    options: ControlOptions | None = None,
    hypothetical: Sequence[JobSpec] = (),
) -> dict[str, Any]:
    """Spend so far (per type, per job, idle), $/h now, what no packing would cost,
    the LP lower bound now, and — with `hypothetical` jobs — what adding them would do."""
    uptime = store.uptime()
    placements = store.placements(since)
    records = {j.job_id: j for j in store.jobs()}
    specs = {job_id: r.spec for job_id, r in records.items()}
    total = sum(i.cost(since, now) for i in uptime)
    per_type: dict[str, float] = defaultdict(float)
    for interval in uptime:
        per_type[interval.instance_type] += interval.cost(since, now)
    per_job, idle = attribute(uptime, placements, dominant_share(specs, catalog), since, now)
    prices = PriceBook(catalog)
    rp = {t.task_id: _rp(prices, t) for job in specs.values() for t in job.tasks}
    no_packing_so_far = sum(
        rp.get(p.task_id, 0.0) * max(0.0, min(now, p.end or now) - max(since, p.start)) / 3600.0
        for p in placements
    )
    snapshot = store.snapshot()
    active = [j.spec for j in snapshot.jobs]
    now_hourly = hourly_cost_now(store)
    no_packing_now = sum(rp.get(t.task_id, 0.0) for job in active for t in job.tasks)
    document: dict[str, Any] = {
        "since": since,
        "until": now,
        "spend": round(total, 6),
        "spend_by_type": {k: round(v, 6) for k, v in sorted(per_type.items()) if v > 0},
        "spend_by_job": {k: round(v, 6) for k, v in sorted(per_job.items())},
        "spend_by_user": _rounded(spend_by(per_job, records, "user")),
        "spend_by_team": _rounded(spend_by(per_job, records, "team")),
        "idle": round(idle, 6),
        "attribution": "each second of an instance's uptime split among the tasks on it by "
        "dominant resource share; seconds with no task are idle",
        "hourly_cost_now": round(now_hourly, 6),
        "no_packing_hourly_cost_now": round(no_packing_now, 6),
        "no_packing_spend": round(no_packing_so_far, 6),
        # Saved = what no packing would have cost − what was actually spent, idle spend
        # included: idle seconds are a cost of packing (booting, draining, waiting).
        "savings": round(no_packing_so_far - total, 6),
        "savings_parts": {
            "no_packing_spend": round(no_packing_so_far, 6),
            "spend_on_tasks": round(total - idle, 6),
            "idle": round(idle, 6),
        },
        "savings_hourly_now": round(no_packing_now - now_hourly, 6),
        "lower_bound_hourly_cost_now": None,
        "jobs": {
            k: {"name": records[k].spec.name, "status": records[k].status}
            for k in sorted(per_job)
            if k in records
        },
    }
    if planner is not None and active:
        view_decision = _plan(snapshot, catalog, planner, options, now, ())
        if view_decision.plan is not None:
            document["lower_bound_hourly_cost_now"] = view_decision.plan.lower_bound_hourly_cost
    if hypothetical:
        if planner is None:
            raise ValueError("a dry run needs a planner")
        document["dry_run"] = dry_run(snapshot, catalog, planner, options, now, hypothetical)
        document["dry_run"]["hourly_cost_before"] = round(now_hourly, 6)
    return document


#: The team column of a job whose owner had no team when it was submitted.
NO_TEAM_LABEL = "(no team)"


def spend_of_jobs(
    store: Store, catalog: Catalog, records: Mapping[str, JobRecord], since: float, now: float
) -> tuple[dict[str, float], float]:
    """({job: $ attributed}, idle $) within [since, now]: `cost_report`'s split."""
    specs = {job_id: r.spec for job_id, r in records.items()}
    return attribute(
        store.uptime(), store.placements(since), dominant_share(specs, catalog), since, now
    )


def spend_by(
    per_job: Mapping[str, float], records: Mapping[str, JobRecord], key: str
) -> dict[str, float]:
    """Each job's attributed spend summed by its owner (`key` "user") or by the team it
    was submitted under ("team"): the same total as by job, grouped otherwise."""
    grouped: dict[str, float] = defaultdict(float)
    for job_id, spent in per_job.items():
        record = records.get(job_id)
        if record is None:
            name = "?"
        elif key == "user":
            name = record.owner
        else:
            name = record.team or NO_TEAM_LABEL
        grouped[name] += spent
    return dict(grouped)


def _rounded(spend: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(spend.items())}


def _rp(prices: PriceBook, task: Any) -> float:
    try:
        return prices.task_rp(task)
    except (KeyError, ValueError):
        return 0.0  # fits no type of today's catalog


def dry_run(
    snapshot: StateSnapshot,
    catalog: Catalog,
    planner: Planner,
    options: ControlOptions | None,
    now: float,
    jobs: Sequence[JobSpec],
) -> dict[str, Any]:
    """The next round's decision if `jobs` were submitted now — nothing recorded or done."""
    decision = _plan(snapshot, catalog, planner, options, now, jobs)
    launches: dict[str, int] = defaultdict(int)
    for launch in decision.launches:
        launches[launch.instance_type] += 1
    plan = decision.plan
    return {
        "jobs": [j.job_id for j in jobs],
        "tasks": sum(len(j.tasks) for j in jobs),
        "chosen": decision.chosen,
        "reason": decision.reason,
        "launch": dict(sorted(launches.items())),
        "launch_hourly_cost": round(sum(lc.hourly_price for lc in decision.launches), 6),
        "drain": [d.instance_id for d in decision.drains],
        "moves": sum(1 for m in decision.moves if m.kind == "migrate"),
        "refused": [f"{r.instance_type}: {r.message}" for r in decision.refused],
        "infeasible": dict(decision.infeasible),
        "hourly_cost_after": None if plan is None else round(plan.hourly_cost, 6),
        "no_packing_hourly_cost_after": None
        if plan is None
        else round(plan.no_packing_hourly_cost, 6),
        "lower_bound_hourly_cost_after": None if plan is None else plan.lower_bound_hourly_cost,
    }


def _plan(
    snapshot: StateSnapshot,
    catalog: Catalog,
    planner: Planner,
    options: ControlOptions | None,
    now: float,
    extra: Sequence[JobSpec],
):
    """decide() on the snapshot, with `extra` jobs added as if just submitted."""
    if extra:
        taken = {j.job_id for j in snapshot.jobs}
        clash = [j.job_id for j in extra if j.job_id in taken]
        if clash:
            raise ValueError(f"job {clash[0]!r} is already in the cluster")
        jobs = snapshot.jobs + tuple(JobRecord(j, "queued", "dry-run", now) for j in extra)
        tasks = dict(snapshot.tasks)
        for job in extra:
            for t in job.tasks:
                tasks[t.task_id] = TaskRecord(t.task_id, job.job_id, updated_at=now)
        snapshot = replace(snapshot, jobs=jobs, tasks=tasks, job_events=snapshot.job_events + 1)
    return decide(snapshot, catalog, (), options or ControlOptions(), planner=planner, now=now)


# -- status and jobs -------------------------------------------------------------------------------


def cluster_status(store: Store, now: float) -> dict[str, Any]:
    """Instances, $/h, tasks by status, and the last round's choice and why."""
    snapshot = store.snapshot(with_throughput=False)
    on: dict[str, list[str]] = defaultdict(list)
    for task in snapshot.tasks.values():
        if task.instance_id is not None and task.status in ("starting", "running", "checkpointing"):
            on[task.instance_id].append(task.task_id)
    instances = [
        {
            "instance": i.instance_id,
            "type": i.instance_type,
            "status": i.status,
            "zone": i.zone,
            "hourly_price": i.hourly_price,
            "worker": "lost" if i.lost_at else ("ready" if i.ready_at else "not registered"),
            "uptime_s": round(now - i.requested_at, 3),
            "tasks": sorted(on.get(i.instance_id, ())),
            "reason": i.reason,
        }
        for i in snapshot.instances
    ]
    by_status: dict[str, int] = defaultdict(int)
    for task in snapshot.tasks.values():
        by_status[task.status] += 1
    jobs: dict[str, int] = defaultdict(int)
    for job in store.jobs():
        jobs[job.status] += 1
    rounds = store.rounds(limit=1)
    last = None
    if rounds:
        r = rounds[-1]
        last = {
            "at": r.at,
            "planner": r.planner,
            "chosen": r.chosen,
            "reason": r.reason,
            "hourly_cost": r.numbers.get("hourly_cost"),
            "lower_bound_hourly_cost": r.numbers.get("lower_bound_hourly_cost"),
            "infeasible": r.numbers.get("infeasible", {}),
            # Types held back after boots that never registered, with the cause.
            "held": r.numbers.get("held", {}),
            "actions": [
                {"kind": a.kind, "target": a.target, "outcome": a.outcome, "reason": a.reason}
                for a in r.actions
                if a.kind in ("launch", "terminate", "report")
            ],
        }
    return {
        "at": now,
        "hourly_cost": round(hourly_cost_now(store), 6),
        "instances": instances,
        "tasks": dict(sorted(by_status.items())),
        "jobs": dict(sorted(jobs.items())),
        "last_round": last,
    }


def job_list(
    store: Store,
    statuses: Iterable[str] | None = None,
    limit: int = 0,
    *,
    records: Sequence[JobRecord] | None = None,
) -> dict[str, Any]:
    """Every job (of `statuses`), oldest first; `records`: the store's jobs, if already read."""
    wanted = set(statuses or ())
    if records is None:
        records = store.jobs(sorted(wanted) if wanted else None)
    elif wanted:
        records = [r for r in records if r.status in wanted]
    if limit:
        records = records[-limit:]
    tasks = store.tasks_of_jobs(r.job_id for r in records)  # one query, not one a job
    return {"jobs": [_job_summary(r, tasks[r.job_id]) for r in records]}


def _job_summary(record: JobRecord, tasks: Sequence[TaskRecord]) -> dict[str, Any]:
    return {
        "job": record.job_id,
        "name": record.spec.name,
        "owner": record.owner,
        "status": record.status,
        "tasks": len(tasks),
        "running": sum(1 for t in tasks if t.status == "running"),
        "progress": max((t.progress for t in tasks), default=0.0),
        "attempts": sum(t.attempt for t in tasks),  # starts of all its tasks
        "moves": sum(t.moves for t in tasks),  # attempts the plan moved elsewhere
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "reason": record.reason,
    }


def job_detail(store: Store, job_id: str, catalog: Catalog, now: float) -> dict[str, Any] | None:
    """One job: its tasks, where each runs, progress, throughput, moves, cost so far."""
    record = store.job(job_id)
    if record is None:
        return None
    placements = [p for p in store.placements() if p.job_id == job_id]
    instances = {p.instance_id for p in placements}
    uptime = [i for i in store.uptime() if i.instance_id in instances]
    everyone = [p for p in store.placements() if p.instance_id in instances]
    specs = {j.job_id: j.spec for j in store.jobs()}
    per_job, _ = attribute(uptime, everyone, dominant_share(specs, catalog), 0.0, now)
    moves: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in placements:
        moves[p.task_id].append(
            {"instance": p.instance_id, "attempt": p.attempt, "start": p.start, "end": p.end}
        )
    tasks = []
    for task in store.tasks_of(job_id):
        history = moves.get(task.task_id, [])
        tasks.append(
            {
                "task": task.task_id,
                "status": task.status,
                "instance": task.instance_id,
                "target": task.target_instance_id,
                "attempt": task.attempt,
                "failures": task.failures,  # those counted toward max_attempts
                "moves": task.moves,  # attempts the plan moved elsewhere
                "retries": task.retries,  # attempts that failed and were started again
                "failure": task.failure,  # class of the latest failure
                "retry_at": task.retry_at,  # a transient failure's back-off ends
                "progress": task.progress,
                "throughput": task.throughput,
                "checkpoint": task.checkpoint,
                "reason": task.reason,
                "migrations": max(0, len(history) - 1),  # instance changes, whatever the cause
                "placements": history,
            }
        )
    return {
        **_job_summary(record, store.tasks_of(job_id)),
        "full_throughput": record.spec.full_throughput or record.solo_throughput,
        "cost": round(per_job.get(job_id, 0.0), 6),
        "task_list": tasks,
    }


def timeline(
    uptime: Sequence[UptimeInterval], since: float, until: float
) -> list[tuple[float, float, float]]:
    """(time, $/h, cumulative $) at every change of the ledger, for plots."""
    events: list[tuple[float, float]] = []
    for i in uptime:
        start, end = max(i.start, since), min(i.end if i.end is not None else until, until)
        if end > start:
            events.append((start, i.hourly_price))
            if end < until:  # still billing at `until`: its rate shows there
                events.append((end, -i.hourly_price))
    events.sort()
    points: list[tuple[float, float, float]] = []
    rate = spent = 0.0
    last = since
    times = sorted({t for t, _ in events} | {since, until})
    for t in times:
        spent += rate * (t - last) / 3600.0
        lo = bisect.bisect_left(events, (t, float("-inf")))
        hi = bisect.bisect_right(events, (t, float("inf")))
        rate += sum(delta for _, delta in events[lo:hi])
        points.append((t, max(rate, 0.0), spent))
        last = t
    return points
