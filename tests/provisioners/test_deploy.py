"""deploy/: the IAM policies grant exactly what the code calls, scoped to one cluster (the
bootstrap script is tested in test_bootstrap)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoscaler.cloud import LaunchRequest, OrphanPolicy
from autoscaler.control import ControlLoop, ControlOptions
from provisioners.aws import make_client
from provisioners.bootstrap import publish_agent_wheel, wheel_presigner
from provisioners.ec2 import TAG_CLUSTER, TAG_MANAGED_BY
from state.memory import InMemoryStore
from tests.builders import KeepPlanner, NullExecutor, Ticking
from tests.provisioners.conftest import REGION, make_cloud
from tests.provisioners.test_bootstrap import WHEEL_NAME, worker_bootstrap

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CLUSTER_TAG = "${aws:PrincipalTag/autoscaler:cluster}"
#: IAM actions of API calls whose action name differs from the call's.
ACTION_OF = {"s3:HeadObject": "s3:GetObject"}


def policy(name: str = "iam-policy.json") -> dict[str, Any]:
    return json.loads((DEPLOY / name).read_text())


def actions_of(document: dict[str, Any]) -> set[str]:
    actions: set[str] = set()
    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow"
        listed = statement["Action"]
        actions |= {listed} if isinstance(listed, str) else set(listed)
    return actions


def statements_with(document: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [
        s
        for s in document["Statement"]
        if action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]


def test_iam_policy_grants_exactly_the_calls_the_daemon_makes(
    config, ec2, client, ami, clock, sleeps, tmp_path
):
    """Run every operation against moto — a launch (image by SSM parameter, spot), list,
    terminate, a dry-run round, publishing the wheel — record the API calls
    of every client, and compare them with the policy's actions."""
    called: set[str] = set()

    def recorder(service: str) -> Any:
        def record(model: Any, **_: Any) -> None:
            name = f"{service}:{model.name}"
            called.add(ACTION_OF.get(name, name))

        return record

    ssm, s3 = client("ssm"), make_client("s3", REGION)
    ssm.put_parameter(Name="/ec2-batch-autoscaler/images/worker", Value=ami, Type="String")
    s3.create_bucket(Bucket="research-batch-artifacts")
    for service, each in (("ec2", ec2), ("ssm", ssm), ("s3", s3)):
        each.meta.events.register(f"before-call.{service}", recorder(service))
    config = replace(
        config,
        spot=("c7i",),
        ami=(("x86_64", "resolve:ssm:/ec2-batch-autoscaler/images/worker"),),
    )
    wheel = tmp_path / WHEEL_NAME
    wheel.write_bytes(b"wheel")

    # What the daemon does at start-up, then in its rounds.
    url, sha256 = publish_agent_wheel(s3, "research-batch-artifacts", "autoscaler", wheel)
    bootstrap = worker_bootstrap(config, wheel_url=wheel_presigner(s3, url), wheel_sha256=sha256)
    cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=bootstrap, ssm=ssm)
    launched = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    cloud.list()
    cloud.terminate([launched.cloud_id])
    dry = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps, ssm=ssm)
    dry.launch(LaunchRequest("r7i.large", "tok-2"))
    dry.terminate([launched.cloud_id])

    implied = {
        "pricing:GetProducts",  # `catalog refresh` (tested against a Stubber: moto has no Pricing)
        "ec2:CreateTags",  # RunInstances' TagSpecifications
        "iam:PassRole",  # RunInstances' IamInstanceProfile
        # EC2 creates the spot service-linked role at an account's first spot launch
        "iam:CreateServiceLinkedRole",
        # EC2, on the daemon's behalf, when the root volume's key is customer-managed
        "kms:CreateGrant",
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:GenerateDataKeyWithoutPlaintext",
        "kms:ReEncryptFrom",
        "kms:ReEncryptTo",
    }
    assert "s3:GetObject" in called  # the wheel's HeadObject; presigned GETs sign the same action
    assert actions_of(policy()) == called | implied


def test_launches_and_terminations_are_scoped_to_this_cluster_and_our_tag():
    document = policy()
    [terminate] = statements_with(document, "ec2:TerminateInstances")
    condition = terminate["Condition"]["StringEquals"]
    assert condition["ec2:ResourceTag/" + TAG_MANAGED_BY] == "ec2-batch-autoscaler"
    assert condition["ec2:ResourceTag/" + TAG_CLUSTER] == CLUSTER_TAG
    tagged = [
        s
        for s in statements_with(document, "ec2:RunInstances")
        if "instance/*" in str(s["Resource"])
    ]
    [launch] = tagged
    condition = launch["Condition"]["StringEquals"]
    assert condition["aws:RequestTag/" + TAG_CLUSTER] == CLUSTER_TAG
    assert condition["aws:RequestTag/" + TAG_MANAGED_BY] == "ec2-batch-autoscaler"
    [spot_role] = statements_with(document, "iam:CreateServiceLinkedRole")
    assert spot_role["Condition"]["StringEquals"]["iam:AWSServiceName"] == "spot.amazonaws.com"
    [grant] = statements_with(document, "kms:CreateGrant")
    assert grant["Condition"]["Bool"]["kms:GrantIsForAWSResource"] == "true"
    # Nothing pins a region: the Pricing API answers from us-east-1 whatever the cluster's.
    assert "RequestedRegion" not in json.dumps(document)


def test_the_worker_role_may_call_nothing():
    # A worker proves its instance with the identity document (no AWS call) and moves its
    # objects with presigned URLs the daemon signs: its role needs no permission at all.
    assert actions_of(policy("worker-iam-policy.json")) == set()
    assert not statements_with(policy(), "ssm:PutParameter")


def test_the_first_run_recipe_a_dry_run_round_asks_ec2_and_changes_nothing(
    config, ec2, ami, clock, sleeps, faults
):
    """The README's first-run recipe: with [ec2] dry_run = true, a round that acts sends
    every launch and termination with DryRun=True (EC2 evaluates the permissions) and
    nothing is launched or terminated."""
    from tests.provisioners.test_ec2_reconcile import past_grace, start_instance, state_of

    orphan = start_instance(ec2, ami, **{TAG_CLUSTER: "test-cluster"})
    faults.watch("RunInstances", "TerminateInstances")
    past_grace(clock, ec2, orphan)
    cloud = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps)
    options = ControlOptions(orphans=OrphanPolicy("terminate"))  # the round acts

    record = ControlLoop(
        KeepPlanner(), cloud, NullExecutor(), InMemoryStore(), Ticking(clock), options
    ).schedule()
    planned = cloud.launch(LaunchRequest("c7i.large", "tok-1"))

    assert [(a.kind, a.outcome) for a in record.record.actions] == [("terminate", "done")]
    assert [c["DryRun"] for c in faults.calls["TerminateInstances"]] == [True]
    assert [c["DryRun"] for c in faults.calls["RunInstances"]] == [True]
    assert planned.dry_run and state_of(ec2, orphan) in ("pending", "running")
    assert "run one round with `dry_run = true`" in (ROOT / "README.md").read_text()
