"""`autoscaler plan`: plan a set of jobs onto an empty cluster and show what packing saves."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.cli_io import add_json, add_min_throughput, load_inputs, print_json, progress
from app.files import check_workloads, load_contention_matrix
from app.table import format_table, money, shorten, wrap_hanging
from app.validation import number_arg
from autoscaler.bounds import (
    CONFIGURATION_TIME_LIMIT_S,
    MIP_MAX_TASKS,
    MIP_TIME_LIMIT_S,
    StaticBounds,
    static_bounds,
)
from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec
from autoscaler.planner import (
    FLUID_MIN_CLASSES,
    PLANNER_NAMES,
    Plan,
    planner_by_name,
    task_classes,
)
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputTable
from autoscaler.view import ClusterView


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `plan` command."""
    plan = sub.add_parser(
        "plan",
        help="plan jobs onto instance types and show what packing saves",
        description="Plan all given jobs onto an empty cluster and compare the hourly cost "
        "with one instance per task. Defaults to the bundled Eva data "
        "(200 jobs of Alibaba's GPU trace, 21 EC2 types).",
    )
    plan.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="instance catalog in Eva's ec2_config.json format (default: bundled 21 EC2 types)",
    )
    plan.add_argument(
        "--jobs",
        type=Path,
        default=None,
        help="jobs in Eva's trace format (default: bundled pai_200.json)",
    )
    plan.add_argument(
        "--throughput",
        type=Path,
        default=None,
        metavar="CSV",
        help="co-location throughputs in Eva's contention-matrix CSV format",
    )
    plan.add_argument(
        "--default-throughput",
        type=number_arg(0.0, 1.0, low_open=True),
        default=DEFAULT_THROUGHPUT,
        metavar="T",
        help="throughput assumed for a pair never observed together "
        f"(default {DEFAULT_THROUGHPUT}; 1.0 = no interference)",
    )
    add_min_throughput(plan)
    plan.add_argument(
        "--planner",
        choices=PLANNER_NAMES,
        default="eva",
        help="eva (default): Algorithm 1 and LP-priced patterns, the better of the two; "
        "eva-plain: Algorithm 1 only",
    )
    plan.add_argument(
        "--pop-threshold",
        type=number_arg(1, 10**9, integer=True),
        default=None,
        metavar="N",
        help="split rounds of more than N tasks POP-style into --pop-parts sub-problems "
        "solved in parallel processes (default: never; a round of more than "
        f"{FLUID_MIN_CLASSES:,} distinct demand vectors takes the fluid path, which is "
        "fast unsplit, and ignores it)",
    )
    plan.add_argument(
        "--pop-parts",
        type=number_arg(2, 256, integer=True),
        default=2,
        metavar="K",
        help="POP sub-problems, 2 to 256 (default 2)",
    )
    plan.add_argument(
        "--bounds",
        choices=("fluid", "configuration", "exact"),
        default="configuration",
        help="lower bounds to report beside the plan: the fluid LP's; also the "
        "configuration LP's (whole tasks; column generation stopped after "
        f"{CONFIGURATION_TIME_LIMIT_S:g} CPU-seconds with Farley's bound; the default); "
        f"also, up to {MIP_MAX_TASKS} tasks, the exact optimum by MIP "
        f"(up to {MIP_TIME_LIMIT_S:g} s more)",
    )
    add_json(plan)
    plan.add_argument(
        "--limit",
        type=number_arg(0, 10**9, integer=True),
        default=30,
        metavar="N",
        help="show at most N instances in the table (0 = all; default 30)",
    )
    plan.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    progress("reading catalog and jobs …")
    catalog, jobs = load_inputs(args.catalog, args.jobs)
    progress(f"planning {sum(len(j.tasks) for j in jobs):,} tasks …")
    if args.throughput is not None:
        table = load_contention_matrix(args.throughput, args.default_throughput)
        check_workloads(table, jobs, str(args.throughput))
    else:
        table = ThroughputTable(default=args.default_throughput)
    view = ClusterView(catalog=catalog, jobs=jobs, throughput=table)
    planner = planner_by_name(
        args.planner,
        pop_threshold=args.pop_threshold,
        pop_parts=args.pop_parts,
        min_throughput=args.min_throughput,
    )
    started = time.perf_counter()
    plan = planner.plan(view)
    seconds = time.perf_counter() - started
    bounds = None
    if plan.lower_bound is not None and args.bounds != "fluid":
        progress("bounding …")
        bounds = static_bounds(
            catalog,
            task_classes(view),
            plan.lower_bound.lower_bound,
            exact=args.bounds == "exact",
            upper_bound=plan.hourly_cost,
        )

    if args.json:
        print_json(plan_document(plan, seconds, planner.name, args.min_throughput, bounds))
    else:
        print(render_plan(plan, jobs, catalog, seconds, args.limit, bounds))
    return 0


