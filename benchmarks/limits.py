"""How much is left to win: a trace's clairvoyant limits beside what eva pays.

Three limits per interval between arrivals and departures, integrated over
the trace (`simulator.bound.per_interval_limits`), each at least the one
before:

1. the fluid bound `autoscaler replay` prints (resources pooled across the
   instances of a type, as if tasks could be split);
2. whole tasks: every composition of the tasks present on every type
   (fractionally many instances);
3. whole tasks at the throughputs the interference matrix (`--contention`) gives
   them: a composition delivers Σ θ_i of work, and every task present must
   progress at full speed.

None counts start-up delays, migrations or the scheduling period; the third
is what a clairvoyant scheduler pays that packs the tasks present optimally
at every moment and knows the interference exactly. A fourth row drops the
trace's timing (`simulator.bound.waiting_limit`): the whole trace's work
pooled into one configuration LP under the same interference, as if every
task were present at once. No schedule pays less, however long it lets jobs
wait: it is the floor under any goal set for this trace in this simulator.
Beside them, `eva` and `no-packing` replayed on the same trace. On pai_200 it takes about half a
minute; on the vCPU catalog compositions multiply (100 jobs of the full trace:
about 3 minutes), so `--jobs` takes the first N jobs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.bundled import bundled
from app.cli_io import load_inputs, write_json
from app.files import load_contention_matrix
from app.table import format_table
from benchmarks.timing import timed
from simulator.bound import per_interval_limits, waiting_limit
from simulator.replay import replay
from simulator.traces import start_at_first_arrival
from simulator.world import ground_truth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks limits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", type=Path, help="Eva-format trace (default: pai_200)")
    parser.add_argument("--catalog", type=Path, help="instance types (default: physical cores)")
    parser.add_argument(
        "--contention", type=Path, help="co-location throughput matrix (default: the measured one)"
    )
    parser.add_argument("--jobs", type=int, help="only the first N jobs to arrive")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    catalog, jobs = load_inputs(args.catalog, args.trace)
    jobs, _ = start_at_first_arrival(jobs)
    trace_name = (args.trace or bundled("pai_200.json")).name
    if args.jobs:
        jobs = sorted(jobs, key=lambda j: j.trace.arrival_time_s)[: args.jobs]
    truth = ground_truth(
        load_contention_matrix(args.contention or bundled("contention_matrix.csv"))
    )

    replayed = {}
    for name in ("no-packing", "eva"):
        seconds, replayed[name] = timed(lambda name=name: replay(jobs, catalog, truth, name))
        print(f"  {name} replayed: ${replayed[name].total_cost:,.0f}, {seconds:.1f} s", flush=True)
    seconds, limits = timed(
        lambda: per_interval_limits(jobs, catalog, truth, on_interval=_progress)
    )
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    waiting_seconds, waiting = timed(lambda: waiting_limit(jobs, catalog, truth))

    base = replayed["no-packing"].total_cost
    eva = replayed["eva"].total_cost
    figures = {
        "fluid bound (tasks split)": limits.fluid,
        "whole tasks": limits.whole_tasks,
        "whole tasks, with interference": limits.with_interference,
        "any schedule, however long jobs wait": waiting.dollars,
        "eva (replayed)": eva,
        "no-packing (replayed)": base,
    }
    rows = [
        [name, f"{dollars:,.0f}", f"{dollars / base:.3f}", f"{eva / dollars:.3f}x"]
        for name, dollars in figures.items()
    ]
    print(
        f"\n{trace_name}: {len(jobs)} jobs, {limits.intervals} intervals, "
        f"limits computed in {seconds:.1f} s\n"
    )
    print(format_table(["", "$", "÷ no-packing", "eva ÷ it"], rows, [False, True, True, True]))
    print(f"\nthe waiting limit pooled the trace's work in one LP in {waiting_seconds:.1f} s")
    if not waiting.exact:
        print("  (too many compositions: it is the pooled fluid bound, without interference)")
    if limits.at_fluid:
        print(
            f"\n{limits.at_fluid} of {limits.intervals} intervals had too many compositions "
            "and count at their fluid bound in every limit"
        )
    if args.json:
        document = {
            "trace": trace_name,
            "jobs": len(jobs),
            "intervals": limits.intervals,
            "intervals_at_fluid_bound": limits.at_fluid,
            "no_packing": round(base, 6),
            "eva": round(eva, 6),
            "fluid": round(limits.fluid, 6),
            "whole_tasks": round(limits.whole_tasks, 6),
            "with_interference": round(limits.with_interference, 6),
            "waiting": round(waiting.dollars, 6),
            "waiting_exact": waiting.exact,
        }
        write_json(args.json, document)


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty() and (done == total or done % 20 == 0):
        sys.stderr.write(f"\r  limits: {done}/{total} intervals")
        sys.stderr.flush()
