"""The cluster's IAM policies, generated from its configuration (`provisioners.policy`):
every call the daemon makes is allowed, as AWS would judge it (`tests/aws_audit.py`), no
statement is there for nothing, nothing outside the cluster is granted, the linter finds
nothing, and deploy/*.json are what the generator writes for the sample configuration."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from autoscaler.cloud import CloudRequestError, LaunchRequest, OrphanPolicy
from autoscaler.control import ControlLoop, ControlOptions
from executor.storage import S3Storage, upload_context
from provisioners.aws import AwsCaller, make_client
from provisioners.bootstrap import BootReports, object_presigner, publish_wheelhouse
from provisioners.catalog import fetch_price_table
from provisioners.config import EC2Config
from provisioners.policy import FILES, daemon_policy, render, s3_lifecycle, worker_policy
from provisioners.spot_prices import fetch_spot_prices
from state.memory import InMemoryStore
from tests.aws_audit import Audit
from tests.aws_iam import Policy, Request, requests_for
from tests.builders import KeepPlanner, NullExecutor, Ticking
from tests.provisioners.conftest import REGION, make_cloud
from tests.provisioners.test_bootstrap import wheelhouse_dir, worker_bootstrap

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUCKET = "research-batch-artifacts"
STORAGE = f"s3://{BUCKET}/research-batch"

#: The configuration deploy/*.json are generated for (deploy/README.md shows it).
SAMPLE = EC2Config(
    region="us-east-1",
    cluster_id="research-batch",
    subnet_ids=("subnet-0123456789abcdef0", "subnet-0fedcba9876543210"),
    security_group_ids=("sg-0123456789abcdef0",),
    ami=(
        (
            "x86_64",
            "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        ),
        (
            "x86_64_nvidia",
            "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
            "base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
        ),
    ),
    families=("c7i", "r7i", "g6"),
)
SAMPLE_STORAGE = "s3://research-batch-artifacts/research-batch"


def lint(document: dict[str, Any]) -> list[str]:
    """parliament's findings on a policy, except the one it cannot judge: it checks each
    statement alone, so `ec2:RunInstances` split the way AWS's own examples split it (tag
    conditions on the instance and volume, none on the image, subnet and security groups)
    reads as resources missing from each half. The audit below checks the two halves
    together, as AWS does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports pkg_resources
        from parliament import analyze_policy_string

    findings = analyze_policy_string(json.dumps(document)).findings
    kept = []
    for finding in findings:
        split_launch = finding.issue == "RESOURCE_MISMATCH" and all(
            d.get("action") == "ec2:RunInstances" for d in finding.detail
        )
        if not split_launch:
            kept.append(f"{finding.issue}: {finding.detail}")
    return kept


# -- the shipped examples and the linter ------------------------------------------------------


def test_deploy_holds_what_the_generator_writes_for_the_sample_configuration():
    expected = {
        FILES["daemon"]: render(daemon_policy(SAMPLE, SAMPLE_STORAGE)),
        FILES["worker"]: render(worker_policy()),
        FILES["lifecycle"]: render(s3_lifecycle(SAMPLE_STORAGE)),
    }
    for name, text in expected.items():
        assert (DEPLOY / name).read_text() == text, f"regenerate deploy/{name}"
    assert not (DEPLOY / "iam-policy.json").exists()  # the hand-written one it replaced


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "spot_enabled": True,
            "spot_types": ("c7i",),
            "key_name": "ops",
            "root_volume_kms_key": "alias/ebs",
        },
        {
            "iam_instance_profile": "autoscaler-worker",
            "ami": (("x86_64", "ami-0123456789abcdef0"),),
        },
    ],
)
def test_the_linter_finds_nothing_in_the_generated_policies(changes):
    assert lint(daemon_policy(replace(SAMPLE, **changes), SAMPLE_STORAGE)) == []
    assert lint(worker_policy()) == []


