"""Replay reports: a comparison table, a JSON document and a plot over time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.table import dollars, format_table
from simulator.replay import ReplayResult


def comparison_table(results: Mapping[str, ReplayResult]) -> str:
    """One row per scheduler; costs and JCT also relative to no-packing."""
    base = results.get("no-packing")
    with_spot = any(r.spot is not None for r in results.values())
    rows = []
    for name, r in results.items():
        norm_cost = f"{r.total_cost / base.total_cost:.3f}" if base and base.total_cost else "-"
        norm_jct = (
            f"{r.avg_jct_hours / base.avg_jct_hours:.3f}" if base and (base.avg_jct_hours) else "-"
        )
        alloc = "/".join(f"{a:.0%}" for a in r.allocation)
        share = f"{r.full_rounds / r.planned_rounds:.1%}" if r.planned_rounds else "-"
        rows.append(
            [
                name + ("" if r.finished else " (unfinished)"),
                dollars(r.total_cost),
                norm_cost,
                f"{r.avg_jct_hours:.2f}",
                norm_jct,
                f"{r.normalized_throughput:.3f}",
                f"{r.tasks_per_instance:.2f}",
                f"{r.migrations / r.tasks:.2f}" if r.tasks else "-",
                alloc,
                share,
                f"{r.planning_seconds * 1000:.1f}",
                *(_spot_cells(r) if with_spot else []),
            ]
        )
    spot_headers = ["spot h", "reclaims", "lost", "deadlines"] if with_spot else []
    return format_table(
        [
            "scheduler",
            "cost $",
            "÷ no-pack",
            "JCT h",
            "÷ no-pack",
            "job tput",
            "tasks/inst",
            "migr/task",
            "alloc G/C/R",
            "full rounds",
            "plan ms",
            *spot_headers,
        ],
        rows,
        [False] + [True] * (10 + len(spot_headers)),
    )


def _spot_cells(r: ReplayResult) -> list[str]:
    """Spot columns: share of instance-hours on spot, reclaims, work lost as a share of
    the jobs' task-hours, deadlines met of those given."""
    if r.spot is None:
        return ["-"] * 4
    s = r.spot
    deadlines = "-"
    if s["jobs_with_deadline"]:
        deadlines = f"{s['deadlines_met']}/{s['jobs_with_deadline']}"
    return [f"{s['spot_share']:.0%}", str(s["interruptions"]), f"{s['lost_share']:.2%}", deadlines]


def document(results: Mapping[str, ReplayResult], **context: Any) -> dict[str, Any]:
    """The `--json` document: deterministic for the same inputs (no wall-clock times)."""
    base = results.get("no-packing")
    out = {}
    for name, r in results.items():
        doc = r.document()
        if base and base.total_cost:
            doc["normalized_cost"] = round(r.total_cost / base.total_cost, 6)
        if base and base.avg_jct_hours:
            doc["normalized_jct"] = round(r.avg_jct_hours / base.avg_jct_hours, 6)
        out[name] = doc
    return {**context, "results": out}


def plot(results: Mapping[str, ReplayResult], path: Path, title: str = "") -> None:
    """Per scheduler, $/h and instance count over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost_ax, count_ax) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name, r in results.items():
        if not r.timeline:
            continue
        days = [t / 86400.0 for t, _, _ in r.timeline]
        cost_ax.step(
            days,
            [c for _, c, _ in r.timeline],
            where="post",
            label=f"{name} (${dollars(r.total_cost)})",
            linewidth=1.1,
        )
        count_ax.step(days, [n for _, _, n in r.timeline], where="post", label=name, linewidth=1.1)
    cost_ax.set_ylabel("instances' cost ($/h)")
    count_ax.set_ylabel("instances")
    count_ax.set_xlabel("simulated time (days)")
    cost_ax.legend(fontsize=8, ncol=2)
    cost_ax.grid(alpha=0.3)
    count_ax.grid(alpha=0.3)
    if title:
        cost_ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
