"""A cluster on EC2 and S3 served by `moto_server`, for the end-to-end tests of the daemon.

The daemon runs on 127.0.0.2, an address its certificate does not name (it names
127.0.0.1, where `init` found it, and the fixed name every client verifies): names are
checked as on a VPC address. Every AWS call it makes is judged against the IAM policy
`autoscaler deploy policy` wrote for this configuration (`AuditedDaemon`,
`tests/aws_audit.py`), and the workers' against theirs, which allows nothing.

moto starts no machine: `BootedInstances` plays the part of the instances. For each instance
of the cluster that EC2 reports running, it reads the instance's user data back from EC2,
takes from it what the bootstrap script would (the daemon's address, the cluster's server
CA, the instance's id), serves the instance's metadata (IMDSv2: its identity document, with
its EC2 id and private address, signed by a stand-in for AWS's key of the region, whose
certificate the cluster's `[ec2] identity_certificates` names) and starts `autoscaler
worker --imds` with those, holding no credentials, as a booted worker does. When EC2 reports
the instance shutting down, its worker and containers go, as they would with the machine.
Only the machine's size is told to the worker (`--capacity`), since this host is not that
type.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from app.config import ClusterConfig, load_cluster_config
from executor.runtime import LABEL_INSTANCE
from provisioners.ec2 import TAG_CLUSTER, TAG_LAUNCH_TOKEN
from provisioners.policy import FILES
from provisioners.wheelhouse import requirements_text
from tests.aws_audit import read_log
from tests.aws_iam import Policy
from tests.e2e.harness import ROOT, Daemon, cli, free_port, set_options
from tests.imds import IdentitySigner, ImdsServer
from tests.provisioners.conftest import register_worker_image

#: AWS's signing key of the region, played by the tests: the cluster trusts its certificate.
AWS = IdentitySigner("us-east-1")

REGION = "us-east-1"
#: The daemon's host: loopback, but not an address its certificate names.
HOST = "127.0.0.2"
#: Statements of the daemon's policy an end-to-end run does not need, and the test that
#: exercises each (`tests/provisioners/test_deploy.py` runs them all against the policy).
EXERCISED_ELSEWHERE = {
    # Prices of us-east-1 are bundled; other regions fetch them (a Stubber plays the API).
    "ReadOnDemandPrices": "tests/provisioners/test_deploy.py, every call the daemon makes",
    # The hourly sweeps of unused build contexts and finished jobs' checkpoints.
    "DeleteUnusedBuildContextsAndFinishedJobsCheckpoints": (
        "tests/provisioners/test_deploy.py, every call the daemon makes"
    ),
}
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def aws_env(endpoint: str, directory: Path) -> dict[str, str]:
    """The environment of a process that talks to moto as if it were AWS."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": str(directory / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(directory / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "XDG_CACHE_HOME": str(directory / "cache"),
    }


def client(service: str, endpoint: str) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=endpoint, **CREDENTIALS)


