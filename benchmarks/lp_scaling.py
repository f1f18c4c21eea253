"""Plan cost against the LP lower bound, and planning time, from 1k to 1M tasks.

Task sets are sampled from pai_200's demand vectors and planned onto an empty
cluster over the 21 EC2 types without interference (`--default-throughput
1.0`, as the issue's checks run it). Side by side, in one run:

- `eva` — the default planner (Algorithm 1 and LP-priced patterns, the better);
- `eva-plain` — Algorithm 1 alone, class-batched;
- the literal task-by-task Algorithm 1 (`autoscaler.reference`) while it
  finishes within its time budget;
- POP with 2 parts, at the sizes where it could matter: its cost against the
  unpartitioned plan (quality loss) and its time;
- the LP itself: a cold solve against a warm re-solve after the counts change;
- distinct demand vectors (`--distinct-sizes`): every task its own vector, so
  classes are as many as tasks; the default planner takes the fluid path
  above `FLUID_MIN_CLASSES`, and the bound is the LP's prices on the true
  demands. The baseline in the same run is no-packing's cost. They are planned
  at throughput 1.0 (the targets) and at Eva's default 0.95, in five shapes
  (`--distinct-shapes`, `benchmarks.workloads.SHAPES`), 1M tasks only for the
  first.

Ratios are plan cost ÷ LP bound (lower is better; 1.0 is unattainable in
general) and time ÷ the default planner's time in the same run.
"""

from __future__ import annotations

import argparse
import random

from app.table import format_table
from autoscaler.bounds import MIP_MAX_TASKS, static_bounds
from autoscaler.lp import ShadowPricer
from autoscaler.planner import Plan, _lp_classes, planner_by_name, task_classes
from autoscaler.reconfiguration import Packer
from autoscaler.reference import algorithm1
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.timing import timed, timed_cpu
from benchmarks.workloads import (
    HELD_OUT,
    SHAPES,
    distinct_jobs,
    pai_catalog_and_jobs,
    sample_jobs,
)

TARGET_RATIO = 1.013
#: Held-out targets: plan cost ÷ the configuration bound (or ÷ the fluid bound where
#: that is not computed), ÷ the MIP optimum on small instances, and 100k tasks' time.
HELD_OUT_TARGET = 1.02
HELD_OUT_FLUID_TARGET = 1.03
HELD_OUT_MIP_TARGET = 1.005
HELD_OUT_SECONDS = 10.0
#: The grouped configuration LP's time here: its capped rows converge slower than
#: `plan --json` may wait, and a bound stopped early (Farley's) is looser.
GROUPED_SECONDS = 60.0


#: Each held-out shape's part of its rows' seeds: the first four in name order, as
#: they were drawn before `lognormal` was added (so a printed seed still repeats them).
SEED_INDEX = {s: i for i, s in enumerate(sorted(list(HELD_OUT)[:4]) + list(HELD_OUT)[4:])}


