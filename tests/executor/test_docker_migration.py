"""A training job's life through real parts: Docker, gRPC with mutual TLS, S3 on moto.

A job built from its Dockerfile runs on one worker, reports its throughput, is
stopped, its checkpoint lands in S3, it resumes on a second worker from that
checkpoint (its iteration count goes on from there) and completes.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from executor.runtime import LABEL_ATTEMPT, LABEL_INSTANCE, LABEL_TASK
from executor.storage import context_digest, is_checkpoint_of, log_key
from tests.executor.conftest import checkpointed_step, job_context, launch, wait_for


def test_a_job_runs_reports_checkpoints_to_s3_resumes_elsewhere_and_completes(
    docker_daemon, docker_client, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path, unique=True)  # built here, not cached
    daemon.agent("inst-a")
    daemon.agent("inst-b")
    task = "job-1/trainer"

    # 1. Started on inst-a: at once `starting` in the report, then running with a throughput.
    daemon.executor.start(launch(task, 1, "inst-a", context, env={"STEP_S": "0.01"}))
    assert daemon.executor.report().tasks[task].state in ("starting", "running")
    running = daemon.until(
        lambda r: r.tasks[task].state == "running" and r.tasks[task].throughput is not None,
        "the job reports a throughput",
    ).tasks[task]
    assert running.instance_id == "inst-a" and running.attempt == 1
    # 0.01 s per step bounds the rate from above whatever the machine's load.
    assert 0 < running.throughput <= 101
    assert {"fetch", "build", "start"} <= set(running.phases)
    later = daemon.until(
        lambda r: r.tasks[task].progress > running.progress, "progress grows"
    ).tasks[task]
    assert later.progress > running.progress > 0

    # 2. Stopped: at least `checkpointing` at once, then stopped with a checkpoint in S3.
    daemon.executor.stop(task, 1)
    assert daemon.executor.report().tasks[task].state in ("checkpointing", "stopped")
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "the job stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    assert stopped.reason == "checkpointed on request"
    # Uploaded through a grant, under attempt 1's own prefix, versioned by the job's step.
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "job-1", task, 1)
    assert {"checkpoint", "upload"} <= set(stopped.phases)
    saved_step = checkpointed_step(daemon.storage, stopped.checkpoint, tmp_path)
    assert saved_step >= later.progress
    assert f"checkpointed at {saved_step}" in stopped.log_tail
    assert daemon.storage.exists(log_key("job-1", task, 1))
    # Terminal states stay reported until acknowledged.
    assert daemon.executor.report().tasks[task].state == "stopped"
    daemon.executor.acknowledge(task, 1)
    assert task not in daemon.executor.report().tasks

    # 3. Resumed on inst-b from that checkpoint: the count goes on, it does not restart.
    total = saved_step + 30
    daemon.executor.start(
        launch(task, 2, "inst-b", context, env={"TOTAL": str(total)}, checkpoint=stopped.checkpoint)
    )
    done = daemon.until(wait_for(task, "completed", "failed"), "the job completes").tasks[task]
    assert done.state == "completed", done.reason
    assert done.instance_id == "inst-b" and done.attempt == 2 and done.exit_code == 0
    assert done.log_tail[0] == f"resumed at {saved_step}"
    assert done.log_tail[-1] == f"done at {total}"
    # The image is content-addressed: the second worker (same engine) neither fetched nor
    # built the context again.
    assert "build" not in done.phases
    assert daemon.storage.exists(log_key("job-1", task, 2))
    # The first attempt's container is gone; the second's too, once it ended.
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_TASK}={task}"})
    assert docker_client.images.get(f"autoscaler/context:{context_digest(context)}")


def test_the_container_runs_unprivileged_with_the_tasks_limits_and_environment(
    docker_daemon, docker_client, tmp_path, monkeypatch
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    monkeypatch.chdir(tmp_path)
    daemon.agent("inst-l", work_dir=Path("relative/work"))  # as the local cloud passes it
    task = "job-2/t0"
    daemon.executor.start(
        launch(
            task,
            3,
            "inst-l",
            context,
            env={"LR": "0.1"},
            cpus=0.5,
            memory_gb=0.25,
            shm_size_gb=0.125,
        )
    )
    seen = daemon.until(wait_for(task, "running", "failed"), "the job runs").tasks[task]
    assert seen.state == "running", seen.reason
    (container,) = docker_client.containers.list(
        filters={"label": [f"{LABEL_TASK}={task}", f"{LABEL_INSTANCE}=inst-l"]}
    )
    host = container.attrs["HostConfig"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["NanoCpus"] == 500_000_000  # 0.5 cores at one thread per core
    assert host["ShmSize"] == 128 << 20
    assert host["Init"] is True
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert set(mounts) == {"/checkpoint", "/run/autoscaler"}
    assert all(m["RW"] and m["Type"] == "bind" for m in mounts.values())
    assert all(m["Source"].startswith(f"{tmp_path}/relative/work/") for m in mounts.values())
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["LR"] == "0.1"
    assert env["AUTOSCALER_JOB_ID"] == "job-2" and env["AUTOSCALER_TASK_ID"] == task
    assert env["AUTOSCALER_ATTEMPT"] == "3" and env["AUTOSCALER_RESUMED"] == "0"
    assert env["AUTOSCALER_CHECKPOINT_DIR"] == "/checkpoint"
    assert env["AUTOSCALER_REPORT_SOCKET"] == "/run/autoscaler/report.sock"
    assert container.labels[LABEL_ATTEMPT] == "3"
    # The job cannot reach anything: it has only a loopback interface.
    code, output = container.exec_run(["cat", "/proc/net/dev"])
    interfaces = {line.split(":")[0].strip() for line in output.decode().splitlines()[2:]}
    assert code == 0 and interfaces == {"lo"}


def test_a_context_that_is_not_what_its_address_says_is_refused(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path, unique=True)
    # Someone overwrites the stored context with other bytes under the same address.
    digest = context_digest(context)
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text("FROM autoscaler/python:3.11\nRUN echo pwned\n")
        tar.add(dockerfile, arcname="Dockerfile")
    daemon.storage.put_file(f"contexts/{digest}.tar.gz", forged)
    daemon.agent("inst-f")
    task = "job-3/t0"
    daemon.executor.start(launch(task, 1, "inst-f", context))
    failed = daemon.until(wait_for(task, "failed"), "the start fails").tasks[task]
    assert re.fullmatch(r"fetch failed: .*does not match its sha256 address", failed.reason)
