"""The [ec2] and [guardrails] tables: typed, frozen, one-line errors naming field and value,
a required cluster id, images checked against each family, and the template `init` writes."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from app.config import load_provisioner_config
from autoscaler.cloud import Guardrails
from autoscaler.errors import InputError
from provisioners.config import (
    DEFAULT_FAMILIES,
    EC2Config,
    ec2_config_template,
    parse_config,
)
from provisioners.images import (
    SUGGESTED_IMAGES,
    accelerator_of,
    architecture_of,
    image_kind,
)

AL2023 = SUGGESTED_IMAGES["x86_64"]
FULL = f"""
[ec2]
region = "us-west-2"
zones = ["us-west-2a", "us-west-2b"]
cluster_id = "research-batch"
subnet_ids = ["subnet-0abc", "subnet-0def"]
security_group_ids = ["sg-0123"]
associate_public_ip = true
iam_instance_profile = "autoscaler-worker"
key_name = "ops"
families = ["c7i", "r7i", "c7g"]
types = ["g5.xlarge"]
orphan_policy = "terminate"
dry_run = true
cache_dir = "cache"
metadata_hop_limit = 2
root_volume_gb = 200
root_volume_type = "io2"
root_volume_encrypted = true
root_volume_kms_key = "alias/autoscaler-ebs"

