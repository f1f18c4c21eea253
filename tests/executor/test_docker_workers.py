"""Workers and daemons that die: SIGKILL mid-task, a daemon restart, an agent restart.

The SIGKILLed worker is a real `autoscaler worker` process enrolling with its
one-time secret and holding no credentials; the others run in this process. The daemon's clock is
manual: a worker is lost when the test moves the clock past the heartbeat
timeout, never because the machine was slow.
"""

from __future__ import annotations

import time

from executor.runtime import LABEL_INSTANCE, LABEL_TASK
from tests.executor.conftest import (
    PATIENCE_S,
    checkpointed_step,
    job_context,
    launch,
    wait_for,
    worker_process,
)


def _first_checkpoint(daemon, context: str, task: str, instance: str) -> tuple[str, int]:
    daemon.executor.start(launch(task, 1, instance, context))
    daemon.until(lambda r: r.tasks[task].progress > 5, "attempt 1 makes progress")
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "attempt 1 stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    daemon.executor.acknowledge(task, 1)
    return stopped.checkpoint, checkpointed_step(daemon.storage, stopped.checkpoint, daemon.work)


def test_a_worker_killed_mid_task_is_lost_and_its_task_resumes_from_its_last_checkpoint(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    task = "job-k/t0"
    daemon.agent("inst-a")
    checkpoint, step = _first_checkpoint(daemon, context, task, "inst-a")

    process = worker_process(daemon, "inst-k", tmp_path)
    daemon.until(lambda r: "inst-k" in r.ready_instances, "the worker process registers")
    daemon.executor.start(launch(task, 2, "inst-k", context, checkpoint=checkpoint))
    daemon.until(
        lambda r: r.tasks[task].state == "running" and r.tasks[task].progress > step + 3,
        "attempt 2 runs on inst-k, past its checkpoint",
    )

    process.kill()  # SIGKILL: no goodbye, no upload
    process.wait(timeout=30)
    daemon.clock.advance(46)
    # inst-a heart-beats on; inst-k does not. Wait until inst-a has been heard at the new
    # time (without asking for a report, which would judge before it could answer).
    deadline = time.monotonic() + PATIENCE_S
    while not any(
        w.instance_id == "inst-a" and w.last_seen == daemon.clock.t
        for w in daemon.executor.workers()
    ):
        assert time.monotonic() < deadline, "inst-a stopped heart-beating"
        time.sleep(0.05)
    report = daemon.executor.report()
    assert report.lost_instances == {"inst-k": "lost worker: silent for 46 s"}
    assert report.ready_instances == {"inst-a"}
    lost = report.tasks[task]
    assert (lost.state, lost.attempt, lost.reason) == (
        "failed",
        2,
        "lost worker: silent for 46 s",
    )
    assert lost.checkpoint == checkpoint  # the last one uploaded: attempt 1's
    # The killed worker's container outlived it; terminating the instance is the round's
    # job (`release`, then the cloud). Here it is still there.
    assert docker_client.containers.list(
        filters={"label": [f"{LABEL_INSTANCE}=inst-k", f"{LABEL_TASK}={task}"]}
    )
    daemon.executor.acknowledge(task, 2)
    daemon.executor.release("inst-k")
    assert "inst-k" not in daemon.executor.report().lost_instances

    daemon.executor.start(
        launch(task, 3, "inst-a", context, env={"TOTAL": str(step + 20)},
               checkpoint=checkpoint)
    )  # fmt: skip
    done = daemon.until(wait_for(task, "completed", "failed"), "attempt 3 completes").tasks[task]
    assert done.state == "completed", done.reason
    assert done.log_tail[0] == f"resumed at {step}"


def test_a_daemon_restart_leaves_the_containers_running_and_the_workers_come_back(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-r")
    task = "job-r/t0"
    daemon.executor.start(launch(task, 1, "inst-r", context))
    before = daemon.until(
        lambda r: r.tasks[task].state == "running" and r.tasks[task].progress > 3, "it runs"
    ).tasks[task]
    (container,) = docker_client.containers.list(filters={"label": f"{LABEL_TASK}={task}"})

    daemon.restart()
    assert daemon.executor.report().tasks == {}  # a new daemon knows nothing yet
    after = daemon.until(
        lambda r: task in r.tasks and r.tasks[task].progress > before.progress,
        "the worker registers again with its running task",
    ).tasks[task]
    assert (after.state, after.attempt, after.instance_id) == ("running", 1, "inst-r")
    (still,) = docker_client.containers.list(filters={"label": f"{LABEL_TASK}={task}"})
    assert still.id == container.id  # the same container, never restarted

    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped" and stopped.checkpoint, stopped.reason


def test_a_restarted_agent_adopts_the_containers_of_its_instance(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    first = daemon.agent("inst-x")
    task = "job-x/t0"
    daemon.executor.start(launch(task, 1, "inst-x", context))
    daemon.until(lambda r: r.tasks[task].progress > 3, "it runs")
    first.close()  # the agent process goes (systemd restarts it); the container stays
    daemon.agents.remove(first)

    daemon.agent("inst-x")
    adopted = daemon.until(
        lambda r: r.tasks[task].state == "running" and r.tasks[task].throughput is not None,
        "the new agent reports the adopted task",
    ).tasks[task]
    assert adopted.attempt == 1
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    assert stopped.reason == "checkpointed on request" and stopped.checkpoint
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_TASK}={task}"})
