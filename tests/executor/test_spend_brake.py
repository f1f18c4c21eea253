"""The agent's spend brake: an instance whose daemon is gone stops itself, so nothing bills
unwatched — after `orphan_timeout_s` with no task running, after `orphan_max_s` with tasks
(checkpointed first, the checkpoint kept on local disk when it cannot be uploaded).

Real agents and a real daemon over gRPC, containers simulated (`SimulatedRuntime`: threads
running the real reporter). The brake's clock is the test's, and its shutdown a recorder;
the daemon is cut off with `partition()` (its server stops).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from executor.attempts import KEPT_FILE, LAUNCH_FILE
from executor.simulated import SimulatedRuntime
from tests.executor.conftest import PATIENCE_S, ManualClock, job_context, launch, wait_for


class Shutdowns:
    """What the brake would run: the reasons it was called with."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.fixture
def daemon(daemon_on, tmp_path):
    return daemon_on(f"file://{tmp_path}/store", {}, SimulatedRuntime())


def _eventually(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def _cut_off(daemon, agent) -> None:
    """The daemon stops answering, and the agent has noticed (a heartbeat failed)."""
    daemon.partition()
    _eventually(lambda: agent._daemon_silent_s() > 0, "a heartbeat fails")


def test_an_idle_agent_without_its_daemon_stops_its_instance_after_the_orphan_timeout(daemon):
    clock, shutdowns = ManualClock(), Shutdowns()
    agent = daemon.agent(
        "inst-1",
        clock=clock,
        shutdown=shutdowns,
        orphan_timeout_s=1800,
        poll_interval_s=0.05,
        rpc_timeout_s=1,
    )
    clock.advance(3600)  # an hour with the daemon answering: nothing to brake for
    beats = agent.beats
    _eventually(lambda: agent.beats > beats, "a heartbeat is answered")
    agent.check_spend_brake()
    assert shutdowns.reasons == []

    _cut_off(daemon, agent)
    clock.advance(1799)
    agent.check_spend_brake()
    assert shutdowns.reasons == [] and agent.stopped_instance is None
    clock.advance(1)
    agent.check_spend_brake()
    assert len(shutdowns.reasons) == 1
    assert "no word from the daemon for 1800 s and no task running" in shutdowns.reasons[0]
    assert agent.stopped_instance == shutdowns.reasons[0]
    agent.check_spend_brake()  # once is enough
    agent.wait()  # the agent ends with its instance
    assert len(shutdowns.reasons) == 1


def test_the_brake_is_off_with_a_zero_timeout(daemon):
    clock, shutdowns = ManualClock(), Shutdowns()
    agent = daemon.agent(
        "inst-1", clock=clock, shutdown=shutdowns, orphan_timeout_s=0, rpc_timeout_s=1
    )
    _cut_off(daemon, agent)
    clock.advance(10**7)
    agent.check_spend_brake()
    assert shutdowns.reasons == [] and agent.stopped_instance is None


def test_an_agent_with_tasks_waits_longer_then_checkpoints_them_and_keeps_them_on_disk(
    daemon, tmp_path
):
    clock, shutdowns = ManualClock(), Shutdowns()
    context = job_context(daemon.storage, tmp_path)
    agent = daemon.agent(
        "inst-1",
        clock=clock,
        shutdown=shutdowns,
        orphan_timeout_s=1800,
        orphan_max_s=7200,
        poll_interval_s=0.05,
        rpc_timeout_s=1,
    )
    task = "brake/t0"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(wait_for(task, "running"), "it runs")
    daemon.until(lambda r: r.tasks[task].progress > 3, "it makes progress")
    (attempt,) = agent.attempts.live()

    _cut_off(daemon, agent)
    clock.advance(1800)  # idle long enough, but a task runs: it is not given up yet
    agent.check_spend_brake()
    assert shutdowns.reasons == []
    assert agent.attempts.live() == [attempt] and attempt.state == "running"

    clock.advance(5400)
    agent.check_spend_brake()  # returns once its task has checkpointed and exited
    assert attempt.exited.is_set()
    (reason,) = shutdowns.reasons
    assert "no word from the daemon for 7200 s with 1 task(s) running" in reason
    # Nothing could be uploaded: the checkpoint the job saved on request stays on disk.
    _eventually(lambda: attempt.terminal, "the attempt ends")
    assert attempt.state == "stopped" and attempt.kept, attempt.reason
    assert "kept on this instance" in attempt.reason
    saved = json.loads((Path(attempt.checkpoint_dir) / "state.json").read_text())
    assert saved["step"] > 3
    # Its step is written beside it, for whoever uploads it later (`down`).
    assert json.loads((attempt.directory / KEPT_FILE).read_text()) == {"step": saved["step"]}


def test_stopping_its_tasks_with_no_daemon_the_agent_keeps_their_checkpoints_without_waiting(
    daemon, tmp_path
):
    """`down` with the daemon stopped: SIGTERM (`--stop-tasks`) checkpoints each task; no
    upload can be granted, so once the containers have stopped the agent keeps each
    checkpoint on disk beside its step at once, rather than spend its upload patience."""
    context = job_context(daemon.storage, tmp_path)
    agent = daemon.agent("inst-1", poll_interval_s=0.05, rpc_timeout_s=1, upload_patience_s=60)
    task = "down/t0"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(lambda r: r.tasks.get(task) is not None and r.tasks[task].progress > 3, "runs")
    (attempt,) = agent.attempts.live()
    _cut_off(daemon, agent)

    began = time.monotonic()
    agent.close(stop_tasks=True)
    assert time.monotonic() - began < agent.config.upload_patience_s
    assert attempt.terminal and attempt.state == "stopped" and attempt.kept, attempt.reason
    saved = json.loads((attempt.checkpoint_dir / "state.json").read_text())
    assert saved["step"] > 3
    assert json.loads((attempt.directory / KEPT_FILE).read_text()) == {"step": saved["step"]}
    assert (attempt.directory / LAUNCH_FILE).is_file()  # whose checkpoint it is