[ec2.ami]
x86_64 = "{AL2023}"
arm64 = "ami-0123456789abcdef0"
x86_64_nvidia = "resolve:ssm:/team/images/gpu:3"

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
    config = load_provisioner_config(write(tmp_path, FULL))

    assert config.ec2 == EC2Config(
        region="us-west-2",
        zones=("us-west-2a", "us-west-2b"),
        cluster_id="research-batch",
        subnet_ids=("subnet-0abc", "subnet-0def"),
        security_group_ids=("sg-0123",),
        associate_public_ip=True,
        iam_instance_profile="autoscaler-worker",
        ami=(
            ("arm64", "ami-0123456789abcdef0"),
            ("x86_64", AL2023),
            ("x86_64_nvidia", "resolve:ssm:/team/images/gpu:3"),
        ),
        key_name="ops",
        families=("c7i", "r7i", "c7g"),
        types=("g5.xlarge",),
        orphan_policy="terminate",
        dry_run=True,
        cache_dir=tmp_path / "cache",  # relative to the configuration file
        metadata_hop_limit=2,
        root_volume_gb=200,
        root_volume_type="io2",
        root_volume_encrypted=True,
        root_volume_kms_key="alias/autoscaler-ebs",
    )
    assert config.ec2.launch_problems() == []
    assert config.ec2.image_for("c7g.large") == ("arm64", "ami-0123456789abcdef0")
    assert config.ec2.image_for("g5.xlarge") == ("x86_64_nvidia", "resolve:ssm:/team/images/gpu:3")
    assert config.guardrails == Guardrails(
        max_instances=20,
        max_hourly_spend=50.0,
        allowed_regions=("us-west-2", "us-east-1"),
        max_launches_per_type_hour=10,  # the default bound
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ec2.region = "eu-west-1"  # type: ignore[misc]


def test_allowed_types_are_the_union_of_families_and_types(tmp_path):
    ec2 = load_provisioner_config(write(tmp_path, FULL)).ec2
    assert ec2.allows("c7i.large") and ec2.allows("g5.xlarge")
    assert not ec2.allows("g5.2xlarge") and not ec2.allows("p3.2xlarge")
    assert not ec2.spot_for("c7i.large")  # spot is off unless the cluster's [spot] enables it
    listed = replace(ec2, spot_enabled=True, spot_types=("c7i", "g5.xlarge"))
    assert listed.spot_for("c7i.8xlarge") and listed.spot_for("g5.xlarge")
    assert not listed.spot_for("r7i.large") and not listed.spot_for("g5.2xlarge")
    assert listed.spot_type_patterns() == ("c7i.*", "g5.xlarge")
    every = replace(ec2, spot_enabled=True)  # no list: every allowed type
    assert every.spot_for("r7i.large") and not every.spot_for("p3.2xlarge")
    assert every.spot_type_patterns() == ("c7g.*", "c7i.*", "g5.xlarge", "r7i.*")


def test_the_old_ec2_spot_list_is_refused_naming_its_replacement(tmp_path):
    path = write(tmp_path, '[ec2]\ncluster_id = "c"\nspot = ["c7i"]\n')
    with pytest.raises(InputError) as error:
        load_provisioner_config(path)
    message = str(error.value)
    assert "\n" not in message and "[ec2]" in message and "field 'spot'" in message
    assert "[spot] enabled = true" in message and "[spot] types" in message


def test_defaults_need_no_file_and_no_account(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = load_provisioner_config(None)
    assert config.ec2.region == "us-east-1"
    assert config.ec2.families == DEFAULT_FAMILIES
    # A file that forgets dry_run launches nothing.
    assert config.ec2.orphan_policy == "report" and config.ec2.dry_run
    assert not config.ec2.spot_enabled and config.ec2.spot_types == () and config.ec2.ami == ()
    assert config.ec2.cache_dir == tmp_path / "ec2-batch-autoscaler"
    assert config.guardrails == Guardrails(max_launches_per_type_hour=10)
    # Safe launch defaults: IMDSv2 hop limit 1, no public IP, an encrypted gp3 root volume.
    assert config.ec2.metadata_hop_limit == 1 and not config.ec2.associate_public_ip
    assert (config.ec2.root_volume_type, config.ec2.root_volume_encrypted) == ("gp3", True)
    # Enough to read the catalog, not to launch: no shared default cluster id.
    assert config.ec2.cluster_id is None
    assert [p.split(" ")[0] for p in config.ec2.launch_problems()] == [
        "cluster_id",
        "subnet_ids",
        "security_group_ids",
        "[ec2.ami]",
    ]  # no instance profile: workers call no AWS API


def test_a_file_without_a_cluster_id_is_refused_naming_the_field_and_the_fix(tmp_path):
    """Two deployments sharing the old default `cluster_id = "default"` would adopt and
    terminate each other's instances."""
    path = write(tmp_path, '[ec2]\nregion = "us-east-1"\n')
    with pytest.raises(InputError) as error:
        load_provisioner_config(path)
    line = str(error.value)
    assert line.startswith(f"{path}: [ec2]: field 'cluster_id': missing")
    assert "run `autoscaler init` or set cluster_id" in line and "\n" not in line
    with pytest.raises(InputError, match="cluster_id"):
        parse_config({})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'orphan_policy = "kill"',
            "[ec2]: field 'orphan_policy' = 'kill': must be one of 'report', 'terminate'",
        ),
        ('region = "US-East"', "[ec2]: field 'region' = 'US-East': must be an AWS region"),
        (
            'zones = ["us-west-2a"]',
            "[ec2]: field 'zones' = ['us-west-2a']: entry 'us-west-2a' must be an availability "
            "zone of region us-east-1",
        ),
        ("dry_run = 1", "[ec2]: field 'dry_run' = 1: must be true or false"),
        ('families = "c7i"', "[ec2]: field 'families' = 'c7i': must be a list"),
        (
            'types = ["c7i.large", "c7i.large"]',
            "field 'types' = ['c7i.large', 'c7i.large']: must not repeat an entry",
        ),
        ("families = []", "at least one of 'families' and 'types' must be non-empty"),
        ('regoin = "us-east-1"', "[ec2]: field 'regoin': unknown field"),
        ("metadata_hop_limit = 0", "field 'metadata_hop_limit' = 0: must be a whole number from 1"),
        ("root_volume_gb = 4", "field 'root_volume_gb' = 4: must be a whole number from 8"),
        ('root_volume_type = "st1"', "field 'root_volume_type' = 'st1': must be one of 'gp3'"),
        ('root_volume_kms_key = "my key"', "field 'root_volume_kms_key' = 'my key': must be a KMS"),
        (
            'root_volume_kms_key = "alias/k"\nroot_volume_encrypted = false',
            "field 'root_volume_kms_key' = 'alias/k': a KMS key encrypts the root volume",
        ),
        ("associate_public_ip = 0", "field 'associate_public_ip' = 0: must be true or false"),
        (
            'ami = "ami-0123456789abcdef0"',
            "field 'ami' = 'ami-0123456789abcdef0': must be an object (a table of fields)",
        ),
        ('ami = { x86_64 = "img-1" }', "entry 'x86_64': must be an image id ('ami-"),
        ('ami = { x86_64 = "resolve:ssm:" }', "entry 'x86_64': must be an image id"),
        ('ami = { sparc = "ami-0123456789abcdef0" }', "unknown image kind 'sparc'"),
        ('ami = { x86_64_tpu = "ami-0123456789abcdef0" }', "unknown image kind 'x86_64_tpu'"),
        (
            'families = ["c7i", "p3"]\nami = { x86_64 = "ami-0123456789abcdef0" }',
            "[ec2]: field 'ami': no image for x86_64_nvidia_proprietary, which p3 needs (its "
            "GPUs need the proprietary NVIDIA driver, and AWS's image with it is Amazon Linux 2 "
            "with Python 3.10",
        ),
        (
            'families = ["c7g"]\nami = { x86_64 = "ami-0123456789abcdef0" }',
            "no image for arm64, which c7g needs",
        ),
        (
            'families = ["c7i"]\ntypes = ["g5g.xlarge"]\n'
            'ami = { x86_64 = "ami-0123456789abcdef0" }',
            "no image for arm64_nvidia, which g5g needs",
        ),
        (
            'families = ["mac2"]\nami = { x86_64 = "ami-0123456789abcdef0" }',
            "mac2 instances are macOS hosts",
        ),
    ],
)
def test_bad_ec2_settings_are_one_line_naming_the_field_and_value(tmp_path, text, message):
    path = write(tmp_path, f'[ec2]\ncluster_id = "t"\n{text}\n')
    with pytest.raises(InputError) as error:
        load_provisioner_config(path)
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith(f"{path}: ")
    assert message in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[guardrails]\nmax_instances = -1",
            "[guardrails]: field 'max_instances' = -1: must be a whole number >= 0",
        ),
        (
            '[guardrails]\nmax_hourly_spend = "lots"',
            "[guardrails]: field 'max_hourly_spend' = 'lots': must be a number, not a string",
        ),
        ('ec2 = "yes"', "field 'ec2' = 'yes': must be a table"),
        ("[ec2\nregion = 1", "malformed TOML: "),
    ],
)
def test_bad_files_and_guardrails_are_one_line_naming_the_field_and_value(tmp_path, text, message):
    body = text if text.startswith(("ec2", "[ec2\n")) else f'[ec2]\ncluster_id = "t"\n{text}'
    path = write(tmp_path, body)
    with pytest.raises(InputError) as error:
        load_provisioner_config(path)
    line = str(error.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and message in line


def test_missing_configuration_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="configuration file not found"):
        load_provisioner_config(tmp_path / "nope.toml")