def test_optional_statements_appear_only_when_configured():
    bare = {s["Sid"] for s in daemon_policy(SAMPLE, SAMPLE_STORAGE)["Statement"]}
    assert not any("Spot" in sid or "Key" in sid or "PassOnly" in sid for sid in bare)
    full = daemon_policy(
        replace(
            SAMPLE,
            spot_enabled=True,
            root_volume_kms_key="arn:aws:kms:us-east-1:123456789012:key/abc",
            iam_instance_profile="arn:aws:iam::123456789012:instance-profile/workers",
        ),
        SAMPLE_STORAGE,
    )
    statements = {s["Sid"]: s for s in full["Statement"]}
    assert statements["PassOnlyTheWorkersRoleAndOnlyToEC2"]["Resource"] == (
        "arn:aws:iam::*:role/workers"
    )
    assert statements["EncryptRootVolumesWithTheConfiguredKeyThroughEC2"]["Resource"] == (
        "arn:aws:kms:us-east-1:123456789012:key/abc"
    )
    assert "CreateTheSpotServiceLinkedRoleOnTheFirstSpotLaunch" in statements


def launch_requests(instance_type: str, *, spot: bool) -> list[Request]:
    """What AWS authorizes for one launch of the sample cluster (`tests/aws_iam.py`)."""
    tags = [
        {"Key": "autoscaler:cluster", "Value": "research-batch"},
        {"Key": "autoscaler:managed-by", "Value": "ec2-batch-autoscaler"},
    ]
    params: dict[str, Any] = {
        "ImageId": "ami-0123456789abcdef0",
        "InstanceType": instance_type,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        "NetworkInterfaces": [
            {"SubnetId": SAMPLE.subnet_ids[0], "Groups": list(SAMPLE.security_group_ids)}
        ],
    }
    if spot:
        params["InstanceMarketOptions"] = {"MarketType": "spot"}
    return requests_for(
        "ec2",
        "RunInstances",
        params,
        region="us-east-1",
        account="123456789012",
        owner_of=lambda image: "amazon",
    )


def launches(policy: dict[str, Any], instance_type: str, *, spot: bool) -> bool:
    judged = Policy(policy)
    return all(judged.evaluate(r).allowed for r in launch_requests(instance_type, spot=spot))


def test_the_policy_grants_spot_launches_only_for_the_spot_types():
    off = daemon_policy(SAMPLE, SAMPLE_STORAGE)
    assert launches(off, "c7i.large", spot=False) and launches(off, "g6.xlarge", spot=False)
    assert not launches(off, "c7i.large", spot=True)  # spot not enabled: no spot launch
    listed = replace(SAMPLE, spot_enabled=True, spot_types=("c7i", "g6.xlarge"))
    some = daemon_policy(listed, SAMPLE_STORAGE)
    assert launches(some, "c7i.large", spot=True) and launches(some, "g6.xlarge", spot=True)
    assert not launches(some, "r7i.large", spot=True) and not launches(
        some, "g6.2xlarge", spot=True
    )
    assert launches(some, "r7i.large", spot=False)  # on-demand stays as it was
    # What the policy grants is what the launch path accepts (`EC2Config.spot_for`).
    for config in (replace(SAMPLE, spot_enabled=True), listed):
        policy = daemon_policy(config, SAMPLE_STORAGE)
        for name in ("c7i.large", "c7i.48xlarge", "r7i.large", "g6.xlarge", "g6.2xlarge"):
            assert launches(policy, name, spot=True) == config.spot_for(name), (config, name)


def test_the_policy_lets_the_daemon_create_only_the_spot_service_linked_role():
    def creates(policy: dict[str, Any], service: str) -> bool:
        [request] = requests_for(
            "iam",
            "CreateServiceLinkedRole",
            {"AWSServiceName": service},
            region="us-east-1",
            account="123456789012",
        )
        return Policy(policy).evaluate(request).allowed

    on = daemon_policy(replace(SAMPLE, spot_enabled=True), SAMPLE_STORAGE)
    assert creates(on, "spot.amazonaws.com")
    assert not creates(on, "ecs.amazonaws.com") and not creates(on, "spotfleet.amazonaws.com")
    # The spot role's own ARN, asked for another service: the condition refuses it.
    spot_role = (
        "arn:aws:iam::123456789012:role/aws-service-role/spot.amazonaws.com/"
        "AWSServiceRoleForEC2Spot"
    )
    other = {"aws:RequestedRegion": "us-east-1", "iam:AWSServiceName": "ecs.amazonaws.com"}
    assert not Policy(on).evaluate(Request("iam:CreateServiceLinkedRole", spot_role, other)).allowed
    assert not creates(daemon_policy(SAMPLE, SAMPLE_STORAGE), "spot.amazonaws.com")


