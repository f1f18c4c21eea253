"""Spot offerings on EC2 (moto): launched with `InstanceMarketOptions` in their zone, only
where the cluster's spot setting (`[spot] enabled`, `types`) allows, after the spot
service-linked role is ensured once; a bare type always on-demand; spot prices from
`DescribeSpotPriceHistory`, parsed, cached and dated. moto's prices are dummies: the tests
check what is done with them."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest

from autoscaler.catalog import SPOT, offering_name
from autoscaler.cloud import CloudRequestError, LaunchRequest, offering_parts
from provisioners.aws import AwsCaller
from provisioners.ec2 import SPOT_ROLE_RETRY_S
from provisioners.spot_prices import (
    SpotPriceTable,
    fetch_spot_prices,
    load_spot_prices,
    prices_from_history,
    refreshed_spot_prices,
    save_spot_prices,
    spot_prices_path,
)
from tests.provisioners.conftest import REGION, Faults, live_instances, make_cloud, zone_of

ZONE_B = f"{REGION}b"


def test_offering_names_split_back_into_type_market_and_zone():
    for ec2_type, market, zone in [
        ("c7i.large", "on-demand", None),
        ("c7i.large", SPOT, None),
        ("c7i.large", SPOT, ZONE_B),
        ("c7i.large", "on-demand", ZONE_B),
    ]:
        assert offering_parts(offering_name(ec2_type, market, zone)) == (ec2_type, market, zone)
    with pytest.raises(ValueError, match="market"):
        offering_parts("c7i.large:reserved")


def spot_on(config, *types: str):
    """`config` with the cluster's spot setting: enabled, for `types` (none: every type)."""
    return replace(config, spot_enabled=True, spot_types=types)


def test_a_spot_offering_launches_as_spot_in_its_zone_through_its_subnet(
    config, ec2, client, network, clock, sleeps, faults
):
    faults.watch("RunInstances")
    cloud = make_cloud(spot_on(config, "c7i"), ec2, clock, sleeps, iam=client("iam"))

    launched = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT, ZONE_B), "tok-1"))

    [params] = faults.calls["RunInstances"]
    assert params["InstanceType"] == "c7i.large"
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    assert zone_of(params) == ZONE_B
    assert params["NetworkInterfaces"][0]["SubnetId"] == network.subnets[ZONE_B]
    [raw] = live_instances(ec2)
    assert raw["InstanceLifecycle"] == "spot" and raw["InstanceType"] == "c7i.large"
    assert launched.spot and launched.zone == ZONE_B
    # Asked again with the same token, the instance is found, not launched twice.
    again = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT, ZONE_B), "tok-1"))
    assert again.cloud_id == launched.cloud_id and len(faults.calls["RunInstances"]) == 1


def test_an_on_demand_offering_in_a_zone_is_not_spot(config, ec2, clock, sleeps, faults):
    faults.watch("RunInstances")
    cloud = make_cloud(config, ec2, clock, sleeps)
    launched = cloud.launch(LaunchRequest(offering_name("r7i.large", zone=ZONE_B), "tok-1"))
    [params] = faults.calls["RunInstances"]
    assert "InstanceMarketOptions" not in params and zone_of(params) == ZONE_B
    assert not launched.spot


def test_spot_for_a_type_the_config_does_not_allow_is_refused_before_any_call(
    config, ec2, clock, sleeps, faults
):
    faults.watch("RunInstances")
    cloud = make_cloud(spot_on(config, "c7i"), ec2, clock, sleeps)
    with pytest.raises(
        CloudRequestError, match=r"spot is not allowed for r7i.large.*\[spot\] types"
    ):
        cloud.launch(LaunchRequest(offering_name("r7i.large", SPOT), "tok-1"))
    off = make_cloud(config, ec2, clock, sleeps)  # spot not enabled: no spot launch at all
    with pytest.raises(CloudRequestError, match=r"c7i.large.*\[spot\] enabled is false"):
        off.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-2"))
    assert faults.calls["RunInstances"] == []


def test_a_bare_type_spot_admits_launches_on_demand(config, ec2, client, clock, sleeps, faults):
    # The old `[ec2] spot` launched a listed bare type as spot at the on-demand price.
    faults.watch("RunInstances")
    cloud = make_cloud(spot_on(config), ec2, clock, sleeps, iam=client("iam"))
    launched = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    [params] = faults.calls["RunInstances"]
    assert "InstanceMarketOptions" not in params and not launched.spot
    [raw] = live_instances(ec2)
    assert raw.get("InstanceLifecycle") is None