def tightest_bound(view: ClusterView, plan: Plan, exact: bool = False) -> tuple[float, str]:
    """The tightest lower bound computed for `view` and which it is: the whole-task LP's
    (`autoscaler.bounds.whole_task_bound`) and the pooled LP's at any size
    (`autoscaler.pooled`: exclusive pools, dual-feasible-function rows); the
    configuration LP's up to
    `STATIC_BOUNDS_MAX_CLASSES` classes, the grouped configuration LP's (demands rounded
    down, the rest fluid) at any size where the configuration LP is not computed or did
    not converge, the fluid one; with `exact` (small inputs), the MIP optimum when
    proven."""
    fluid = plan.lower_bound_hourly_cost
    assert fluid is not None
    classes = task_classes(view)
    bounds = static_bounds(
        view.catalog,
        classes,
        fluid,
        exact=exact,
        upper_bound=plan.hourly_cost,
        grouped_time_limit_s=GROUPED_SECONDS,
    )
    if bounds.mip is not None and bounds.mip.optimal:
        return bounds.tightest, "MIP optimum"
    config = bounds.configuration
    named = [(fluid, "fluid"), (bounds.whole_tasks or 0.0, "whole-task LP")]
    if config is not None:
        named.append(
            (config.lower_bound, "configuration" + ("" if config.converged else " (Farley)"))
        )
    if bounds.grouped is not None:
        named.append((bounds.grouped.lower_bound, "grouped configuration"))
    if bounds.pooled is not None:
        named.append((bounds.pooled.lower_bound, "pooled LP"))
    if bounds.mip is not None:
        named.append((bounds.mip.lower_bound, "MIP bound"))
    return max(named, key=lambda v: v[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--literal-budget",
        type=float,
        default=60.0,
        help="skip the literal Algorithm 1 at sizes after one took longer (s)",
    )
    parser.add_argument(
        "--pop-from",
        type=int,
        default=100_000,
        help="also plan with POP (2 parts) from this size on",
    )
    parser.add_argument(
        "--distinct-sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000]
    )
    parser.add_argument(
        "--distinct-throughputs",
        type=float,
        nargs="*",
        default=[1.0, 0.95],
        help="default throughputs to plan the distinct vectors at (targets: at 1.0)",
    )
    parser.add_argument(
        "--distinct-shapes",
        nargs="*",
        choices=sorted(SHAPES),
        default=list(SHAPES),
        help="distributions of the distinct vectors (1M tasks: the first only)",
    )
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="only the held-out rows: distributions the packer was not tuned on "
        "(`benchmarks.workloads.HELD_OUT`), with seeds drawn for this run",
    )
    parser.add_argument("--held-out-sizes", type=int, nargs="*", default=[200, 5_000, 100_000])
    parser.add_argument(
        "--held-out-shapes",
        nargs="*",
        choices=list(HELD_OUT),
        default=list(HELD_OUT),
        help="the held-out distributions to plan (default: all)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the held-out rows' seed (default: drawn, printed)"
    )
    args = parser.parse_args(argv)
    if args.held_out:
        held_out(args.held_out_sizes, args.seed, args.held_out_shapes)
        return

    catalog, source = pai_catalog_and_jobs()
    table = ThroughputTable(default=1.0)
    rows, pop_rows, seconds = [], [], {}
    literal_ok = True
    literal_s, literal_n = 0.0, 1
    failures: list[str] = []
    for n in args.sizes:
        print(f"  sampling {n:,} tasks …", flush=True)
        jobs = sample_jobs(source, n, seed=n)
        view = ClusterView(catalog, jobs, throughput=table)
        eva_wall_s, eva_s, eva = timed_cpu(lambda view=view: planner_by_name("eva").plan(view))
        _, plain_s, plain = timed_cpu(lambda view=view: planner_by_name("eva-plain").plan(view))
        bound = eva.lower_bound_hourly_cost
        assert bound is not None
        seconds[n] = eva_s
        literal = "-"
        if literal_ok:
            _, lit_s, lit = timed_cpu(lambda jobs=jobs: algorithm1(jobs, catalog, table))
            literal = f"{lit.hourly_cost / bound:.4f} in {lit_s:.1f} s ({lit_s / eva_s:,.0f}x)"
            literal_s, literal_n = lit_s, n
        later = [m for m in args.sizes if m > n]
        if literal_ok and later:  # it is quadratic: skip sizes it would not finish in time
            literal_ok = literal_s * (later[0] / literal_n) ** 2 <= args.literal_budget
        ratio = eva.hourly_cost / bound
        tight, tight_kind = tightest_bound(view, eva)
        if ratio > TARGET_RATIO:
            failures.append(f"{n:,} tasks: {ratio:.4f}x the bound > {TARGET_RATIO}")
        rows.append(
            [
                f"{n:,}",
                f"{bound:,.2f}",
                f"{eva.hourly_cost:,.2f}",
                f"{ratio:.4f}",
                f"{eva.hourly_cost / tight:.4f} ({tight_kind})",
                f"{eva_s:.2f}",
                f"{eva_wall_s:.2f}",
                f"{plain.hourly_cost / bound:.4f}",
                f"{plain_s:.2f}",
                literal,
            ]
        )
        if n >= args.pop_from:
            pop_s, pop = timed(
                lambda view=view: planner_by_name("eva", pop_threshold=0, pop_parts=2).plan(view)
            )
            pop_rows.append(
                [
                    f"{n:,}",
                    f"{pop.hourly_cost / eva.hourly_cost - 1:+.4%}",
                    f"{pop_s:.2f}",
                    f"{pop_s / eva_wall_s:.2f}x",  # wall: POP's parts are processes
                ]
            )
        print(f"  {n:,} tasks done", flush=True)

    print()
    print(
        format_table(
            [
                "tasks",
                "LP bound $/h",
                "eva $/h",
                "eva ÷ bound",
                "eva ÷ tightest",
                "eva CPU-s",
                "eva s",
                "eva-plain ÷ bound",
                "eva-plain CPU-s",
                "literal Alg.1 ÷ bound, CPU-s (÷ eva)",
            ],
            rows,
            [True] * 4 + [False] + [True] * 4 + [False],
        )
    )
    if pop_rows:
        print("\nPOP, 2 parts in parallel processes, against the unpartitioned eva plan:")
        print(
            format_table(
                ["tasks", "cost change", "s", "time ÷ eva"], pop_rows, [True, True, True, True]
            )
        )

    # The LP alone: a cold solve, then a warm re-solve after the counts change.
    jobs = sample_jobs(source, 10_000, seed=1)
    classes = _lp_classes(Packer(ClusterView(catalog, jobs, throughput=table)))
    pricer = ShadowPricer()
    cold = pricer.solve(catalog, classes)
    changed = [
        type(c)(c.demands, c.count + i % 7, c.group, c.group_limit) for i, c in enumerate(classes)
    ]
    warm = pricer.solve(catalog, changed)
    cold_ms, warm_ms = cold.seconds * 1e3, warm.seconds * 1e3
    print(
        f"\nLP over {len(classes)} classes × {len(catalog)} types: cold {cold_ms:.2f} ms, "
        f"warm re-solve {warm_ms:.2f} ms ({cold_ms / warm_ms:.1f}x faster)"
    )

    distinct_rows, distinct_s, distinct_ratio = [], {}, {}
    runs = [
        (shape, n, t)
        for shape in args.distinct_shapes
        for t in args.distinct_throughputs
        for n in args.distinct_sizes
        if n < 1_000_000 or shape == args.distinct_shapes[0]
    ]
    for shape, n, default in runs:
        print(f"  {n:,} distinct vectors ({shape}), default throughput {default} …", flush=True)
        jobs = distinct_jobs(n, seed=n, shape=shape)
        view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=default))
        wall_s, s, plan = timed_cpu(lambda view=view: planner_by_name("eva").plan(view))
        bound = plan.lower_bound_hourly_cost
        assert bound is not None
        tight, tight_kind = tightest_bound(view, plan) if default == 1.0 else (bound, "fluid")
        if default == 1.0:
            distinct_s[shape, n], distinct_ratio[shape, n] = s, plan.hourly_cost / bound
        distinct_rows.append(
            [
                shape,
                f"{n:,}",
                f"{default}",
                f"{bound:,.2f}",
                f"{plan.hourly_cost:,.2f}",
                f"{plan.hourly_cost / bound:.4f}",
                f"{plan.hourly_cost / tight:.4f} ({tight_kind})",
                f"{plan.hourly_cost / plan.no_packing_hourly_cost:.4f}",
                f"{s:.2f}",
                f"{wall_s:.2f}",
            ]
        )
        del jobs, view, plan
    if distinct_rows:
        print("\nDistinct demand vectors (one class per task):")
        print(
            format_table(
                [
                    "shape",
                    "tasks",
                    "throughput",
                    "LP bound $/h",
                    "eva $/h",
                    "÷ bound",
                    "÷ tightest",
                    "÷ no-packing",
                    "eva CPU-s",
                    "eva s",
                ],
                distinct_rows,
                [False] + [True] * 5 + [False, True, True, True],
            )
        )

    # Times are CPU seconds: what a plan takes on a machine of its own, which a shared
    # one is not (wall time is the column beside them).
    print("\nTargets (CPU seconds):")
    big, mid, top = 100_000, 10_000, 1_000_000
    checks = [(f"≤ {TARGET_RATIO}x the bound at every size", not failures)]
    if big in seconds:
        checks.append((f"100k tasks under 2 s ({seconds[big]:.2f} s)", seconds[big] < 2.0))
    if big in seconds and mid in seconds:
        r = seconds[big] / seconds[mid]
        checks.append((f"100k within 12x the 10k time ({r:.1f}x)", r <= 12.0))
    if top in seconds:
        checks.append((f"1M tasks under 30 s ({seconds[top]:.2f} s)", seconds[top] < 30.0))
    for (shape, n), s in distinct_s.items():
        limit_s = {100_000: 10.0, 1_000_000: 120.0}.get(n)
        if limit_s is not None:
            checks.append(
                (
                    f"{n:,} distinct vectors ({shape}) under {limit_s:.0f} s at ≤ 1.03x the "
                    f"bound ({s:.1f} s, {distinct_ratio[shape, n]:.4f}x)",
                    s < limit_s and distinct_ratio[shape, n] <= 1.03,
                )
            )
    for text, ok in checks:
        print(f"  [{'ok' if ok else 'MISSED'}] {text}")
    for f in failures:
        print(f"  MISSED: {f}")


