"""No work lost, no task run twice — on a real Docker engine.

- Checkpoints are uploaded while the job runs: the daemon's report names each
  as the attempt's latest, older versions are pruned (the newest two kept).
- A worker agent killed with SIGKILL: the daemon resumes the task from the
  checkpoint uploaded before the kill (at most one interval lost), and the
  orphaned container stops itself (its watchdog) with the documented status.
- A restarted agent keeps only the attempts the daemon still wants.
- An agent told to stop its tasks (`--stop-tasks`, for `down`) checkpoints them
  first.

The daemon's clock is manual: a worker is lost when the test says so.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace

from executor.reporter import ORPHANED_EXIT
from executor.runtime import LABEL_INSTANCE, LABEL_TASK
from executor.storage import attempt_prefix, is_checkpoint_of
from tests.executor.conftest import (
    PATIENCE_S,
    checkpointed_step,
    job_context,
    launch,
    wait_for,
    worker_process,
)


def _every(start, seconds: float):
    """The launch, with the job checkpointing on its own every `seconds`."""
    return replace(start, run=replace(start.run, checkpoint_every_s=seconds))


def _containers(docker_client, task: str, instance: str | None = None) -> list:
    labels = [f"{LABEL_TASK}={task}"] + ([f"{LABEL_INSTANCE}={instance}"] if instance else [])
    return docker_client.containers.list(all=True, filters={"label": labels})


def test_checkpoints_are_uploaded_while_the_job_runs_and_old_ones_pruned(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1")
    task = "ckpt/t0"
    daemon.executor.start(_every(launch(task, 1, "inst-1", context), 0.3))
    seen: list[str] = []

    def three_while_running(report) -> bool:
        now = report.tasks.get(task)
        running = now is not None and now.state == "running" and now.checkpoint
        if running and (not seen or seen[-1] != now.checkpoint):
            seen.append(now.checkpoint)
        return len(seen) >= 3

    daemon.until(three_while_running, "three checkpoints are reported while the job runs")
    assert all(is_checkpoint_of(daemon.storage, ref, "ckpt", task, 1) for ref in seen)
    steps = [checkpointed_step(daemon.storage, ref, tmp_path) for ref in seen[-2:]]
    assert steps[0] < steps[1]  # versioned by step: each a newer state of the job
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    assert checkpointed_step(daemon.storage, stopped.checkpoint, tmp_path) >= steps[1]
    # The heartbeat that named the last one pruned all but the newest two.
    versions = daemon.storage.list(attempt_prefix("ckpt", task, 1) + "checkpoint-")
    assert len(versions) == 2, versions
    assert daemon.storage.key(stopped.checkpoint) == versions[-1]


def test_an_agent_killed_mid_task_loses_at_most_one_interval_and_its_job_stops_itself(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    task = "kill9/t0"
    process = worker_process(daemon, "inst-k", tmp_path, "--job-watchdog", "2")
    daemon.until(lambda r: "inst-k" in r.ready_instances, "the worker process registers")
    daemon.executor.start(_every(launch(task, 1, "inst-k", context), 0.5))
    running = daemon.until(
        lambda r: r.tasks[task].state == "running" and r.tasks[task].checkpoint is not None,
        "a checkpoint is uploaded while it runs",
    ).tasks[task]
    process.send_signal(signal.SIGKILL)  # no goodbye, no upload at the end
    process.wait(timeout=30)
    (container,) = _containers(docker_client, task, "inst-k")

    # Nobody polls the job any more: within its watchdog (and grace) it checkpoints and
    # exits with the documented status instead of running on beside its task's next attempt.
    result = container.wait(timeout=PATIENCE_S)
    assert result["StatusCode"] == ORPHANED_EXIT
    assert "no word from the worker" in container.logs().decode()

    # The daemon gives the worker up; the task resumes from what was uploaded before the
    # kill: a newer checkpoint than the one seen while it ran, or that one.
    daemon.clock.advance(46)
    lost = daemon.executor.report().tasks[task]
    assert (lost.state, lost.failure) == ("failed", "infrastructure")
    assert is_checkpoint_of(daemon.storage, lost.checkpoint, "kill9", task, 1)
    resumed_at = checkpointed_step(daemon.storage, lost.checkpoint, tmp_path)
    assert resumed_at >= checkpointed_step(daemon.storage, running.checkpoint, tmp_path) > 0
    daemon.executor.acknowledge(task, 1)
    daemon.executor.release("inst-k")
    daemon.agent("inst-a")
    daemon.executor.start(
        launch(task, 2, "inst-a", context, env={"TOTAL": str(resumed_at + 5)},
               checkpoint=lost.checkpoint)
    )  # fmt: skip
    done = daemon.until(wait_for(task, "completed", "failed"), "attempt 2 completes").tasks[task]
    assert done.state == "completed", done.reason
    assert done.log_tail[0] == f"resumed at {resumed_at}"


def test_a_restarted_agent_keeps_only_the_attempts_the_daemon_still_wants(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    kept, moved = "restart/kept", "restart/moved"
    process = worker_process(daemon, "inst-r", tmp_path, "--job-watchdog", "0")
    daemon.until(lambda r: "inst-r" in r.ready_instances, "the worker process registers")
    for task in (kept, moved):
        daemon.executor.start(launch(task, 1, "inst-r", context))
    daemon.until(lambda r: all(r.tasks[t].state == "running" for t in (kept, moved)), "both run")
    (kept_container,) = _containers(docker_client, kept, "inst-r")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)

    # While the agent is down the daemon runs `moved` elsewhere (its next attempt).
    daemon.agent("inst-b")
    daemon.executor.start(launch(moved, 2, "inst-b", context))
    daemon.until(lambda r: r.tasks[moved].attempt == 2, "attempt 2 of moved is asked for")

    worker_process(daemon, "inst-r", tmp_path, "--job-watchdog", "0")  # the same work dir
    deadline = time.monotonic() + PATIENCE_S
    while _containers(docker_client, moved, "inst-r"):
        assert time.monotonic() < deadline, "the unwanted attempt still has a container"
        time.sleep(0.1)
    # The attempt the daemon still wants is adopted, never restarted: the same container.
    (still,) = _containers(docker_client, kept, "inst-r")
    assert still.id == kept_container.id and still.status == "running"
    before = daemon.executor.report().tasks[kept].progress
    daemon.until(lambda r: r.tasks[kept].progress > before, "the adopted job still counts")
    assert daemon.executor.report().tasks[moved].attempt == 2


def test_an_agent_stopping_its_tasks_checkpoints_them_first(docker_daemon, docker_client, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    agent = daemon.agent("inst-d")
    task = "down/t0"
    daemon.executor.start(launch(task, 1, "inst-d", context))
    daemon.until(lambda r: r.tasks[task].progress > 3, "it runs")
    agent.close(stop_tasks=True)  # what SIGTERM does with --stop-tasks (`down`)
    daemon.agents.remove(agent)
    # Before the agent returned, the daemon heard how the task ended.
    stopped = daemon.executor.report().tasks[task]
    assert (stopped.state, stopped.reason) == ("stopped", "checkpointed on request")
    assert stopped.failure == "infrastructure"
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "down", task, 1)
    assert checkpointed_step(daemon.storage, stopped.checkpoint, tmp_path) > 3
    assert not _containers(docker_client, task)


def test_sigterm_to_a_worker_with_stop_tasks_checkpoints_its_tasks_and_leaves_nothing(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    task = "sigterm/t0"
    process = worker_process(daemon, "inst-t", tmp_path, "--stop-tasks")
    daemon.until(lambda r: "inst-t" in r.ready_instances, "the worker process registers")
    daemon.executor.start(launch(task, 1, "inst-t", context))
    daemon.until(lambda r: r.tasks[task].progress > 3, "it runs")
    process.send_signal(signal.SIGTERM)  # what `down` does to each agent
    assert process.wait(timeout=PATIENCE_S) == 0, process.stderr.read().decode()
    stopped = daemon.executor.report().tasks[task]
    assert (stopped.state, stopped.failure) == ("stopped", "infrastructure"), stopped.reason
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "sigterm", task, 1)
    assert checkpointed_step(daemon.storage, stopped.checkpoint, tmp_path) > 3
    assert not _containers(docker_client, task)