# -- the spot service-linked role -------------------------------------------------------------


def test_the_first_spot_launch_creates_the_spot_role_once(config, ec2, client, clock, sleeps):
    iam = client("iam")
    roles = Faults(iam, service="iam").watch("CreateServiceLinkedRole")
    cloud = make_cloud(spot_on(config), ec2, clock, sleeps, iam=iam)
    cloud.launch(LaunchRequest("c7i.large", "tok-0"))  # on-demand: no role asked for
    assert roles.calls["CreateServiceLinkedRole"] == []

    cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    cloud.launch(LaunchRequest(offering_name("r7i.large", SPOT), "tok-2"))

    assert roles.calls["CreateServiceLinkedRole"] == [{"AWSServiceName": "spot.amazonaws.com"}]
    # (moto names the role AWSServiceRoleForspot; AWS, AWSServiceRoleForEC2Spot)
    [role] = iam.list_roles(PathPrefix="/aws-service-role/spot.amazonaws.com/")["Roles"]
    assert role["Path"] == "/aws-service-role/spot.amazonaws.com/"
    assert cloud.spot_role is not None and cloud.spot_role.ok
    assert "created" in cloud.spot_role.note


def test_a_role_that_exists_already_is_success_and_not_asked_again(
    config, ec2, client, clock, sleeps
):
    iam = client("iam")
    iam.create_service_linked_role(AWSServiceName="spot.amazonaws.com")  # made in the console
    roles = Faults(iam, service="iam").watch("CreateServiceLinkedRole")
    cloud = make_cloud(spot_on(config), ec2, clock, sleeps, iam=iam)
    first = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-2"))
    assert first.spot and len(roles.calls["CreateServiceLinkedRole"]) == 1
    assert cloud.spot_role is not None and cloud.spot_role.ok
    assert "exists" in cloud.spot_role.note


@pytest.mark.parametrize(
    ("message", "exists"),
    [
        # AWS's answer when the role is there (moto answers EntityAlreadyExists, above).
        ("Service role name AWSServiceRoleForEC2Spot has been taken in this account, "
         "please try a different suffix.", True),
        ("1 validation error detected: something else", False),
    ],
)  # fmt: skip
def test_aws_invalid_input_means_the_role_exists_only_when_the_name_is_taken(
    config, ec2, client, clock, sleeps, message, exists
):
    iam = client("iam")
    Faults(iam, service="iam").plan("CreateServiceLinkedRole", ["InvalidInput"], message)
    cloud = make_cloud(spot_on(config), ec2, clock, sleeps, iam=iam)
    assert cloud.ensure_spot_role().ok is exists


def test_a_denied_role_is_recorded_and_asked_again_only_after_the_retry_period(
    config, ec2, client, clock, sleeps
):
    iam = client("iam")
    roles = Faults(iam, service="iam")
    roles.plan("CreateServiceLinkedRole", ["AccessDenied"], "not authorized")
    cloud = make_cloud(spot_on(config), ec2, clock, sleeps, iam=iam)
    launched = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    assert launched.spot  # the launch goes on: EC2 says whether the role was needed
    assert cloud.spot_role is not None and not cloud.spot_role.ok
    assert "AccessDenied" in cloud.spot_role.note
    cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-2"))
    assert len(roles.calls["CreateServiceLinkedRole"]) == 1  # no hot loop
    clock.advance(SPOT_ROLE_RETRY_S)
    cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-3"))
    assert len(roles.calls["CreateServiceLinkedRole"]) == 2 and cloud.spot_role.ok


def test_a_dry_run_creates_no_role(config, ec2, client, clock, sleeps):
    iam = client("iam")
    roles = Faults(iam, service="iam").watch("CreateServiceLinkedRole")
    cloud = make_cloud(replace(spot_on(config), dry_run=True), ec2, clock, sleeps, iam=iam)
    cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    assert roles.calls["CreateServiceLinkedRole"] == []
    assert iam.list_roles(PathPrefix="/aws-service-role/")["Roles"] == []


# -- spot prices ------------------------------------------------------------------------------