def _saved(base: float, cost: float) -> float:
    """$/h saved against no packing; a difference of rounding errors is 0, not -0.0000."""
    saved = base - cost
    return 0.0 if abs(saved) < 1e-9 * max(1.0, base) else saved


def plan_document(
    plan: Plan,
    seconds: float,
    planner_name: str = "eva",
    min_throughput: float = 0.0,
    bounds: StaticBounds | None = None,
) -> dict[str, Any]:
    """The plan as the JSON document `autoscaler plan --json` writes. `bounds`: the
    configuration LP's and the MIP's beside the fluid one, when computed."""
    cost = plan.hourly_cost
    base = plan.no_packing_hourly_cost
    bound = plan.lower_bound
    saved = _saved(base, cost)
    tightest = bounds.tightest if bounds is not None else (bound.lower_bound if bound else None)
    return {
        "hourly_cost": cost,
        "no_packing_hourly_cost": base,
        "lower_bound_hourly_cost": None if bound is None else bound.lower_bound,
        "gap_to_lower_bound": None
        if not bound or not bound.lower_bound
        else cost / bound.lower_bound - 1.0,
        "bounds": None if bounds is None else bounds.document(),
        "tightest_lower_bound_hourly_cost": tightest,
        "gap_to_tightest_bound": None if not tightest else cost / tightest - 1.0,
        "savings_per_hour": saved,
        "savings_fraction": saved / base if base else 0.0,
        "seconds": seconds,
        "planner": planner_name,
        "min_throughput": min_throughput,
        "partitions": plan.partitions,
        "chosen": plan.chosen,
        "reason": plan.reason,
        "lp": None
        if bound is None
        else {
            "types_used": bound.type_usage,
            "shadow_prices": {t: p for t, p in bound.shadow_prices.items() if any(p)},
            "seconds": bound.seconds,
        },
        "instances": [
            {
                "type": inst.type.name,
                "hourly_cost": inst.type.hourly_cost,
                "tasks": list(inst.tasks),
            }
            for inst in plan.configuration
        ],
        "candidates": [c.summary() for c in plan.candidates],
    }


