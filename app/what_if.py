"""What the cluster's own history would have cost under other schedulers.

`autoscaler replay --from-cluster` and `autoscaler cost-report --what-if` read
the cluster's state database (`simulator.history.cluster_history`: its jobs,
their measured work and solo speeds, the co-location table it learned, the
prices it paid) and replay it through the same control loop under each
scheduler, beside what the ledger billed over the same window.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.config import ClusterConfig
from app.table import dollars
from simulator.history import ClusterHistory, cluster_history
from simulator.replay import ReplayResult


def load_history(config: ClusterConfig, since: float, until: float) -> ClusterHistory:
    """The cluster's history in [since, until], from its database and offline catalog."""
    from app.wiring import offline_catalog, open_state

    catalog = offline_catalog(config)
    store = open_state(config)
    try:
        return cluster_history(
            store,
            catalog,
            since=since,
            until=until,
            default_throughput=config.planner.default_throughput,
        )
    finally:
        store.close()


def nothing_to_replay(history: ClusterHistory) -> str:
    """The one line said when the window holds no job to replay."""
    window = f"between {_when(history.since)} and {_when(history.until)}"
    if history.left_out:
        return (
            f"nothing to replay: the {len(history.left_out)} job(s) submitted {window} "
            f"did no measurable work (first: {history.left_out[0][0]}: {history.left_out[0][1]})"
        )
    return f"nothing to replay: no job was submitted to the cluster {window}"


def cluster_document(history: ClusterHistory, results: Mapping[str, ReplayResult]) -> dict:
    """What the cluster paid beside the replays, for `--json` and the tables."""
    ran = history.scheduler
    same = results.get(ran) if ran is not None else None
    return {
        "since": history.since,
        "until": history.until,
        "jobs": len(history.jobs),
        "tasks": sum(len(j.tasks) for j in history.jobs),
        "left_out": [{"job_id": j, "reason": why} for j, why in history.left_out],
        "jobs_submitted_earlier_running_in_window": history.earlier_jobs,
        "scheduler": ran,
        "paid": round(history.spend, 6),
        "paid_attribution": "the cost ledger within the window, idle instances included",
        "replayed_as_run": None if same is None else round(same.total_cost, 6),
        "replayed_as_run_ratio": round(same.total_cost / history.spend, 6)
        if same is not None and history.spend > 0
        else None,
        "repriced": {name: round(paid, 6) for name, _, paid in history.repriced},
        "billed_types_not_in_catalog": list(history.unknown_types),
    }


def paid_lines(history: ClusterHistory, results: Mapping[str, ReplayResult]) -> list[str]:
    """The replay table's companion: what the cluster paid, and how the replay of its
    own scheduler compares."""
    doc = cluster_document(history, results)
    lines = [
        f"The cluster paid ${dollars(history.spend)} over the window (the ledger, idle "
        f"instances included){f', running {history.scheduler}' if history.scheduler else ''}."
    ]
    if doc["replayed_as_run"] is not None and history.spend > 0:
        lines.append(
            f"Replayed under {history.scheduler}, its history costs "
            f"${dollars(doc['replayed_as_run'])} = {doc['replayed_as_run_ratio']:.3f} of that."
        )
    if history.earlier_jobs:
        lines.append(
            f"{history.earlier_jobs} job(s) submitted before the window ran into it: the "
            "ledger bills their instances, the replays do not run them."
        )
    if history.left_out:
        lines.append(
            f"Left out: {len(history.left_out)} job(s) ("
            + "; ".join(f"{j}: {why}" for j, why in history.left_out[:3])
            + ("; …" if len(history.left_out) > 3 else "")
            + ")."
        )
    if history.unknown_types:
        lines.append(
            "Billed types the catalog no longer has (not replayable): "
            + ", ".join(history.unknown_types)
            + "."
        )
    return lines


def what_if_line(document: Mapping[str, Any]) -> str:
    """cost-report's line, from its `what_if` document (`what_if_document`)."""
    costs = document["would_have_cost"]
    if not costs:
        return document["message"]
    return (
        f"{_span(document['since'], document['until'])} under {' / '.join(costs)} would have "
        f"cost {' / '.join(f'${dollars(c)}' for c in costs.values())} "
        f"(paid ${dollars(document['paid'])}; replayed from the database)"
    )


def what_if_document(history: ClusterHistory, results: Mapping[str, ReplayResult]) -> dict:
    """cost-report's `what_if` entry in `--json`."""
    return {
        **cluster_document(history, results),
        "would_have_cost": {name: round(r.total_cost, 6) for name, r in results.items()},
        "message": "" if history.jobs else nothing_to_replay(history),
    }


def _span(since: float, until: float) -> str:
    if since <= 0:
        return "Everything so far"
    days = (until - since) / 86400.0
    if days >= 1:
        return f"Last {days:,.0f} days" if days >= 10 else f"Last {days:.2g} days"
    return f"Last {days * 24:.2g} hours"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def what_if(
    config: ClusterConfig, since: float, until: float, workers: int | None = None
) -> dict[str, Any]:
    """cost-report's what-if: the window's history replayed under each default scheduler
    (no bound), as its `--json` entry (`what_if_line` renders it)."""
    from app.commands.replay import _run_replays
    from simulator.replay import DEFAULT_SCHEDULERS

    history = load_history(config, since, until)
    if not history.jobs:
        return what_if_document(history, {})
    results, _ = _run_replays(
        list(DEFAULT_SCHEDULERS),
        list(history.jobs),
        history.catalog,
        history.truth,
        config.cluster.interval_s,
        config.planner.min_throughput,
        workers,
        bound=False,
    )
    return what_if_document(history, results)
