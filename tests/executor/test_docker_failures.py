"""Bad things that happen, each ending as a task state with its reason and its failure class,
nothing checkpointed lost.

A Dockerfile that fails to build, an image that cannot be pulled, a command
that is not there, a job that exits non-zero (with a code it declares fatal or
not), one killed for memory, one that ignores the checkpoint request, an S3
upload that fails. (A worker killed with SIGKILL, and a daemon that restarts:
test_docker_workers.py.)
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from autoscaler.jobs import TaskRun
from executor.storage import attempt_prefix, is_checkpoint_of, log_key
from tests.executor.conftest import job_context, launch, wait_for


def _checkpoint_from_a_first_attempt(daemon, context: str, task: str, instance: str) -> str:
    """Run attempt 1 until it has made progress, stop it, return its checkpoint."""
    daemon.executor.start(launch(task, 1, instance, context))
    daemon.until(lambda r: r.tasks[task].progress > 5, "the first attempt makes progress")
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped" and stopped.checkpoint, stopped.reason
    daemon.executor.acknowledge(task, 1)
    return stopped.checkpoint


def test_a_dockerfile_that_fails_to_build(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path, "broken")
    daemon.agent("inst-1")
    daemon.executor.start(launch("bad/t0", 1, "inst-1", context))
    failed = daemon.until(wait_for("bad/t0", "failed", "running"), "the build ends").tasks["bad/t0"]
    assert (failed.state, failed.failure) == ("failed", "deterministic")
    assert failed.reason.startswith("build failed: "), failed.reason
    # The Dockerfile's own failure is in the reason: the command, its code, its output.
    assert "exit 3' returned a non-zero code: 3" in failed.reason
    assert "compiling the model" in failed.reason
    assert "build" in failed.phases and "start" not in failed.phases
    assert failed.checkpoint is None
    # The build's output is the attempt's log: `autoscaler logs` shows it.
    assert "compiling the model" in failed.log_tail
    assert "Step 2/2" in _read(daemon, log_key("bad", "bad/t0", 1), tmp_path)


def test_a_job_that_exits_non_zero_keeps_its_log_and_what_it_saved(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1")
    task = "crash/t0"
    env = {"EXIT_AFTER": "25", "EXIT_CODE": "3", "SAVE_EVERY": "10"}
    daemon.executor.start(launch(task, 1, "inst-1", context, env=env))
    failed = daemon.until(wait_for(task, "failed", "completed"), "the job exits").tasks[task]
    assert (failed.state, failed.failure) == ("failed", "transient")  # a retry may not fail
    assert failed.reason == "exit code 3" and failed.exit_code == 3
    assert failed.log_tail[-1] == "giving up at 25"
    assert daemon.storage.exists(log_key("crash", task, 1))
    log_text = _read(daemon, log_key("crash", task, 1), tmp_path)
    assert "saved at 20" in log_text and "giving up at 25" in log_text
    # What the job checkpointed on its own before failing is kept: the next attempt
    # resumes from step 20, not from zero.
    assert is_checkpoint_of(daemon.storage, failed.checkpoint, "crash", task, 1)
    daemon.executor.acknowledge(task, 1)
    daemon.executor.start(
        launch(task, 2, "inst-1", context, env={"TOTAL": "30"}, checkpoint=failed.checkpoint)
    )
    done = daemon.until(wait_for(task, "completed", "failed"), "the retry completes").tasks[task]
    assert done.state == "completed", done.reason
    assert done.log_tail[0] == "resumed at 20"


def test_an_exit_code_the_job_declares_fatal_is_deterministic(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1")
    task = "fatal/t0"
    start = launch(task, 1, "inst-1", context, env={"EXIT_AFTER": "3", "EXIT_CODE": "3"})
    start = replace(start, run=replace(start.run, fatal_exit_codes=(2, 3)))
    daemon.executor.start(start)
    failed = daemon.until(wait_for(task, "failed", "completed"), "the job exits").tasks[task]
    assert (failed.state, failed.failure) == ("failed", "deterministic")
    assert failed.reason == "exit code 3, which the job declares fatal"


def test_a_command_that_is_not_there_is_deterministic(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1")
    task = "typo/t0"
    start = launch(task, 1, "inst-1", context)
    start = replace(start, run=replace(start.run, command=("pyhton", "train.py")))
    daemon.executor.start(start)
    failed = daemon.until(wait_for(task, "failed", "completed"), "the start fails").tasks[task]
    assert (failed.state, failed.failure) == ("failed", "deterministic"), failed.reason
    assert "not found" in failed.reason and "pyhton" in failed.reason, failed.reason


def test_an_image_that_cannot_be_pulled_is_deterministic(docker_daemon):
    daemon = docker_daemon
    daemon.agent("inst-1")
    task = "nopull/t0"
    start = launch(task, 1, "inst-1", "unused")
    # No registry listens there: the pull fails however often it is tried.
    daemon.executor.start(replace(start, run=TaskRun(image="127.0.0.1:9/no/such:image")))
    failed = daemon.until(wait_for(task, "failed", "running"), "the pull fails").tasks[task]
    assert (failed.state, failed.failure) == ("failed", "deterministic"), failed.reason
    assert failed.reason.startswith("fetch failed: cannot pull 127.0.0.1:9/no/such:image")


def test_a_job_killed_for_memory(docker_daemon, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1")
    task = "hog/t0"
    env = {"ALLOCATE_MB": "16", "STEP_S": "0.001"}
    daemon.executor.start(launch(task, 1, "inst-1", context, env=env, memory_gb=0.125))
    failed = daemon.until(wait_for(task, "failed", "completed"), "the job dies").tasks[task]
    assert (failed.state, failed.failure) == ("failed", "transient")
    assert failed.reason == "out of memory (limit 0.125 GiB)"
    assert failed.exit_code == 137


def test_a_job_that_ignores_the_checkpoint_request_is_killed_and_keeps_its_last_save(
    docker_daemon, tmp_path
):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1", checkpoint_wait_s=1.0, stop_grace_s=1.0)
    task = "deaf/t0"
    env = {"IGNORE_STOP": "1", "SAVE_EVERY": "10", "STEP_S": "0.005"}
    daemon.executor.start(launch(task, 1, "inst-1", context, env=env))
    daemon.until(lambda r: r.tasks[task].progress >= 12, "the job has saved once")
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "the job is stopped").tasks[task]
    assert (stopped.state, stopped.failure) == ("stopped", "infrastructure")
    assert stopped.reason == (
        "did not acknowledge the checkpoint request within 1 s; sent SIGTERM; "
        "killed after a 1 s grace period"
    )
    assert stopped.exit_code == 137
    # Its own last save survives the kill: the checkpoint it had written is uploaded.
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "deaf", task, 1)
    saves = [line for line in stopped.log_tail if line.startswith("saved at ")]
    assert saves, stopped.log_tail
    daemon.executor.acknowledge(task, 1)
    daemon.executor.start(
        launch(task, 2, "inst-1", context, env={"TOTAL": "1"}, checkpoint=stopped.checkpoint)
    )
    resumed = daemon.until(wait_for(task, "completed", "failed"), "resumes").tasks[task]
    resumed_at = int(resumed.log_tail[0].removeprefix("resumed at "))
    # The last save the log shows is at most a few steps behind the uploaded one (the log
    # tail is read after the kill; the checkpoint is whatever the directory held then).
    assert resumed_at >= int(saves[-1].removeprefix("saved at ")) >= 10


class _Unavailable(BaseHTTPRequestHandler):
    """S3 on a bad day: every request answered 503, as S3 answers when it sheds load."""

    def do_PUT(self) -> None:
        self.server.refused.append(self.path)  # type: ignore[attr-defined]
        self.send_response(503, "Service Unavailable")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_an_upload_that_fails_keeps_the_previous_checkpoint(docker_daemon, moto_endpoint, tmp_path):
    daemon = docker_daemon
    context = job_context(daemon.storage, tmp_path)
    daemon.agent("inst-1", upload_patience_s=1.0)
    task = "s3down/t0"
    previous = _checkpoint_from_a_first_attempt(daemon, context, task, "inst-1")
    daemon.executor.start(launch(task, 2, "inst-1", context, checkpoint=previous))
    daemon.until(lambda r: r.tasks[task].attempt == 2 and r.tasks[task].throughput, "it runs")
    # S3 starts refusing checkpoint uploads (logs still go through): the grants the daemon
    # signs from now on lead to an S3 endpoint that answers 503.
    down = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    down.refused = []  # type: ignore[attr-defined]
    threading.Thread(target=down.serve_forever, daemon=True).start()

    def to_the_unavailable_endpoint(request, **kwargs):
        if request.url.split("?")[0].endswith(".tar.gz"):
            request.url = request.url.replace(moto_endpoint, f"http://127.0.0.1:{down.server_port}")

    daemon.storage.client.meta.events.register(
        "before-sign.s3.PutObject", to_the_unavailable_endpoint
    )
    try:
        daemon.executor.stop(task, 2)
        failed = daemon.until(wait_for(task, "stopped", "failed"), "attempt 2 ends").tasks[task]
    finally:
        down.shutdown()
    assert (failed.state, failed.failure) == ("failed", "infrastructure"), failed.reason
    assert re.fullmatch(
        r"checkpoint upload failed: cannot upload to http://\S+/jobs/s3down/t0/2/"
        r"checkpoint-\d{12}\.tar\.gz: HTTP 503 Service Unavailable \(checkpointed on request\)",
        failed.reason,
    ), failed.reason
    # Tried again while S3 refused (the daemon answering), then given up after the patience.
    assert len(down.refused) >= 2, down.refused  # type: ignore[attr-defined]
    # Nothing half-uploaded is referenced: the task resumes from the checkpoint before.
    assert failed.checkpoint == previous
    assert not daemon.storage.list(attempt_prefix("s3down", task, 2) + "checkpoint-")
    assert daemon.storage.exists(log_key("s3down", task, 2))


def _read(daemon, key: str, tmp_path) -> str:
    target = tmp_path / "read"
    daemon.storage.get_file(key, target)
    return target.read_text()