def render_plan(
    plan: Plan,
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    seconds: float,
    limit: int,
    bounds: StaticBounds | None = None,
) -> str:
    n_tasks = sum(len(j.tasks) for j in jobs)
    instances = sorted(
        plan.configuration, key=lambda i: (-i.type.hourly_cost, i.type.name, i.tasks)
    )
    shown = instances if limit == 0 else instances[:limit]
    rows = [
        (
            n,
            inst.instance_id or f"new-{n}",
            inst.type.name,
            len(inst.tasks),
            shorten(inst.tasks, 56),
            f"{inst.type.hourly_cost:.4g}",
        )
        for n, inst in enumerate(shown, start=1)
    ]
    out = [
        f"Plan for {n_tasks} tasks of {len(jobs)} jobs over {len(catalog)} instance types",
        "",
        format_table(
            ["#", "instance", "type", "n", "tasks", "$/h"],
            rows,
            [True, False, False, True, False, True],
        ),
    ]
    if len(shown) < len(instances):
        out.append(
            f"… {len(instances) - len(shown)} more instances "
            "(--limit 0 shows all; --json prints all)"
        )
    by_type: dict[str, list[int]] = {}
    for inst in instances:
        entry = by_type.setdefault(inst.type.name, [0, 0])
        entry[0] += 1
        entry[1] += len(inst.tasks)
    type_rows = [
        (name, count, tasks, f"{count * catalog[name].hourly_cost:,.2f}")
        for name, (count, tasks) in by_type.items()
    ]
    base = plan.no_packing_hourly_cost
    cost = plan.hourly_cost
    saved = _saved(base, cost)
    out += [
        "",
        format_table(["type", "instances", "tasks", "$/h"], type_rows, [False, True, True, True]),
        "",
    ]
    summary = len(out)
    out += [
        f"Hourly cost             {money(cost)}/h on {len(instances)} instances",
        f"No-packing hourly cost  {money(base)}/h on {n_tasks} instances "
        "(each task alone on its cheapest type)",
        f"Savings                 {money(saved)}/h ({saved / base:.1%})" if base else "",
    ]
    bound = plan.lower_bound_hourly_cost
    if bound:
        out.append(
            f"LP lower bound          {money(bound)}/h — this plan is "
            f"{cost / bound - 1:.2%} above it (no plan can cost less, before interference)"
        )
    if bounds is not None and bounds.whole_tasks is not None:
        out.append(
            f"Whole-task LP bound     {money(bounds.whole_tasks)}/h — "
            f"{cost / bounds.whole_tasks - 1:.2%} above it (the LP with dual-feasible-function "
            "rows)"
        )
    if bounds is not None and bounds.configuration is not None:
        config = bounds.configuration
        value = max(bounds.fluid, config.lower_bound)
        how = (
            "converged"
            if config.converged
            else f"Farley's bound after {config.iterations} iterations, {config.seconds:.1f} s"
        )
        out.append(
            f"Configuration bound     {money(value)}/h — {cost / value - 1:.2%} above it "
            f"(configuration LP, {how})"
        )
    if bounds is not None and bounds.grouped is not None:
        grouped = bounds.grouped
        value = max(bounds.fluid, grouped.lower_bound)
        out.append(
            f"Configuration bound     {money(value)}/h — {cost / value - 1:.2%} above it "
            "(configuration LP on demands rounded down, the rest fluid)"
        )
    if bounds is not None and bounds.pooled is not None and bounds.pooled.lower_bound > 0:
        pooled = bounds.pooled
        apart = (
            f", {pooled.exclusive_tasks:,} tasks filling the {pooled.resource} of every type "
            "they fit pooled apart"
            if pooled.resource
            else ""
        )
        out.append(
            f"Pooled LP bound         {money(pooled.lower_bound)}/h — "
            f"{cost / pooled.lower_bound - 1:.2%} above it (the whole-task LP at any size{apart})"
        )
    if bounds is not None and bounds.mip is not None:
        mip = bounds.mip
        if mip.optimal:
            out.append(
                f"Optimum (MIP)           {money(mip.lower_bound)}/h — this plan is "
                f"{cost / mip.lower_bound - 1:.2%} above it"
            )
        else:
            out.append(
                f"Optimum (MIP)           not proven in {mip.seconds:.0f} s: at least "
                f"{money(mip.lower_bound)}/h"
                + ("" if mip.hourly_cost is None else f", found {money(mip.hourly_cost)}/h")
            )
    split = f", {plan.partitions} POP parts" if plan.partitions > 1 else ""
    configs = {c.configuration for c in plan.candidates}
    how = (
        "full and partial reconfiguration agree"
        if len(configs) == 1 and len(plan.candidates) > 1
        else f"{plan.chosen} reconfiguration"
    )
    out.append(f"Planned in {seconds:.3f} s ({how}{split})")
    # the summary lines are "label  value": long values wrap under the value
    return "\n".join(out[:summary] + [wrap_hanging(line, 24) for line in out[summary:]])