def test_a_spot_launch_is_refused_as_aws_refuses_it_without_the_service_linked_role_grant():
    """EC2 creates the spot service-linked role as the caller at a spot launch when the
    account has none (moto checks neither); the evaluator asks for that grant with every
    spot launch, so a policy without it launches on-demand only — the end-to-end run
    (`tests/e2e/test_ec2_spot.py`) launches spot through this same evaluation."""
    on = daemon_policy(replace(SAMPLE, spot_enabled=True), SAMPLE_STORAGE)
    without = {
        **on,
        "Statement": [
            s
            for s in on["Statement"]
            if s.get("Sid") != "CreateTheSpotServiceLinkedRoleOnTheFirstSpotLaunch"
        ],
    }
    assert len(without["Statement"]) == len(on["Statement"]) - 1
    assert launches(on, "c7i.large", spot=True)
    assert not launches(without, "c7i.large", spot=True)
    assert launches(without, "c7i.large", spot=False)


def test_nothing_outside_the_cluster_is_granted():
    policy = Policy(daemon_policy(SAMPLE, SAMPLE_STORAGE))
    ours = {"ec2:ResourceTag/autoscaler:cluster": "research-batch",
            "ec2:ResourceTag/autoscaler:managed-by": "ec2-batch-autoscaler"}  # fmt: skip
    theirs = {**ours, "ec2:ResourceTag/autoscaler:cluster": "other"}
    instance = "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
    region = {"aws:RequestedRegion": "us-east-1"}
    assert policy.evaluate(Request("ec2:TerminateInstances", instance, {**region, **ours})).allowed
    assert not policy.evaluate(
        Request("ec2:TerminateInstances", instance, {**region, **theirs})
    ).allowed
    # Launch only from the configured subnets; objects only under the cluster's prefix.
    assert policy.evaluate(
        Request("ec2:RunInstances", "arn:aws:ec2:us-east-1:1:subnet/subnet-0123456789abcdef0")
    ).allowed
    assert not policy.evaluate(
        Request("ec2:RunInstances", "arn:aws:ec2:us-east-1:1:subnet/subnet-0ther")
    ).allowed
    assert not policy.evaluate(
        Request("ec2:RunInstances", "arn:aws:ec2:eu-west-1:1:subnet/subnet-0123456789abcdef0")
    ).allowed
    assert not policy.evaluate(Request("s3:GetObject", f"arn:aws:s3:::{BUCKET}/other/k")).allowed
    assert not policy.evaluate(
        Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": "other/"})
    ).allowed
    assert not policy.evaluate(
        Request("ec2:DescribeInstances", "*", {"aws:RequestedRegion": "eu-west-1"})
    ).allowed
    # The workers' role, if any, may do nothing at all.
    assert not Policy(worker_policy()).evaluate(Request("s3:GetObject", "arn:aws:s3:::x/y")).allowed


def test_the_lifecycle_rule_expires_jobs_objects_and_boot_reports_under_the_prefix():
    rules = {r["ID"]: r for r in s3_lifecycle(SAMPLE_STORAGE, 14)["Rules"]}
    assert rules["expire-jobs-after-14-days"]["Filter"] == {"Prefix": "research-batch/jobs/"}
    assert rules["expire-instances-after-14-days"]["Expiration"] == {"Days": 14}
    assert rules["abort-incomplete-uploads-after-1-day"]["Filter"] == {"Prefix": "research-batch/"}


# -- everything the daemon does, audited -----------------------------------------------------------


