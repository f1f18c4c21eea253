"""Fixtures for the EC2 provisioner tests: fake credentials, moto, a manual clock, faults.

AWS is moto's in-process mock (`mock_aws`, the decorator mode) unless a test
starts `moto_server` itself. Faults are injected with botocore's event hooks on
top of moto: a handler on `provide-client-params.ec2.<Operation>` raises the
`ClientError` a test chose for the calls it chose; the others reach moto.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from autoscaler.cloud import Guardrails
from provisioners.config import EC2Config
from provisioners.ec2 import EC2Cloud

REGION = "us-east-1"


@pytest.fixture(autouse=True)
def fake_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, no user AWS config, no endpoint override, no cache in $HOME."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    # moto would load ~1,300 public AMIs into every region it creates (0.2 s each time);
    # the tests register the one image they launch instead.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def botocore_session() -> botocore.session.Session:
    """One botocore session for all tests: it caches the service models (loading
    EC2's takes ~0.3 s, which a fresh session per test would pay every time)."""
    return botocore.session.get_session()


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def client(aws: None, botocore_session: botocore.session.Session) -> Callable[[str], Any]:
    """`client("ec2")`: a boto3 client talking to moto."""

    def make(service: str) -> Any:
        if service == "s3":  # boto3 cannot add its S3 methods twice to one botocore session
            return boto3.Session().client(service, region_name=REGION)
        return boto3.Session(botocore_session=botocore_session).client(service, region_name=REGION)

    return make


@pytest.fixture
def ec2(client: Callable[[str], Any]) -> Any:
    return client("ec2")


class Images:
    """Worker images registered in moto, described as real EC2 describes them.

    moto's `DescribeImages` leaves out the architecture and the root device a
    registered image was given; this puts them back into its answers.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.facts: dict[str, dict[str, Any]] = {}
        client.meta.events.register("after-call.ec2.DescribeImages", self._describe)

    def register(
        self, architecture: str = "x86_64", root: str = "/dev/xvda", snapshot_gb: int = 8
    ) -> str:
        image_id = register_worker_image(self.client, architecture, root)
        self.facts[image_id] = {
            "Architecture": architecture,
            "RootDeviceName": root,
            "BlockDeviceMappings": [{"DeviceName": root, "Ebs": {"VolumeSize": snapshot_gb}}],
        }
        return image_id

    def _describe(self, parsed: dict[str, Any], **_: Any) -> None:
        for image in parsed.get("Images", []):
            image.update(self.facts.get(image["ImageId"], {}))


@pytest.fixture
def images(ec2: Any) -> Images:
    return Images(ec2)


@pytest.fixture
def ami(images: Images) -> str:
    """The worker image the tests launch (x86_64), registered in moto."""
    return images.register()


def register_worker_image(ec2: Any, architecture: str = "x86_64", root: str = "/dev/xvda") -> str:
    return ec2.register_image(
        Name=f"autoscaler-worker-{architecture}-{len(SUBNET_ZONES)}-{time.monotonic_ns()}",
        RootDeviceName=root,
        Architecture=architecture,
        VirtualizationType="hvm",
    )["ImageId"]


#: Subnet id -> its zone, for `zone_of` (filled by the `network` fixture).
SUBNET_ZONES: dict[str, str] = {}


@dataclass(frozen=True)
class Network:
    """The default VPC's subnets (one per zone, by zone) and a workers' security group."""

    subnets: dict[str, str]  # zone -> subnet id
    security_group: str


@pytest.fixture
def network(ec2: Any) -> Network:
    SUBNET_ZONES.clear()
    subnets: dict[str, str] = {}
    for subnet in ec2.describe_subnets()["Subnets"]:
        subnets.setdefault(subnet["AvailabilityZone"], subnet["SubnetId"])
        SUBNET_ZONES[subnet["SubnetId"]] = subnet["AvailabilityZone"]
    group = ec2.create_security_group(GroupName="workers", Description="autoscaler workers")
    return Network(dict(sorted(subnets.items())), group["GroupId"])


@pytest.fixture
def instance_profile(client: Callable[[str], Any]) -> str:
    client("iam").create_instance_profile(InstanceProfileName="autoscaler-worker")
    return "autoscaler-worker"


class Clock:
    """A clock the test moves by hand (epoch seconds; starts at the real time, since
    moto stamps launch times with it)."""

    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sleeps() -> list[float]:
    """Backoff delays the code asked for; the test never actually waits."""
    return []


def client_error(code: str, operation: str, message: str = "injected") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@dataclass
class Faults:
    """Plan errors for an operation's calls; record every call's parameters.

    `plan(op, [code_or_None, ...])`: the n-th call of `op` raises the n-th code
    (None lets it through to moto). `when(op, predicate, code)` raises for
    every call whose parameters match.
    """

    client: Any
    service: str = "ec2"
    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _planned: dict[str, list[tuple[str | None, str]]] = field(default_factory=dict)
    _rules: dict[str, list[tuple[Any, str, str]]] = field(default_factory=dict)

    def _watch(self, operation: str) -> None:
        if operation in self.calls:
            return
        self.calls[operation] = []

        def handler(params: dict[str, Any], **_: Any) -> None:
            self.calls[operation].append(dict(params))
            planned = self._planned.get(operation)
            if planned:
                code, message = planned.pop(0)
                if code is not None:
                    raise client_error(code, operation, message)
            for predicate, code, message in self._rules.get(operation, []):
                if predicate(params):
                    raise client_error(code, operation, message)

        self.client.meta.events.register(
            f"provide-client-params.{self.service}.{operation}", handler
        )

    def watch(self, *operations: str) -> Faults:
        for operation in operations:
            self._watch(operation)
        return self

    def plan(self, operation: str, codes: list[str | None], message: str = "injected") -> None:
        self._watch(operation)
        self._planned.setdefault(operation, []).extend((code, message) for code in codes)

    def when(self, operation: str, predicate: Any, code: str, message: str = "injected") -> None:
        self._watch(operation)
        self._rules.setdefault(operation, []).append((predicate, code, message))


@pytest.fixture
def faults(ec2: Any) -> Faults:
    return Faults(ec2)


@pytest.fixture
def config(ami: str, tmp_path: Path, network: Network, instance_profile: str) -> EC2Config:
    """A configuration ready to launch: subnets in every zone, a security group, the
    workers' instance profile, and the test image for x86_64 types (and NVIDIA ones)."""
    return EC2Config(
        region=REGION,
        cluster_id="test-cluster",
        subnet_ids=tuple(network.subnets.values()),
        security_group_ids=(network.security_group,),
        iam_instance_profile=instance_profile,
        ami=(("x86_64", ami), ("x86_64_nvidia", ami), ("x86_64_nvidia_proprietary", ami)),
        families=("c7i", "r7i", "p3"),
        cache_dir=tmp_path / "cache",
        dry_run=False,  # these tests launch (the default is a dry run)
    )


def make_cloud(
    config: EC2Config,
    ec2: Any,
    clock: Clock,
    sleeps: list[float],
    guardrails: Guardrails | None = None,
    **kwargs: Any,
) -> EC2Cloud:
    return EC2Cloud(config, guardrails, ec2=ec2, clock=clock, sleep=sleeps.append, **kwargs)


def zone_of(params: dict[str, Any]) -> str | None:
    """The zone a RunInstances call asked for (by the subnet of its network interface)."""
    interfaces = params.get("NetworkInterfaces") or [{}]
    return SUBNET_ZONES.get(interfaces[0].get("SubnetId", ""))


def live_instances(ec2: Any) -> list[dict[str, Any]]:
    """Instances moto holds that are not shutting down or terminated, read straight from EC2."""
    states = ["pending", "running", "stopping", "stopped"]
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": states}]
    )
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


