"""The job-side reporter: counting, the throughput window, and its wire protocol."""

from __future__ import annotations

import ast
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from executor import reporter as reporter_module
from executor.reporter import Reporter, ask

SOURCE = Path(reporter_module.__file__)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_throughput_is_none_until_a_window_has_passed_then_iterations_per_second():
    clock = Clock()
    rep = Reporter(socket_path="", window_s=10, clock=clock)
    assert rep.throughput() is None
    clock.t += 30  # start-up (loading data, building the model) is not counted
    for _ in range(20):  # 2 iterations per second ...
        clock.t += 0.5
        rep.step()
    assert rep.throughput() is None  # ... for 9.5 s since the first: not a whole window
    clock.t += 0.5
    assert rep.throughput() == pytest.approx(2.0)  # the job's pace: one iteration per 0.5 s
    assert rep.iterations == 20


def test_the_window_follows_the_latest_pace():
    clock = Clock()
    rep = Reporter(socket_path="", window_s=10, clock=clock)
    for _ in range(40):  # 1 it/s for 40 s
        clock.t += 1
        rep.step()
    for _ in range(60):  # then 3 it/s for 20 s
        clock.t += 1 / 3
        rep.step()
    # Over the last 10 s (give or take one sample: window / 64) only the new pace counts.
    assert rep.throughput() == pytest.approx(3.0, rel=0.05)
    clock.t += 10  # stalled for a whole window
    assert rep.throughput() == pytest.approx(0.0, abs=0.1)


def test_counts_continue_from_the_step_a_job_resumed_at():
    rep = Reporter(socket_path="", window_s=1, start=500)
    assert list(rep.wrap(["a", "b", "c"])) == ["a", "b", "c"]
    assert rep.iterations == 503


def test_the_wire_protocol_over_the_report_socket(tmp_path):
    path = str(tmp_path / "report.sock")
    clock = Clock()
    with Reporter(path, window_s=2, start=7, clock=clock) as rep:
        clock.t += 1
        rep.step()
        status = ask(path, {"op": "status"})
        assert status == {
            "ok": True,
            "protocol": 2,
            "iterations": 8,
            "throughput": None,
            "window_s": 2.0,
            "first_iteration_at": status["first_iteration_at"],
            "checkpoint_requested": False,
            "checkpoint_done": False,
            "checkpoint_seq": 0,
            "checkpoint_step": None,
            "checkpoint_collected": 0,
            "orphaned": False,
        }
        assert isinstance(status["first_iteration_at"], float)
        assert not rep.should_checkpoint()
        assert ask(path, {"op": "checkpoint"}) == {
            "ok": True,
            "checkpoint_requested": True,
            "checkpoint_done": False,
        }
        assert rep.should_checkpoint() and rep.wait_for_checkpoint_request(0)
        rep.checkpoint_done()
        assert not rep.should_checkpoint()
        assert ask(path, {"op": "status"})["checkpoint_done"] is True
        assert ask(path, {"op": "launch"}) == {
            "ok": False,
            "error": "unknown op 'launch'; expected 'status', 'checkpoint' or 'collected'",
        }
        # Several requests on one connection, answered in order; a bad line gets an error.
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(path)
            raw.sendall(b'{"op": "status"}\nnot json\n{"op": "status"}\n')
            answers = b""
            while answers.count(b"\n") < 3:
                answers += raw.recv(4096)
        first, bad, third = (json.loads(line) for line in answers.splitlines())
        assert first["iterations"] == third["iterations"] == 8
        assert bad == {"ok": False, "error": "not a JSON object on one line"}
    assert not Path(path).exists()  # closed: the socket is gone


def test_a_socket_path_longer_than_a_socket_address_holds(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "report.sock")
    assert len(path) > 108
    with Reporter(path, window_s=1) as rep:
        rep.step(5)
        assert ask(path, {"op": "status"})["iterations"] == 5


