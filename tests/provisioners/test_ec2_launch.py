"""EC2Cloud.launch against moto: tags and configuration, idempotency, capacity, throttling,
guardrails, dry run and spot."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError

from autoscaler.cloud import (
    Cloud,
    CloudRequestError,
    CloudUnavailable,
    Guardrails,
    InsufficientCapacity,
    LaunchRefused,
    LaunchRequest,
    UnavailableOffering,
    unavailable_types,
)
from autoscaler.errors import InputError
from provisioners.aws import make_client
from provisioners.ec2 import (
    CATALOG_RETRY_AFTER_OUTAGE_S,
    MANAGED_BY,
    PROFILE_PROPAGATION_DELAYS_S,
    QUOTA_COOLDOWN_S,
    QUOTA_ERROR_CODES,
    TAG_CLUSTER,
    TAG_LAUNCH_TOKEN,
    TAG_MANAGED_BY,
    UNAVAILABLE_COOLDOWN_S,
    ZONE_FALLBACK_CODES,
    QuotaExceeded,
)
from tests.provisioners.conftest import REGION, Faults, live_instances, make_cloud, zone_of
from tests.provisioners.test_bootstrap import worker_bootstrap

REPO = Path(__file__).resolve().parents[2]
BUNDLED_C7I_LARGE = 0.08925  # provisioners/data/prices-us-east-1.json

ZONE_A, ZONE_B, ZONE_C = f"{REGION}a", f"{REGION}b", f"{REGION}c"


def request(token: str, instance_type: str = "c7i.large", **kwargs: Any) -> LaunchRequest:
    return LaunchRequest(instance_type=instance_type, instance_id=token, **kwargs)


def test_ec2_cloud_implements_the_cloud_interface(config, ec2, clock, sleeps):
    assert isinstance(make_cloud(config, ec2, clock, sleeps), Cloud)


def test_launch_tags_and_configures_the_instance_from_the_config(
    config, ec2, network, clock, sleeps
):
    ec2.create_key_pair(KeyName="ops")
    subnets = network.subnets
    config = replace(config, subnet_ids=(subnets[ZONE_B], subnets[ZONE_C]), key_name="ops")
    bootstrap = worker_bootstrap(config)
    cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=bootstrap)

    launched = cloud.launch(request("tok-1", tags={"team": "ml"}))

    [raw] = live_instances(ec2)
    assert raw["InstanceId"] == launched.cloud_id
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[TAG_CLUSTER] == "test-cluster"
    assert tags[TAG_LAUNCH_TOKEN] == "tok-1"
    assert tags[TAG_MANAGED_BY] == MANAGED_BY
    assert tags["team"] == "ml"
    # The first subnet's zone is tried first; subnets pin the zone.
    assert raw["SubnetId"] == subnets[ZONE_B]
    assert launched.zone == raw["Placement"]["AvailabilityZone"] == ZONE_B
    groups = [g["GroupId"] for g in raw["NetworkInterfaces"][0]["Groups"]]
    assert groups == [network.security_group]
    assert raw["IamInstanceProfile"]["Arn"].endswith("/autoscaler-worker")
    assert raw["KeyName"] == "ops"
    assert raw["ImageId"] == dict(config.ami)["x86_64"]
    assert raw["InstanceType"] == "c7i.large"
    sent = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    assert base64.b64decode(sent["UserData"]["Value"]).decode() == bootstrap.render("tok-1")
    assert launched.instance_id == "tok-1" and not launched.spot and not launched.dry_run


def test_launch_sets_what_a_real_account_needs_explicitly(config, ec2, clock, sleeps, faults):
    """No public IP, IMDSv2 with hop limit 1, an encrypted gp3 root volume on the image's
    root device, and an instance that terminates when it shuts itself down."""
    faults.watch("RunInstances")
    cloud = make_cloud(
        replace(config, root_volume_kms_key="alias/autoscaler-ebs"), ec2, clock, sleeps
    )

    launched = cloud.launch(request("tok-1"))

    [sent] = faults.calls["RunInstances"]
    [interface] = sent["NetworkInterfaces"]
    assert interface["AssociatePublicIpAddress"] is False
    assert "SubnetId" not in sent and "SecurityGroupIds" not in sent and "Placement" not in sent
    [raw] = live_instances(ec2)
    assert "PublicIpAddress" not in raw
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    assert raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert raw["MetadataOptions"]["HttpEndpoint"] == "enabled"
    [root] = sent["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda"  # the image's root device
    [volume] = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [launched.cloud_id]}]
    )["Volumes"]
    assert (volume["Size"], volume["VolumeType"], volume["Encrypted"]) == (100, "gp3", True)
    assert volume["KmsKeyId"] == "alias/autoscaler-ebs"
    behavior = ec2.describe_instance_attribute(
        InstanceId=launched.cloud_id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behavior["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


def test_a_public_ip_and_a_higher_hop_limit_are_opt_in(config, ec2, clock, sleeps):
    cloud = make_cloud(
        replace(config, associate_public_ip=True, metadata_hop_limit=2), ec2, clock, sleeps
    )
    cloud.launch(request("tok-1"))
    [raw] = live_instances(ec2)
    assert raw.get("PublicIpAddress")
    assert raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 2


def test_a_configuration_not_ready_to_launch_is_refused_when_the_cloud_is_built(
    config, ec2, clock, sleeps
):
    bare = replace(config, subnet_ids=(), security_group_ids=(), iam_instance_profile=None, ami=())
    with pytest.raises(InputError) as refused:
        make_cloud(bare, ec2, clock, sleeps)
    message = str(refused.value)
    for field in ("subnet_ids", "security_group_ids", "[ec2.ami]"):
        assert field in message
    # Workers call no AWS API: their instance profile is optional.
    assert "iam_instance_profile" not in message
    assert "default VPC" in message and "autoscaler init" in message and "\n" not in message


def test_a_resolve_ssm_image_is_resolved_checked_and_sent_as_an_id(
    config, ec2, client, ami, clock, sleeps, faults
):
    ssm = client("ssm")
    ssm.put_parameter(Name="/team/worker-image", Value=ami, Type="String")
    watched = Faults(ssm, service="ssm").watch("GetParameter")
    faults.watch("RunInstances")
    config = replace(config, ami=(("x86_64", "resolve:ssm:/team/worker-image"),))
    cloud = make_cloud(config, ec2, clock, sleeps, ssm=ssm)

    cloud.launch(request("tok-1"))
    cloud.launch(request("tok-2", "r7i.large"))

    assert [c["ImageId"] for c in faults.calls["RunInstances"]] == [ami, ami]
    assert [c["Name"] for c in watched.calls["GetParameter"]] == ["/team/worker-image"]  # cached


def test_a_missing_ssm_image_parameter_names_the_setting(config, ec2, client, clock, sleeps):
    config = replace(config, ami=(("x86_64", "resolve:ssm:/team/nothing-here"),))
    cloud = make_cloud(config, ec2, clock, sleeps, ssm=client("ssm"))
    with pytest.raises(CloudRequestError, match=r"/team/nothing-here .*check \[ec2.ami\]"):
        cloud.launch(request("tok-1"))
    assert live_instances(ec2) == []


def test_an_image_of_another_architecture_is_refused_before_launching(
    config, ec2, images, clock, sleeps, faults
):
    graviton_image = images.register(architecture="arm64")
    faults.watch("RunInstances")
    cloud = make_cloud(replace(config, ami=(("x86_64", graviton_image),)), ec2, clock, sleeps)

    with pytest.raises(CloudRequestError) as refused:
        cloud.launch(request("tok-1"))

    assert f"[ec2.ami] x86_64 = '{graviton_image}'" in str(refused.value)
    assert "an arm64 image; c7i.large needs x86_64" in str(refused.value)
    assert faults.calls["RunInstances"] == []


def test_the_root_volume_follows_the_image_root_device_and_is_never_smaller(
    config, ec2, images, clock, sleeps, faults
):
    ubuntu_like = images.register(root="/dev/sda1", snapshot_gb=75)
    faults.watch("RunInstances")
    config = replace(config, ami=(("x86_64", ubuntu_like),))
    make_cloud(config, ec2, clock, sleeps).launch(request("tok-1"))
    assert faults.calls["RunInstances"][0]["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"

    small = make_cloud(replace(config, root_volume_gb=50), ec2, clock, sleeps)
    with pytest.raises(CloudRequestError, match="root_volume_gb = 50 is smaller than the 75 GiB"):
        small.launch(request("tok-2"))


PROPAGATING = (
    "Value (autoscaler-worker) for parameter iamInstanceProfile.name is invalid. "
    "Invalid IAM Instance Profile name"
)


def test_a_new_instance_profile_is_retried_while_it_propagates(config, ec2, clock, sleeps, faults):
    faults.plan("RunInstances", ["InvalidParameterValue"] * 2 + [None], message=PROPAGATING)
    cloud = make_cloud(config, ec2, clock, sleeps)

    launched = cloud.launch(request("tok-1"))

    assert [i["InstanceId"] for i in live_instances(ec2)] == [launched.cloud_id]
    assert sleeps == list(PROFILE_PROPAGATION_DELAYS_S[:2])
    tokens = {c["ClientToken"] for c in faults.calls["RunInstances"]}
    assert len(faults.calls["RunInstances"]) == 3 and len(tokens) == 1  # the same request


def test_an_instance_profile_that_never_works_is_a_bounded_configuration_error(
    config, ec2, clock, sleeps, faults
):
    faults.when("RunInstances", lambda p: True, "InvalidParameterValue", message=PROPAGATING)
    cloud = make_cloud(config, ec2, clock, sleeps)

    with pytest.raises(CloudRequestError, match=r"check \[ec2\] iam_instance_profile") as failed:
        cloud.launch(request("tok-1"))

    assert sleeps == list(PROFILE_PROPAGATION_DELAYS_S)
    assert f"after {sum(PROFILE_PROPAGATION_DELAYS_S):g} s" in str(failed.value)
    assert not failed.value.retryable


def test_another_invalid_parameter_is_not_retried(config, ec2, clock, sleeps, faults):
    faults.plan("RunInstances", ["InvalidParameterValue"], message="Invalid value for KmsKeyId")
    with pytest.raises(CloudRequestError, match="KmsKeyId"):
        make_cloud(config, ec2, clock, sleeps).launch(request("tok-1"))
    assert sleeps == []


def test_request_tags_cannot_overwrite_the_ownership_tags(config, ec2, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)
    cloud.launch(request("tok-1", tags={TAG_CLUSTER: "someone-else"}))
    [raw] = live_instances(ec2)
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}[TAG_CLUSTER] == "test-cluster"


def test_launch_twice_with_one_token_starts_one_instance(config, ec2, clock, sleeps, faults):
    faults.watch("RunInstances")
    cloud = make_cloud(config, ec2, clock, sleeps)
    first = cloud.launch(request("tok-1"))
    again = cloud.launch(request("tok-1"))
    assert again.cloud_id == first.cloud_id
    assert len(live_instances(ec2)) == 1
    assert len(faults.calls["RunInstances"]) == 1


def test_crash_between_run_instances_and_recording_does_not_launch_twice(
    config, ec2, clock, sleeps, faults
):
    faults.watch("RunInstances")
    crashed = []

    def crash_after_ec2_answered(**_: Any) -> None:
        if not crashed:
            crashed.append(True)
            raise KeyboardInterrupt("the daemon died before recording the instance")

    ec2.meta.events.register("after-call.ec2.RunInstances", crash_after_ec2_answered)
    with pytest.raises(KeyboardInterrupt):
        make_cloud(config, ec2, clock, sleeps).launch(request("tok-1"))
    [started] = live_instances(ec2)  # EC2 did start it

    restarted = make_cloud(config, ec2, clock, sleeps)  # a new process, no memory
    found = restarted.launch(request("tok-1"))

    assert found.cloud_id == started["InstanceId"]
    assert len(live_instances(ec2)) == 1
    assert len(faults.calls["RunInstances"]) == 1


def test_capacity_error_in_one_zone_falls_back_to_the_next(config, ec2, clock, sleeps, faults):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    faults.when(
        "RunInstances",
        lambda p: zone_of(p) == ZONE_A and p["InstanceType"] == "c7i.large",
        "InsufficientInstanceCapacity",
    )
    cloud = make_cloud(config, ec2, clock, sleeps)

    launched = cloud.launch(request("tok-1"))

    assert launched.zone == ZONE_B
    assert [zone_of(p) for p in faults.calls["RunInstances"]] == [ZONE_A, ZONE_B]
    assert cloud.unavailable() == [
        UnavailableOffering(
            "c7i.large", ZONE_A, clock.now + UNAVAILABLE_COOLDOWN_S, "InsufficientInstanceCapacity"
        )
    ]
    # While the offering cools down, the next launch goes straight to the next zone.
    cloud.launch(request("tok-2"))
    assert [zone_of(p) for p in faults.calls["RunInstances"]][2:] == [ZONE_B]
    # Other types are not affected by a c7i.large capacity error.
    cloud.launch(request("tok-3", "r7i.large"))
    assert zone_of(faults.calls["RunInstances"][-1]) == ZONE_A
    # After the cool-down, zone A is tried again.
    clock.advance(UNAVAILABLE_COOLDOWN_S + 1)
    assert [o.instance_type for o in cloud.unavailable()] == []
    cloud.launch(request("tok-4"))
    assert [zone_of(p) for p in faults.calls["RunInstances"]][-2:] == [ZONE_A, ZONE_B]


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "Unsupported"])
def test_no_capacity_anywhere_is_insufficient_capacity(code, config, ec2, clock, sleeps, faults):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    faults.when("RunInstances", lambda p: True, code)
    cloud = make_cloud(config, ec2, clock, sleeps)

    with pytest.raises(InsufficientCapacity) as failed:
        cloud.launch(request("tok-1"))

    assert failed.value.zones == (ZONE_A, ZONE_B)
    assert failed.value.retryable
    assert code in str(failed.value)
    assert live_instances(ec2) == []
    offerings = cloud.unavailable()
    assert {(o.zone, o.reason) for o in offerings if o.zone} == {(ZONE_A, code), (ZONE_B, code)}
    # No allowed zone is left: the whole type is reported, so the round plans around it.
    [whole] = [o for o in offerings if o.zone is None]
    assert whole.instance_type == "c7i.large" and ZONE_A in whole.reason and ZONE_B in whole.reason
    # Every zone cooling down: the next attempt fails fast, without calling EC2.
    calls = len(faults.calls["RunInstances"])
    with pytest.raises(InsufficientCapacity, match="cooling down"):
        cloud.launch(request("tok-1"))
    assert len(faults.calls["RunInstances"]) == calls


@pytest.mark.parametrize("code", sorted(ZONE_FALLBACK_CODES))
def test_every_zone_capacity_error_falls_back_to_the_next_zone(
    code, config, ec2, clock, sleeps, faults
):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    faults.when("RunInstances", lambda p: zone_of(p) == ZONE_A, code)
    cloud = make_cloud(config, ec2, clock, sleeps)

    assert cloud.launch(request("tok-1")).zone == ZONE_B
    assert ("c7i.large", ZONE_A) in {(o.instance_type, o.zone) for o in cloud.unavailable()}


def test_a_subnet_out_of_addresses_is_avoided_for_every_type(config, ec2, clock, sleeps, faults):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    faults.when(
        "RunInstances",
        lambda p: zone_of(p) == ZONE_A and p["InstanceType"] == "c7i.large",
        "InsufficientFreeAddressesInSubnet",
    )
    cloud = make_cloud(config, ec2, clock, sleeps)

    assert cloud.launch(request("tok-1")).zone == ZONE_B
    # The zone's subnet is full for every type, not only the one that tried.
    assert cloud.launch(request("tok-2", "r7i.large")).zone == ZONE_B
    assert [zone_of(p) for p in faults.calls["RunInstances"]] == [ZONE_A, ZONE_B, ZONE_B]
    reasons = {o.reason for o in cloud.unavailable() if o.instance_type == "r7i.large"}
    assert any("no free IP address" in r for r in reasons)


@pytest.mark.parametrize("code", sorted(QUOTA_ERROR_CODES))
def test_a_quota_error_stops_at_once_and_cools_down_the_family_region_wide(
    code, config, ec2, clock, sleeps, faults
):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    faults.when("RunInstances", lambda p: p["InstanceType"].startswith("c7i."), code)
    cloud = make_cloud(config, ec2, clock, sleeps)

    with pytest.raises(QuotaExceeded) as failed:
        cloud.launch(request("tok-1"))

    # A region-wide quota: the other zone is not tried.
    assert [zone_of(p) for p in faults.calls["RunInstances"]] == [ZONE_A]
    message = str(failed.value)
    assert "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances" in message
    assert "(L-1216C47A) in us-east-1" in message
    page = (
        "https://us-east-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-1216C47A"
    )
    assert page in message
    assert failed.value.quota.code == "L-1216C47A" and failed.value.retryable
    # Every c7i type of the catalog is unavailable in every zone, for the quota's cool-down.
    c7i = {t.name for t in cloud.catalog() if t.family == "c7i"}
    whole = {o.instance_type: o for o in cloud.unavailable() if o.zone is None}
    assert set(whole) == c7i and len(c7i) > 1
    assert {o.until_s for o in whole.values()} == {clock.now + QUOTA_COOLDOWN_S}
    assert set(unavailable_types(cloud.unavailable(), clock.now)) == c7i
    assert page in unavailable_types(cloud.unavailable(), clock.now)["c7i.xlarge"]
    # Another c7i type fails fast, without asking EC2; another family is not affected.
    calls = len(faults.calls["RunInstances"])
    with pytest.raises(InsufficientCapacity, match="L-1216C47A"):
        cloud.launch(request("tok-2", "c7i.xlarge"))
    assert len(faults.calls["RunInstances"]) == calls
    assert cloud.launch(request("tok-3", "r7i.large")).zone == ZONE_A
    # After the cool-down the family is tried again.
    clock.advance(QUOTA_COOLDOWN_S + 1)
    with pytest.raises(QuotaExceeded):
        cloud.launch(request("tok-2", "c7i.xlarge"))
    assert len(faults.calls["RunInstances"]) == calls + 2


def test_a_spot_quota_names_the_spot_quota(config, ec2, client, clock, sleeps, faults):
    faults.when("RunInstances", lambda p: True, "MaxSpotInstanceCountExceeded")
    spot = replace(config, spot_enabled=True, spot_types=("c7i",))
    cloud = make_cloud(spot, ec2, clock, sleeps, iam=client("iam"))
    with pytest.raises(QuotaExceeded, match=r"All Standard .* Spot Instance Requests.*L-34B43A08"):
        cloud.launch(request("tok-1", "c7i.large:spot"))


def test_throttling_is_retried_with_a_bounded_backoff(config, ec2, clock, sleeps, faults):
    faults.plan("RunInstances", ["RequestLimitExceeded", "RequestLimitExceeded", None])
    faults.plan("DescribeInstances", ["Throttling"])
    cloud = make_cloud(config, ec2, clock, sleeps)

    launched = cloud.launch(request("tok-1"))

    assert [i["InstanceId"] for i in live_instances(ec2)] == [launched.cloud_id]
    assert sleeps == [1.0, 1.0, 2.0]  # one throttled lookup, two throttled launches


def test_throttling_past_the_bound_is_cloud_unavailable_and_retryable(
    config, ec2, clock, sleeps, faults
):
    faults.plan("RunInstances", ["RequestLimitExceeded"] * 5)
    cloud = make_cloud(config, ec2, clock, sleeps)

    with pytest.raises(CloudUnavailable, match="RequestLimitExceeded") as failed:
        cloud.launch(request("tok-1"))

    assert failed.value.retryable
    assert sleeps == [1.0, 2.0, 4.0, 8.0]
    assert live_instances(ec2) == []
    assert cloud.unavailable() == []  # throttling says nothing about capacity
    # Once AWS stops throttling, the same request goes through.
    assert cloud.launch(request("tok-1")).cloud_id == live_instances(ec2)[0]["InstanceId"]


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Any:
        yield self.data


def test_botocore_adaptive_retries_absorb_a_throttled_response(
    config, aws, botocore_session, clock, sleeps
):
    """A throttling *HTTP response* is retried inside botocore (our backoff never sees it)."""
    client = make_client("ec2", REGION, session=boto3.Session(botocore_session=botocore_session))
    assert client.meta.config.retries["mode"] == "adaptive"
    sent: list[bool] = []
    throttled = (
        b"<Response><Errors><Error><Code>RequestLimitExceeded</Code>"
        b"<Message>Request limit exceeded.</Message></Error></Errors>"
        b"<RequestID>1</RequestID></Response>"
    )

    def first_send_throttled(request: Any, **_: Any) -> AWSResponse | None:
        sent.append(True)
        if len(sent) == 1:
            return AWSResponse(request.url, 503, {}, _Body(throttled))
        return None

    client.meta.events.register("before-send.ec2.RunInstances", first_send_throttled)
    cloud = make_cloud(config, client, clock, sleeps)

    launched = cloud.launch(request("tok-1"))

    assert len(sent) == 2
    assert sleeps == []
    assert launched.state in ("pending", "running")


def test_unknown_subnet_is_a_request_error_naming_the_setting(config, ec2, clock, sleeps):
    cloud = make_cloud(replace(config, subnet_ids=("subnet-00000000",)), ec2, clock, sleeps)
    with pytest.raises(CloudRequestError, match=r"check \[ec2\] subnet_ids") as failed:
        cloud.launch(request("tok-1"))
    assert not failed.value.retryable


def test_requested_zones_are_an_order_of_preference_within_the_allowed(config, ec2, clock, sleeps):
    cloud = make_cloud(replace(config, zones=(ZONE_A, ZONE_B, ZONE_C)), ec2, clock, sleeps)
    assert cloud.launch(request("tok-1", zones=(ZONE_C, ZONE_A))).zone == ZONE_C
    with pytest.raises(CloudRequestError, match=f"{REGION}f requested"):
        cloud.launch(request("tok-2", zones=(f"{REGION}f",)))


def test_type_not_offered_in_any_allowed_zone_is_a_configuration_error(config, ec2, clock, sleeps):
    # moto (like us-east-1) offers no c7i in us-east-1e.
    cloud = make_cloud(replace(config, zones=(f"{REGION}e",)), ec2, clock, sleeps)
    with pytest.raises(CloudRequestError, match="not offered in any allowed zone"):
        cloud.launch(request("tok-1"))
    assert live_instances(ec2) == []


# --- allowed types and regions ---------------------------------------------------------


def test_a_type_outside_the_allowed_families_is_refused_without_calling_ec2(
    config, ec2, clock, sleeps, faults
):
    faults.watch("RunInstances")
    cloud = make_cloud(replace(config, families=("c7i",)), ec2, clock, sleeps)
    with pytest.raises(CloudRequestError) as refused:
        cloud.launch(request("tok-1", "r7i.large"))
    assert "r7i.large is not allowed" in str(refused.value)
    assert "families: c7i" in str(refused.value)
    assert faults.calls["RunInstances"] == [] and live_instances(ec2) == []


def test_guardrail_allowed_regions_is_checked_at_construction(config, ec2, clock, sleeps):
    with pytest.raises(LaunchRefused) as refused:
        make_cloud(config, ec2, clock, sleeps, Guardrails(allowed_regions=("eu-west-1",)))
    assert refused.value.rule == "allowed_regions"
    assert "region us-east-1 is not allowed (allowed: eu-west-1)" in str(refused.value)


# --- dry run and spot ----------------------------------------------------------------------


def test_dry_run_launch_checks_with_ec2_and_launches_nothing(config, ec2, clock, sleeps, faults):
    faults.watch("RunInstances")
    cloud = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps)

    planned = cloud.launch(request("tok-1"))

    assert planned.dry_run and planned.cloud_id.startswith("dry-run-")
    assert [p.get("DryRun") for p in faults.calls["RunInstances"]] == [True]
    assert live_instances(ec2) == []
    assert cloud.launch(request("tok-1")) == planned  # idempotent within the run


def test_dry_run_without_permission_is_a_typed_error(config, ec2, clock, sleeps, faults):
    faults.plan("RunInstances", ["UnauthorizedOperation"])
    cloud = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps)
    with pytest.raises(CloudRequestError, match=r"`autoscaler deploy policy`"):
        cloud.launch(request("tok-1"))


def test_spot_is_per_offering_and_a_bare_type_is_on_demand(
    config, ec2, client, clock, sleeps, faults
):
    # Spot enabled for c7i: its `:spot` offering launches as spot, its bare type (and any
    # other bare type) on-demand, as the catalog prices them.
    faults.watch("RunInstances")
    spot_config = replace(config, spot_enabled=True, spot_types=("c7i",))
    cloud = make_cloud(spot_config, ec2, clock, sleeps, iam=client("iam"))

    spot = cloud.launch(request("tok-1", "c7i.large:spot"))
    bare = cloud.launch(request("tok-2", "c7i.large"))
    on_demand = cloud.launch(request("tok-3", "r7i.large"))

    first, second, third = faults.calls["RunInstances"]
    assert first["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "InstanceMarketOptions" not in second and "InstanceMarketOptions" not in third
    lifecycle = {i["InstanceId"]: i.get("InstanceLifecycle") for i in live_instances(ec2)}
    assert lifecycle == {spot.cloud_id: "spot", bare.cloud_id: None, on_demand.cloud_id: None}
    assert spot.spot and not bare.spot and not on_demand.spot


def test_after_an_outage_the_catalog_is_asked_for_again_within_minutes(config, ec2, clock, sleeps):
    make_cloud(config, ec2, clock, sleeps).catalog()  # caches the catalog
    clock.advance(2 * 86400)  # the cache is now stale
    outage = [True]

    def unreachable(**_: Any) -> None:
        if outage:
            raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    ec2.meta.events.register("provide-client-params.ec2.DescribeInstanceTypes", unreachable)
    cloud = make_cloud(config, ec2, clock, sleeps)

    assert cloud.ec2_catalog().origin == "cache"  # stale, but launches can go on
    outage.clear()
    clock.advance(60)
    assert cloud.ec2_catalog().origin == "cache"  # not hammering AWS
    clock.advance(CATALOG_RETRY_AFTER_OUTAGE_S)
    assert cloud.ec2_catalog().origin == "aws"


@pytest.mark.parametrize("token", ["", "x" * 257])
def test_launch_token_must_fit_an_ec2_tag(token, config, ec2, clock, sleeps):
    with pytest.raises(CloudRequestError, match="launch token must be 1 to 256 characters"):
        make_cloud(config, ec2, clock, sleeps).launch(request(token))


# -- a boot that never became a worker ----------------------------------------------------------


def test_a_boot_is_diagnosed_from_its_state_reason_its_report_and_its_console(
    config, ec2, client, clock, sleeps
):
    """What `diagnose` reads of an instance whose worker never registered: EC2's state
    reason (here the shutdown the bootstrap asked for), the failure report its bootstrap
    left under the cluster's prefix, and the bootstrap's lines in the console output."""
    from provisioners.bootstrap import BootReports

    s3 = client("s3")
    s3.create_bucket(Bucket="boot-reports")
    reports = BootReports(s3, "boot-reports", "cluster")
    cloud = make_cloud(
        config, ec2, clock, sleeps, bootstrap=worker_bootstrap(config, reports=reports)
    )
    launched = cloud.launch(request("tok-1"))
    s3.put_object(
        Bucket="boot-reports",
        Key="cluster/instances/tok-1/bootstrap-report.txt",
        Body=b"FAILED while checking the NVIDIA driver\nnvidia-smi: not found\n",
    )
    ec2.stop_instances(InstanceIds=[launched.cloud_id])
    # What AWS sends is base64; botocore's own handler decodes it before the binding reads.
    console = "boot\nautoscaler-bootstrap: installing Docker\nautoscaler-bootstrap: FAILED\nend\n"

    def console_output(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        class Raw:
            def stream(self, **_: Any) -> Any:
                yield b""

        output = base64.b64encode(console.encode()).decode()
        return AWSResponse("https://ec2.invalid/", 200, {}, Raw()), {"Output": output}

    ec2.meta.events.register("before-call.ec2.GetConsoleOutput", console_output)

    found = cloud.diagnose(launched.cloud_id, "tok-1")

    assert "EC2: Client.UserInitiatedShutdown" in found
    assert "bootstrap: FAILED while checking the NVIDIA driver | nvidia-smi: not found" in found
    assert (
        "console: autoscaler-bootstrap: installing Docker | autoscaler-bootstrap: FAILED" in found
    )
    assert "boot |" not in found  # only the bootstrap's own lines


def test_a_diagnosis_that_cannot_be_had_says_so_and_never_raises(
    config, ec2, clock, sleeps, faults
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    launched = cloud.launch(request("tok-1"))
    faults.when("DescribeInstances", lambda p: True, "UnauthorizedOperation")
    found = cloud.diagnose(launched.cloud_id, "tok-1")
    assert found.startswith("EC2 state unknown (") and "UnauthorizedOperation" in found