#: The daemon's statements for `audited_config` (spot, a customer-managed key, an image by
#: SSM parameter): each is removed in turn below, and the run must then be denied.
AUDITED_SIDS = (
    "DescribeTypesInstancesImagesAndSubnetsInTheRegion",
    "LaunchOnlyInstancesAndVolumesTaggedForThisCluster",
    "LaunchSpotInstancesOnlyOfTheSpotTypes",
    "ReadSpotPricesInTheRegion",
    "LaunchFromTheConfiguredImagesSubnetsAndSecurityGroups",
    "LaunchTheImagesTheAccountsOwnParametersName",
    "ResolveTheConfiguredImageParameters",
    "TagOnlyWhileLaunching",
    "TerminateAndDiagnoseOnlyThisClustersInstances",
    "PassOnlyTheWorkersRoleAndOnlyToEC2",
    "CreateTheSpotServiceLinkedRoleOnTheFirstSpotLaunch",
    "EncryptRootVolumesWithTheConfiguredKeyThroughEC2",
    "LetEC2HoldAGrantOnThatKeyForTheVolume",
    "ReadOnDemandPrices",
    "ReadAndWriteThisClustersObjects",
    "ListOnlyThisClustersPrefix",
    "DeleteUnusedBuildContextsAndFinishedJobsCheckpoints",
)


def audited_config(config: EC2Config) -> EC2Config:
    return replace(
        config,
        spot_enabled=True,
        spot_types=("c7i",),
        ami=(("x86_64", "resolve:ssm:/ec2-batch-autoscaler/images/worker"),),
        root_volume_kms_key="alias/autoscaler-ebs",
        key_name=None,
    )


def run_the_daemons_calls(
    policy: dict[str, Any], config: EC2Config, ec2, client, ami, clock, sleeps, tmp_path
) -> tuple[Audit, str]:
    """Against moto, judged by `tests/aws_audit.py` with `policy`, every kind of call the
    daemon makes: launch (image by SSM parameter, spot, a customer-managed key, the
    workers' profile), list, diagnose and terminate, a dry-run launch, publishing the
    wheelhouse and presigning it, reading a boot report that is not there, the storage of
    contexts, checkpoints and logs (multipart upload included), and the prices (botocore's
    Stubber: moto has no Pricing API). A denied call ends the run (as it would stop the
    daemon's action); the audit holds what was judged. Returns the audit and the
    wheelhouse's digest."""
    ssm, s3, iam = client("ssm"), make_client("s3", REGION), client("iam")
    ssm.put_parameter(Name="/ec2-batch-autoscaler/images/worker", Value=ami, Type="String")
    s3.create_bucket(Bucket=BUCKET)

    def tags_of(instance_id: str) -> dict[str, str]:
        found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return {t["Key"]: t["Value"] for t in found[0]["Instances"][0].get("Tags", [])}

    def owner_of(image_id: str) -> str:
        return ec2.describe_images(ImageIds=[image_id])["Images"][0]["OwnerId"]

    audit = Audit(Policy(policy), tags_of=tags_of, owner_of=owner_of)
    storage = S3Storage(BUCKET, "research-batch", region_name=REGION)
    pricing = make_client("pricing", "us-east-1")
    for each in (ec2, ssm, s3, storage.client, pricing, iam):
        audit.attach(each)

    digest: list[str] = []

    def the_calls() -> None:
        # What the daemon does at start-up, then in its rounds and steps.
        url, sha256 = publish_wheelhouse(
            s3, BUCKET, "research-batch", wheelhouse_dir(tmp_path / "w")
        )
        reports = BootReports(s3, BUCKET, "research-batch")
        bootstrap = worker_bootstrap(
            config,
            wheelhouse_url=object_presigner(s3, url),
            wheelhouse_sha256=sha256,
            reports=reports,
        )
        cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=bootstrap, ssm=ssm, iam=iam)
        launched = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
        cloud.list()
        assert "bootstrap: no report" in cloud.diagnose(launched.cloud_id, "tok-1")
        cloud.terminate([launched.cloud_id])
        # A spot offering in one zone, priced from the region's spot price history.
        fetch_spot_prices(AwsCaller(ec2), REGION, ["c7i.large"], clock())
        spot = cloud.launch(LaunchRequest(f"c7i.large:spot@{REGION}a", "tok-3"))
        cloud.terminate([spot.cloud_id])
        dry = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps, ssm=ssm)
        dry.launch(LaunchRequest("r7i.large", "tok-2"))
        context = tmp_path / "context"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM scratch\n")
        (context / "big.bin").write_bytes(b"\0" * (9 * 2**20))  # over boto3's multipart threshold
        upload_context(storage, context)
        storage.put_file("jobs/j/t/1/checkpoint-000000000050.tar.gz", context / "big.bin")
        storage.grant_put("jobs/j/t/2/output.log", 600)
        storage.grant_get("jobs/j/t/1/checkpoint-000000000050.tar.gz", 600)
        storage.list("jobs/j/")
        storage.delete("jobs/j/t/1/checkpoint-000000000050.tar.gz")
        with Stubber(pricing) as stub:
            stub.add_response("get_products", {"PriceList": [], "FormatVersion": "aws_v1"})
            try:
                fetch_price_table(AwsCaller(pricing), REGION, "2026-01-01")
            except CloudRequestError as exc:  # the answer stubbed: no prices for the region
                assert "no on-demand Linux prices" in str(exc)
            else:
                raise AssertionError("an empty price list was taken for prices")
        digest.append(sha256)

    try:
        the_calls()
    except Exception:
        if not any(r.denied for r in audit.records):  # a denial, or a 403 for a missing key
            raise
    return audit, digest[0] if digest else ""