def ec2_cluster(
    directory: Path, endpoint: str, *, state_url: str | None = None, spot: bool = False
) -> ClusterConfig:
    """`autoscaler init` for EC2, then what an operator fills in: the account's network, an
    image, the workers' instance profile, a bucket, the wheelhouse; short rounds. `spot`:
    `[spot] enabled = true` too, before the policies are written (they grant spot then)."""
    ec2 = client("ec2", endpoint)
    ami = register_worker_image(ec2)
    subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    group = ec2.create_security_group(GroupName=f"{name}-workers", Description="workers")
    client("iam", endpoint).create_instance_profile(InstanceProfileName=f"{name}-worker")
    bucket = f"{name}-artifacts"
    client("s3", endpoint).create_bucket(Bucket=bucket)

    code, out = cli("init", "--dir", str(directory), "--name", name, "--bucket", bucket)
    assert code == 0, out
    # The wheelhouse workers would install at boot: published by the daemon, never
    # installed here (the workers below run this checkout; a real offline install of one
    # is not tested yet).
    house = directory / "wheelhouse"
    house.mkdir()
    (house / "ec2_batch_autoscaler_worker-0.1.0-py3-none-any.whl").write_bytes(
        b"PK\x05\x06" + bytes(18)
    )
    (house / "requirements.txt").write_text(requirements_text(house))
    path = directory / "autoscaler.toml"
    text = path.read_text()
    if state_url is not None:
        text = re.sub(r'# url = "postgresql[^\n]*', f'url = "{state_url}"', text)
        text = text.replace('path = "state.db"', "# path = unused", 1)
    path.write_text(text)
    set_options(
        path,
        {
            "interval_s": "6",
            "step_s": "1",
            "wheelhouse": '"wheelhouse"',
            "dry_run": "false",
            "subnet_ids": f'["{subnets[0]}", "{subnets[1]}"]',
            "security_group_ids": f'["{group["GroupId"]}"]',
            "iam_instance_profile": f'"{name}-worker"',
            "families": '["c7i", "r7i"]',
            "orphan_policy": '"terminate"',
            "x86_64": f'"{ami}"',
            "x86_64_nvidia": f'"{ami}"',
            "heartbeat_s": "30",
            "worker_listen": f'"{HOST}:{free_port()}"',
        },
    )
    AWS.write(directory / "aws-certificates")
    path.write_text(
        path.read_text().replace(
            "[ec2]\n", '[ec2]\nidentity_certificates = "aws-certificates"\n', 1
        )
    )
    chosen = load_cluster_config(path)  # init takes the next free ports when ours are held
    text = path.read_text().replace(
        f'listen = "{chosen.api.listen}"', f'listen = "{HOST}:{free_port()}"'
    )
    path.write_text(
        text.replace(f'listen = "{chosen.metrics.listen}"', f'listen = "127.0.0.1:{free_port()}"')
    )
    if spot:
        path.write_text(path.read_text() + "\n[spot]\nenabled = true\n")
    # The policies for the configuration as it now is (init wrote them for its defaults).
    code, out = cli("deploy", "policy", "--config", str(path))
    assert code == 0, out
    return load_cluster_config(path)


def audited(module: str, *, log: Path, policy: Path, principal: str, endpoint: str) -> list[str]:
    """`python -m MODULE` with every boto3 client it makes audited (`tests/aws_audit.py`)."""
    code = (
        "import sys, runpy, tests.aws_audit as audit; "
        f"audit.install({str(log)!r}, {str(policy)!r}, {principal!r}, {REGION!r}, {endpoint!r}); "
        f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", code]


class AuditedDaemon(Daemon):
    """`autoscaler daemon`, each AWS call it makes judged against its generated policy."""

    def __init__(self, config_path: Path, endpoint: str, **kwargs: Any) -> None:
        self.endpoint = endpoint
        self.audit_log = config_path.parent / "daemon-aws-calls.jsonl"
        self.policy = config_path.parent / "policies" / FILES["daemon"]
        super().__init__(config_path, **kwargs)

    def _start(self) -> subprocess.Popen[bytes]:
        self.env["PYTHONPATH"] = str(ROOT)  # the audit lives in tests/
        command = audited(
            "app",
            log=self.audit_log,
            policy=self.policy,
            principal="daemon",
            endpoint=self.endpoint,
        )
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*command, "daemon", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.config_path.parent,
            )


def check_aws_calls(directory: Path) -> None:
    """Every AWS call the daemon and the workers made was allowed by their policies, and
    every statement of the daemon's was needed by some call (or is exercised, and named,
    in `EXERCISED_ELSEWHERE`)."""
    calls = read_log(directory / "daemon-aws-calls.jsonl")
    assert calls, "the audit recorded no call of the daemon"
    denied = [
        (c["operation"], r["action"], r["resource"], r["reason"])
        for c in calls
        for r in c["requests"]
        if not r["allowed"] and "missing key" not in c["operation"]
    ]
    assert denied == [], f"calls the daemon's policy does not allow: {denied}"
    refused_missing = [c for c in calls if "missing key" in c["operation"] and "403" in c["note"]]
    assert refused_missing == [], refused_missing
    used = {sid for c in calls for r in c["requests"] if r["allowed"] for sid in r["by"]}
    policy = Policy(json.loads((directory / "policies" / FILES["daemon"]).read_text()))
    unused = sorted(set(policy.sids) - used - set(EXERCISED_ELSEWHERE))
    assert unused == [], f"statements no call of the daemon needed: {unused}"
    workers = read_log(directory / "worker-aws-calls.jsonl")
    assert workers == [], f"workers called AWS: {workers}"


