"""deploy/: the worker bootstrap renders to safe bash; the IAM policy grants what we call."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autoscaler.cloud import LaunchRequest
from autoscaler.errors import InputError
from provisioners.ec2 import MAX_USER_DATA_BYTES, read_worker_bootstrap, worker_user_data
from tests.provisioners.conftest import make_cloud

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
VALUES = {
    "MASTER_ADDRESS": "10.0.0.5:50051",
    "WORKER_TOKEN": "s3cret",
    "CLUSTER_ID": "research-batch",
    "AGENT_PACKAGE": "ec2-batch-autoscaler[worker]==0.1.0",
}
bash = shutil.which("bash")
needs_bash = pytest.mark.skipif(bash is None, reason="bash is not installed")


@needs_bash
def test_worker_bootstrap_renders_to_syntactically_valid_bash(tmp_path):
    script = tmp_path / "user-data.sh"
    script.write_text(read_worker_bootstrap(DEPLOY / "worker-bootstrap.sh", VALUES))
    checked = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert "MASTER_ADDRESS=10.0.0.5:50051\n" in text
    assert "AGENT_PACKAGE='ec2-batch-autoscaler[worker]==0.1.0'\n" in text
    assert "{{" not in text


@needs_bash
def test_bootstrap_values_cannot_inject_commands(tmp_path):
    hostile = "$(touch pwned)'; touch pwned2; echo '"
    template = 'TOKEN={{WORKER_TOKEN}}\nprintf %s "$TOKEN"\n'
    rendered = worker_user_data(template, {**VALUES, "WORKER_TOKEN": hostile})
    ran = subprocess.run([bash, "-c", rendered], capture_output=True, text=True, cwd=tmp_path)
    assert ran.stdout == hostile
    assert list(tmp_path.iterdir()) == []


def test_bootstrap_with_a_missing_value_or_unknown_placeholder_is_an_error():
    with pytest.raises(InputError, match="needs a value for WORKER_TOKEN"):
        worker_user_data("x", {k: v for k, v in VALUES.items() if k != "WORKER_TOKEN"})
    with pytest.raises(InputError, match=r"unknown placeholder \{\{MASTER_PORT\}\}"):
        worker_user_data("PORT={{MASTER_PORT}}", VALUES)


def test_user_data_over_the_ec2_limit_is_refused_up_front(config, ec2, clock, sleeps):
    with pytest.raises(InputError, match=f"at most {MAX_USER_DATA_BYTES}"):
        make_cloud(config, ec2, clock, sleeps, user_data="#" * (MAX_USER_DATA_BYTES + 1))


def policy_actions() -> set[str]:
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())
    actions: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        listed = statement["Action"]
        actions |= {listed} if isinstance(listed, str) else set(listed)
    return actions


def test_iam_policy_grants_exactly_the_calls_the_provisioner_makes(
    config, ec2, client, clock, sleeps
):
    """Run every operation against moto, record the EC2 API calls, compare with the policy."""
    called: set[str] = set()

    def record(model: Any, **_: Any) -> None:
        called.add(f"ec2:{model.name}")

    ec2.meta.events.register("before-call.ec2", record)
    cloud = make_cloud(replace(config, spot=("c7i",)), ec2, clock, sleeps)

    launched = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    cloud.list()
    cloud.terminate([launched.instance_id])

    implied = {
        "pricing:GetProducts",  # `catalog refresh` (tested against a Stubber: moto has no Pricing)
        "ec2:CreateTags",  # RunInstances' TagSpecifications
        "iam:PassRole",  # RunInstances' IamInstanceProfile
    }
    assert policy_actions() == called | implied
