"""deploy/: the IAM policy grants exactly what the code calls (the bootstrap: test_bootstrap)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoscaler.cloud import LaunchRequest
from tests.provisioners.conftest import make_cloud

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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