class Lag:
    """`DescribeInstances` lagging `RunInstances`, as on real EC2 (moto lists at once).

    Hidden instances are left out of every `DescribeInstances` answer until
    revealed; with `hide_new`, each instance `RunInstances` starts is hidden.
    """

    def __init__(self, client: Any) -> None:
        self.hidden: set[str] = set()
        self.hide_new = False
        client.meta.events.register("after-call.ec2.DescribeInstances", self._filter)
        client.meta.events.register("after-call.ec2.RunInstances", self._launched)

    def hide(self, *instance_ids: str) -> None:
        self.hidden |= set(instance_ids)

    def reveal(self) -> None:
        self.hidden.clear()

    def _filter(self, parsed: dict[str, Any], **_: Any) -> None:
        reservations = []
        for reservation in parsed.get("Reservations", []):
            kept = [i for i in reservation["Instances"] if i["InstanceId"] not in self.hidden]
            if kept:
                reservations.append({**reservation, "Instances": kept})
        if "Reservations" in parsed:
            parsed["Reservations"] = reservations

    def _launched(self, parsed: dict[str, Any], **_: Any) -> None:
        if self.hide_new:
            self.hidden |= {i["InstanceId"] for i in parsed.get("Instances", [])}


@pytest.fixture
def lag(ec2: Any) -> Lag:
    return Lag(ec2)


class IdempotentRunInstances:
    """EC2's `ClientToken` semantics, which moto lacks: a repeated `RunInstances` with a
    token that already succeeded returns the same instances, or fails with
    `IdempotentParameterMismatch` when any other parameter differs."""

    def __init__(self, client: Any) -> None:
        self.done: dict[str, tuple[dict[str, Any], Any, dict[str, Any]]] = {}
        events = client.meta.events
        events.register("before-parameter-build.ec2.RunInstances", self._remember)
        events.register("before-call.ec2.RunInstances", self._replay)
        events.register("after-call.ec2.RunInstances", self._record)

    @staticmethod
    def _remember(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["test_client_token"] = params.get("ClientToken")
        context["test_params"] = copy.deepcopy(params)

    def _replay(self, context: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]] | None:
        earlier = self.done.get(context.get("test_client_token") or "")
        if earlier is None:
            return None
        params, http, parsed = earlier
        if params != context["test_params"]:
            raise client_error("IdempotentParameterMismatch", "RunInstances")
        return http, copy.deepcopy(parsed)

    def _record(
        self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        token = context.get("test_client_token")
        if token and http_response.status_code == 200 and parsed.get("Instances"):
            self.done.setdefault(
                token, (context["test_params"], http_response, copy.deepcopy(parsed))
            )


@pytest.fixture
def idempotent(ec2: Any) -> IdempotentRunInstances:
    return IdempotentRunInstances(ec2)
