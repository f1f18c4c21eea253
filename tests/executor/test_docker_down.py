"""`autoscaler down --yes` on a real Docker engine, with the daemon stopped: every task
checkpoints first, what it saved is uploaded and recorded for its task, and nothing of the
cluster is left — also when an agent was killed with SIGKILL while its task ran.

The cluster is `autoscaler init --local`'s; its local cloud starts real agents (as the
daemon would), which enroll with the test's daemon side of the executor.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tarfile
import time
from pathlib import Path

import pytest

from app.cli import main
from app.config import load_cluster_config
from app.init import init_cluster
from app.wiring import offline_catalog, open_state
from autoscaler.cloud import LaunchRequest
from autoscaler.store import TaskUpdate
from executor.client import Launch
from executor.runtime import LABEL_INSTANCE
from executor.storage import checkpoint_step, open_storage
from provisioners.local import LocalCloud, _alive, _processes
from tests.builders import job
from tests.executor.conftest import PATIENCE_S, job_context, launch, s3_options
from tests.store_writes import adopted_round

TASK = "dn/0"


class _Verifier:
    """The local cloud proves its agents (its one-time secrets); made before the cloud."""

    cloud: LocalCloud | None = None

    def verify(self, request, launch):
        assert self.cloud is not None
        return self.cloud.verify(request, launch)


@pytest.fixture
def cluster(tmp_path, daemon_on, docker_runtime, s3_url, moto_endpoint):
    """A local cluster directory, its state holding job `dn` with its task placed on
    `test-1` (attempt 1), the daemon side of the executor, and the cluster's local cloud
    with one real agent, running the task in Docker."""
    init_cluster(tmp_path / "cluster", name="test", local=True)
    config = load_cluster_config(tmp_path / "cluster" / "autoscaler.toml")
    verifier = _Verifier()
    daemon = daemon_on(s3_url, s3_options(moto_endpoint), docker_runtime, verifier=verifier)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(daemon.server_ca.cert_pem)
    env = {k: "" for k in os.environ if k.startswith("AWS_")}  # the agent holds no credentials
    cloud = LocalCloud(
        offline_catalog(config),
        config.path.parent / "local-cloud",  # where `down` (build_cloud) looks
        daemon_address=daemon.address,
        ca_path=ca,
        python=sys.executable,
        extra_env=env,
        throughput_window_s=0.5,
    )
    verifier.cloud = cloud
    daemon.ledger.add_launch(Launch("test-1"))  # type: ignore[attr-defined]
    daemon.instances.add("test-1")
    launched = cloud.launch(LaunchRequest("c7i.large", "test-1"))
    daemon.until(lambda r: "test-1" in r.ready_instances, "the agent enrolls")

    store = open_state(config, create=True)
    now = time.time()
    store.submit_job(job("dn", (0, 0.5, 0.25)), owner="ana", at=now)
    adopted_round(store, now, requests=[("test-1", "c7i.large", 0.1)], targets={TASK: "test-1"})
    store.transition_instance("test-1", "running", now, cloud_id=launched.cloud_id)
    store.update_tasks([TaskUpdate(TASK, status="running", instance_id="test-1", attempt=1)], now)
    store.close()

    context = job_context(daemon.storage, tmp_path)
    daemon.executor.start(launch(TASK, 1, "test-1", context))
    daemon.until(lambda r: r.tasks[TASK].progress > 20, "the job runs and counts")
    yield config, daemon, cloud
    cloud.sweep()  # whatever a failed test left


def _down(config, capsys, *flags: str) -> dict:
    assert main(["down", "--yes", "--json", *flags, "--config", str(config.path)]) == 0
    return json.loads(capsys.readouterr().out)


def _nothing_left(config, docker_client) -> None:
    marker = str((config.path.parent / "local-cloud" / "instances").absolute())
    assert [pid for pid, cmdline in _processes() if marker in cmdline] == []
    labelled = docker_client.containers.list(all=True, filters={"label": LABEL_INSTANCE})
    assert [c.id for c in labelled if c.labels[LABEL_INSTANCE] == "test-1"] == []


def _saved_step(config, ref: str, tmp_path: Path) -> int:
    archive = tmp_path / "saved.tar.gz"
    open_storage(config.storage.url).get_file(ref, archive)
    with tarfile.open(archive) as tar:
        member = tar.extractfile("state.json")
        assert member is not None
        return json.load(member)["step"]


def _resumes_from(config, step: int) -> None:
    """The task is pending again, from the checkpoint `down` recorded; its job queued."""
    store = open_state(config)
    try:
        snapshot = store.snapshot(with_throughput=False)
        task = snapshot.tasks[TASK]
        assert (task.status, task.instance_id) == ("pending", None)
        assert checkpoint_step(task.checkpoint) == step
        assert [j.job_id for j in snapshot.jobs] == ["dn"]
        assert all(i.status in ("terminated", "failed") for i in store.instances())
    finally:
        store.close()


def test_down_after_an_agent_was_killed_checkpoints_its_orphaned_task_and_leaves_nothing(
    cluster, docker_client, capsys, tmp_path
):
    config, daemon, cloud = cluster
    pid = cloud._read("test-1")["pid"]
    os.kill(pid, signal.SIGKILL)  # the agent dies; its container runs on
    deadline = time.monotonic() + PATIENCE_S
    while _alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    daemon.partition()  # and the daemon is stopped too
    [running] = docker_client.containers.list(filters={"label": f"{LABEL_INSTANCE}=test-1"})

    report = _down(config, capsys, "--grace", "30")

    [task] = report["tasks"]
    assert (task["task_id"], task["instance_id"], task["saved"]) == (TASK, "test-1", "by down")
    assert report["leftovers"]["containers"] == [running.id]
    # What the job saved when `down` asked it (as its agent would have) is in the storage.
    assert task["checkpoint_step"] > 20
    assert _saved_step(config, task["checkpoint"], tmp_path) == task["checkpoint_step"]
    _nothing_left(config, docker_client)
    _resumes_from(config, task["checkpoint_step"])


def test_down_with_the_daemon_stopped_has_each_agent_checkpoint_its_tasks_first(
    cluster, docker_client, capsys, tmp_path
):
    config, daemon, cloud = cluster
    pid = cloud._read("test-1")["pid"]
    daemon.partition()  # the daemon is stopped: no agent can get an upload granted

    began = time.monotonic()
    report = _down(config, capsys)  # the default grace
    took = time.monotonic() - began

    assert report["terminated"] == ["test-1"] and not _alive(pid)
    assert report["leftovers"] == {"agents": [], "containers": []}  # the agent saw to it
    [task] = report["tasks"]
    assert task["saved"] == "by down" and task["checkpoint_step"] > 20
    assert _saved_step(config, task["checkpoint"], tmp_path) == task["checkpoint_step"]
    # The agent gave up on uploads once its containers stopped, not after its patience.
    assert took < report["grace_s"]
    _nothing_left(config, docker_client)
    _resumes_from(config, task["checkpoint_step"])
    # `down` again finds nothing more to do.
    again = _down(config, capsys)
    assert again["terminated"] == [] and again["tasks"] == []