def test_the_reporter_needs_nothing_but_the_standard_library(tmp_path):
    tree = ast.parse(SOURCE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported - {"__future__"} <= sys.stdlib_module_names
    # Copied alone into a directory, it imports and works (as it would in any image).
    shutil.copy(SOURCE, tmp_path / "reporter.py")
    script = (
        "import reporter; r = reporter.Reporter(socket_path='', window_s=1); "
        "r.step(3); print(r.iterations)"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-E", "-c", script],  # no site-packages at all
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3.0"


def test_a_job_that_exits_leaves_its_last_count_beside_the_socket(tmp_path):
    # The worker polls every few seconds; what a job counted after the last poll is read
    # from final.json once it has exited, however it exits (here: sys.exit after a loop).
    shutil.copy(SOURCE, tmp_path / "reporter.py")
    report = tmp_path / "report"
    report.mkdir()
    script = (
        "import sys, reporter\n"
        f"r = reporter.Reporter(socket_path={str(report / 'report.sock')!r}, start=100)\n"
        "for _ in range(37): r.step()\n"
        "sys.exit(0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((report / "final.json").read_text()) == {
        "protocol": 2,
        "iterations": 137,
        "checkpoint_seq": 0,
        "checkpoint_step": None,
        "orphaned": False,
    }
    assert not (report / "report.sock").exists()


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="must be positive"):
        Reporter(socket_path="", window_s=0)


# -- checkpoints on the job's schedule, collected by the worker ----------------------------------


def test_a_checkpoint_is_due_every_interval_from_the_last_one():
    clock = Clock()
    rep = Reporter(socket_path="", window_s=1, checkpoint_every_s=60, clock=clock)
    clock.t += 59
    assert not rep.checkpoint_due()
    clock.t += 1
    assert rep.checkpoint_due()
    clock.t += 30  # the job saves late (it was mid-epoch): the next is due 60 s after it
    rep.step(10)
    rep.checkpoint_done()
    assert rep.status()["checkpoint_seq"] == 1 and rep.status()["checkpoint_step"] == 10
    clock.t += 59
    assert not rep.checkpoint_due()
    clock.t += 1
    assert rep.checkpoint_due()


def test_the_interval_comes_from_the_environment_the_worker_sets(monkeypatch):
    monkeypatch.setenv("AUTOSCALER_CHECKPOINT_EVERY_S", "12.5")
    assert Reporter(socket_path="", window_s=1).checkpoint_every_s == 12.5
    monkeypatch.delenv("AUTOSCALER_CHECKPOINT_EVERY_S")
    assert Reporter(socket_path="", window_s=1).checkpoint_every_s == 900.0


def test_the_next_checkpoint_waits_until_the_worker_has_collected_the_last(tmp_path):
    path = str(tmp_path / "report.sock")
    clock = Clock()
    with Reporter(
        path, window_s=1, checkpoint_every_s=10, clock=clock, worker_collects=True
    ) as rep:
        clock.t += 10
        rep.checkpoint_done(100)
        clock.t += 10  # due by the clock, but checkpoint 1 is still in the directory
        assert not rep.checkpoint_due()
        # A stop request waits too: the job would overwrite what the worker copies.
        ask(path, {"op": "checkpoint"})
        assert rep.stop_requested and not rep.checkpoint_due() and not rep.should_checkpoint()
        status = ask(path, {"op": "status"})
        assert (status["checkpoint_seq"], status["checkpoint_step"]) == (1, 100)
        assert status["checkpoint_collected"] == 0
        assert status["checkpoint_done"] is False  # nothing saved since the request
        assert ask(path, {"op": "collected", "seq": 7}) == {"ok": True, "checkpoint_collected": 1}
        assert rep.checkpoint_due() and rep.should_checkpoint()
        rep.checkpoint_done(120)
        assert not rep.checkpoint_due()
        assert ask(path, {"op": "status"})["checkpoint_done"] is True
        assert ask(path, {"op": "collected", "seq": "2"})["ok"] is False


def test_a_worker_of_protocol_1_collects_nothing_and_the_job_never_waits(tmp_path):
    clock = Clock()
    path = str(tmp_path / "report.sock")
    with Reporter(path, window_s=1, checkpoint_every_s=10, clock=clock) as rep:
        rep.checkpoint_done()
        clock.t += 10
        assert rep.checkpoint_due()  # no AUTOSCALER_WORKER_PROTOCOL: nobody to wait for


# -- the watchdog --------------------------------------------------------------------------------


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []

    def __call__(self, code: int) -> None:
        self.codes.append(code)


def test_the_watchdog_stops_a_job_no_worker_has_asked_after(tmp_path):
    path = str(tmp_path / "report.sock")
    clock, exits = Clock(), Exits()
    rep = Reporter(
        path,
        window_s=1,
        clock=clock,
        watchdog_s=90,
        watchdog_grace_s=30,
        worker_collects=True,
        exit=exits,
    )
    rep.checkpoint_done()  # not collected: the worker died before it could
    clock.t += 80
    ask(path, {"op": "status"})  # any request says the worker is alive
    clock.t += 89
    rep.watchdog_tick()
    assert not rep.orphaned and not rep.checkpoint_due()
    clock.t += 1
    rep.watchdog_tick()  # 90 s without a word: fire
    assert rep.orphaned and rep.stop_requested
    assert rep.checkpoint_due()  # a last checkpoint, with nobody left to collect the one before
    assert exits.codes == []
    rep.checkpoint_done()
    clock.t += 1
    rep.watchdog_tick()
    assert exits.codes == []  # a moment to exit by itself
    clock.t += 1
    rep.watchdog_tick()
    assert exits.codes == [75]
    final = json.loads((tmp_path / "final.json").read_text())
    assert final["orphaned"] is True and final["checkpoint_seq"] == 2
    # The job exiting meanwhile (its atexit close comes second) still ends with 75, not 0.
    rep.close()
    assert exits.codes == [75, 75]


def test_a_job_that_never_saves_is_stopped_when_the_watchdogs_grace_ends(tmp_path):
    clock, exits = Clock(), Exits()
    rep = Reporter(
        str(tmp_path / "report.sock"),
        window_s=1,
        clock=clock,
        watchdog_s=10,
        watchdog_grace_s=30,
        exit=exits,
    )
    clock.t += 10
    rep.watchdog_tick()
    clock.t += 29
    rep.watchdog_tick()
    assert exits.codes == []
    clock.t += 1
    rep.watchdog_tick()
    assert exits.codes == [75]


def test_an_orphaned_job_exits_with_75_having_saved_its_checkpoint(tmp_path):
    # A real process and the watchdog's own thread: nobody polls it, so it saves and exits
    # with the documented status; a job whose worker dies cannot run on unseen.
    shutil.copy(SOURCE, tmp_path / "reporter.py")
    report = tmp_path / "report"
    report.mkdir()
    script = (
        "import sys, time, reporter\n"
        f"r = reporter.Reporter(socket_path={str(report / 'report.sock')!r}, window_s=1,\n"
        "                      watchdog_s=0.5, watchdog_grace_s=60)\n"
        "while True:\n"
        "    time.sleep(0.01); r.step()\n"
        "    if r.checkpoint_due():\n"
        "        open('saved', 'w').write(str(r.iterations)); r.checkpoint_done()\n"
        "        if r.stop_requested: break\n"
        "print('exited the loop', flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 75, result.stderr
    assert "exited the loop" in result.stdout
    assert "no word from the worker" in result.stderr
    assert float((tmp_path / "saved").read_text()) > 0
    assert json.loads((report / "final.json").read_text())["orphaned"] is True
