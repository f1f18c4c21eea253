"""The local cloud: instances are agent processes on this host, tracked on disk so a
restarted daemon finds them; terminating one stops its process."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from app.bundled import bundled
from app.files import load_catalog
from autoscaler.cloud import CloudRequestError, LaunchRequest
from executor.client import Launch
from executor.enrollment import EnrollmentRefused
from executor.protos import worker_pb2 as pb
from executor.security import read_secret
from provisioners.local import SECRET_FILE, LocalCloud, _alive


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, python: str, **kwargs) -> LocalCloud:
    return LocalCloud(
        load_catalog(bundled("ec2_config.json")),
        tmp_path / "cloud",
        daemon_address="127.0.0.1:7443",
        ca_path=tmp_path / "ca.pem",
        python=python,
        **kwargs,
    )


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_launch_starts_one_agent_advertising_the_types_capacity(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent)
    try:
        first = cloud.launch(LaunchRequest("c7i.xlarge", "tok-1"))
        again = cloud.launch(LaunchRequest("c7i.xlarge", "tok-1"))  # idempotent by token
        assert again.cloud_id == first.cloud_id and first.instance_id == "tok-1"
        [listed] = cloud.list()
        assert (listed.cloud_id, listed.state, listed.instance_type) == (
            first.cloud_id,
            "running",
            "c7i.xlarge",
        )
        argv = tmp_path / "cloud" / "instances" / "tok-1" / "work" / "argv"
        wait_for(lambda: argv.exists() and argv.read_text())  # written, not just created
        args = argv.read_text()
        assert "--instance-id tok-1" in args and "--capacity 0,2,8" in args
        assert "--daemon 127.0.0.1:7443" in args
        secret = tmp_path / "cloud" / "instances" / "tok-1" / "work" / SECRET_FILE
        assert f"--enrollment-secret {secret}" in args
        # Told to stop, it checkpoints its tasks first; without a daemon it stops itself.
        assert "--stop-tasks" in args.split()
        assert "--orphan-timeout" not in args  # the agent's own default unless configured
    finally:
        cloud.terminate_all()


def test_agents_get_the_spend_brake_the_cluster_configures(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent, orphan_timeout_s=600.0, orphan_max_s=0.0)
    try:
        cloud.launch(LaunchRequest("c7i.large", "tok-1"))
        argv = tmp_path / "cloud" / "instances" / "tok-1" / "work" / "argv"
        wait_for(lambda: argv.exists() and argv.read_text())
        args = argv.read_text()
        assert "--orphan-timeout 600 " in args and "--orphan-max 0" in args
    finally:
        cloud.terminate_all()


def test_leftover_agents_are_found_by_their_work_directory_whatever_their_record_says(
    tmp_path, fake_agent
):
    cloud = make(tmp_path, fake_agent)
    other = make(tmp_path / "elsewhere", fake_agent)  # another cluster's cloud on this host
    try:
        cloud.launch(LaunchRequest("c7i.large", "tok-1"))
        cloud.launch(LaunchRequest("c7i.large", "tok-2"))
        other.launch(LaunchRequest("c7i.large", "tok-1"))
        pids = {t: cloud._read(t)["pid"] for t in ("tok-1", "tok-2")}
        # tok-2's record is wrong (says terminated while its agent runs): still found.
        record = cloud._read("tok-2")
        record["state"] = "terminated"
        cloud._write(record)
        assert [i.instance_id for i in cloud.list()] == ["tok-1"]
        wait_for(lambda: set(cloud.leftovers().agents) >= set(pids.values()))
        found = cloud.leftovers()
        assert other._read("tok-1")["pid"] not in found.agents  # not this cluster's
        swept = cloud.sweep(grace_s=5.0)
        assert set(swept.agents) == set(found.agents)
        assert not any(_alive(pid) for pid in pids.values())
        assert not cloud.leftovers()
        assert [i.instance_id for i in other.list()] == ["tok-1"]  # left alone
    finally:
        cloud.terminate_all()
        other.terminate_all()


def test_terminate_signals_every_agent_at_once_and_kills_those_that_outlive_the_grace(
    tmp_path,
):
    # An agent that ignores SIGTERM (as one stopping its tasks for longer than the grace).
    script = tmp_path / "stubborn-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[sys.argv.index('--work-dir') + 1], 'ready').touch()\n"
        "time.sleep(600)\n"
    )
    script.chmod(0o755)
    cloud = make(tmp_path, str(script))
    launched = [cloud.launch(LaunchRequest("c7i.large", f"tok-{n}")) for n in (1, 2, 3)]
    pids = [cloud._read(f"tok-{n}")["pid"] for n in (1, 2, 3)]
    for n in (1, 2, 3):  # each ignores SIGTERM by now
        wait_for((tmp_path / "cloud" / "instances" / f"tok-{n}" / "work" / "ready").exists)
    heard: list[tuple[int, float]] = []
    began = time.monotonic()
    cloud.terminate([i.cloud_id for i in launched], grace_s=1.5, waiting=lambda *a: heard.append(a))
    took = time.monotonic() - began
    assert not any(_alive(pid) for pid in pids)
    assert took < 3 * 1.5  # one grace for all of them, not one each
    assert heard and heard[0][0] == 3  # told how many were still stopping
    assert cloud.list() == []


def test_each_agent_gets_a_one_time_secret_only_it_can_read(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent)
    try:
        for token in ("tok-1", "tok-2"):
            cloud.launch(LaunchRequest("c7i.large", token))
        secrets = {}
        for token in ("tok-1", "tok-2"):
            path = tmp_path / "cloud" / "instances" / token / "work" / SECRET_FILE
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            secrets[token] = read_secret(path).decode().strip()
            # The cloud's record keeps only its digest.
            assert secrets[token] not in (path.parent.parent / "instance.json").read_text()

        def enroll(token: str, secret: str) -> None:
            request = pb.EnrollRequest(instance_id=token, local_secret=secret)
            cloud.verify(request, Launch(token))

        with pytest.raises(EnrollmentRefused, match="wrong enrollment secret"):
            enroll("tok-2", secrets["tok-1"])  # another agent's secret
        enroll("tok-1", secrets["tok-1"])
        with pytest.raises(EnrollmentRefused, match="used already"):
            enroll("tok-1", secrets["tok-1"])
        # Used once, even for a daemon restarted in between (the record is on disk).
        with pytest.raises(EnrollmentRefused, match="used already"):
            make(tmp_path, fake_agent).verify(
                pb.EnrollRequest(instance_id="tok-1", local_secret=secrets["tok-1"]),
                Launch("tok-1"),
            )
        with pytest.raises(EnrollmentRefused, match="runs no instance"):
            enroll("tok-9", secrets["tok-2"])
    finally:
        cloud.terminate_all()
    with pytest.raises(EnrollmentRefused, match="runs no instance"):
        enroll("tok-2", secrets["tok-2"])  # terminated: nothing enrolls as it any more


def test_terminate_stops_the_agent_and_a_restarted_daemon_still_sees_the_rest(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent)
    a = cloud.launch(LaunchRequest("c7i.large", "tok-a"))
    b = cloud.launch(LaunchRequest("c7i.large", "tok-b"))
    pid_a = cloud._read("tok-a")["pid"]
    try:
        cloud.terminate([a.cloud_id, "local-unknown"])
        assert not _alive(pid_a, "tok-a")
        restarted = make(tmp_path, fake_agent)  # a new process, nothing in memory
        assert [i.cloud_id for i in restarted.list()] == [b.cloud_id]
        # launching a token again after a restart returns what it started
        assert restarted.launch(LaunchRequest("c7i.large", "tok-b")).cloud_id == b.cloud_id
    finally:
        cloud.terminate_all()
    assert cloud.list() == []


def test_an_agent_that_dies_is_an_instance_gone(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent)
    cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    pid = cloud._read("tok-1")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cloud.list() == [])
    assert cloud._read("tok-1")["state"] == "terminated"


def test_emulated_delays_keep_it_pending_until_acquired(tmp_path, fake_agent):
    clock = Clock()
    cloud = make(tmp_path, fake_agent, emulate_delays=True, clock=clock)
    try:
        launched = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
        assert launched.state == "pending"
        acquisition = load_catalog(bundled("ec2_config.json"))["c7i.large"].launch_delays
        clock.now += acquisition.acquisition_s + 0.01
        assert [i.state for i in cloud.list()] == ["running"]
    finally:
        cloud.terminate_all()


def test_a_type_outside_the_catalog_is_refused(tmp_path, fake_agent):
    with pytest.raises(CloudRequestError, match="not in the catalog"):
        make(tmp_path, fake_agent).launch(LaunchRequest("x9.huge", "tok-1"))
