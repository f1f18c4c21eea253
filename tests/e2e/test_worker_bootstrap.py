"""The worker bootstrap executed for real, in a stand-in instance (`tests/e2e/instance.py`).

The daemon of an EC2 cluster (moto for EC2 and S3) publishes the real wheelhouse built by
`autoscaler deploy wheelhouse` and launches an instance for a submitted job; the user data
it wrote for that launch runs with bash in a container of a local Amazon Linux stand-in
image, whose only network is the metadata service (IMDSv2, the instance's signed identity
document), S3 and the daemon. It must install the agent offline (pip with `--no-index
--require-hashes` from the downloaded wheelhouse), start it as its unprivileged user, and
the agent must enroll: the daemon records the instance as registered. A wheelhouse that
differs from its hash ends in the shutdown path, with the reason PUT where the daemon
reads it (`BootReports`).
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from provisioners.bootstrap import (
    BootReports,
    WorkerBootstrap,
    object_presigner,
    publish_wheelhouse,
)
from provisioners.ec2 import TAG_CLUSTER
from tests.e2e.ec2 import AWS, REGION, aws_env, client, ec2_cluster, user_data_values
from tests.e2e.harness import Daemon, cli, cli_json, copy_example, state_of, until
from tests.e2e.instance import Instance, Links, ensure_instance_image
from tests.executor.conftest import docker_client, moto_endpoint, python_image  # noqa: F401
from tests.imds import ImdsServer

pytestmark = [pytest.mark.timeout(900), pytest.mark.long]

#: The images' interpreter here (the stand-in copies this host's 3.11), x86_64 only.
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64")


@pytest.fixture(scope="session")
def docker_socket(docker_client) -> str:  # noqa: F811
    scheme, _, path, _, _ = urlsplit(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    if scheme != "unix":
        pytest.skip("the stand-in instance mounts the engine's Unix socket")
    return path


@pytest.fixture(scope="session")
def instance_image(docker_client, python_image, docker_socket) -> str:  # noqa: F811
    return ensure_instance_image(docker_client, docker_socket)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """The workers' wheelhouse, built as an operator does (once per session)."""
    out = tmp_path_factory.mktemp("wheelhouse")
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    code, text = cli("deploy", "wheelhouse", "--out", str(out), "--python", "3.11", *platforms)
    assert code == 0, text
    return out


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):  # noqa: F811
    for key, value in aws_env(moto_endpoint, tmp_path).items():
        monkeypatch.setenv(key, value)
    return moto_endpoint


@pytest.fixture
def links() -> Iterator[Links]:
    # Unix socket paths are short (108 bytes): not under tmp_path.
    directory = Path(tempfile.mkdtemp(prefix="net-", dir="/tmp"))
    directory.chmod(0o755)
    made = Links(directory)
    yield made
    made.close()
    shutil.rmtree(directory, ignore_errors=True)


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def _running(ec2, cluster: str) -> list[dict]:
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def test_the_bootstrap_installs_the_agent_offline_and_its_agent_registers(
    tmp_path,
    aws,
    wheelhouse,
    instance_image,
    docker_client,  # noqa: F811
    docker_socket,
    links,
):
    config = ec2_cluster(tmp_path / "cluster", aws)
    house = config.path.parent / "wheelhouse"
    shutil.rmtree(house)
    shutil.copytree(wheelhouse, house)  # the real one, where the configuration names it
    at = ("--config", str(config.path))
    ec2 = client("ec2", aws)
    daemon = Daemon(config.path)
    instance = imds = None
    try:
        daemon.wait_serving()
        job = copy_example("train", tmp_path / "jobs", {"TOTAL": "600"})
        cli_json("submit", str(job), *at)
        [launched, *_] = until(
            "EC2 to run an instance", lambda: _running(ec2, config.cluster.name), daemon=daemon
        )
        ec2_id = launched["InstanceId"]
        attribute = ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")
        user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
        ours = user_data_values(user_data)
        document = AWS.document(
            ec2_id, launched["PrivateIpAddress"], instanceType=launched["InstanceType"]
        )
        imds = ImdsServer(document, AWS.rsa2048(document))
        links.add("169.254.169.254:80", _host_port(imds.url))
        # The daemon's enrollment address, and where enrolled workers heart-beat.
        for address in {ours["DAEMON_ADDRESS"], config.worker_address}:
            links.add(address, address)
        links.add(_host_port(aws), _host_port(aws))
        instance = Instance.boot(docker_client, user_data, links, tmp_path, docker_socket)

        until("the user data to end", lambda: instance.status() is not None, daemon=daemon)
        assert instance.status() == 0, instance.logs()
        calls = instance.calls()
        assert "systemctl enable --now autoscaler-worker" in calls, calls
        assert not [c for c in calls if c.startswith(("shutdown", "poweroff"))], calls
        # Installed offline from the wheelhouse: the agent runs from the bootstrap's venv.
        code, out = instance.container.exec_run(["/opt/autoscaler-worker/bin/pip", "freeze"])
        assert code == 0 and b"ec2-batch-autoscaler-worker" in out.lower().replace(b"_", b"-")

        def registered():
            with state_of(config) as store:
                records = {i.instance_id: i for i in store.instances(include_finished=True)}
            record = records.get(ours["INSTANCE_ID"])
            return record if record is not None and record.ready_at is not None else None

        record = until("the worker to register", registered, daemon=daemon)
        assert record.cloud_id == ec2_id
        # It proved its instance with the identity document, through IMDSv2.
        assert "PUT /latest/api/token" in imds.requests
        assert "GET /latest/dynamic/instance-identity/document" in imds.requests
        assert daemon.stop() == 0
    finally:
        if instance is not None:
            print(instance.logs())
            instance.remove()
        if imds is not None:
            imds.close()
        daemon.kill()
        cli("down", "--yes", *at)


def test_a_wheelhouse_differing_from_its_hash_shuts_the_instance_down_with_the_reason(
    tmp_path,
    aws,
    wheelhouse,
    instance_image,
    docker_client,  # noqa: F811
    docker_socket,
    links,
):
    s3 = client("s3", aws)
    s3.create_bucket(Bucket="boot-artifacts")
    url, sha256 = publish_wheelhouse(s3, "boot-artifacts", "c1", wheelhouse)
    key = urlsplit(url).path.lstrip("/")
    archive = s3.get_object(Bucket="boot-artifacts", Key=key)["Body"].read()
    tampered = archive[:-1024] + bytes([archive[-1024] ^ 1]) + archive[-1023:]
    s3.put_object(Bucket="boot-artifacts", Key=key, Body=tampered)
    reports = BootReports(s3, "boot-artifacts", "c1")
    bootstrap = WorkerBootstrap(
        "127.0.0.2:7443",
        AWS.cert.public_bytes(Encoding.PEM).decode(),  # any PEM: no daemon is dialled
        "c1",
        REGION,
        object_presigner(s3, url),
        sha256,
        reports=reports,
    )
    links.add(_host_port(aws), _host_port(aws))
    instance = Instance.boot(
        docker_client, bootstrap.render("i-tampered"), links, tmp_path, docker_socket
    )
    try:
        until("the user data to end", lambda: instance.status() is not None)
        assert instance.status() == 1, instance.logs()
        calls = instance.calls()
        assert any(c.startswith("shutdown -h now") for c in calls), calls
        assert not any(c.startswith("systemctl enable --now autoscaler-worker") for c in calls)
        report = reports.read("i-tampered")
        assert "checking the wheelhouse's sha256" in report, report
        assert f"sha256 is not {sha256}" in report, report
    finally:
        instance.remove()