def test_the_newest_price_of_each_type_and_zone_is_kept():
    t0 = dt.datetime(2026, 11, 26, 10, tzinfo=dt.UTC)
    entries = [
        {"InstanceType": "c7i.large", "AvailabilityZone": "z1", "SpotPrice": "0.0300",
         "Timestamp": t0, "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "c7i.large", "AvailabilityZone": "z1", "SpotPrice": "0.0350",
         "Timestamp": t0 + dt.timedelta(hours=1), "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "c7i.large", "AvailabilityZone": "z2", "SpotPrice": "0.0280",
         "Timestamp": t0, "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "c7i.large", "AvailabilityZone": "z2", "SpotPrice": "0.2000",
         "Timestamp": t0 + dt.timedelta(hours=2), "ProductDescription": "Windows"},
        {"InstanceType": "r7i.large", "AvailabilityZone": "z1", "SpotPrice": "0",
         "Timestamp": t0, "ProductDescription": "Linux/UNIX"},
    ]  # fmt: skip
    assert prices_from_history(entries) == {"c7i.large": {"z1": 0.035, "z2": 0.028}}


def test_describe_spot_price_history_is_read_for_the_wanted_types(ec2, faults):
    faults.watch("DescribeSpotPriceHistory")
    table = fetch_spot_prices(AwsCaller(ec2), REGION, ["c7i.large", "r7i.large"], 1.8e9)
    [params] = faults.calls["DescribeSpotPriceHistory"]
    assert sorted(params["InstanceTypes"]) == ["c7i.large", "r7i.large"]
    assert params["ProductDescriptions"] == ["Linux/UNIX"]
    assert table.region == REGION and table.retrieved_s == 1.8e9
    assert set(table.prices) <= {"c7i.large", "r7i.large"} and table.prices
    for zones in table.prices.values():
        assert all(zone.startswith(REGION) and price > 0 for zone, price in zones.items())


def test_the_table_is_cached_with_its_date_and_reused_until_stale(ec2, faults, tmp_path):
    faults.watch("DescribeSpotPriceHistory")
    caller = AwsCaller(ec2)
    first, note = refreshed_spot_prices(tmp_path, REGION, caller, ["c7i.large"], 1.8e9)
    assert note is None and first is not None
    saved = json.loads(spot_prices_path(tmp_path, REGION).read_text())
    assert saved["retrieved"].startswith("2027-01-15T08:00:00")  # dated to the second
    assert saved["source"] == "EC2 DescribeSpotPriceHistory"

    again, _ = refreshed_spot_prices(tmp_path, REGION, caller, ["c7i.large"], 1.8e9 + 600)
    assert again == first and len(faults.calls["DescribeSpotPriceHistory"]) == 1
    later, _ = refreshed_spot_prices(tmp_path, REGION, caller, ["c7i.large"], 1.8e9 + 7200)
    assert len(faults.calls["DescribeSpotPriceHistory"]) == 2
    assert later is not None and later.retrieved_s == 1.8e9 + 7200


def test_a_failed_refresh_keeps_the_cached_prices_and_says_how_old(ec2, faults, tmp_path):
    cached = SpotPriceTable(REGION, {"c7i.large": {f"{REGION}a": 0.031}}, 1.8e9)
    save_spot_prices(cached, spot_prices_path(tmp_path, REGION))
    faults.plan("DescribeSpotPriceHistory", ["UnauthorizedOperation"])
    kept, note = refreshed_spot_prices(
        tmp_path, REGION, AwsCaller(ec2), ["c7i.large"], 1.8e9 + 3 * 3600
    )
    assert kept == cached
    assert note is not None and "3.0 h old" in note and "DescribeSpotPriceHistory" in note
    assert kept.price("c7i.large") == 0.031 and kept.price("c7i.large", "elsewhere") is None


def test_a_cached_table_reads_back_exactly(tmp_path):
    table = SpotPriceTable(REGION, {"c7i.large": {"a": 0.0312, "b": 0.0299}}, 1.8e9 + 0.5)
    path = spot_prices_path(tmp_path, REGION)
    save_spot_prices(table, path)
    assert load_spot_prices(path) == table


