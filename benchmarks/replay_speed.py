"""Replay speed: pai_200 with all seven schedulers, and a synthetic 6,000-job trace.

Targets (issue [3]): the seven schedulers on pai_200 together in under 60 s
(Eva's reference simulator takes about 8.5 minutes for its five, stepping
one simulated second at a time); a 6,000-job synthetic trace with `eva` in
under 2 minutes. The baseline measured in the same run is `no-packing`,
which plans trivially: each scheduler's time is also shown as a ratio to
it, which is the cost of its decisions on top of the simulation itself.
"""

from __future__ import annotations

import argparse

from autoscaler.bundled import bundled
from autoscaler.files import load_catalog, load_contention_matrix, load_jobs
from autoscaler.jobs import jobs_from_eva
from autoscaler.table import format_table
from benchmarks.timing import timed
from simulator.replay import DEFAULT_SCHEDULERS, replay
from simulator.traces import synthesize
from simulator.world import ground_truth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks replay", description=__doc__)
    parser.add_argument("--synthetic-jobs", type=int, default=6000)
    args = parser.parse_args(argv)

    catalog = load_catalog(bundled("ec2_config.json"))
    pai = load_jobs(bundled("pai_200.json"), catalog)
    truth = ground_truth(load_contention_matrix(bundled("contention_matrix.csv")))

    rows, seconds = [], {}
    for name in DEFAULT_SCHEDULERS:
        s, result = timed(lambda name=name: replay(pai, catalog, truth, name))
        seconds[name] = s
        rows.append([name, f"{result.total_cost:,.0f}", result.rounds, f"{s:.1f}"])
        print(f"  pai_200 {name}: {s:.1f} s", flush=True)
    base = seconds["no-packing"]
    for row in rows:
        row.append(f"{seconds[row[0]] / base:.2f}x")
    total = sum(seconds.values())
    print()
    print(
        format_table(
            ["scheduler", "cost $", "rounds", "s", "÷ no-packing s"],
            rows,
            [False, True, True, True, True],
        )
    )
    print(
        f"\npai_200, seven schedulers: {total:.1f} s in all "
        f"[{'ok' if total < 60 else 'MISSED'}: target under 60 s]"
    )

    trace = jobs_from_eva(synthesize(pai, args.synthetic_jobs, seed=1))
    tasks = sum(len(j.tasks) for j in trace)
    print(f"\nsynthetic trace: {len(trace):,} jobs, {tasks:,} tasks (seed 1) …", flush=True)
    base_s, base_r = timed(lambda: replay(trace, catalog, truth, "no-packing"))
    eva_s, eva_r = timed(lambda: replay(trace, catalog, truth, "eva"))
    print(
        format_table(
            ["scheduler", "cost $", "÷ no-packing $", "rounds", "s", "÷ no-packing s"],
            [
                [
                    "no-packing",
                    f"{base_r.total_cost:,.0f}",
                    "1.000",
                    base_r.rounds,
                    f"{base_s:.1f}",
                    "1.00x",
                ],
                [
                    "eva",
                    f"{eva_r.total_cost:,.0f}",
                    f"{eva_r.total_cost / base_r.total_cost:.3f}",
                    eva_r.rounds,
                    f"{eva_s:.1f}",
                    f"{eva_s / base_s:.2f}x",
                ],
            ],
            [False, True, True, True, True, True],
        )
    )
    print(
        f"\n{len(trace):,}-job synthetic trace with eva: {eva_s:.1f} s "
        f"[{'ok' if eva_s < 120 else 'MISSED'}: target under 120 s]"
    )


if __name__ == "__main__":
    main()
