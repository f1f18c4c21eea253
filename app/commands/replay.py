"""`autoscaler replay` and `autoscaler trace synthesize`."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.bundled import bundled
from app.cli_io import add_min_throughput, load_inputs, warn_unmatched, write_json
from app.files import load_contention_matrix, read_json
from app.replay_report import comparison_table, document, plot
from app.table import output_width, wrap
from app.validation import PLOT_FORMATS, number_arg, output_path
from autoscaler.errors import InputError
from autoscaler.jobs import jobs_from_eva
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.throughput import DEFAULT_THROUGHPUT
from autoscaler.work import check_work
from simulator.bound import clairvoyant_bound
from simulator.replay import DEFAULT_SCHEDULERS, MAX_SLOWDOWN, SCHEDULERS, ReplayResult, replay
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
        choices=SCHEDULERS,
        default=None,
        metavar="NAME",
        help=f"schedulers to compare (default: {' '.join(DEFAULT_SCHEDULERS)}; "
        f"also: eva-plain); no-packing is always run as the yardstick",
    )
    rp.add_argument(
        "--interval",
        type=number_arg(1.0, 86400.0),
        default=ROUND_INTERVAL_S,
        metavar="S",
        help=f"seconds between scheduling rounds, 1 to 86400 (default {ROUND_INTERVAL_S:g})",
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
        "--workers",
        type=number_arg(1, 256, integer=True),
        default=None,
        metavar="N",
        help="replays run side by side in N processes, each scheduler's and the bound's "
        "(default: one per core available; 1 = one after another); the results are the same",
    )
    rp.add_argument(
        "--json", type=output_path(), default=None, metavar="OUT", help="write results as JSON"
    )
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
        type=number_arg(0.0, 10_000.0, low_open=True),
        default=3.0,
        help="arrivals per hour (default 3: one every 20 minutes on average)",
    )
    syn.add_argument(
        "--multi-task",
        type=number_arg(0.0, 1.0),
        default=0.0,
        metavar="SHARE",
        help="share of jobs duplicated into 2- or 4-task jobs (default 0)",
    )
    syn.add_argument("--out", type=output_path(), required=True)
    syn.set_defaults(func=cmd_synthesize)


def cmd_replay(args: argparse.Namespace) -> int:
    catalog, jobs = load_inputs(args.catalog, args.trace)
    source = str(args.trace or bundled("pai_200.json"))
    if args.synthesize is not None:
        jobs = jobs_from_eva(
            synthesize(jobs, args.synthesize, args.seed), source=f"synthetic from {source}"
        )
        source = f"synthetic: {args.synthesize} jobs from {source}, seed {args.seed}"
    check_work(jobs, source)  # one definition of a job's work, or one line saying why not
    jobs, offset = start_at_first_arrival(jobs)
    check_replay_span(jobs, source)
    if offset:
        print(
            wrap(
                f"note: {source}: arrival times start at {offset:,.0f} s (Unix timestamps?); "
                f"replaying from the first arrival instead of {offset / 86400 / 365:,.1f} years "
                "of empty rounds"
            ),
            file=sys.stderr,
        )
    contention_path = args.contention or bundled("contention_matrix.csv")
    contention = load_contention_matrix(contention_path)
    warn_unmatched(contention, jobs, str(contention_path))
    truth = ground_truth(contention, args.unknown_throughput)
    names = list(dict.fromkeys(args.scheduler or DEFAULT_SCHEDULERS))
    if "no-packing" not in names:
        names.append("no-packing")  # the yardstick every cost is normalized to

    try:
        results, limit = _run_replays(
            names, jobs, catalog, truth, args.interval, args.min_throughput, args.workers
        )
    except _WorkerDied as exc:
        print(f"autoscaler: error: {exc}", file=sys.stderr)
        return 1

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
    if args.json is not None:
        write_json(
            args.json,
            document(
                results,
                trace=source,
                interval_s=args.interval,
                seed=args.seed,
                min_throughput=args.min_throughput,
                clairvoyant_bound=round(limit, 6),
            ),
        )
    if args.plot is not None:
        try:
            plot(results, args.plot, f"Replay of {len(jobs)} jobs")
        except OSError as exc:
            raise InputError(
                f"cannot write plot: {exc.strerror or exc}", source=str(args.plot)
            ) from None
        print(f"plot written to {args.plot}")  # with its .png, as matplotlib wrote it
    unfinished = [
        f"{n} ({r.jobs_completed}/{r.jobs_total} jobs)"
        for n, r in results.items()
        if not r.finished
    ]
    if unfinished:
        print(
            f"warning: not every job finished under {', '.join(unfinished)}: a replay stops "
            f"once the last job to arrive has had {MAX_SLOWDOWN:.0f} times the longest job's "
            "duration (cost up to then; JCT over the jobs that finished)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_synthesize(args: argparse.Namespace) -> int:
    source_path = args.source or bundled("pai_200.json")
    source = jobs_from_eva(read_json(source_path, "trace"), source=str(source_path))
    trace = synthesize(source, args.jobs, args.seed, args.rate, args.multi_task)
    write_json(args.out, trace)
    tasks = sum(len(j["tasks"]) for j in trace.values())
    last = max(j["arrival_time"] for j in trace.values())
    print(
        f"wrote {len(trace)} jobs ({tasks} tasks) arriving over {last / 86400:.1f} days "
        f"to {args.out}"
    )
    return 0


def _run_replays(
    names: list[str],
    jobs: list[JobSpec],
    catalog: Catalog,
    truth: ThroughputTable,
    interval_s: float,
    min_throughput: float,
    workers: int | None,
) -> tuple[dict[str, ReplayResult], float]:
    """Each scheduler's replay, and the clairvoyant bound: in parallel processes.

    The replays share nothing (each has its own world, store and planner, and
    is deterministic), so running them side by side changes no figure, only
    the wall time: the command takes about as long as its slowest replay
    rather than the sum (on the full trace, eva's 4 minutes instead of 5).
    """
    board = _Progress(names, len(jobs))
    workers = min(workers or _cores(), len(names) + 1)
    inputs = (jobs, catalog, truth, interval_s, {"min_throughput": min_throughput})
    finished: dict[str, object] = {}
    if workers <= 1:
        for name in [*names, _BOUND]:
            finished[name], seconds = _run_one(name, inputs, partial(board.update, name))
            if name != _BOUND:
                board.done(name, finished[name], seconds)  # type: ignore[arg-type]
    else:
        _run_in_workers(names, inputs, workers, board, finished)
    limit = finished.pop(_BOUND)
    return {name: finished[name] for name in names}, limit  # type: ignore[misc]


_BOUND = "the clairvoyant bound"


def _run_one(
    name: str, inputs: tuple, on_round: Callable[[float, int, int], None]
) -> tuple[object, float]:
    """One scheduler's replay (or, for `_BOUND`, the bound), and its wall time."""
    jobs, catalog, truth, interval_s, options = inputs
    started = time.perf_counter()
    if name == _BOUND:
        result: object = clairvoyant_bound(jobs, catalog)
    else:
        result = replay(
            jobs, catalog, truth, name, interval_s, on_round=on_round, planner_options=options
        )
    return result, time.perf_counter() - started


def _run_in_workers(
    names: list[str], inputs: tuple, workers: int, board: _Progress, finished: dict[str, object]
) -> None:
    """`_run_one` for every name and the bound, in forked processes, into `finished`."""
    # One forked process per replay (and one for the bound), at most `workers` at
    # once: they inherit the inputs, and report progress and their result on a
    # queue. Processes of our own rather than a pool: a pool waits forever for
    # the result of a worker the kernel killed (out of memory, say).
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    waiting = sorted(names, key=lambda n: (not n.startswith("eva"), names.index(n)))
    waiting.append(_BOUND)  # the longest first (eva's planners), the short ones beside them
    running: dict[str, multiprocessing.process.BaseProcess] = {}
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                name = waiting.pop(0)
                running[name] = context.Process(
                    target=_worker,
                    args=(name, messages, inputs, board.tty),
                    name=f"replay {name}",
                )
                with _sigint_held():
                    running[name].start()
            _receive(messages, board, finished, running, timeout=0.2)
            for name, process in list(running.items()):
                if not process.is_alive():
                    # Its last message may still be in the pipe: read what is there.
                    _receive(messages, board, finished, running, timeout=0.0)
                    if name in running:
                        raise _WorkerDied(name, process.exitcode)
    finally:
        for process in running.values():  # on an error or Ctrl-C, none goes on alone
            process.terminate()
        for process in running.values():
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


def _worker(name: str, messages, inputs: tuple, progress: bool) -> None:
    """A replay's process: `_run_one`, its progress and result sent back on `messages`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held during the fork
    parent = os.getppid()
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