# --- images by kind ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "kind"),
    [
        ("c7i", "x86_64"),
        ("r7i", "x86_64"),
        ("m7i-flex", "x86_64"),
        ("u-6tb1", "x86_64"),
        ("c7g", "arm64"),
        ("m6gd", "arm64"),
        ("im4gn", "arm64"),
        ("is4gen", "arm64"),
        ("a1", "arm64"),
        ("p3", "x86_64_nvidia_proprietary"),
        ("g3s", "x86_64_nvidia_proprietary"),
        ("p5en", "x86_64_nvidia"),
        ("g4dn", "x86_64_nvidia"),
        ("gr6", "x86_64_nvidia"),
        ("g5g", "arm64_nvidia"),
        ("p6e-gb200", "arm64_nvidia"),
        ("g4ad", "x86_64_amd"),
        ("inf2", "x86_64_neuron"),
        ("trn1", "x86_64_neuron"),
        ("dl1", "x86_64_gaudi"),
        ("dl2q", "x86_64_qualcomm"),
        ("f1", "x86_64_fpga"),
    ],
)
def test_each_family_needs_the_image_kind_its_name_says(family, kind):
    assert image_kind(family) == kind
    arch = "arm64" if kind.startswith("arm64") else "x86_64"
    assert architecture_of(family) == arch
    accelerator = kind[len(arch) + 1 :].removesuffix("_proprietary")
    assert accelerator_of(family) == (accelerator or None)


