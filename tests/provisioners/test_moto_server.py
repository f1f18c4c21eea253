"""End to end over HTTP: `moto_server` on 127.0.0.1, the CLI and EC2Cloud through `endpoint_url`.

The server runs as a separate process, so nothing here shares state with the
in-process mock: the catalog refresh, a launch, a crash and its retry, an
orphan, a termination, and finally AWS going away.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from app.config import load_provisioner_config
from autoscaler.cloud import LaunchRequest
from provisioners.aws import make_client
from provisioners.bootstrap import object_presigner, publish_wheelhouse
from provisioners.ec2 import TAG_CLUSTER, EC2Cloud
from provisioners.wheelhouse import pack, requirements_text
from state.memory import InMemoryStore
from tests.provisioners.conftest import REGION, Clock, register_worker_image
from tests.provisioners.test_ec2_reconcile import known_to, orphan_actions, past_grace, round_over


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def moto_server() -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.05)
        yield url, server
    finally:
        server.terminate()
        server.wait(timeout=10)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # One attempt per call: moto_server answers the unimplemented Pricing API with HTTP 500,
    # which botocore would otherwise retry with backoff; nothing else here fails.
    env["AWS_MAX_ATTEMPTS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_catalog_launch_crash_orphan_terminate_and_outage_over_http(moto_server, tmp_path: Path):
    url, server = moto_server
    raw = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    ami = register_worker_image(raw)
    subnets = [s["SubnetId"] for s in raw.describe_subnets()["Subnets"]]
    group = raw.create_security_group(GroupName="workers", Description="workers")["GroupId"]
    iam = boto3.client("iam", region_name=REGION, endpoint_url=url)
    iam.create_instance_profile(InstanceProfileName="autoscaler-worker")
    config_path = tmp_path / "autoscaler.toml"
    config_path.write_text(
        f'[ec2]\ncluster_id = "e2e"\norphan_policy = "terminate"\n'
        f'zones = ["{REGION}b", "{REGION}c"]\ncache_dir = "{tmp_path / "cache"}"\n'
        f'subnet_ids = {json.dumps(subnets)}\nsecurity_group_ids = ["{group}"]\n'
        'iam_instance_profile = "autoscaler-worker"\nfamilies = ["c7i", "r7i"]\n'
        "dry_run = false\n"
        f'[ec2.ami]\nx86_64 = "{ami}"\n'
        "[guardrails]\nmax_instances = 3\nmax_hourly_spend = 5.0\n"
    )

    # 1. The catalog, refreshed through the CLI.
    refreshed = cli("catalog", "refresh", "--config", str(config_path), "--endpoint-url", url)
    assert refreshed.returncode == 1, refreshed.stderr  # no Pricing API in moto
    assert "prices not refreshed" in refreshed.stderr and "Traceback" not in refreshed.stderr
    assert "18 instance types" in refreshed.stdout
    assert "Source: AWS (fetched" in refreshed.stdout

    # 2. A launch, then a new process (as after a crash before recording) retries it.
    config = load_provisioner_config(config_path)
    clock = Clock()
    cloud = EC2Cloud.from_config(config, endpoint_url=url, clock=clock)
    launched = cloud.launch(LaunchRequest("r7i.large", "e2e-1"))
    assert launched.zone == f"{REGION}b"
    after_crash = EC2Cloud.from_config(config, endpoint_url=url, clock=clock)
    assert after_crash.launch(LaunchRequest("r7i.large", "e2e-1")).cloud_id == (launched.cloud_id)
    assert [i.cloud_id for i in after_crash.list()] == [launched.cloud_id]

    # 3. An orphan: tagged with our cluster, unknown to the state.
    orphan = raw.run_instances(
        ImageId=ami,
        InstanceType="c7i.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "e2e"}]}
        ],
    )["Instances"][0]["InstanceId"]
    store = InMemoryStore()
    known_to(store, launched, clock())
    past_grace(clock, raw, orphan)  # the grace period runs from the orphan's own launch time
    assert orphan_actions(round_over(after_crash, store, clock)) == [("terminate", orphan, "done")]
    assert [i.cloud_id for i in after_crash.list() if i.state != "shutting-down"] == [
        launched.cloud_id
    ]

    # 4. Terminate what we launched.
    after_crash.terminate([launched.cloud_id])
    assert all(i.state in ("shutting-down", "terminated") for i in after_crash.list())

    # 5. AWS goes away: the refresh falls back to the cached catalog and says so.
    server.terminate()
    server.wait(timeout=10)
    offline = cli("catalog", "refresh", "--config", str(config_path), "--endpoint-url", url)
    assert offline.returncode == 1
    assert "Traceback" not in offline.stderr
    assert "catalog not refreshed" in offline.stderr and "cannot reach AWS" in offline.stderr
    assert "Showing the cached catalog instead" in offline.stderr
    assert "Source: AWS (cached; fetched" in offline.stdout


def test_a_published_wheelhouse_is_fetched_by_its_presigned_url_and_matches_its_hash(
    moto_server, tmp_path: Path
):
    """What a booting worker does with its user data: download the wheelhouse by the URL
    made for its launch (no AWS credentials) and check the hash."""
    url, _ = moto_server
    s3 = make_client("s3", REGION, endpoint_url=url)
    s3.create_bucket(Bucket="research-batch-artifacts")
    house = tmp_path / "wheelhouse"
    house.mkdir()
    (house / "ec2_batch_autoscaler_worker-0.1.0-py3-none-any.whl").write_bytes(
        b"PK\x03\x04" + bytes(range(256)) * 64
    )
    (house / "requirements.txt").write_text(requirements_text(house))

    s3_url, sha256 = publish_wheelhouse(s3, "research-batch-artifacts", "autoscaler", house)
    presigned = object_presigner(s3, s3_url)()

    with urllib.request.urlopen(presigned, timeout=10) as response:
        body = response.read()
    assert hashlib.sha256(body).hexdigest() == sha256 == pack(house)[1]
    with pytest.raises(urllib.error.HTTPError):  # the URL is the credential: no signature, nothing
        urllib.request.urlopen(presigned.split("?", 1)[0], timeout=10)


def test_down_terminates_every_instance_tagged_with_the_cluster_known_or_not(
    moto_server, tmp_path: Path
):
    from app.down import graceful_down

    url, _server = moto_server
    raw = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    ami = register_worker_image(raw)
    subnets = [s["SubnetId"] for s in raw.describe_subnets()["Subnets"]]
    group = raw.create_security_group(GroupName="workers", Description="workers")["GroupId"]
    iam = boto3.client("iam", region_name=REGION, endpoint_url=url)
    iam.create_instance_profile(InstanceProfileName="autoscaler-worker")
    config_path = tmp_path / "autoscaler.toml"
    config_path.write_text(
        f'[ec2]\ncluster_id = "e2e"\nzones = ["{REGION}b"]\ncache_dir = "{tmp_path / "cache"}"\n'
        f'subnet_ids = {json.dumps(subnets)}\nsecurity_group_ids = ["{group}"]\n'
        'iam_instance_profile = "autoscaler-worker"\nfamilies = ["c7i", "r7i"]\n'
        "dry_run = false\n"
        f'[ec2.ami]\nx86_64 = "{ami}"\n'
        "[guardrails]\nmax_instances = 3\nmax_hourly_spend = 5.0\n"
    )
    clock = Clock()
    cloud = EC2Cloud.from_config(
        load_provisioner_config(config_path), endpoint_url=url, clock=clock
    )
    launched = cloud.launch(LaunchRequest("r7i.large", "e2e-1"))  # known to the state

    def tagged(cluster: str) -> str:
        return raw.run_instances(
            ImageId=ami,
            InstanceType="c7i.large",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": cluster}]}
            ],
        )["Instances"][0]["InstanceId"]

    unknown = tagged("e2e")  # ours, but the state never heard of it (a crash, a lost record)
    stopped = tagged("e2e")  # ours, and stopped (its disk still bills)
    raw.stop_instances(InstanceIds=[stopped])
    neighbour = tagged("other")  # another cluster's: never touched
    store = InMemoryStore()
    known_to(store, launched, clock())

    report = graceful_down(store, cloud, None, clock)

    assert sorted(i["cloud_id"] for i in report.instances) == sorted(
        [launched.cloud_id, unknown, stopped]
    )
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in raw.describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    for ours in (launched.cloud_id, unknown, stopped):
        assert states[ours] in ("shutting-down", "terminated"), (ours, states[ours])
    assert states[neighbour] == "running"
    assert cloud.list() == [] or all(
        i.state in ("shutting-down", "terminated") for i in cloud.list()
    )
    # The state records the instance it knew as ending, billed until EC2 said so.
    [record] = store.instances(include_finished=True)
    assert record.status in ("terminating", "terminated")
