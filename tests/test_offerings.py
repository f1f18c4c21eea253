"""Offering names: on-demand keeps the bare EC2 type name, other markets and zones are
spelled out, so existing records and traces keep their meaning."""

import pytest

from autoscaler.catalog import SPOT, InstanceType, offering_name
from autoscaler.resources import Resources


def test_on_demand_in_any_zone_is_the_bare_type_name() -> None:
    assert offering_name("p3.2xlarge") == "p3.2xlarge"


def test_spot_and_zone_are_spelled_out() -> None:
    assert offering_name("p3.2xlarge", SPOT) == "p3.2xlarge:spot"
    assert offering_name("p3.2xlarge", SPOT, "us-east-1a") == "p3.2xlarge:spot@us-east-1a"
    assert offering_name("c5.xlarge", zone="us-east-1b") == "c5.xlarge@us-east-1b"


def test_an_unknown_market_is_refused() -> None:
    with pytest.raises(ValueError, match="market"):
        offering_name("p3.2xlarge", "reserved")


def test_an_offering_launches_its_ec2_type() -> None:
    spot = InstanceType(
        "p3.2xlarge:spot", "p3", Resources(1, 8, 61), 0.92, market=SPOT, ec2_type="p3.2xlarge"
    )
    plain = InstanceType("p3.2xlarge", "p3", Resources(1, 8, 61), 3.06)
    assert (spot.launch_type, spot.is_spot) == ("p3.2xlarge", True)
    assert (plain.launch_type, plain.is_spot) == ("p3.2xlarge", False)
