"""Replays of real and synthetic traces: fidelity, invariants, determinism, the command."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bundled import bundled
from app.commands import replay as cli
from app.files import jobs_from_eva, load_catalog, load_contention_matrix, load_jobs
from autoscaler.decide import WaitPolicy
from autoscaler.errors import InputError
from autoscaler.work import solo_seconds
from simulator.replay import MAX_SLOWDOWN, SCHEDULERS, replay
from simulator.traces import start_at_first_arrival, synthesize
from simulator.world import ground_truth
from state.memory import InMemoryStore
from tests.simulator.harsh import harsh_world

REFERENCE_NO_PACKING = 35_858.0  # Eva's own simulator on pai_200 (EuroSys '25 artifact)
REFERENCE_EVA_NORMALIZED = 0.705

pytestmark = pytest.mark.long  # minutes of replays in all


@pytest.fixture(scope="module")
def pai():
    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = load_jobs(bundled("pai_200.json"), catalog)
    truth = ground_truth(load_contention_matrix(bundled("contention_matrix.csv")))
    return catalog, jobs, truth


@pytest.fixture(scope="module")
def pai_baseline(pai):
    catalog, jobs, truth = pai
    return replay(jobs, catalog, truth, "no-packing")


def test_no_packing_matches_the_reference_simulator(pai_baseline):
    # No-packing makes no decisions: this checks the delays and the billing.
    assert pai_baseline.total_cost == pytest.approx(REFERENCE_NO_PACKING, rel=0.03)
    assert pai_baseline.avg_jct_hours == pytest.approx(17.67, rel=0.03)
    assert pai_baseline.jobs_completed == 200 and pai_baseline.migrations == 0


@pytest.fixture(scope="module")
def pai_eva(pai):
    catalog, jobs, truth = pai
    return replay(jobs, catalog, truth, "eva")


def test_eva_beats_the_reference_eva_without_hurting_jct_much(pai_eva, pai_baseline):
    eva = pai_eva
    assert eva.total_cost / pai_baseline.total_cost <= REFERENCE_EVA_NORMALIZED
    assert eva.avg_jct_hours <= 1.15 * pai_baseline.avg_jct_hours
    assert eva.full_rounds > 0 and eva.migrations > 0


def test_a_control_loop_rebuilt_before_every_round_and_step_decides_the_same(pai, pai_eva):
    # Nothing the loop needs lives only in its memory. A daemon restarted
    # between any two steps (its loop and planner built anew from the store) must
    # give byte for byte the replay of one that never restarted.
    catalog, jobs, truth = pai
    rebuilt = replay(jobs, catalog, truth, "eva", rebuild=True)
    assert json.dumps(rebuilt.document()) == json.dumps(pai_eva.document())
    assert rebuilt.migrations > 0 and rebuilt.full_rounds > 0  # it did move things


def test_without_interference_a_rebuilt_control_loop_decides_the_same_too(pai):
    # At default throughput 1.0 (a world with no interference) the planner packs
    # by the configuration LP unpriced for interference. Its patterns used to be
    # kept in memory between rounds: rebuilt before every step, the loop then
    # replayed pai_200 for $24,437 against $24,388.
    catalog, jobs, _ = pai
    truth = ground_truth(None, 1.0)
    once = replay(jobs, catalog, truth, "eva", default_throughput=1.0)
    rebuilt = replay(jobs, catalog, truth, "eva", default_throughput=1.0, rebuild=True)
    assert json.dumps(rebuilt.document()) == json.dumps(once.document())
    assert once.migrations > 0 and once.full_rounds > 0


def test_a_minimum_throughput_keeps_jct_where_interference_is_harsh(pai):
    # Every co-location runs each task at 0.55. Packing still pays by TNRP when an
    # instance costs less than 0.55 of the tasks' RPs, so Eva slows jobs by a
    # quarter to save 3%; a user who caps slowdown at 0.7 keeps jobs at full
    # speed, losing only what the planner pays to learn the pairs.
    catalog, jobs, _ = pai
    jobs, truth = jobs[:100], ground_truth(None, 0.55)
    base = replay(jobs, catalog, truth, "no-packing")
    eva = replay(jobs, catalog, truth, "eva")
    capped = replay(jobs, catalog, truth, "eva", planner_options={"min_throughput": 0.7})
    assert eva.avg_jct_hours > 1.15 * base.avg_jct_hours  # what the cap is for
    assert eva.total_cost < 0.99 * base.total_cost
    assert capped.avg_jct_hours < 1.02 * base.avg_jct_hours
    assert capped.total_cost < 1.01 * base.total_cost
    assert capped.jobs_completed == len(jobs)


def test_packing_saves_money_where_interference_is_harsh_and_jobs_wait_for_stragglers(
    tmp_path,
):
    # A fuzzed world (`harsh.py`, seed 5): pairs at 0.3-1, jobs of up to 16 unlike
    # tasks that move at their slowest task's pace. While a task's TNRP was floored
    # at 0, one that stalled its job was "worth nothing" and stayed where its
    # neighbours paid for the instance: eva cost 1.026x no packing at 1.17x its JCT.
    catalog_path, jobs_path, matrix_path = harsh_world(5, tmp_path)
    catalog = load_catalog(catalog_path)
    jobs, _ = start_at_first_arrival(load_jobs(jobs_path, catalog))
    truth = ground_truth(load_contention_matrix(matrix_path))
    base = replay(jobs, catalog, truth, "no-packing")
    eva = replay(jobs, catalog, truth, "eva")
    assert eva.jobs_completed == base.jobs_completed == len(jobs)
    assert eva.total_cost < 0.95 * base.total_cost
    assert eva.avg_jct_hours < 1.15 * base.avg_jct_hours


def test_rounds_in_which_nothing_changed_reuse_the_last_candidates(pai, monkeypatch):
    # Between arrivals and completions most rounds see the same jobs, instances
    # and estimates: the planner re-scores last round's candidates instead of
    # packing again (a catalog rebuilt every round once defeated this).
    from autoscaler.planner import EvaPlanner

    catalog, jobs, truth = pai
    calls = {"plan": 0, "pack": 0}
    plan, candidates = EvaPlanner.plan, EvaPlanner._candidates

    def counted_plan(self, view):
        calls["plan"] += 1
        return plan(self, view)

    def counted_candidates(self, view, prices):
        calls["pack"] += 1
        return candidates(self, view, prices)

    monkeypatch.setattr(EvaPlanner, "plan", counted_plan)
    monkeypatch.setattr(EvaPlanner, "_candidates", counted_candidates)
    replay(jobs[:60], catalog, truth, "eva")
    assert calls["plan"] > 100 and calls["pack"] < calls["plan"] / 2, calls


@pytest.fixture(scope="module")
def small_synthetic(pai):
    _, jobs, _ = pai
    trace = synthesize(jobs, 40, seed=3, arrivals_per_hour=6.0, multi_task_share=0.3)
    return jobs_from_eva(trace)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_replay_keeps_the_invariants(pai, small_synthetic, scheduler):
    # The simulated world refuses (raises) a task started on two instances or
    # beyond an instance's capacity; here: every job completes, the ledger
    # equals the cloud's own bill, and nothing is left running.
    catalog, _, truth = pai
    result = replay(small_synthetic, catalog, truth, scheduler)
    assert result.finished and result.jobs_completed == len(small_synthetic)
    assert result.total_cost == pytest.approx(result.billed, rel=1e-9)
    assert result.timeline[-1][2] == 0  # no instance left
    assert all(h > 0 for h in result.jct_hours.values())


def test_jobs_that_wait_for_room_start_within_their_budget(pai):
    # Allowed to wait 30% of its solo duration, no job starts later than that plus what
    # the same jobs' starts take without the rule (a round's wait, a boot, a setup).
    catalog, jobs, truth = pai
    delays = {}
    for policy in (None, WaitPolicy(jct_factor=1.3, min_saving=0.1)):
        store = InMemoryStore()
        result = replay(jobs[:60], catalog, truth, "eva", store=store, waiting=policy)
        assert result.finished and result.jobs_completed == 60
        records = store.jobs()
        delays[policy] = {r.job_id: r.started_at - r.submitted_at for r in records}
        if policy is not None:
            held = [r for r in store.rounds() if r.numbers.get("waiting_for_room")]
            assert held, "the rule never held a job back on these 60 jobs"
            budgets = {r.job_id: 0.3 * solo_seconds(r.spec) for r in records}
    usual = max(delays[None].values())
    late = {
        job_id: waited
        for job_id, waited in delays[policy].items()
        if waited > budgets[job_id] + usual
    }
    assert not late
    assert max(delays[policy].values()) > usual  # some job did wait


def run_replay(args: list[str], tmp_path, name: str, hash_seed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-m", "app", "replay", *args, "--json"],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    return done.stdout  # --json: the document alone on standard output


def test_same_inputs_give_byte_identical_json_serial_or_parallel(tmp_path):
    trace = tmp_path / "trace.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "trace",
            "synthesize",
            "--jobs",
            "25",
            "--seed",
            "5",
            "--rate",
            "6",
            "--multi-task",
            "0.3",
            "--out",
            str(trace),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    args = ["--trace", str(trace), "--scheduler", "eva", "owl", "stratus"]
    # One after another in one process, and side by side in forked workers.
    first = run_replay([*args, "--workers", "1"], tmp_path, "a.json", "1")
    second = run_replay([*args, "--workers", "3"], tmp_path, "b.json", "12345")
    assert first == second
    doc = json.loads(first)
    for name in ("eva", "owl", "stratus", "no-packing"):
        result = doc["results"][name]
        for key, kind in [
            ("total_cost", float),
            ("avg_jct_hours", float),
            ("jobs_completed", int),
            ("instances_launched", int),
            ("migrations", int),
        ]:
            assert isinstance(result[key], kind), (name, key)
        assert result["jobs_completed"] == 25


def test_replay_command_prints_the_table_and_draws_the_plot(tmp_path):
    trace = tmp_path / "t.json"
    data = json.loads(bundled("pai_200.json").read_text())
    trace.write_text(json.dumps({k: data[k] for k in list(data)[:12]}))
    png = tmp_path / "plot.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "replay",
            "--trace",
            str(trace),
            "--scheduler",
            "eva",
            "synergy",
            "--min-throughput",
            "0.8",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("scheduler"))
    above = lines[lines.index(header) - 1]  # headers break between words to fit 100 columns
    assert "no-pack" in header and "migr/task" in header and "rounds" in header
    assert "÷" in above and "full" in above
    assert all(len(line) <= 100 for line in lines[: lines.index(header) + 10])
    assert any(line.startswith("no-packing") and " 1.000 " in line for line in lines)
    assert "jobs" in result.stderr  # progress, one line per scheduler
    assert "co-locate no task below 0.8 of its speed" in " ".join(result.stdout.split())


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """6,000 synthetic jobs: eva needs minutes on them, no-packing most of one."""
    trace = tmp_path_factory.mktemp("long") / "t.json"
    subprocess.run(
        [sys.executable, "-m", "app", "trace", "synthesize", "--jobs", "6000",
         "--seed", "2", "--out", str(trace)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return trace


@contextlib.contextmanager
def parallel_replay(trace) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """`autoscaler replay` of eva and no-packing side by side, and its two workers
    once both are forked (at most 2 minutes); the command is killed on the way out."""
    command = subprocess.Popen(
        [sys.executable, "-m", "app", "replay", "--trace", str(trace),
         "--scheduler", "eva", "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        workers: list[int] = []
        for _ in range(1200):
            workers = _children(command.pid)
            if len(workers) == 2 or command.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert len(workers) == 2, workers
        yield command, workers
    finally:
        command.kill()
        command.wait()


def test_an_interrupted_parallel_replay_leaves_no_worker_running(long_trace):
    # Ctrl-C (here SIGINT to the command alone, as `kill -INT` sends it) while
    # the replays run in their workers: the command stops with 130 at once and
    # takes its workers with it. Both replays need minutes or most of one on
    # this trace, so a command that waited for its workers would time out.
    with parallel_replay(long_trace) as (command, workers):
        command.send_signal(signal.SIGINT)
        assert command.wait(timeout=60) == 130
        assert "interrupted" in command.stderr.read()
        for pid in workers:
            _wait_gone(pid)


def test_ctrl_c_while_a_worker_is_forked_still_stops_the_command():
    # The signal lands while the first worker is being forked (the child exists,
    # the parent has not returned from fork): it used to be raised in an after-fork
    # hook, printed as "Exception ignored" and dropped, and the command replayed on.
    # Now it is held until the fork is done. Sent as soon as the child shows (the
    # window is milliseconds wide, so a few tries: it hit three times in four).
    for _ in range(4):
        command = subprocess.Popen(
            [sys.executable, "-m", "app", "replay", "--scheduler", "eva", "--workers", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            while not _children(command.pid) and command.poll() is None:
                pass
            command.send_signal(signal.SIGINT)
            assert command.wait(timeout=60) == 130
            assert command.stderr.read().strip() == "autoscaler: interrupted"
        finally:
            command.kill()
            command.wait()


def test_a_killed_replay_worker_is_an_error_not_a_wait(long_trace):
    # A worker the kernel kills (the OOM killer sends SIGKILL) never sends its
    # result: the command says which replay died and how, and stops the other
    # (a process pool would have waited for that result forever).
    with parallel_replay(long_trace) as (command, workers):
        os.kill(workers[0], signal.SIGKILL)
        assert command.wait(timeout=60) == 1
        stderr = command.stderr.read()
        error = stderr.strip().splitlines()[-1]
        assert error.startswith("autoscaler: error: the process replaying ")
        assert "killed by signal 9" in error and "--workers 1" in error
        assert "Traceback" not in stderr
        _wait_gone(workers[1])


def test_workers_of_a_replay_killed_outright_stop_too(long_trace):
    # SIGKILL (or a SIGTERM nothing catches) gives the command no chance to
    # stop its workers: they notice they were orphaned and stop themselves.
    with parallel_replay(long_trace) as (command, workers):
        command.kill()
        command.wait(timeout=60)
        for pid in workers:
            _wait_gone(pid)


def test_a_worker_forked_as_its_command_died_ends_itself(long_trace, tmp_path):
    # A Ctrl-C or a kill during the fork: the command is gone before its new worker
    # asked who its parent is. Asked then, the answer is the orphan's new parent, and
    # the worker replayed on alone for as long as the replay took, holding the
    # command's output pipes (a caller waiting for them hung with it). Here the
    # command (a forked process of this test) dies the moment its worker exists,
    # and the worker looks only once it has gone.
    said = tmp_path / "worker"
    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = load_jobs(long_trace, catalog)
    inputs = (jobs, catalog, ground_truth(None), 300.0, {}, None)

    def command() -> None:
        real = cli._worker

        def late(*args):
            first = os.getppid()
            for _ in range(3000):  # until the command is gone (at most 5 minutes)
                if os.getppid() != first:
                    break
                threading.Event().wait(0.1)
            real(*args)

        cli._worker = late  # this process's copy only

        def die_once_forked() -> None:
            while not (children := _children(os.getpid())):
                threading.Event().wait(0.01)
            said.write_text(str(children[0]))
            os._exit(0)

        threading.Thread(target=die_once_forked, daemon=True).start()
        board = cli._Progress(["eva"], len(jobs))
        cli._run_in_workers(["eva"], inputs, 1, board, {}, bound=False)

    process = multiprocessing.get_context("fork").Process(target=command)
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0, process.exitcode
    _wait_gone(int(said.read_text()))  # eva on this trace needs minutes


def test_an_error_in_a_replay_worker_is_raised_in_the_command(pai, monkeypatch):
    # The workers are forked, so a replay patched here runs in them too: owl's
    # fails as bad input would. The error reaches the command as itself (the
    # CLI prints an InputError as one line), with the worker's traceback as a
    # note, and no worker is left behind.
    catalog, jobs, truth = pai
    real = cli.replay

    def failing(jobs, catalog, truth, name, *args, **kwargs):
        if name == "owl":
            raise InputError("no such thing", source="trace.json", field="tasks")
        return real(jobs, catalog, truth, name, *args, **kwargs)

    monkeypatch.setattr(cli, "replay", failing)
    with pytest.raises(InputError) as raised:
        cli._run_replays(["owl", "eva", "no-packing"], jobs, catalog, truth, 300.0, 0.0, 2)
    assert str(raised.value) == "trace.json: field 'tasks': no such thing"
    assert any("in the process replaying owl" in n for n in raised.value.__notes__)
    assert multiprocessing.active_children() == []


def _children(pid: int) -> list[int]:
    """`pid`'s child processes (none once it has exited)."""
    children: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _wait_gone(pid: int) -> None:
    """Until `pid` has exited (reaped, or a zombie nobody waits for); a deadline of 5
    minutes, not a timing: on a loaded machine a worker may take a while to notice."""
    for _ in range(3000):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        threading.Event().wait(0.1)
    raise AssertionError(f"worker {pid} still running")


