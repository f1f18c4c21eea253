"""The dashboard's documents: what each page shows, built on the command line's own.

Every figure a command also prints comes from that command's document builder
(`app.reports`: `cluster_status`, `job_list`, `job_detail`, `cost_report`,
`timeline`), called through the submission API's own methods, so a page and
`autoscaler status`/`cost-report` show the same numbers. What is added here is
only what no command prints: tasks grouped on their instances with their
measured throughput, guardrail headroom, the series the charts draw, and the
decision log filtered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from app.reports import ec2_type_of, market_of, spend_by, timeline
from autoscaler.catalog import Catalog
from autoscaler.cloud import Guardrails
from autoscaler.store import BILLED_STATUSES, JobRecord, RoundRecord, Store

#: What the Jobs page calls a job still to run or running.
UNFINISHED = ("queued", "running")


def now_document(
    status: Mapping[str, Any],
    store: Store,
    catalog: Catalog,
    guardrails: Guardrails,
    now: float,
) -> dict[str, Any]:
    """The Now page: `status` (the `ClusterStatus` document, as it is) plus each instance's
    capacity type and its tasks with their measured throughput, the last round's $/h
    beside no packing and the LP bound (Eva §4.2, §5), and each guardrail's headroom."""
    snapshot = store.snapshot(with_throughput=False)
    by_instance: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in snapshot.tasks.values():
        if task.instance_id is not None and task.status in ("starting", "running", "checkpointing"):
            by_instance[task.instance_id].append(
                {
                    "task": task.task_id,
                    "job": task.job_id,
                    "status": task.status,
                    "throughput": task.throughput,
                    "progress": task.progress,
                }
            )
    instances = []
    groups: dict[tuple[str, str], int] = defaultdict(int)
    for entry in status["instances"]:
        # The market as `status` reads it (`reports.market_of`, the offering's name), so an
        # offering gone from today's catalog still shows as what it was bought as.
        known = entry["type"] in catalog
        market = entry.get("market") or market_of(entry["type"])
        ec2_type = catalog[entry["type"]].launch_type if known else ec2_type_of(entry["type"])
        groups[(ec2_type, market)] += 1
        instances.append(
            {
                **entry,
                "ec2_type": ec2_type,
                "market": market,
                "task_detail": sorted(by_instance.get(entry["instance"], ()), key=_task_key),
            }
        )
    rounds = store.rounds(limit=1)
    numbers = rounds[-1].numbers if rounds else {}
    hourly = status["hourly_cost"]
    return {
        **status,
        "instances": instances,
        "instances_by_type": [
            {"type": t, "market": m, "count": n} for (t, m), n in sorted(groups.items())
        ],
        "hourly": {
            "now": hourly,
            "planned": numbers.get("hourly_cost"),
            "no_packing": numbers.get("no_packing_hourly_cost"),
            "lower_bound": numbers.get("lower_bound_hourly_cost"),
        },
        "headroom": headroom(store, guardrails, hourly, now),
    }


def _task_key(task: Mapping[str, Any]) -> str:
    return str(task["task"])


def headroom(store: Store, guardrails: Guardrails, hourly: float, now: float) -> list[dict]:
    """Each set guardrail: its limit, what is used, and what is left (`Guardrails`)."""
    rows = []
    if guardrails.max_instances is not None:
        live = sum(1 for i in store.instances() if i.status in BILLED_STATUSES)
        rows.append(_row("max_instances", guardrails.max_instances, live))
    if guardrails.max_hourly_spend is not None:
        rows.append(_row("max_hourly_spend", guardrails.max_hourly_spend, hourly))
    if guardrails.max_daily_spend is not None:
        day = store.cost_between(now - 86400.0, now)
        rows.append(_row("max_daily_spend", guardrails.max_daily_spend, day))
    return rows


def _row(name: str, limit: float, used: float) -> dict[str, Any]:
    return {
        "guardrail": name,
        "limit": limit,
        "used": round(used, 6),
        "left": round(limit - used, 6),
        "used_share": round(used / limit, 4) if limit > 0 else None,
    }


def jobs_document(
    listed: Mapping[str, Any],
    per_job: Mapping[str, float],
    idle: float,
    records: Mapping[str, JobRecord],
) -> dict[str, Any]:
    """The Jobs page: the `ListJobs` document with each job's attributed cost so far
    (`cost_report`'s split, `spend_of_jobs`) and, when its total work is known and it has
    made progress, the cost expected at completion at the pace so far; the spend by user
    and by team as `cost-report --by` prints them."""
    jobs = []
    for job in listed["jobs"]:
        cost = round(per_job.get(job["job"], 0.0), 6)
        record = records.get(job["job"])
        total = record.spec.trace.total_iters if record is not None else None
        if job["status"] == "completed":
            expected: float | None = cost
        elif total and job["progress"] > 0:
            expected = round(cost * total / job["progress"], 6)
        else:
            expected = None
        jobs.append({**job, "cost": cost, "expected_cost": expected, "total_iters": total})
    counts: dict[str, int] = defaultdict(int)
    for job in jobs:
        counts[job["status"]] += 1
    return {
        "jobs": jobs,
        "counts": dict(sorted(counts.items())),
        "spend_by_user": _rounded(spend_by(per_job, records, "user")),
        "spend_by_team": _rounded(spend_by(per_job, records, "team")),
        "spend_on_jobs": round(sum(per_job.values()), 6),
        "idle": round(idle, 6),
    }


