"""`GrpcExecutor` and the agents over real gRPC with TLS and tokens, containers simulated.

The Executor contract's rules (asynchronous, idempotent by attempt, terminal
states until acknowledged, reasons, readiness and liveness), without Docker
(the protocol's security is `test_worker_identity.py`'s): the agents run
`executor.simulated.SimulatedRuntime`, whose "containers" are threads speaking
the real report-socket protocol.
(`test_docker_*.py` run the same agents on a real Docker engine.)
"""

from __future__ import annotations

import logging
import time

import pytest

from autoscaler.execution import Executor
from executor.protos import worker_pb2 as pb
from executor.simulated import SimulatedRuntime
from tests.executor.conftest import PATIENCE_S, job_context, launch, wait_for


@pytest.fixture
def daemon(daemon_on, tmp_path):
    return daemon_on(f"file://{tmp_path}/store", {}, SimulatedRuntime())


@pytest.fixture
def context(daemon, tmp_path):
    return job_context(daemon.storage, tmp_path)


def _eventually(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_grpc_executor_is_an_executor(daemon):
    assert isinstance(daemon.executor, Executor)


def test_requests_show_at_once_and_terminal_states_stay_until_acknowledged(daemon, context):
    agent = daemon.agent("inst-1")
    executor = daemon.executor
    executor.start(launch("j/t", 1, "inst-1", context, env={"STEP_S": "0.005"}))
    assert executor.report().tasks["j/t"].state in ("starting", "running")
    daemon.until(lambda r: r.tasks["j/t"].throughput is not None, "it reports a throughput")
    executor.stop("j/t", 1)
    assert executor.report().tasks["j/t"].state in ("checkpointing", "stopped")
    stopped = daemon.until(wait_for("j/t", "stopped"), "it stops").tasks["j/t"]
    assert stopped.reason == "checkpointed on request"
    assert stopped.checkpoint == daemon.storage.ref(
        f"jobs/j/t/1/checkpoint-{int(stopped.progress):012d}.tar.gz"
    )
    for _ in range(3):
        assert executor.report().tasks["j/t"] == stopped
    executor.acknowledge("j/t", 1)
    assert "j/t" not in executor.report().tasks
    # The worker forgets it at its next heartbeat.
    _eventually(lambda: agent.statuses() == [], "the worker forgets the acknowledged attempt")

    # Resumed from its checkpoint, the task keeps its progress until the job counts again.
    executor.start(launch("j/t", 2, "inst-1", context, checkpoint=stopped.checkpoint))
    assert executor.report().tasks["j/t"].progress == stopped.progress > 0
    resumed = daemon.until(lambda r: r.tasks["j/t"].state == "running", "it runs again")
    assert resumed.tasks["j/t"].progress >= stopped.progress


def test_jobs_that_exit_the_moment_they_have_checkpointed_are_all_stopped(daemon, context):
    # A job exits right after saving; the agent must still know it was asked (not that it
    # finished on its own), however its threads interleave.
    for instance in ("inst-1", "inst-2"):
        daemon.agent(instance)
    tasks = [(f"j{i}/t", f"inst-{1 + i % 2}") for i in range(8)]
    for task, instance in tasks:
        daemon.executor.start(launch(task, 1, instance, context, env={"STEP_S": "0.002"}))
    daemon.until(lambda r: all(r.tasks[t].progress > 0 for t, _ in tasks), "all run")
    for task, _ in tasks:
        daemon.executor.stop(task, 1)
    report = daemon.until(
        lambda r: all(r.tasks[t].state in ("stopped", "completed", "failed") for t, _ in tasks),
        "all end",
    )
    assert {report.tasks[t].state for t, _ in tasks} == {"stopped"}
    assert {report.tasks[t].reason for t, _ in tasks} == {"checkpointed on request"}
    assert all(report.tasks[t].checkpoint for t, _ in tasks)


def test_start_and_stop_are_idempotent_by_attempt(daemon, context):
    daemon.agent("inst-1")
    runtime = daemon.runtime
    executor = daemon.executor
    first = launch("j/t", 1, "inst-1", context)
    executor.start(first)
    executor.start(first)
    daemon.until(wait_for("j/t", "running"), "it runs")
    executor.start(first)
    assert len(runtime.containers({"autoscaler.task": "j/t"})) == 1
    before = executor.report().tasks["j/t"]
    executor.stop("j/t", 7)  # never seen: nothing happens
    executor.stop("other/t", 1)
    assert executor.report().tasks["j/t"].state == before.state == "running"
    executor.stop("j/t", 1)
    executor.stop("j/t", 1)
    daemon.until(wait_for("j/t", "stopped"), "it stops")
    executor.stop("j/t", 1)  # already stopped: nothing happens
    assert executor.report().tasks["j/t"].state == "stopped"


def test_starts_that_cannot_happen_fail_with_their_reason(daemon, context):
    daemon.agent("inst-1")
    executor = daemon.executor
    executor.start(launch("a/t", 1, "inst-9", context))
    assert executor.report().tasks["a/t"].reason == "no worker is registered for instance inst-9"
    executor.start(launch("b/t", 1, "inst-1", context, cpus=1.5))
    executor.start(launch("c/t", 1, "inst-1", context, cpus=1.0))
    report = daemon.until(wait_for("c/t", "failed"), "the second start is refused")
    assert report.tasks["b/t"].state in ("starting", "running")
    assert report.tasks["c/t"].reason == "does not fit on inst-1: 1 cores asked, 0.5 of 2 free"


def test_a_silent_worker_is_lost_its_tasks_fail_and_it_kills_them_when_it_is_heard_again(
    daemon, context
):
    agent = daemon.agent("inst-1")
    daemon.agent("inst-2")
    executor = daemon.executor
    executor.start(launch("j/t", 4, "inst-1", context, checkpoint=None))
    daemon.until(wait_for("j/t", "running"), "it runs")

    daemon.partition()  # no worker reaches the daemon
    daemon.clock.advance(60)
    report = executor.report()
    assert report.lost_instances == {
        "inst-1": "lost worker: silent for 60 s",
        "inst-2": "lost worker: silent for 60 s",
    }
    assert report.ready_instances == frozenset()
    lost = report.tasks["j/t"]
    assert (lost.state, lost.reason, lost.instance_id) == (
        "failed",
        "lost worker: silent for 60 s",
        "inst-1",
    )
    executor.start(launch("k/t", 1, "inst-1", context))  # a lost worker takes nothing
    assert executor.report().tasks["k/t"].reason == "lost worker: silent for 60 s"

    daemon.heal()  # the workers are heard again, but they were given up
    _eventually(lambda: agent.lost_reason is not None, "the worker learns it was given up")
    assert agent.lost_reason.startswith("lost worker: silent for 60 s")
    _eventually(
        lambda: [s.state for s in agent.statuses()] == [pb.TASK_STATE_FAILED],
        "the worker kills the task it had",
    )
    assert not any(c.running for c in daemon.runtime.containers({"autoscaler.task": "j/t"}))
    # Once the round has released the instance, the daemon forgets it.
    executor.release("inst-1")
    assert "inst-1" not in executor.report().lost_instances


def test_a_released_instance_cannot_register_again(daemon, context):
    agent = daemon.agent("inst-1")
    daemon.executor.start(launch("j/t", 1, "inst-1", context))
    daemon.until(wait_for("j/t", "running"), "it runs")
    daemon.executor.release("inst-1")  # the round gives the instance up
    assert daemon.executor.report().ready_instances == frozenset()
    # Its worker, forgotten, tries to register again and is told why it may not.
    _eventually(lambda: agent.lost_reason is not None, "the worker is refused")
    assert agent.lost_reason == "instance inst-1 was released: it is being terminated"
    _eventually(
        lambda: [s.state for s in agent.statuses()] == [pb.TASK_STATE_FAILED],
        "the worker kills what it ran",
    )
    assert "inst-1" not in daemon.executor.report().ready_instances


def test_a_newer_attempt_elsewhere_stops_the_old_one(daemon, context):
    old = daemon.agent("inst-1")
    daemon.agent("inst-2")
    executor = daemon.executor
    executor.start(launch("j/t", 1, "inst-1", context))
    daemon.until(wait_for("j/t", "running"), "attempt 1 runs")
    executor.start(launch("j/t", 2, "inst-2", context))
    report = daemon.until(
        lambda r: r.tasks["j/t"].attempt == 2 and r.tasks["j/t"].state == "running",
        "attempt 2 runs",
    )
    assert report.tasks["j/t"].instance_id == "inst-2"
    _eventually(lambda: old.statuses() == [], "attempt 1 is stopped and forgotten")


def test_a_released_instance_is_a_normal_end_logged_at_info(daemon, caplog):
    agent = daemon.agent("inst-1")
    with caplog.at_level(logging.INFO, logger="executor"):
        daemon.executor.release("inst-1")  # scale-in: its tasks were stopped before
        _eventually(lambda: agent.lost_reason is not None, "the worker hears it was released")
        expected = (logging.INFO, f"the daemon released this instance ({agent.lost_reason})")

        def said() -> list[tuple[int, str]]:
            records = list(caplog.records)  # the agent's thread logs after it sets the reason
            return [(r.levelno, r.getMessage()) for r in records if r.name == "executor.agent"]

        _eventually(lambda: expected in said(), "the worker logs why it stops")
    assert [m for level, m in said() if level >= logging.WARNING] == []


def test_progress_reaches_the_daemon_as_it_moves_not_once_a_heartbeat_interval(daemon_on, tmp_path):
    # Heartbeats every 30 s: without progress beats the daemon's count would stand still
    # for 30 s after the first iteration; with them it moves about once a second.
    daemon = daemon_on(f"file://{tmp_path}/store", {}, SimulatedRuntime(), heartbeat_interval_s=30)
    agent = daemon.agent("inst-1", poll_interval_s=0.1, progress_interval_s=0.5)
    context = job_context(daemon.storage, tmp_path)
    daemon.executor.start(launch("j/t", 1, "inst-1", context, env={"STEP_S": "0.01"}))
    seen = [daemon.until(lambda r: r.tasks["j/t"].progress > 0, "the first iteration").tasks]
    beats = agent.beats
    began = time.monotonic()
    for _ in range(3):
        before = seen[-1]["j/t"].progress
        report = daemon.until(lambda r, b=before: r.tasks["j/t"].progress > b, "it moves", 10)
        seen.append(report.tasks)
    # Rate-limited: at most one progress beat a progress_interval_s (and a few others).
    assert agent.beats - beats <= (time.monotonic() - began) / 0.5 + 3
