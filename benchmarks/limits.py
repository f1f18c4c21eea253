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
Beside them, `eva` and `no-packing` replayed on the same trace, under the
same interference options as `autoscaler replay` (`--unknown-throughput`,
`--min-throughput`, `--interval`). Past `--max-compositions` a limit falls
back to its fluid bound, and the output says so. On pai_200 it takes about half a
minute; on the vCPU catalog compositions multiply (100 jobs of the full trace:
about 3 minutes), so `--jobs` takes the first N jobs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.bundled import bundled
from app.cli_io import add_min_throughput, load_inputs, write_json
from app.files import load_contention_matrix
from app.table import format_table
from app.validation import number_arg
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.throughput import DEFAULT_THROUGHPUT
from autoscaler.work import check_work
from benchmarks.timing import timed
from simulator.bound import MAX_COMPOSITIONS, per_interval_limits, waiting_limit
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
    # The interference options of `autoscaler replay`, read the same way: the limits
    # and the replays beside them then describe one world.
    parser.add_argument(
        "--unknown-throughput",
        type=number_arg(0.0, 1.0, low_open=True),
        default=DEFAULT_THROUGHPUT,
        metavar="T",
        help="ground-truth throughput of pairs the contention matrix leaves unmeasured "
        f"(default {DEFAULT_THROUGHPUT}, as `autoscaler replay`)",
    )
    add_min_throughput(parser)
    parser.add_argument(
        "--interval",
        type=number_arg(1.0, 86400.0),
        default=ROUND_INTERVAL_S,
        metavar="S",
        help=f"seconds between the replays' rounds (default {ROUND_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--max-compositions",
        type=number_arg(1, 100_000_000, integer=True),
        default=MAX_COMPOSITIONS,
        metavar="N",
        help="past this many compositions on one type, a limit falls back to its fluid "
        f"bound, and says so (default {MAX_COMPOSITIONS:,})",
    )
    parser.add_argument("--jobs", type=int, help="only the first N jobs to arrive")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    catalog, jobs = load_inputs(args.catalog, args.trace)
    trace_name = (args.trace or bundled("pai_200.json")).name
    check_work(jobs, trace_name)
    jobs, _ = start_at_first_arrival(jobs)
    if args.jobs:
        jobs = tuple(sorted(jobs, key=lambda j: j.trace.arrival_time_s)[: args.jobs])
    truth = ground_truth(
        load_contention_matrix(args.contention or bundled("contention_matrix.csv")),
        args.unknown_throughput,
    )
    cap = args.max_compositions

    replayed = {}
    for name in ("no-packing", "eva"):
        seconds, replayed[name] = timed(
            lambda name=name: replay(
                jobs,
                catalog,
                truth,
                name,
                interval_s=args.interval,
                planner_options={"min_throughput": args.min_throughput},
            )
        )
        print(f"  {name} replayed: ${replayed[name].total_cost:,.0f}, {seconds:.1f} s", flush=True)
    seconds, limits = timed(
        lambda: per_interval_limits(jobs, catalog, truth, cap, on_interval=_progress)
    )
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    waiting_seconds, waiting = timed(lambda: waiting_limit(jobs, catalog, truth, cap))

    base = replayed["no-packing"].total_cost
    eva = replayed["eva"].total_cost
    looser = "" if waiting.exact else " (FELL BACK to the pooled fluid bound)"
    figures = {
        "fluid bound (tasks split)": limits.fluid,
        "whole tasks": limits.whole_tasks,
        "whole tasks, with interference": limits.with_interference,
        f"any schedule, however long jobs wait{looser}": waiting.dollars,
        "eva (replayed)": eva,
        "no-packing (replayed)": base,
    }
    rows = [
        [name, f"{dollars:,.0f}", f"{dollars / base:.3f}", f"{eva / dollars:.3f}x"]
        for name, dollars in figures.items()
    ]
    print(
        f"\n{trace_name}: {len(jobs)} jobs, {limits.intervals} intervals, "
        f"limits computed in {seconds:.1f} s; unmeasured pairs at "
        f"{args.unknown_throughput:g}"
        + (f", eva co-locates nothing below {args.min_throughput:g}" if args.min_throughput else "")
        + "\n"
    )
    print(format_table(["", "$", "÷ no-packing", "eva ÷ it"], rows, [False, True, True, True]))
    print(f"\nthe waiting limit pooled the trace's work in one LP in {waiting_seconds:.1f} s")
    if not waiting.exact:
        print(
            f"  it fell back to a looser bound: more than {cap:,} compositions on one type, "
            "so it is the pooled fluid bound, without interference (raise --max-compositions, "
            "or take fewer --jobs)"
        )
    if limits.at_fluid:
        print(
            f"\n{limits.at_fluid} of {limits.intervals} intervals had more than {cap:,} "
            "compositions and count at their fluid bound in every limit (looser)"
        )
    if args.json:
        document = {
            "trace": trace_name,
            "jobs": len(jobs),
            "unknown_throughput": args.unknown_throughput,
            "min_throughput": args.min_throughput,
            "interval_s": args.interval,
            "max_compositions": cap,
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
