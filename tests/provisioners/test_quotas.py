"""Which EC2 vCPU quota an instance family counts against, and where to raise it."""

from __future__ import annotations

import pytest

from provisioners.quotas import quota_for, quota_group


@pytest.mark.parametrize(
    ("family", "group"),
    [
        ("c7i", "standard"),
        ("r7i", "standard"),
        ("m7g", "standard"),
        ("is4gen", "standard"),
        ("p3", "p"),
        ("p5en", "p"),
        ("g5", "g"),
        ("g4dn", "g"),
        ("gr6", "g"),
        ("vt1", "g"),
        ("inf2", "inf"),
        ("trn1n", "trn"),
        ("dl1", "dl"),
        ("f2", "f"),
        ("x2idn", "x"),
        ("hpc7g", "hpc"),
        ("u-6tb1", "u"),
    ],
)
def test_each_family_belongs_to_the_quota_group_of_its_class_letters(family, group):
    assert quota_group(family) == group


def test_on_demand_and_spot_quotas_are_named_as_in_the_console():
    p3 = quota_for("p3", "eu-west-1", spot=False)
    assert (p3.name, p3.code) == ("Running On-Demand P instances", "L-417A185B")
    assert p3.url == (
        "https://eu-west-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-417A185B"
    )
    spot = quota_for("g5", "us-east-1", spot=True)
    assert (spot.name, spot.code) == ("All G and VT Spot Instance Requests", "L-3819A6DF")
    high_memory_spot = quota_for("u-6tb1", "us-east-1", spot=True)
    assert high_memory_spot.code is None and high_memory_spot.url.endswith("/ec2/quotas")