def test_a_spot_offering_named_by_az_id_launches_in_that_zone(
    config, ec2, client, network, clock, sleeps, faults
):
    # Spot prices and `[spot] zones` name zones by AZ ID (use1-az1): the same physical zone
    # in every account, where zone names (us-east-1b) are mapped per account.
    zone_id = client("ec2").describe_subnets(SubnetIds=[network.subnets[ZONE_B]])["Subnets"][0][
        "AvailabilityZoneId"
    ]
    assert zone_id and zone_id != ZONE_B
    faults.watch("RunInstances")
    cloud = make_cloud(spot_on(config, "c7i"), ec2, clock, sleeps, iam=client("iam"))

    launched = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT, zone_id), "tok-1"))

    [params] = faults.calls["RunInstances"]
    assert params["NetworkInterfaces"][0]["SubnetId"] == network.subnets[ZONE_B]
    assert launched.spot and launched.zone == ZONE_B


def test_spot_prices_in_force_are_read_by_az_id_and_asked_for_hourly(
    config, ec2, client, network, clock, sleeps, faults
):
    faults.watch("DescribeSpotPriceHistory")
    cloud = make_cloud(spot_on(config, "c7i"), ec2, clock, sleeps, iam=client("iam"))
    table = cloud.spot_prices()
    assert table is not None and len(faults.calls["DescribeSpotPriceHistory"]) >= 1
    subnets = client("ec2").describe_subnets(SubnetIds=list(network.subnets.values()))
    ids = {s["AvailabilityZoneId"] for s in subnets["Subnets"]}
    zones = set(table.prices["c7i.large"])  # moto's prices, by the zones' IDs, not names
    assert zones and zones <= ids and not any(z.startswith(REGION) for z in zones)
    assert "r7i.large" not in table.prices  # spot is not allowed for r7i here
    asked = len(faults.calls["DescribeSpotPriceHistory"])
    clock.advance(1800)
    assert cloud.spot_prices() is table and len(faults.calls["DescribeSpotPriceHistory"]) == asked
    clock.advance(3600)
    assert cloud.spot_prices() is not table
    assert len(faults.calls["DescribeSpotPriceHistory"]) > asked
    off = make_cloud(config, ec2, clock, sleeps)
    assert off.spot_prices() is None


def test_spot_prices_in_force_are_those_of_the_zones_the_cluster_launches_in(
    config, ec2, client, network, clock, sleeps
):
    """EC2 prices every zone; a zone with no subnet of the cluster has no AZ ID known to
    it, and no instance of it is bought there: its price is left out rather than kept
    under its zone name, where no offering (named by AZ ID) would ever read it."""
    two = dict(list(network.subnets.items())[:2])
    assert len(network.subnets) > len(two)
    narrow = replace(spot_on(config, "c7i"), subnet_ids=tuple(two.values()))
    cloud = make_cloud(narrow, ec2, clock, sleeps, iam=client("iam"))
    table = cloud.spot_prices()
    subnets = client("ec2").describe_subnets(SubnetIds=list(two.values()))["Subnets"]
    ids = {s["AvailabilityZoneId"] for s in subnets}
    history = client("ec2").describe_spot_price_history(InstanceTypes=["c7i.large"])
    priced = {p["AvailabilityZone"] for p in history["SpotPriceHistory"]}
    assert set(two) <= priced and len(priced) > len(two)  # EC2 priced more zones than ours
    assert table is not None and set(table.prices["c7i.large"]) == ids


def test_a_regional_spot_instance_is_billed_at_the_price_of_the_zone_it_landed_in(
    config, ec2, client, network, clock, sleeps
):
    # `c7i.large:spot` is planned at the median of the cluster's zones; EC2 places it in
    # one of them and bills that zone's price, which the launch's answer (and a listing
    # of it, should that answer be lost) carries. Prices as EC2 gives them, by zone name,
    # each zone its own.
    cfg = spot_on(config, "c7i")
    zones = sorted(network.subnets)
    assert len(zones) >= 3
    prices = {zone: round(0.010 + 0.004 * i, 3) for i, zone in enumerate(zones)}
    table = SpotPriceTable(REGION, {"c7i.large": prices}, clock())
    save_spot_prices(table, spot_prices_path(cfg.cache_dir, REGION))
    cloud = make_cloud(cfg, ec2, clock, sleeps, iam=client("iam"))

    launched = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))

    assert launched.spot and launched.zone in prices
    assert launched.hourly_price == prices[launched.zone]
    [listed] = cloud.list()
    assert listed.hourly_price == prices[launched.zone]
    again = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    assert again.hourly_price == prices[launched.zone]  # found by its token: the same
    on_demand = cloud.launch(LaunchRequest("c7i.large", "tok-2"))
    assert not on_demand.spot and on_demand.hourly_price is None  # its request's stands
