"""`autoscaler replay` and `autoscaler trace synthesize`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from autoscaler.bundled import bundled
from autoscaler.cli_io import load_inputs, write_json
from autoscaler.errors import InputError
from autoscaler.files import load_contention_matrix, read_json
from autoscaler.jobs import jobs_from_eva
from autoscaler.table import wrap
from autoscaler.throughput import DEFAULT_THROUGHPUT
from simulator.replay import DEFAULT_SCHEDULERS, SCHEDULERS, ReplayResult, replay
from simulator.report import comparison_table, document, plot
from simulator.traces import synthesize
from simulator.world import ground_truth


def register(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser(
        "replay",
        help="simulate a job trace with each scheduler and compare cost and JCT",
        description="Replay a trace through the real control loop on a virtual clock, "
        "against a simulated cloud with measured delays and hidden co-location "
        "interference. Defaults to the bundled Eva data (pai_200.json, 21 EC2 types, "
        "measured contention matrix) and all seven schedulers.",
    )
    rp.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="jobs in Eva's trace format (default: bundled pai_200.json)",
    )
    rp.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="instance types in Eva's ec2_config.json format (default: bundled)",
    )
    rp.add_argument(
        "--contention",
        type=Path,
        default=None,
        metavar="CSV",
        help="ground-truth co-location throughputs, Eva's contention-matrix CSV "
        "(default: bundled; the planners never read it, Owl excepted)",
    )
    rp.add_argument(
        "--scheduler",
        nargs="+",
        choices=SCHEDULERS,
        default=None,
        metavar="NAME",
        help=f"schedulers to compare (default: {' '.join(DEFAULT_SCHEDULERS)}; "
        f"also: eva-plain); no-packing is always run as the yardstick",
    )
    rp.add_argument(
        "--interval",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds between scheduling rounds (default 300)",
    )
    rp.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed recorded with the results; with --synthesize, the trace's seed",
    )
    rp.add_argument(
        "--synthesize",
        type=int,
        default=None,
        metavar="JOBS",
        help="replay a synthetic trace of JOBS jobs drawn from --trace instead",
    )
    rp.add_argument(
        "--unknown-throughput",
        type=float,
        default=DEFAULT_THROUGHPUT,
        metavar="T",
        help="ground-truth throughput of pairs the contention matrix leaves "
        f"unmeasured (default {DEFAULT_THROUGHPUT}, as Eva's simulator)",
    )
    rp.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results as JSON")
    rp.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="OUT.png",
        help="draw $/h and instance count over time per scheduler",
    )
    rp.set_defaults(func=cmd_replay)

    tr = sub.add_parser("trace", help="job trace tools")
    trace_sub = tr.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    syn = trace_sub.add_parser(
        "synthesize",
        help="write a synthetic trace (Poisson arrivals, Gavel-style durations)",
        description="Jobs drawn from a source trace's demands and workloads, with Poisson "
        "arrivals and Gavel-style durations (Eva §6.1); --multi-task makes a share of "
        "them 2- or 4-task jobs (Eva §6.7).",
    )
    syn.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="source trace (default: bundled pai_200.json)",
    )
    syn.add_argument("--jobs", type=int, required=True, help="number of jobs")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument(
        "--rate",
        type=float,
        default=3.0,
        help="arrivals per hour (default 3: one every 20 minutes on average)",
    )
    syn.add_argument(
        "--multi-task",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of jobs duplicated into 2- or 4-task jobs (default 0)",
    )
    syn.add_argument("--out", type=Path, required=True)
    syn.set_defaults(func=cmd_synthesize)


def cmd_replay(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise InputError(
            "must be positive", field="--interval", value=args.interval, has_value=True
        )
    if not 0.0 < args.unknown_throughput <= 1.0:
        raise InputError(
            "must be in (0, 1]",
            field="--unknown-throughput",
            value=args.unknown_throughput,
            has_value=True,
        )
    catalog, jobs = load_inputs(args.catalog, args.trace)
    source = str(args.trace or bundled("pai_200.json"))
    if args.synthesize is not None:
        if args.synthesize < 1:
            raise InputError(
                "must be at least 1", field="--synthesize", value=args.synthesize, has_value=True
            )
        jobs = jobs_from_eva(
            synthesize(jobs, args.synthesize, args.seed), source=f"synthetic from {source}"
        )
        source = f"synthetic: {args.synthesize} jobs from {source}, seed {args.seed}"
    for job in jobs:
        facts = job.trace
        if facts.duration_s is None and (facts.total_iters is None or job.full_throughput is None):
            raise InputError(
                "a replay needs 'duration' or 'total_iters' and 'full_throughput'",
                source=source,
                where=f"job {job.job_id!r}",
                field="duration",
            )
    contention = load_contention_matrix(args.contention or bundled("contention_matrix.csv"))
    truth = ground_truth(contention, args.unknown_throughput)
    names = list(dict.fromkeys(args.scheduler or DEFAULT_SCHEDULERS))
    if "no-packing" not in names:
        names.append("no-packing")  # the yardstick every cost is normalized to

    results: dict[str, ReplayResult] = {}
    for name in names:
        bar = _Progress(name, len(jobs))
        started = time.perf_counter()
        results[name] = replay(jobs, catalog, truth, name, args.interval, on_round=bar.update)
        bar.done(results[name], time.perf_counter() - started)

    print(
        wrap(
            f"Replay of {len(jobs)} jobs ({source}) over {len(catalog)} instance types, "
            f"rounds every {args.interval:g} s"
        )
        + "\n"
    )
    print(comparison_table(results))
    print(
        "\n"
        + wrap(
            "cost ÷ no-pack and JCT ÷ no-pack are relative to one instance per task; "
            "job tput is the mean share of full speed a job ran at; alloc is allocated ÷ "
            "provisioned GPU/CPU/RAM; plan ms is planning time per round."
        )
    )
    if args.json is not None:
        write_json(
            args.json, document(results, trace=source, interval_s=args.interval, seed=args.seed)
        )
    if args.plot is not None:
        try:
            plot(results, args.plot, f"Replay of {len(jobs)} jobs")
        except OSError as exc:
            raise InputError(
                f"cannot write plot: {exc.strerror or exc}", source=str(args.plot)
            ) from None
        print(f"plot written to {args.plot}")
    unfinished = [n for n, r in results.items() if not r.finished]
    if unfinished:
        print(f"warning: not every job finished under {', '.join(unfinished)}", file=sys.stderr)
        return 1
    return 0


def cmd_synthesize(args: argparse.Namespace) -> int:
    source_path = args.source or bundled("pai_200.json")
    source = jobs_from_eva(read_json(source_path, "trace"), source=str(source_path))
    if args.jobs < 1:
        raise InputError("must be at least 1", field="--jobs", value=args.jobs, has_value=True)
    if args.rate <= 0:
        raise InputError("must be positive", field="--rate", value=args.rate, has_value=True)
    if not 0.0 <= args.multi_task <= 1.0:
        raise InputError(
            "must be in [0, 1]", field="--multi-task", value=args.multi_task, has_value=True
        )
    trace = synthesize(source, args.jobs, args.seed, args.rate, args.multi_task)
    write_json(args.out, trace)
    tasks = sum(len(j["tasks"]) for j in trace.values())
    last = max(j["arrival_time"] for j in trace.values())
    print(
        f"wrote {len(trace)} jobs ({tasks} tasks) arriving over {last / 86400:.1f} days "
        f"to {args.out}"
    )
    return 0


class _Progress:
    """A one-line progress bar on a terminal; a line per scheduler otherwise."""

    def __init__(self, name: str, total_jobs: int) -> None:
        self.name = name
        self.total = total_jobs
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, now: float, done: int, total: int) -> None:
        if not self.tty:
            return
        wall = time.monotonic()
        if wall - self._last < 0.1 and done < total:
            return
        self._last = wall
        width = 30
        filled = int(width * done / total) if total else width
        sys.stderr.write(
            f"\r{self.name:<17} [{'#' * filled}{'.' * (width - filled)}] "
            f"{done}/{total} jobs done, day {now / 86400:.1f}   "
        )
        sys.stderr.flush()

    def done(self, result: ReplayResult, seconds: float) -> None:
        line = (
            f"{self.name:<17} {result.jobs_completed}/{result.jobs_total} jobs, "
            f"${result.total_cost:,.0f}, {seconds:.1f} s"
        )
        sys.stderr.write(("\r" if self.tty else "") + line + (" " * 30 if self.tty else "") + "\n")
        sys.stderr.flush()