def held_out(sizes: list[int], seed: int | None, shapes: list[str] | None = None) -> None:
    """Plan distinct demand vectors from the held-out distributions, with seeds not fixed
    in advance, against the tightest bound computed; no-packing is the baseline."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    print(f"held-out rows, seed {seed} (--held-out --seed {seed} repeats them)", flush=True)
    catalog, _ = pai_catalog_and_jobs()
    rows, checks = [], []
    for shape in shapes or list(HELD_OUT):
        for n in sizes:
            run_seed = (seed * 1_000_003 + n * 31 + SEED_INDEX[shape]) % 2**32
            jobs = distinct_jobs(n, seed=run_seed, shape=shape)
            view = ClusterView(catalog, jobs, throughput=ThroughputTable(default=1.0))
            s, cpu_s, plan = timed_cpu(lambda view=view: planner_by_name("eva").plan(view))
            fluid = plan.lower_bound_hourly_cost
            assert fluid is not None
            small = n <= MIP_MAX_TASKS
            bound_s, (tight, kind) = timed(
                lambda view=view, plan=plan, small=small: tightest_bound(view, plan, exact=small)
            )
            ratio = plan.hourly_cost / tight
            target = {
                "MIP optimum": HELD_OUT_MIP_TARGET,
                "fluid": HELD_OUT_FLUID_TARGET,
                "whole-task LP": HELD_OUT_FLUID_TARGET,
            }.get(kind, HELD_OUT_TARGET)
            # CPU seconds: what the plan costs a machine of its own, which this one
            # (shared) is not
            ok = ratio <= target and (n < 100_000 or cpu_s < HELD_OUT_SECONDS)
            checks.append(ok)
            rows.append(
                [
                    shape,
                    f"{n:,}",
                    f"{run_seed}",
                    f"{plan.hourly_cost:,.2f}",
                    f"{tight:,.2f}",
                    kind,
                    f"{plan.hourly_cost / fluid:.4f}",
                    f"{ratio:.4f}",
                    f"{target}",
                    f"{plan.hourly_cost / plan.no_packing_hourly_cost:.4f}",
                    f"{cpu_s:.2f}",
                    f"{s:.2f}",
                    f"{bound_s:.1f}",
                    "ok" if ok else "MISSED",
                ]
            )
            print(
                f"  {shape} {n:,} (seed {run_seed}): {ratio:.4f}x {kind}, "
                f"{plan.hourly_cost / fluid:.4f}x fluid, in {cpu_s:.2f} CPU-s ({s:.2f} s)",
                flush=True,
            )
            del jobs, view, plan
    print()
    print(
        format_table(
            [
                "shape",
                "tasks",
                "seed",
                "eva $/h",
                "bound $/h",
                "bound",
                "÷ fluid",
                "÷ bound",
                "target",
                "÷ no-packing",
                "eva CPU-s",
                "eva s",
                "bound s",
                "",
            ],
            rows,
            [False, True, True, True, True, False, True, True, True, True, True, True, True, False],
        )
    )
    print(
        f"\n{sum(checks)} of {len(checks)} rows within target (100k tasks also under "
        f"{HELD_OUT_SECONDS:g} CPU-s); seed {seed}"
    )


if __name__ == "__main__":
    main()