def test_every_call_the_daemon_makes_is_allowed_and_every_statement_is_needed(
    config, ec2, client, ami, clock, sleeps, tmp_path
):
    """With the policy the generator writes for this configuration, nothing is denied and
    every statement is used."""
    config = audited_config(config)
    policy = daemon_policy(config, STORAGE)
    assert tuple(Policy(policy).sids) == AUDITED_SIDS
    audit, sha256 = run_the_daemons_calls(policy, config, ec2, client, ami, clock, sleeps, tmp_path)
    assert [r.to_json() for r in audit.denied()] == []
    missing = [r for r in audit.records if "missing key" in r.operation]
    assert missing and all("404" in r.note for r in missing)  # prefix listed: 404, not 403
    presigned = {(r.operation, r.requests[0][0].resource) for r in audit.records if r.presigned}
    assert (
        "GetObject",
        f"arn:aws:s3:::{BUCKET}/research-batch/wheelhouse/{sha256}.tar",
    ) in presigned
    assert (
        "PutObject",
        f"arn:aws:s3:::{BUCKET}/research-batch/instances/tok-1/bootstrap-report.txt",
    ) in presigned
    # No statement is there for nothing.
    assert sorted(set(Policy(policy).sids) - audit.used()) == []


@pytest.mark.parametrize("sid", AUDITED_SIDS)
def test_without_any_one_statement_the_daemons_calls_are_denied(
    sid, config, ec2, client, ami, clock, sleeps, tmp_path
):
    """The audit above fails whichever needed statement is removed: a call needs what it
    granted, and no other statement grants it."""
    config = audited_config(config)
    policy = daemon_policy(config, STORAGE)
    [removed] = [s for s in policy["Statement"] if s["Sid"] == sid]
    policy["Statement"] = [s for s in policy["Statement"] if s["Sid"] != sid]
    audit, _ = run_the_daemons_calls(policy, config, ec2, client, ami, clock, sleeps, tmp_path)
    actions = removed["Action"] if isinstance(removed["Action"], list) else [removed["Action"]]
    denied = {r.action for record in audit.records for r, _ in record.denied}
    assert denied & set(actions), (sid, denied)


def test_a_policy_missing_a_statement_makes_the_audit_fail(config, ec2, client, ami, clock, sleeps):
    """The check above fails when a needed statement is removed (here: tagging at launch)."""
    policy = daemon_policy(config, STORAGE)
    policy["Statement"] = [s for s in policy["Statement"] if s["Sid"] != "TagOnlyWhileLaunching"]
    audit = Audit(Policy(policy))
    audit.attach(ec2)
    cloud = make_cloud(config, ec2, clock, sleeps)
    with pytest.raises(Exception, match="UnauthorizedOperation"):
        cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    [denied] = audit.denied()
    assert denied.operation == "RunInstances"
    assert {r.action for r, _ in denied.denied} == {"ec2:CreateTags"}


def test_the_first_run_recipe_a_dry_run_round_asks_ec2_and_changes_nothing(
    config, ec2, ami, clock, sleeps, faults
):
    """The README's first-run recipe: with [ec2] dry_run = true, a round that acts sends
    every launch and termination with DryRun=True (EC2 evaluates the permissions) and
    nothing is launched or terminated."""
    from provisioners.ec2 import TAG_CLUSTER
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
