"""`autoscaler replay` and `autoscaler trace synthesize`."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from app.bundled import bundled
from app.cli_io import add_json, add_min_throughput, load_inputs, note, print_json
from app.files import (
    check_workloads,
    jobs_from_eva,
    load_availability_trace,
    load_contention_matrix,
    load_jobs,
)
from app.replay_report import comparison_table, document, plot
from app.table import output_width, wrap
from app.validation import (
    PLOT_FORMATS,
    SINCE_FORMS,
    atomic_output,
    check_outputs,
    number_arg,
    output_path,
    parse_since,
    seconds_arg,
    write_atomically,
)
from autoscaler.decide import WaitPolicy
from autoscaler.errors import InputError
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.planner import PLANNER_NAMES
from autoscaler.spot import SpotPolicy, planning_inputs
from autoscaler.throughput import DEFAULT_THROUGHPUT
from autoscaler.work import check_work
from provisioners.catalog import bundled_spot_snapshot, spot_offerings
from simulator.bound import clairvoyant_bound
from simulator.replay import (
    DEFAULT_SCHEDULERS,
    MAX_SLOWDOWN,
    SCHEDULERS,
    SPOT_SCHEDULERS,
    ReplayResult,
    SpotReplay,
    replay,
    spot_variant,
)
from simulator.spot import parse_trace_flag, trace_key_matches
from simulator.traces import check_replay_span, start_at_first_arrival, synthesize
from simulator.world import ground_truth

if TYPE_CHECKING:
    from autoscaler.catalog import Catalog
    from autoscaler.jobs import JobSpec
    from autoscaler.throughput import ThroughputTable


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
        choices=tuple(dict.fromkeys((*SCHEDULERS, *SPOT_SCHEDULERS))),
        default=None,
        metavar="NAME",
        help=f"schedulers to compare (default: {' '.join(DEFAULT_SCHEDULERS)}; "
        f"also: eva-plain; with --spot: {' '.join(SPOT_SCHEDULERS)}); no-packing is always "
        "run as the yardstick",
    )
    rp.add_argument(
        "--interval",
        type=seconds_arg(1.0, 86400.0),
        default=None,
        metavar="S",
        help="time between scheduling rounds: seconds, or with a unit (5m), 1 s to 1 d "
        f"(default {ROUND_INTERVAL_S:g}; with --from-cluster, the cluster's)",
    )
    rp.add_argument(
        "--from-cluster",
        action="store_true",
        help="replay the cluster's own history instead of a trace: the jobs submitted to it "
        "(their demands, measured work and solo speed), the co-location table it learned "
        "and the prices it paid, read from its state database, beside what it paid",
    )
    rp.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="TOML",
        help="with --from-cluster: the cluster's configuration (default: $AUTOSCALER_CONFIG, "
        "else ./autoscaler.toml)",
    )
    rp.add_argument(
        "--since",
        default=None,
        metavar="T",
        help="with --from-cluster: only jobs submitted from T on: "
        + SINCE_FORMS
        + " (default: everything recorded)",
    )
    rp.add_argument(
        "--seed",
        type=number_arg(0, 2**32 - 1, integer=True),
        default=0,
        metavar="N",
        help="seed recorded with the results; with --synthesize, the trace's seed",
    )
    rp.add_argument(
        "--synthesize",
        type=number_arg(1, 1_000_000, integer=True),
        default=None,
        metavar="JOBS",
        help="replay a synthetic trace of JOBS jobs drawn from --trace instead",
    )
    rp.add_argument(
        "--unknown-throughput",
        type=number_arg(0.0, 1.0, low_open=True),
        default=DEFAULT_THROUGHPUT,
        metavar="T",
        help="ground-truth throughput of pairs the contention matrix leaves "
        f"unmeasured (default {DEFAULT_THROUGHPUT}, as Eva's simulator)",
    )
    add_min_throughput(rp)
    rp.add_argument(
        "--wait-jct-factor",
        type=number_arg(1.0, 10.0),
        default=1.0,
        metavar="F",
        help="Eva's planners let a newly arrived job without a deadline wait for room a "
        "departure frees, up to (F - 1) x its solo duration, rather than open an instance "
        "saving less than --wait-min-saving of its reservation price (default 1.0: never; "
        "the [planner] table's wait_jct_factor)",
    )
    rp.add_argument(
        "--wait-min-saving",
        type=number_arg(0.0, 1.0),
        default=WaitPolicy().min_saving,
        metavar="S",
        help=f"see --wait-jct-factor (default {WaitPolicy().min_saving:g})",
    )
    rp.add_argument(
        "--workers",
        type=number_arg(1, 256, integer=True),
        default=None,
        metavar="N",
        help="replays run side by side in N processes, each scheduler's and the bound's "
        "(default: one per core available; 1 = one after another); the results are the same",
    )
    rp.add_argument(
        "--spot",
        action="store_true",
        help="add spot offerings at the bundled snapshot's prices beside on-demand ones, "
        "reclaim them as seeded from their interruption rates (or --spot-trace), and compare "
        f"{', '.join(SPOT_SCHEDULERS)}",
    )
    rp.add_argument(
        "--spot-trace",
        action="append",
        default=[],
        metavar="TYPE[@ZONE]=FILE",
        help="with --spot: an availability trace for the spot offerings of TYPE (in ZONE), "
        '{"metadata": {"gap_seconds": 600}, "data": [0, 1, ...]} with 1 = no spot capacity in '
        "that interval; repeats when shorter than the replay (repeatable)",
    )
    rp.add_argument(
        "--spot-rate",
        type=number_arg(0.0, 3600.0),
        default=None,
        metavar="PER_HOUR",
        help="with --spot: reclaims per instance-hour of every spot offering without a trace "
        "(default: each offering's advisor band)",
    )
    rp.add_argument(
        "--spot-zones",
        default=None,
        metavar="Z1,Z2|all",
        help="with --spot: one spot offering per listed zone (AZ IDs such as use1-az1; all: "
        "every zone the snapshot prices) instead of one per type at its median zone price",
    )
    rp.add_argument(
        "--spot-seed",
        type=number_arg(0, 2**32 - 1, integer=True),
        default=0,
        metavar="N",
        help="with --spot: seed of the reclaims drawn from interruption rates",
    )
    rp.add_argument(
        "--deadline-factor",
        type=number_arg(1.0, 1e6),
        default=None,
        metavar="F",
        help="give every job a deadline of F times its running time alone after its arrival "
        "(its max_jct_factor); as its slack runs out a job is pinned to on-demand",
    )
    add_json(rp)
    rp.add_argument(
        "--plot",
        type=output_path(".png", PLOT_FORMATS),
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
    syn.add_argument(
        "--jobs",
        type=number_arg(1, 1_000_000, integer=True),
        required=True,
        help="number of jobs (1 to 1,000,000)",
    )
    syn.add_argument("--seed", type=number_arg(0, 2**32 - 1, integer=True), default=0)
    syn.add_argument(
        "--rate",
        type=number_arg(MIN_RATE_PER_HOUR, 10_000.0),
        default=3.0,
        help=f"arrivals per hour, {MIN_RATE_PER_HOUR:g} to 10,000 (default 3: one every 20 "
        "minutes on average)",
    )
    syn.add_argument(
        "--multi-task",
        type=number_arg(0.0, 1.0),
        default=0.0,
        metavar="SHARE",
        help="share of jobs duplicated into 2- or 4-task jobs (default 0)",
    )
    syn.add_argument(
        "--out", type=output_path(), required=True, help="the trace to write (never --from)"
    )
    add_json(syn)
    syn.set_defaults(func=cmd_synthesize)


def cmd_replay(args: argparse.Namespace) -> int:
    if args.from_cluster:
        return _replay_cluster(args)
    for flag, value in (("--config", args.config), ("--since", args.since)):
        if value is not None:
            raise InputError(f"{flag} reads a cluster's history: give it with --from-cluster")
    if args.interval is None:
        args.interval = ROUND_INTERVAL_S
    trace_path = args.trace or bundled("pai_200.json")
    contention_path = args.contention or bundled("contention_matrix.csv")
    catalog_path = args.catalog or bundled("ec2_config.json")
    check_outputs(
        {"--plot": args.plot},
        [
            ("the trace", trace_path),
            ("the catalog", catalog_path),
            ("the contention matrix", contention_path),
        ],
    )
    catalog, jobs = load_inputs(args.catalog, args.trace)
    source = str(trace_path)
    if args.synthesize is not None:
        jobs = jobs_from_eva(
            synthesize(jobs, args.synthesize, args.seed), source=f"synthetic from {source}"
        )
        source = f"synthetic: {args.synthesize} jobs from {source}, seed {args.seed}"
    check_work(jobs, source)  # one definition of a job's work, or one line saying why not
    jobs, offset = start_at_first_arrival(jobs)
    check_replay_span(jobs, source)
    if offset:
        note(
            wrap(
                f"note: {source}: arrival times start at {offset:,.0f} s (Unix timestamps?); "
                f"replaying from the first arrival instead of {offset / 86400 / 365:,.1f} years "
                "of empty rounds"
            )
        )
    contention = load_contention_matrix(contention_path)
    if args.contention is not None:
        check_workloads(contention, jobs, str(contention_path))
    elif not _names_any(contention, jobs):
        note(
            f"warning: {contention_path}: none of its workloads appears in the jobs: "
            "every pair runs at --unknown-throughput"
        )
    truth = ground_truth(contention, args.unknown_throughput)
    _announce(jobs, args.interval)
    if args.deadline_factor is not None:
        jobs = tuple(dataclasses.replace(j, max_jct_factor=args.deadline_factor) for j in jobs)
    spot = _spot_inputs(args, catalog)
    names = list(dict.fromkeys(args.scheduler or (SPOT_SCHEDULERS if spot else DEFAULT_SCHEDULERS)))
    if "no-packing" not in names:
        names.append("no-packing")  # the yardstick every cost is normalized to
    spot_only = [n for n in names if n not in SCHEDULERS]
    if spot_only and spot is None:
        raise InputError(f"--scheduler {' '.join(spot_only)}: replays with --spot only")

    waiting = (
        WaitPolicy(args.wait_jct_factor, args.wait_min_saving)
        if args.wait_jct_factor > 1.0
        else None
    )
    try:
        results, limit = _run_replays(
            names,
            jobs,
            catalog,
            truth,
            args.interval,
            args.min_throughput,
            args.workers,
            spot=spot,
            waiting=waiting,
        )
    except _WorkerDied as exc:
        print(f"autoscaler: error: {exc}", file=sys.stderr)
        return 1

    if args.json:
        print_json(
            document(
                results,
                trace=source,
                interval_s=args.interval,
                seed=args.seed,
                min_throughput=args.min_throughput,
                clairvoyant_bound=round(limit, 6),
                **({"spot": spot.describe()} if spot else {}),
                **({"waiting": dataclasses.asdict(waiting)} if waiting else {}),
            )
        )
    else:
        _print_results(results, jobs, catalog, source, args, limit)
    if args.plot is not None:
        with atomic_output(args.plot) as tmp:
            try:
                plot(results, tmp, f"Replay of {len(jobs)} jobs")
            except (OSError, ValueError) as exc:
                raise InputError(
                    f"cannot write plot: {getattr(exc, 'strerror', None) or exc}",
                    source=str(args.plot),
                ) from None
        note(f"plot written to {args.plot}")
    unfinished = [
        f"{n} ({r.jobs_completed}/{r.jobs_total} jobs)"
        for n, r in results.items()
        if not r.finished
    ]
    if unfinished:
        note(
            f"warning: not every job finished under {', '.join(unfinished)}: a replay stops "
            f"once the last job to arrive has had {MAX_SLOWDOWN:.0f} times the longest job's "
            "duration (cost up to then; JCT over the jobs that finished)"
        )
        return 1
    return 0


#: The trace options --from-cluster replaces with the cluster's own records.
_TRACE_OPTIONS = (
    ("--trace", "trace"),
    ("--catalog", "catalog"),
    ("--contention", "contention"),
    ("--synthesize", "synthesize"),
)


def _replay_cluster(args: argparse.Namespace) -> int:
    """`replay --from-cluster`: the cluster's history under every scheduler, beside what
    its ledger billed over the same window (`app.what_if`)."""
    from app.config import load_cluster_config
    from app.validation import state_files
    from app.what_if import cluster_document, load_history, nothing_to_replay, paid_lines
    from provisioners.catalog import catalog_cache_path, price_table_path

    for flag, name in _TRACE_OPTIONS:
        if getattr(args, name) is not None:
            raise InputError(
                f"{flag} and --from-cluster exclude each other: the cluster's history "
                "brings its own jobs, catalog and co-location table"
            )
    config = load_cluster_config(args.config)
    now = time.time()
    since = parse_since(args.since, now) if args.since else 0.0
    ec2 = config.provisioner.ec2
    check_outputs(
        {"--plot": args.plot},
        [
            ("the cluster's configuration", config.path),
            *state_files(config.state.sqlite_path),
            ("the catalog cache", catalog_cache_path(ec2)),
            ("the price table", price_table_path(ec2)),
        ],
    )
    history = load_history(config, since, now)
    if not history.jobs:
        if args.json:
            print_json({"cluster": cluster_document(history, {}), "results": {}})
        else:
            print(nothing_to_replay(history))
        return 0
    interval = args.interval if args.interval is not None else config.cluster.interval_s
    min_throughput = args.min_throughput or config.planner.min_throughput
    waiting = (
        WaitPolicy(args.wait_jct_factor, args.wait_min_saving)
        if args.wait_jct_factor > 1.0
        else config.planner.waiting()
    )
    names = list(dict.fromkeys(args.scheduler or DEFAULT_SCHEDULERS))
    if history.scheduler in SCHEDULERS and history.scheduler not in names:
        names.insert(0, history.scheduler)  # the yardstick of the reproduction
    if "no-packing" not in names:
        names.append("no-packing")
    source = f"the cluster {config.cluster.name}'s history"
    try:
        results, limit = _run_replays(
            names,
            list(history.jobs),
            history.catalog,
            history.truth,
            interval,
            min_throughput,
            args.workers,
            waiting=waiting,
        )
    except _WorkerDied as exc:
        print(f"autoscaler: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(
            {
                **document(
                    results,
                    trace=source,
                    interval_s=interval,
                    seed=args.seed,
                    min_throughput=min_throughput,
                    clairvoyant_bound=round(limit, 6),
                    **({"waiting": dataclasses.asdict(waiting)} if waiting else {}),
                ),
                "cluster": cluster_document(history, results),
            }
        )
    else:
        args.interval, args.min_throughput = interval, min_throughput
        _print_results(results, history.jobs, history.catalog, source, args, limit)
        print("\n" + "\n".join(wrap(line) for line in paid_lines(history, results)))
    if args.plot is not None:
        with atomic_output(args.plot) as tmp:
            plot(results, tmp, f"Replay of {source}")
        note(f"plot written to {args.plot}")
    return 0


def _print_results(
    results: dict[str, ReplayResult],
    jobs: tuple[JobSpec, ...],
    catalog: Catalog,
    source: str,
    args: argparse.Namespace,
    limit: float,
) -> None:
    print(
        wrap(
            f"Replay of {len(jobs)} jobs ({source}) over {len(catalog)} instance types, "
            f"rounds every {args.interval:g} s"
            + (
                f"; Eva's planners co-locate no task below {args.min_throughput:g} of its speed"
                if args.min_throughput
                else ""
            )
        )
        + "\n"
    )
    print(comparison_table(results))
    base = results["no-packing"].total_cost
    above = ", ".join(
        f"{name} {r.total_cost / limit:.2f}x" for name, r in results.items() if limit > 0
    )
    print(
        "\n"
        + wrap(
            f"The limit: the clairvoyant fluid bound (LP bound of the tasks present, "
            f"integrated over the trace; no delays, no interference) is ${limit:,.0f}"
            + (f" = {limit / base:.3f} of no-packing; cost ÷ it: {above}." if base else ".")
        )
    )
    print(
        "\n"
        + wrap(
            "cost ÷ no-pack and JCT ÷ no-pack are relative to one instance per task; "
            "job tput is the mean share of full speed a job ran at; tasks/inst is running "
            "tasks per live instance, booting and draining ones included (so no-packing "
            "shows just under 1); "
            "alloc is allocated ÷ provisioned GPU/CPU/RAM; plan ms is planning time per round."
        )
    )


#: Task-rounds (rounds times the tasks present) above which a replay says how long it
#: will be before it starts: pai_200 at the default interval is ~60,000.
ANNOUNCE_TASK_ROUNDS = 2_000_000


def _announce(jobs: tuple[JobSpec, ...], interval_s: float) -> None:
    """Say how much work a replay is before it starts, when it is a lot: the simulated
    span over the round interval, and the rounds times the tasks each job keeps present."""
    end = 0.0
    task_rounds = 0.0
    for job in jobs:
        facts = job.trace
        work = facts.duration_s
        if facts.total_iters is not None and job.full_throughput:
            work = facts.total_iters / job.full_throughput
        work = work or 0.0
        end = max(end, facts.arrival_time_s + work)
        task_rounds += work / interval_s * len(job.tasks)
    if task_rounds < ANNOUNCE_TASK_ROUNDS:
        return
    rounds = end / interval_s
    note(
        wrap(
            f"note: this replay simulates {end / 86400:,.1f} days in rounds every "
            f"{interval_s:g} s: about {rounds:,.0f} rounds and {task_rounds:,.0f} task-rounds "
            "per scheduler, which may take a long time"
            + (" (progress below; Ctrl-C stops it)" if sys.stderr.isatty() else "")
            + "; a longer --interval or a shorter trace is quicker"
        )
    )


def _names_any(table: ThroughputTable, jobs: tuple[JobSpec, ...]) -> bool:
    known = {w for (w, _), _ in table.items()} | {o for (_, c), _ in table.items() for o in c}
    return not known or bool(known & {t.workload for j in jobs for t in j.tasks})


#: The slowest arrival rate `trace synthesize` takes (one job every 100 hours).
MIN_RATE_PER_HOUR = 0.01


def cmd_synthesize(args: argparse.Namespace) -> int:
    source_path = args.source or bundled("pai_200.json")
    check_outputs({"--out": args.out}, [("the source trace (--from)", source_path)])
    span_s = args.jobs / args.rate * 3600.0
    if span_s > MAX_SYNTHETIC_SPAN_S:
        raise InputError(
            f"with --jobs {args.jobs:,} the arrivals would span about {span_s / 86400 / 365:,.0f} "
            f"years; at most {MAX_SYNTHETIC_SPAN_S / 86400 / 365:,.0f} (raise --rate)",
            field="--rate",
            value=args.rate,
            has_value=True,
        )
    source = load_jobs(source_path)
    trace = synthesize(source, args.jobs, args.seed, args.rate, args.multi_task)
    write_atomically(args.out, orjson.dumps(trace, option=orjson.OPT_INDENT_2) + b"\n")
    tasks = sum(len(j["tasks"]) for j in trace.values())
    last = max(j["arrival_time"] for j in trace.values())
    summary = {
        "out": str(args.out),
        "jobs": len(trace),
        "tasks": tasks,
        "days": round(last / 86400, 3),
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"wrote {len(trace)} jobs ({tasks} tasks) arriving over {last / 86400:.1f} days "
            f"to {args.out}"
        )
    return 0


#: The longest span of arrivals `trace synthesize` writes (a trace must stay readable:
#: arrivals are bounded by `app.files.MAX_TRACE_SECONDS`).
MAX_SYNTHETIC_SPAN_S = 1000 * 365 * 86400.0


def _run_replays(
    names: list[str],
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    truth: ThroughputTable,
    interval_s: float,
    min_throughput: float,
    workers: int | None,
    *,
    bound: bool = True,
    spot: SpotInputs | None = None,
    waiting: WaitPolicy | None = None,
) -> tuple[dict[str, ReplayResult], float]:
    """Each scheduler's replay, and the clairvoyant bound (0 without `bound`): in
    parallel processes.

    The replays share nothing (each has its own world, store and planner, and
    is deterministic), so running them side by side changes no figure, only
    the wall time: the command takes about as long as its slowest replay
    rather than the sum (on the full trace, eva's 4 minutes instead of 5).
    `waiting` applies to Eva's planners only: the baselines, no-packing the yardstick
    among them, place every job at once as their papers do.
    """
    board = _Progress(names, len(jobs))
    workers = min(workers or _cores(), len(names) + bound)
    inputs = (jobs, catalog, truth, interval_s, {"min_throughput": min_throughput}, spot, waiting)
    finished: dict[str, object] = {}
    if workers <= 1:
        for name in [*names, *([_BOUND] if bound else [])]:
            finished[name], seconds = _run_one(name, inputs, partial(board.update, name))
            if name != _BOUND:
                board.done(name, finished[name], seconds)  # type: ignore[arg-type]
    else:
        _run_in_workers(names, inputs, workers, board, finished, bound)
    limit = finished.pop(_BOUND, 0.0)
    return {name: finished[name] for name in names}, limit  # type: ignore[misc, return-value]


_BOUND = "the clairvoyant bound"


@dataclass(frozen=True)
class SpotInputs:
    """`replay --spot`: the catalog with spot offerings, the reclaims' settings, and
    where the prices came from."""

    catalog: Catalog
    base: SpotReplay
    prices: str

    def describe(self) -> dict[str, object]:
        return {
            "prices": self.prices,
            "offerings": sum(1 for t in self.catalog if t.is_spot),
            "seed": self.base.seed,
            "traces": sorted(self.base.traces),
            "rate_per_hour": self.base.rate_per_hour,
        }


def _spot_inputs(args: argparse.Namespace, catalog: Catalog) -> SpotInputs | None:
    """What --spot and its options ask for (None without --spot)."""
    spot_only = (
        ("--spot-trace", args.spot_trace),
        ("--spot-rate", args.spot_rate),
        ("--spot-zones", args.spot_zones),
    )
    if not args.spot:
        for flag, value in spot_only:
            if value:
                raise InputError(f"{flag} is an option of --spot: give --spot with it")
        return None
    region = catalog.region or "us-east-1"
    snapshot = bundled_spot_snapshot(region)
    if snapshot is None:
        raise InputError(f"no spot price snapshot is bundled for {region}")
    zones = None if args.spot_zones is None else [z for z in args.spot_zones.split(",") if z]
    with_spot = spot_offerings(catalog, snapshot, zones=zones)
    if args.spot_rate is not None:  # the rate reclaims are drawn at is the one planned by
        with_spot = spot_offerings(
            catalog,
            snapshot,
            zones=zones,
            observed={t.name: args.spot_rate for t in with_spot if t.is_spot},
        )
    traces = {}
    for flag in args.spot_trace:
        key, path = parse_trace_flag(flag)
        if not any(t.is_spot and trace_key_matches(key, t) for t in with_spot):
            raise InputError(f"--spot-trace {key}: no spot offering of the catalog matches it")
        traces[key] = load_availability_trace(path)
    base = SpotReplay(seed=args.spot_seed, traces=traces, rate_per_hour=args.spot_rate)
    return SpotInputs(with_spot, base, f"{snapshot.source}; retrieved {snapshot.retrieved}")


def _run_one(
    name: str, inputs: tuple, on_round: Callable[[float, int, int], None]
) -> tuple[object, float]:
    """One scheduler's replay (or, for `_BOUND`, the bound), and its wall time."""
    return _replayed(name, inputs, on_round)


def _replayed(
    name: str, inputs: tuple, on_round: Callable[[float, int, int], None]
) -> tuple[object, float]:
    jobs, catalog, truth, interval_s, options, spot, waiting = inputs
    started = time.perf_counter()
    if name == _BOUND:
        if spot is not None:  # spot offerings at their effective price (`autoscaler.spot`)
            catalog, jobs = planning_inputs(jobs, spot.catalog, spot.base.policy or SpotPolicy())
        result: object = clairvoyant_bound(jobs, catalog)
    elif spot is not None:
        row = spot_variant(name, spot.base)
        result = replay(
            jobs,
            spot.catalog if row.on_spot else catalog,
            truth,
            row.scheduler,
            interval_s,
            on_round=on_round,
            planner_options={**options, **row.planner_options},
            spot=row.settings,
            waiting=waiting if row.scheduler in PLANNER_NAMES else None,
        )
    else:
        result = replay(
            jobs,
            catalog,
            truth,
            name,
            interval_s,
            on_round=on_round,
            planner_options=options,
            waiting=waiting if name in PLANNER_NAMES else None,
        )
    return result, time.perf_counter() - started


def _run_in_workers(
    names: list[str],
    inputs: tuple,
    workers: int,
    board: _Progress,
    finished: dict[str, object],
    bound: bool = True,
) -> None:
    """`_run_one` for every name and the bound, in forked processes, into `finished`."""
    # One forked process per replay (and one for the bound), at most `workers` at
    # once: they inherit the inputs, and report progress and their result on a
    # queue. Processes of our own rather than a pool: a pool waits forever for
    # the result of a worker the kernel killed (out of memory, say).
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    waiting = sorted(names, key=lambda n: (not n.startswith("eva"), names.index(n)))
    if bound:
        waiting.append(_BOUND)  # the longest first (eva's planners), the short ones beside them
    running: dict[str, multiprocessing.process.BaseProcess] = {}
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                name = waiting.pop(0)
                process: multiprocessing.process.BaseProcess = context.Process(
                    target=_worker,
                    args=(name, messages, inputs, board.tty, os.getpid()),
                    name=f"replay {name}",
                )
                with _sigint_held():  # a Ctrl-C held here is raised as this block ends,
                    process.start()
                    running[name] = process  # when the process has its handle to end it
            _receive(messages, board, finished, running, timeout=0.2)
            for name, process in list(running.items()):
                if not process.is_alive():
                    # Its last message may still be in the pipe: read what is there.
                    _receive(messages, board, finished, running, timeout=0.0)
                    if name in running:
                        raise _WorkerDied(name, process.exitcode)
    finally:
        # On an error or Ctrl-C none goes on alone; one this command cannot end (killed
        # outright) ends itself (`_worker`).
        started = [p for p in running.values() if p.pid is not None]
        for process in started:
            process.terminate()
        for process in started:
            process.join()


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Ctrl-C held back while a worker is forked, and delivered after.

    Arriving during the fork, its KeyboardInterrupt is raised in an after-fork
    hook (logging's), where Python prints "Exception ignored" and drops it: the
    command went on replaying. Blocked, the signal waits for the fork to end.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _WorkerDied(RuntimeError):
    """A replay's process ended without a result (killed, or out of memory)."""

    def __init__(self, name: str, exitcode: int | None) -> None:
        how = (
            f"was killed by signal {-exitcode}"
            if exitcode is not None and exitcode < 0
            else f"exited with status {exitcode}"
        )
        hint = " (out of memory?)" if exitcode == -signal.SIGKILL else ""
        super().__init__(
            f"the process replaying {name} {how}{hint} before it gave its result; "
            "--workers 1 replays one after another in this process"
        )


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the command dies (Linux's parent-death
    signal): a command killed outright cannot stop its workers, and a worker deep in
    a long round would otherwise notice only at its next round. Elsewhere, the
    worker's check at every round is what remains."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the command died before the signal was set
        os._exit(1)


#: prctl(2)'s option that sets the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _worker(name: str, messages, inputs: tuple, progress: bool, parent: int) -> None:
    """A replay's process: `_run_one`, its progress and result sent back on `messages`.

    `parent` is the command's pid as the command read it before the fork: read here,
    after a Ctrl-C that ended the command during the fork, it would be the orphan's new
    parent, and the worker — holding the command's output pipes — replayed on alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held during the fork
    _die_with_parent(parent)
    last = [0.0]

    def on_round(now: float, done: int, total: int) -> None:
        if os.getppid() != parent:
            os._exit(1)  # the command was killed outright: nobody wants the result
        wall = time.monotonic()
        if progress and (wall - last[0] >= 0.2 or done == total):
            last[0] = wall
            messages.put(("progress", name, (now, done, total)))

    try:
        messages.put(("done", name, _run_one(name, inputs, on_round)))
    except Exception as exc:  # sent back whole, to be raised in the parent
        where = f"in the process replaying {name}:\n{traceback.format_exc()}"
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        exc.add_note(where)  # shown where the parent prints a traceback
        messages.put(("error", name, exc))


def _receive(
    messages,
    board: _Progress,
    finished: dict[str, object],
    running: dict[str, multiprocessing.process.BaseProcess],
    timeout: float,
) -> None:
    """Act on the workers' messages: wait up to `timeout` for the first, then take
    whatever else is there."""
    try:
        message = messages.get(timeout=timeout) if timeout > 0 else messages.get_nowait()
        while True:
            kind, name, payload = message
            if kind == "progress":
                board.update(name, *payload)
            elif kind == "error":
                raise payload
            else:
                result, seconds = payload
                finished[name] = result
                running.pop(name).join()
                if name != _BOUND:
                    board.done(name, result, seconds)
            message = messages.get_nowait()
    except queue.Empty:
        pass


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Progress:
    """Replays under way on one line of a terminal; a line per scheduler as each ends."""

    def __init__(self, names: list[str], total_jobs: int) -> None:
        self.total = total_jobs
        self.tty = sys.stderr.isatty()
        self.running: dict[str, tuple[float, int]] = {}  # name -> (simulated now, jobs done)
        self.ended: set[str] = set()
        self.width = max(len(n) for n in names)
        self._last = 0.0

    def update(self, name: str, now: float, done: int, total: int) -> None:
        if name in self.ended:
            return  # a late report from a replay that has ended
        self.running[name] = (now, done)
        if not self.tty:
            return
        wall = time.monotonic()
        if wall - self._last < 0.1 and done < total:
            return
        self._last = wall
        self._show()

    def _show(self) -> None:
        if not self.running:
            return
        if len(self.running) == 1:  # one replay: a bar
            name, (now, done) = next(iter(self.running.items()))
            text = f" {done}/{self.total} jobs done, day {now / 86400:.1f}"
            room = output_width() - self.width - 3 - len(text) - 1
            bar = max(10, min(40, room))
            filled = int(bar * done / self.total) if self.total else bar
            line = f"{name:<{self.width}} [{'#' * filled}{'.' * (bar - filled)}]{text}"
        else:
            line = " · ".join(
                f"{name} {done}/{self.total} jobs, day {now / 86400:.1f}"
                for name, (now, done) in self.running.items()
            )
        sys.stderr.write("\r" + line[: output_width() - 1].ljust(output_width() - 1))
        sys.stderr.flush()

    def done(self, name: str, result: ReplayResult, seconds: float) -> None:
        self.running.pop(name, None)
        self.ended.add(name)
        line = (
            f"{name:<{self.width}} {result.jobs_completed}/{result.jobs_total} jobs, "
            f"${result.total_cost:,.0f}, {seconds:.1f} s"
        )
        pad = output_width() - 1 - len(line) if self.tty else 0
        sys.stderr.write(("\r" if self.tty else "") + line + " " * max(pad, 0) + "\n")
        sys.stderr.flush()
        if self.tty:
            self._show()