def user_data_values(script: str) -> dict[str, str]:
    """The values the rendered bootstrap assigns at its top, evaluated by bash itself."""
    start = script.index("\nDAEMON_ADDRESS=")
    end = script.index("\n", script.index("\nTHROUGHPUT_WINDOW=") + 1)
    names = (
        "DAEMON_ADDRESS",
        "CA_PEM",
        "CLUSTER_ID",
        "REGION",
        "INSTANCE_ID",
        "THROUGHPUT_WINDOW",
    )
    quoted = " ".join(f'"${name}"' for name in names)
    shell = f'eval "$1"; printf "%s\\0" {quoted}'
    printed = subprocess.run(
        ["bash", "-c", shell, "_", script[start:end]],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    return dict(zip(names, printed.split("\0"), strict=False))


@dataclass
class BootedInstances:
    """Starts the worker of each running instance of `cluster`; stops it when EC2 does."""

    endpoint: str
    cluster: str
    capacity: dict[str, str]  # instance type -> "GPU,CPU,RAM"
    directory: Path
    docker: Any  # a docker client, to remove what a vanished machine ran
    cluster_dir: Path  # the cluster's directory: its policies, where the audit writes
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)  # EC2 id -> our id
    user_data: dict[str, dict[str, str]] = field(default_factory=dict)
    metadata: dict[str, ImdsServer] = field(default_factory=dict)  # EC2 id -> its IMDS
    errors: list[str] = field(default_factory=list)
    halted: set[str] = field(default_factory=set)  # EC2 ids whose machine is gone
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.ec2 = client("ec2", self.endpoint)

    def start(self) -> BootedInstances:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.poll()
            except Exception as exc:  # reported by the test, not lost in a thread
                self.errors.append(repr(exc))

    def listing(self) -> list[dict[str, Any]]:
        """Every instance of the cluster EC2 knows, terminated ones included."""
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]}]
        )
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def poll(self) -> None:
        for inst in self.listing():
            ec2_id, state = inst["InstanceId"], inst["State"]["Name"]
            if state == "running" and ec2_id not in self.workers:
                self._boot(ec2_id, inst["InstanceType"], inst["PrivateIpAddress"])
            elif state in ("shutting-down", "terminated", "stopping", "stopped"):
                self._halt(ec2_id)

    def _boot(self, ec2_id: str, itype: str, private_ip: str) -> None:
        attribute = self.ec2.describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")
        script = base64.b64decode(attribute["UserData"]["Value"]).decode()
        values = user_data_values(script)
        self.user_data[ec2_id] = values
        ours = values["INSTANCE_ID"]
        work = self.directory / ours
        work.mkdir(parents=True, exist_ok=True)
        ca = work / "ca.pem"
        ca.write_text(values["CA_PEM"] + "\n")
        document = AWS.document(ec2_id, private_ip, instanceType=itype)
        self.metadata[ec2_id] = imds = ImdsServer(document, AWS.rsa2048(document))
        command = [
            *audited(
                "executor",
                log=self.cluster_dir / "worker-aws-calls.jsonl",
                policy=self.cluster_dir / "policies" / FILES["worker"],
                principal="worker",
                endpoint=self.endpoint,
            ),
            "--daemon", values["DAEMON_ADDRESS"],
            "--ca", str(ca),
            "--imds", imds.url,
            "--instance-id", ours,
            "--capacity", self.capacity[itype],
            "--work-dir", str(work),
            "--checkpoint-wait", "5",
            "--stop-grace", "5",
            "--throughput-window", values["THROUGHPUT_WINDOW"],  # the cluster's interval_s
        ]  # fmt: skip
        with (work / "agent.log").open("ab") as log:
            self.workers[ec2_id] = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # No AWS credentials: a worker calls no AWS API (grants and IMDS only).
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                    "PYTHONPATH": str(ROOT),
                },
                start_new_session=True,
            )
        self.tokens[ec2_id] = ours

    def _halt(self, ec2_id: str) -> None:
        process = self.workers.get(ec2_id)
        if process is None or ec2_id in self.halted:
            return
        self.halted.add(ec2_id)
        if process.poll() is None:  # its worker may have died first: its containers go all
            os.killpg(process.pid, signal.SIGKILL)  # the same (the machine is gone: no goodbye)
            process.wait(timeout=30)
        imds = self.metadata.pop(ec2_id, None)
        if imds is not None:
            imds.close()
        for container in self.docker.containers.list(
            all=True, filters={"label": f"{LABEL_INSTANCE}={self.tokens[ec2_id]}"}
        ):
            container.remove(force=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for ec2_id in list(self.workers):
            self._halt(ec2_id)

    def instance_ids(self) -> list[str]:
        """The launch-token tag of every instance EC2 ever started for the cluster."""
        return [
            tag["Value"]
            for inst in self.listing()
            for tag in inst.get("Tags", [])
            if tag["Key"] == TAG_LAUNCH_TOKEN
        ]
