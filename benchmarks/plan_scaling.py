"""Planning time and cost for 1k–8k tasks: class-batched planner vs literal Algorithm 1.

Tasks are sampled from pai_200's demand vectors and workloads and planned onto
an empty cluster over the 21 EC2 types, with Eva's default interference model
(unseen pairs at 0.95). The baseline is the task-by-task transcription of
Algorithm 1 (`autoscaler.reference`), timed in the same run; it is skipped
above `--baseline-max` tasks because it is quadratic.
"""

from __future__ import annotations

import argparse

from app.table import format_table
from autoscaler.planner import EvaPlanner
from autoscaler.reference import algorithm1
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.timing import best_of
from benchmarks.workloads import pai_catalog_and_jobs, sample_jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks plan", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument(
        "--baseline-max",
        type=int,
        default=2000,
        help="largest size to run the quadratic baseline on",
    )
    parser.add_argument("--default-throughput", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    catalog, source = pai_catalog_and_jobs()
    table = ThroughputTable(default=args.default_throughput)
    rows = []
    for n in args.sizes:
        jobs = sample_jobs(source, n, seed=n)
        view = ClusterView(catalog, jobs, throughput=table)
        ours_s, plan = best_of(args.repeats, lambda view=view: EvaPlanner().plan(view))
        row = [
            n,
            f"{ours_s:.4f}",
            f"{plan.hourly_cost:,.2f}",
            f"{plan.no_packing_hourly_cost:,.2f}",
        ]
        if n <= args.baseline_max:
            base_s, literal = best_of(1, lambda jobs=jobs: algorithm1(jobs, catalog, table))
            ratio = plan.hourly_cost / literal.hourly_cost
            row += [f"{base_s:.3f}", f"{base_s / ours_s:,.0f}x", f"{ratio:.4f}"]
        else:
            row += ["-", "-", "-"]
        rows.append(row)
        print(f"  {n} tasks done", flush=True)
    print()
    print(
        format_table(
            [
                "tasks",
                "planner s",
                "$/h",
                "no-packing $/h",
                "literal Alg.1 s",
                "speed-up",
                "$/h ÷ literal",
            ],
            rows,
            [True, True, True, True, True, True, True],
        )
    )
    print(
        "\nplanner s: Eva ensemble (full + partial + criterion) on an empty cluster, best of "
        f"{args.repeats}; literal Alg.1: one task-by-task run in the same process; "
        "$/h ÷ literal: below 1 where the LP-priced patterns beat Algorithm 1 alone."
    )


if __name__ == "__main__":
    main()