# --- the template `autoscaler init` writes -----------------------------------------------------


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1"])
def test_the_init_template_parses_with_safe_defaults(region):
    text = ec2_config_template("research-batch", region)
    config = parse_config(tomllib.loads(text))
    ec2 = config.ec2

    assert (ec2.cluster_id, ec2.region) == ("research-batch", region)
    assert ec2.dry_run  # the first run is a dry run
    assert not ec2.associate_public_ip
    assert ec2.metadata_hop_limit == 1
    assert (ec2.root_volume_type, ec2.root_volume_encrypted, ec2.root_volume_gb) == (
        "gp3",
        True,
        100,
    )
    assert ec2.families == DEFAULT_FAMILIES
    assert dict(ec2.ami) == {
        "x86_64": SUGGESTED_IMAGES["x86_64"],
        "x86_64_nvidia": SUGGESTED_IMAGES["x86_64_nvidia"],
    }
    assert config.guardrails.allowed_regions == (region,)
    # Every limit a daemon on EC2 needs to start.
    assert config.guardrails.unattended_problems() == []
    assert config.guardrails.max_launches_per_type_hour == 10
    # What only the account knows is left for the user, and named before any launch (an
    # instance profile is optional: workers call no AWS API).
    assert [p.split(" ")[0] for p in ec2.launch_problems()] == [
        "subnet_ids",
        "security_group_ids",
    ]


def test_the_init_template_writes_the_network_and_profile_it_is_given():
    text = ec2_config_template(
        "research-batch",
        "us-east-1",
        subnet_ids=("subnet-0abc", "subnet-0def"),
        security_group_ids=("sg-0123",),
        iam_instance_profile="autoscaler-worker",
    )
    ec2 = parse_config(tomllib.loads(text)).ec2
    assert ec2.subnet_ids == ("subnet-0abc", "subnet-0def")
    assert ec2.security_group_ids == ("sg-0123",)
    assert ec2.iam_instance_profile == "autoscaler-worker"
    assert ec2.launch_problems() == []


SETTING = re.compile(r"^(# )?[a-z0-9_]+ = ")


def test_every_launch_setting_in_the_init_template_is_explained_by_a_comment():
    lines = ec2_config_template("research-batch", "us-east-1").splitlines()
    for key in (
        "cluster_id",
        "dry_run",
        "subnet_ids",
        "security_group_ids",
        "associate_public_ip",
        "iam_instance_profile",
        "metadata_hop_limit",
        "root_volume_gb",
        "root_volume_kms_key",
        "families",
        "x86_64_nvidia",
        "max_hourly_spend",
    ):
        [at] = [i for i, line in enumerate(lines) if re.match(rf"^(# )?{key} = ", line)]
        block = []
        for line in reversed(lines[:at]):  # the comment above it (or above its group)
            if (SETTING.match(line) or line.startswith("[")) and not block:
                continue
            if not line.startswith("# ") or SETTING.match(line):
                break
            block.append(line)
        assert len(" ".join(block)) > 40, f"{key} has no explanation above it"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("my cluster", "us-east-1"), "cluster_id"),
        (("research-batch", "US-East"), "region"),
    ],
)
def test_the_init_template_refuses_bad_values(args, field):
    with pytest.raises(InputError, match=f"field '{field}'"):
        ec2_config_template(*args)
