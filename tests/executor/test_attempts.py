"""The attempt runner's memory across agent processes: the launch kept beside each attempt
in the worker protocol's own encoding, and adoption by a restarted agent.

Containers are simulated (`SimulatedRuntime`: threads that outlive the agent object,
as Docker containers outlive the agent process); `test_docker_workers.py` does the
same restart on a real engine.
"""

from __future__ import annotations

import pytest

from autoscaler.execution import ResourceLimits, TaskLaunch
from autoscaler.jobs import TaskRun
from executor.attempts import LAUNCH_FILE, load_launch, save_launch
from executor.messages import BadMessage
from executor.runtime import LABEL_TASK
from executor.simulated import SimulatedRuntime
from executor.storage import is_checkpoint_of
from tests.executor.conftest import job_context, launch, wait_for


@pytest.fixture
def runtime():
    return SimulatedRuntime()


@pytest.fixture
def daemon(daemon_on, tmp_path, runtime):
    return daemon_on(f"file://{tmp_path}/store", {}, runtime)


def test_a_launch_is_kept_in_the_protocols_encoding_and_read_back_whole(tmp_path):
    full = TaskLaunch(
        task_id="j/t",
        job_id="j",
        attempt=3,
        instance_id="inst-1",
        workload="j_t",
        run=TaskRun(
            build_context="s3://b/contexts/" + "a" * 64 + ".tar.gz",
            command=("python", "train.py"),
            env=(("A", "1"), ("B", "two")),
            shm_size_gb=0.5,
            network=True,
            checkpoint_every_s=120.0,
            fatal_exit_codes=(2, 3),
        ),
        limits=ResourceLimits(cpus=1.5, memory_gb=2.0, gpus=(0, 1), shm_size_gb=1.0),
        checkpoint="s3://b/jobs/j/t/2.tar.gz",
    )
    bare = TaskLaunch(
        task_id="j/u",
        job_id="j",
        attempt=1,
        instance_id="",
        workload="j_u",
        run=TaskRun(image="autoscaler/python:3.11"),
        limits=ResourceLimits(cpus=0.5, memory_gb=0.25),
    )
    for original in (full, bare):
        save_launch(tmp_path, original)
        assert load_launch(tmp_path) == original
    (tmp_path / LAUNCH_FILE).write_bytes(b"")  # an empty message: no task id
    with pytest.raises(BadMessage, match="task_id"):
        load_launch(tmp_path)


def test_an_agent_restarted_on_its_work_dir_adopts_its_running_attempt(daemon, tmp_path, runtime):
    context = job_context(daemon.storage, tmp_path)
    first = daemon.agent("inst-a")
    task = "adopt/t0"
    daemon.executor.start(launch(task, 1, "inst-a", context, env={"STEP_S": "0.005"}))
    daemon.until(lambda r: r.tasks[task].progress > 3, "it runs")
    [saved] = list((tmp_path / "workers" / "inst-a" / "attempts").glob(f"*/{LAUNCH_FILE}"))
    assert load_launch(saved.parent).task_id == task
    first.close(grace_s=0)  # the agent process goes; its container keeps running
    daemon.agents.remove(first)

    second = daemon.agent("inst-a")  # the same instance, the same work directory
    [status] = second.statuses()
    assert (status.task_id, status.attempt) == (task, 1)
    before = daemon.executor.report().tasks[task].progress
    daemon.until(lambda r: r.tasks[task].progress > before, "the adopted job still counts")
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert (stopped.state, stopped.reason) == ("stopped", "checkpointed on request")
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "adopt", task, 1)
    assert not runtime.containers({LABEL_TASK: task})  # ended and removed


def test_a_container_without_a_readable_launch_is_removed_not_adopted(daemon, tmp_path, runtime):
    context = job_context(daemon.storage, tmp_path)
    first = daemon.agent("inst-b")
    task = "orphan/t0"
    daemon.executor.start(launch(task, 1, "inst-b", context, env={"STEP_S": "0.005"}))
    daemon.until(lambda r: r.tasks[task].progress > 0, "it runs")
    first.close(grace_s=0)
    daemon.agents.remove(first)
    [saved] = list((tmp_path / "workers" / "inst-b" / "attempts").glob(f"*/{LAUNCH_FILE}"))
    saved.write_bytes(b"\xff not a message")

    second = daemon.agent("inst-b")
    assert second.statuses() == []
    assert not runtime.containers({LABEL_TASK: task})
