"""The [ec2] and [guardrails] tables: typed, frozen, and one-line errors naming field and value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autoscaler.cloud import Guardrails
from autoscaler.errors import InputError
from provisioners.config import (
    DEFAULT_FAMILIES,
    EC2Config,
    load_config,
    parse_config,
)

FULL = """
[ec2]
region = "us-west-2"
zones = ["us-west-2a", "us-west-2b"]
cluster_id = "research-batch"
subnet_ids = ["subnet-0abc", "subnet-0def"]
security_group_ids = ["sg-0123"]
iam_instance_profile = "autoscaler-worker"
ami = "ami-0123456789abcdef0"
key_name = "ops"
families = ["c7i", "r7i"]
types = ["g5.xlarge"]
spot = ["c7i", "g5.xlarge"]
orphan_policy = "terminate"
dry_run = true
cache_dir = "cache"

[guardrails]
max_instances = 20
max_hourly_spend = 50
allowed_regions = ["us-west-2", "us-east-1"]

[daemon]
period_s = 60
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "autoscaler.toml"
    path.write_text(text)
    return path


def test_full_configuration_is_parsed_into_frozen_dataclasses(tmp_path):
    config = load_config(write(tmp_path, FULL))

    assert config.ec2 == EC2Config(
        region="us-west-2",
        zones=("us-west-2a", "us-west-2b"),
        cluster_id="research-batch",
        subnet_ids=("subnet-0abc", "subnet-0def"),
        security_group_ids=("sg-0123",),
        iam_instance_profile="autoscaler-worker",
        ami="ami-0123456789abcdef0",
        key_name="ops",
        families=("c7i", "r7i"),
        types=("g5.xlarge",),
        spot=("c7i", "g5.xlarge"),
        orphan_policy="terminate",
        dry_run=True,
        cache_dir=tmp_path / "cache",  # relative to the configuration file
    )
    assert config.guardrails == Guardrails(
        max_instances=20, max_hourly_spend=50.0, allowed_regions=("us-west-2", "us-east-1")
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ec2.region = "eu-west-1"  # type: ignore[misc]


def test_allowed_types_are_the_union_of_families_and_types(tmp_path):
    ec2 = load_config(write(tmp_path, FULL)).ec2
    assert ec2.allows("c7i.large") and ec2.allows("g5.xlarge")
    assert not ec2.allows("g5.2xlarge") and not ec2.allows("p3.2xlarge")
    assert ec2.spot_for("c7i.8xlarge") and ec2.spot_for("g5.xlarge")
    assert not ec2.spot_for("r7i.large")


def test_defaults_need_no_file_and_no_account(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = load_config(None)
    assert config.ec2.region == "us-east-1"
    assert config.ec2.families == DEFAULT_FAMILIES
    assert config.ec2.orphan_policy == "report" and not config.ec2.dry_run
    assert config.ec2.spot == () and config.ec2.ami is None
    assert config.ec2.cache_dir == tmp_path / "ec2-batch-autoscaler"
    assert config.guardrails == Guardrails()
    assert parse_config({}) == dataclasses.replace(config, source="config")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[ec2]\norphan_policy = "kill"',
            "[ec2]: field 'orphan_policy' = 'kill': must be 'report' or 'terminate'",
        ),
        ('[ec2]\nregion = "US-East"', "[ec2]: field 'region' = 'US-East': must be an AWS region"),
        (
            '[ec2]\nzones = ["us-west-2a"]',
            "[ec2]: field 'zones' = ['us-west-2a']: entry 'us-west-2a' must be an availability "
            "zone of region us-east-1",
        ),
        (
            '[ec2]\nami = "img-1"',
            "[ec2]: field 'ami' = 'img-1': must be an id starting with 'ami-'",
        ),
        ("[ec2]\ndry_run = 1", "[ec2]: field 'dry_run' = 1: must be true or false"),
        ('[ec2]\nfamilies = "c7i"', "[ec2]: field 'families' = 'c7i': must be a list"),
        (
            '[ec2]\ntypes = ["c7i.large", "c7i.large"]',
            "field 'types' = ['c7i.large', 'c7i.large']: must not repeat an entry",
        ),
        ("[ec2]\nfamilies = []", "at least one of 'families' and 'types' must be non-empty"),
        ('[ec2]\nregoin = "us-east-1"', "[ec2]: field 'regoin': unknown field"),
        (
            "[guardrails]\nmax_instances = -1",
            "[guardrails]: field 'max_instances' = -1: must be a whole number >= 0",
        ),
        (
            '[guardrails]\nmax_hourly_spend = "lots"',
            "[guardrails]: field 'max_hourly_spend' = 'lots': must be a number of US dollars",
        ),
        ('ec2 = "yes"', "field 'ec2' = 'yes': must be a table"),
        ("[ec2\nregion = 1", "malformed TOML: "),
    ],
)
def test_bad_configuration_is_one_line_naming_the_field_and_value(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as error:
        load_config(path)
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith(f"{path}: ")
    assert message in line


def test_missing_configuration_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="configuration file not found"):
        load_config(tmp_path / "nope.toml")