def _rounded(spend: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(spend.items())}


def job_timeline(detail: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A job's timeline from its `GetJob` document: submission, start, each placement (a
    move when a task changes instance), checkpoints, the end; oldest first."""
    events: list[dict[str, Any]] = [
        {"at": detail["submitted_at"], "event": "submitted", "what": detail["job"]}
    ]
    if detail.get("started_at"):
        events.append({"at": detail["started_at"], "event": "started", "what": ""})
    for task in detail.get("task_list", ()):
        previous = None
        for placement in task.get("placements", ()):
            kind = "placed" if previous is None else "moved"
            where = placement["instance"]
            what = f"{task['task']} on {where} (attempt {placement['attempt']})"
            if previous is not None:
                what = f"{task['task']} {previous} → {where} (attempt {placement['attempt']})"
            events.append({"at": placement["start"], "event": kind, "what": what})
            if placement.get("end") is not None:
                events.append(
                    {"at": placement["end"], "event": "left", "what": f"{task['task']} off {where}"}
                )
            previous = where
        if task.get("checkpoint"):
            events.append(
                {"at": None, "event": "checkpoint", "what": f"{task['task']}: {task['checkpoint']}"}
            )
        if task.get("failure"):
            events.append(
                {
                    "at": None,
                    "event": f"{task['failure']} failure",
                    "what": f"{task['task']}: {task.get('reason', '')}",
                }
            )
    if detail.get("finished_at"):
        events.append(
            {"at": detail["finished_at"], "event": detail["status"], "what": detail["reason"]}
        )
    return sorted(events, key=lambda e: (e["at"] is None, e["at"] or 0.0))


def spend_series(
    store: Store, rounds: Sequence[RoundRecord], since: float, until: float
) -> dict[str, list]:
    """The Spend chart's series: the ledger's $/h and cumulative $ at every change
    (`app.reports.timeline`, what `cost-report --plot` draws), and each round's planned
    $/h, no-packing $/h and LP lower bound, as column arrays (uPlot's data layout)."""
    uptime = store.uptime()
    # From the first billed second, not from `since` = 0 (the epoch) when none is given.
    since = max(since, min((i.start for i in uptime), default=since))
    points = timeline(uptime, since, until)
    planned = [r for r in rounds if r.numbers.get("hourly_cost") is not None and r.at >= since]
    return {
        "t": [round(p[0], 3) for p in points],
        "hourly": [round(p[1], 6) for p in points],
        "spent": [round(p[2], 6) for p in points],
        "round_t": [round(r.at, 3) for r in planned],
        "round_hourly": [r.numbers.get("hourly_cost") for r in planned],
        "round_no_packing": [r.numbers.get("no_packing_hourly_cost") for r in planned],
        "round_lower_bound": [r.numbers.get("lower_bound_hourly_cost") for r in planned],
    }


def decisions_document(
    rounds: Sequence[RoundRecord],
    *,
    kind: str = "",
    outcome: str = "",
    text: str = "",
    chosen: str = "",
) -> dict[str, Any]:
    """The decision log, newest round first: each round's choice and reason and its
    actions, keeping only the actions (and rounds) that match every filter given."""
    needle = text.lower()
    out = []
    for r in reversed(rounds):
        if chosen and r.chosen != chosen:
            continue
        actions = [
            {
                "kind": a.kind,
                "target": a.target,
                "outcome": a.outcome,
                "reason": a.reason,
                "message": a.message,
            }
            for a in r.actions
            if (not kind or a.kind == kind)
            and (not outcome or a.outcome == outcome)
            and (
                not needle
                or needle in a.reason.lower()
                or needle in a.target.lower()
                or needle in a.message.lower()
            )
        ]
        filtered = bool(kind or outcome or needle)
        if filtered and not actions and not (needle and needle in r.reason.lower()):
            continue
        out.append(
            {
                "round": r.round_id,
                "at": r.at,
                "planner": r.planner,
                "chosen": r.chosen,
                "reason": r.reason,
                "hourly_cost": r.numbers.get("hourly_cost"),
                "lower_bound_hourly_cost": r.numbers.get("lower_bound_hourly_cost"),
                "infeasible": r.numbers.get("infeasible", {}),
                "actions": actions,
            }
        )
    return {"rounds": out}