def test_replay_rejects_a_trace_without_durations(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"7": {"tasks": {"0": {"demand": {"any": [1, 4, 8]}}}}}))
    result = subprocess.run(
        [sys.executable, "-m", "app", "replay", "--trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "job '7'" in result.stderr and "duration" in result.stderr


def test_a_replay_where_packed_tasks_crawl_stops_and_says_so(pai):
    # Every pair at 1% of full speed: Stratus, blind to interference, packs tasks
    # that would take a hundred times their duration or more (without the horizon
    # it ran for simulated decades); Eva learns the pairs and keeps them apart.
    catalog, jobs, _ = pai
    jobs, truth = jobs[:20], ground_truth(None, 0.01)
    last = max(j.trace.arrival_time_s for j in jobs)
    horizon = last + MAX_SLOWDOWN * max(j.trace.duration_s for j in jobs) + 86400
    stratus = replay(jobs, catalog, truth, "stratus")
    assert not stratus.finished and stratus.jobs_completed < 20
    assert stratus.end_time_s <= horizon + 300
    eva = replay(jobs, catalog, truth, "eva")
    assert eva.finished and eva.jobs_completed == 20


def test_replay_costs_below_100_dollars_keep_their_cents():
    from app.table import dollars

    assert dollars(0.15) == "0.15"  # a short replay read "$0"
    assert dollars(99.994) == "99.99"
    assert dollars(25_140.4) == "25,140"
