"""The provisioner's part of the daemon's TOML configuration: the `[ec2]` and `[guardrails]` tables.

`ec2_config_template` writes both, commented, for `autoscaler init`; in short:

    [ec2]
    region = "us-east-1"
    cluster_id = "research-batch"             # required: tags this deployment's instances
    zones = ["us-east-1a", "us-east-1b"]      # allowed zones, in order of preference
    subnet_ids = ["subnet-0abc", "subnet-0def"]
    security_group_ids = ["sg-0123"]
    associate_public_ip = false
    iam_instance_profile = "autoscaler-worker"  # optional: workers call no AWS API
    metadata_hop_limit = 1                    # IMDSv2 is always required
    root_volume_gb = 100                      # gp3, encrypted (account's default key)
    root_volume_type = "gp3"
    root_volume_encrypted = true
    root_volume_kms_key = "alias/ebs"         # optional customer-managed key
    key_name = "ops"
    families = ["c7i", "r7i", "g6"]           # allowed instance families ...
    types = ["g5.xlarge"]                     # ... and/or single types (the union is allowed)
    spot = ["c7i"]                            # types or families launched as spot (none by default)
    orphan_policy = "report"                  # or "terminate"
    dry_run = true                            # the default: EC2 checks every call, nothing starts
    cache_dir = "~/.cache/ec2-batch-autoscaler"

    [ec2.ami]                                 # one image per kind the allowed families need
    x86_64 = "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    x86_64_nvidia = "ami-0123456789abcdef0"

    [guardrails]
    max_instances = 20
    max_hourly_spend = 50.0                   # USD per hour, running plus requested
    max_daily_spend = 600.0                   # USD over any 24 hours, from the ledger
    max_launches_per_type_hour = 10           # launches of one type in any hour
    allowed_regions = ["us-east-1"]

`cluster_id` is required in a file (two deployments sharing a default would
adopt and terminate each other's instances). `dry_run` is true unless the file
says otherwise: a configuration that forgets it launches nothing. A daemon on EC2
refuses to start without `max_instances`, `max_hourly_spend` and `max_daily_spend`
(`Guardrails.unattended_problems`). The launch settings — subnets,
security groups, instance profile, images — may be left out for commands that
only read the catalog; `EC2Cloud` refuses to start without them
(`EC2Config.launch_problems`). Other tables of the file belong to other parts
of the daemon and are ignored here; an unknown key inside `[ec2]` or
`[guardrails]` is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autoscaler.cloud import Guardrails
from autoscaler.errors import InputError
from provisioners.images import (
    SUGGESTED_IMAGES,
    UnsupportedFamily,
    check_image_reference,
    check_kind,
    image_kind,
)

OrphanPolicy = Literal["report", "terminate"]

#: The CPU families of the bundled price table (Eva's types), allowed by default. Its p3
#: types are not: their V100 GPUs need the proprietary NVIDIA driver, and AWS's image with
#: it runs a Python older than the worker's (`provisioners.images`).
DEFAULT_FAMILIES: tuple[str, ...] = ("c7i", "r7i")

#: Launches of one instance type within any hour, unless `[guardrails]` says otherwise.
DEFAULT_LAUNCHES_PER_TYPE_HOUR = 10

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_FAMILY = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_TYPE = re.compile(r"^[a-z0-9][a-z0-9-]*\.[a-z0-9-]+$")


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ec2-batch-autoscaler`, else `~/.cache/ec2-batch-autoscaler`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ec2-batch-autoscaler"


#: EBS volume types a worker's root volume may have.
ROOT_VOLUME_TYPES: tuple[str, ...] = ("gp3", "gp2", "io1", "io2")


@dataclass(frozen=True, slots=True)
class EC2Config:
    """Where and how the EC2 provisioner launches instances (the `[ec2]` table)."""

    region: str = "us-east-1"
    zones: tuple[str, ...] = ()
    cluster_id: str | None = None  # required in a file; None only without one
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    associate_public_ip: bool = False
    iam_instance_profile: str | None = None
    ami: tuple[tuple[str, str], ...] = ()  # (image kind, ami-... or resolve:ssm:...)
    key_name: str | None = None
    families: tuple[str, ...] = DEFAULT_FAMILIES
    types: tuple[str, ...] = ()
    spot: tuple[str, ...] = ()
    orphan_policy: OrphanPolicy = "report"
    dry_run: bool = True
    cache_dir: Path = field(default_factory=default_cache_dir)
    metadata_hop_limit: int = 1
    root_volume_gb: int = 100
    root_volume_type: str = "gp3"
    root_volume_encrypted: bool = True
    root_volume_kms_key: str | None = None
    # AWS's certificates for instance identity documents beyond the bundled ones
    # (`provisioners.identity`): `<region>.rsa2048.pem`, `<region>.dsa.pem`.
    identity_certificates: Path | None = None

    def allows(self, instance_type: str) -> bool:
        """True when the type is listed in `types` or its family in `families`."""
        return instance_type in self.types or family_of(instance_type) in self.families

    def spot_for(self, instance_type: str) -> bool:
        """True when `spot` lists the type or its family."""
        return instance_type in self.spot or family_of(instance_type) in self.spot

    def image_for(self, instance_type: str) -> tuple[str, str | None]:
        """(the image kind the type needs, the configured image for it or None)."""
        kind = image_kind(family_of(instance_type))
        return kind, dict(self.ami).get(kind)

    def launch_problems(self) -> list[str]:
        """What is missing before this configuration can launch an instance (empty: ready).

        Each entry names the field and why it matters, so the daemon can refuse
        to start with one line instead of failing at the first launch.
        """
        problems = []
        if self.cluster_id is None:
            problems.append("cluster_id (the tag that marks this deployment's instances)")
        if not self.subnet_ids:
            problems.append("subnet_ids (without them a launch depends on a default VPC)")
        if not self.security_group_ids:
            problems.append("security_group_ids (the workers' firewall)")
        if not self.ami:
            problems.append("[ec2.ami] (the images the workers boot)")
        return problems


@dataclass(frozen=True, slots=True)
class ProvisionerConfig:
    """Both tables, as parsed from one configuration file."""

    ec2: EC2Config = field(default_factory=EC2Config)
    guardrails: Guardrails = field(default_factory=Guardrails)
    source: str | None = None


def family_of(instance_type: str) -> str:
    """`c7i` for `c7i.large`: EC2 names a type `<family>.<size>`."""
    return instance_type.split(".", 1)[0]


def parse_config(
    data: Mapping[str, Any], source: str = "config", base_dir: Path | None = None
) -> ProvisionerConfig:
    """Validate the `[ec2]` and `[guardrails]` tables of a parsed TOML document."""
    ec2 = _Table(data, "ec2", source)
    region = ec2.get("region", _region, "us-east-1")
    zones = ec2.get("zones", _list_of(_zone_in(region)), ())
    families = ec2.get("families", _list_of(_family), DEFAULT_FAMILIES)
    types = ec2.get("types", _list_of(_type), ())
    if not families and not types:
        raise InputError(
            "at least one of 'families' and 'types' must be non-empty "
            "(an unrestricted catalog would let the planner pick any of ~800 types)",
            source=source,
            where="[ec2]",
        )
    cache_dir = ec2.get("cache_dir", _string, None)
    cluster_id = ec2.get("cluster_id", _cluster_id, None)
    if cluster_id is None:
        raise InputError(
            "missing: every deployment needs its own cluster id (its instances are tagged "
            "with it, and two deployments sharing one would adopt and terminate each other's "
            "instances); run `autoscaler init` or set cluster_id",
            source=source,
            where="[ec2]",
            field="cluster_id",
        )
    ami = ec2.get("ami", _images, ())
    if ami:
        _check_images_cover(ami, families, types, source)
    ec2_config = EC2Config(
        region=region,
        zones=zones,
        cluster_id=cluster_id,
        subnet_ids=ec2.get("subnet_ids", _list_of(_prefixed("subnet-")), ()),
        security_group_ids=ec2.get("security_group_ids", _list_of(_prefixed("sg-")), ()),
        associate_public_ip=ec2.get("associate_public_ip", _bool, False),
        iam_instance_profile=ec2.get("iam_instance_profile", _string, None),
        ami=ami,
        key_name=ec2.get("key_name", _string, None),
        families=families,
        types=types,
        spot=ec2.get("spot", _list_of(_family_or_type), ()),
        orphan_policy=ec2.get("orphan_policy", _orphan_policy, "report"),
        dry_run=ec2.get("dry_run", _bool, True),
        cache_dir=_path(cache_dir, base_dir) if cache_dir is not None else default_cache_dir(),
        metadata_hop_limit=ec2.get("metadata_hop_limit", _whole_in(1, 64), 1),
        root_volume_gb=ec2.get("root_volume_gb", _whole_in(8, 16384), 100),
        root_volume_type=ec2.get("root_volume_type", _one_of(ROOT_VOLUME_TYPES), "gp3"),
        root_volume_encrypted=ec2.get("root_volume_encrypted", _bool, True),
        root_volume_kms_key=ec2.get("root_volume_kms_key", _kms_key, None),
        identity_certificates=_optional_path(
            ec2.get("identity_certificates", _string, None), base_dir
        ),
    )
    if ec2_config.root_volume_kms_key and not ec2_config.root_volume_encrypted:
        raise InputError(
            "a KMS key encrypts the root volume: set root_volume_encrypted = true or remove it",
            source=source,
            where="[ec2]",
            field="root_volume_kms_key",
            value=ec2_config.root_volume_kms_key,
            has_value=True,
        )
    ec2.reject_unknown()

    rails = _Table(data, "guardrails", source)
    guardrails = Guardrails(
        max_instances=rails.get("max_instances", _count, None),
        max_hourly_spend=rails.get("max_hourly_spend", _money, None),
        allowed_regions=rails.get("allowed_regions", _list_of(_region), ()),
        max_daily_spend=rails.get("max_daily_spend", _dollars, None),
        max_launches_per_type_hour=rails.get(
            "max_launches_per_type_hour", _positive_count, DEFAULT_LAUNCHES_PER_TYPE_HOUR
        ),
    )
    rails.reject_unknown()
    return ProvisionerConfig(ec2_config, guardrails, source)


def _optional_path(value: str | None, base_dir: Path | None) -> Path | None:
    return None if value is None else _path(value, base_dir)


# --- validation -------------------------------------------------------------------------------


class _Invalid(ValueError):
    """A value is wrong; the message says what was expected."""


class _Table:
    """One TOML table, read key by key so every error names `[table] field = value`."""

    _KNOWN: Mapping[str, frozenset[str]] = {
        "ec2": frozenset(
            {
                "region",
                "zones",
                "cluster_id",
                "subnet_ids",
                "security_group_ids",
                "associate_public_ip",
                "iam_instance_profile",
                "ami",
                "metadata_hop_limit",
                "root_volume_gb",
                "root_volume_type",
                "root_volume_encrypted",
                "root_volume_kms_key",
                "key_name",
                "families",
                "types",
                "spot",
                "orphan_policy",
                "dry_run",
                "cache_dir",
                "identity_certificates",
            }
        ),
        "guardrails": frozenset(
            {
                "max_instances",
                "max_hourly_spend",
                "max_daily_spend",
                "max_launches_per_type_hour",
                "allowed_regions",
            }
        ),
    }

    def __init__(self, data: Mapping[str, Any], name: str, source: str) -> None:
        raw = data.get(name, {})
        self.name, self.source = name, source
        if not isinstance(raw, Mapping):
            raise InputError(
                "must be a table", source=source, field=name, value=raw, has_value=True
            )
        self.raw = raw

    def get(self, key: str, check: Callable[[Any], Any], default: Any) -> Any:
        if key not in self.raw:
            return default
        value = self.raw[key]
        try:
            return check(value)
        except _Invalid as exc:
            raise InputError(
                str(exc),
                source=self.source,
                where=f"[{self.name}]",
                field=key,
                value=value,
                has_value=True,
            ) from None

    def reject_unknown(self) -> None:
        unknown = sorted(set(self.raw) - self._KNOWN[self.name])
        if unknown:
            raise InputError(
                f"unknown field (known: {', '.join(sorted(self._KNOWN[self.name]))})",
                source=self.source,
                where=f"[{self.name}]",
                field=unknown[0],
            )


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("must be a non-empty string")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("must be true or false")
    return value


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not pattern.match(value):
            raise _Invalid(f"must be {what}")
        return value

    return check


_region = _matching(_REGION, "an AWS region name such as 'us-east-1'")
_cluster_id = _matching(
    _CLUSTER_ID, "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
)
_family = _matching(_FAMILY, "an instance family such as 'c7i'")
_type = _matching(_TYPE, "an instance type such as 'c7i.large'")


def _family_or_type(value: Any) -> str:
    if isinstance(value, str) and (_FAMILY.match(value) or _TYPE.match(value)):
        return value
    raise _Invalid("must be an instance type ('c7i.large') or family ('c7i')")


def _prefixed(prefix: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.startswith(prefix) or len(value) <= len(prefix):
            raise _Invalid(f"must be an id starting with '{prefix}'")
        return value

    return check


def _zone_in(region: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.startswith(region) or value == region:
            raise _Invalid(f"must be an availability zone of region {region}, such as '{region}a'")
        return value

    return check


def _list_of(item: Callable[[Any], str]) -> Callable[[Any], tuple[str, ...]]:
    def check(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise _Invalid("must be a list")
        checked: list[str] = []
        for v in value:
            try:
                checked.append(item(v))
            except _Invalid as exc:
                raise _Invalid(f"entry {v!r} {exc}") from None
        items = tuple(checked)
        if len(set(items)) != len(items):
            raise _Invalid("must not repeat an entry")
        return items

    return check


def _whole_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"must be a whole number from {low} to {high}")
        return value

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise _Invalid(f"must be one of {', '.join(repr(c) for c in choices)}")
        return value  # type: ignore[no-any-return]

    return check


_KMS_KEY = re.compile(
    r"^(arn:aws[a-z-]*:kms:\S+|alias/[A-Za-z0-9/_-]+|[0-9a-f-]{36}|mrk-[0-9a-f]{32})$"
)


def _kms_key(value: Any) -> str:
    if not isinstance(value, str) or not _KMS_KEY.match(value):
        raise _Invalid("must be a KMS key id, key ARN, alias ARN or 'alias/<name>'")
    return value


def _images(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise _Invalid(
            "must be a table of images by kind, such as "
            f"{{ x86_64 = {SUGGESTED_IMAGES['x86_64']!r} }} (see `autoscaler init`)"
        )
    images = []
    for kind, reference in value.items():
        try:
            check_kind(kind)
            if not isinstance(reference, str):
                raise ValueError("must be a string")
            check_image_reference(reference)
        except ValueError as exc:
            raise _Invalid(f"entry {kind!r}: {exc}") from None
        images.append((kind, reference))
    if not images:
        raise _Invalid("must name at least one image")
    return tuple(sorted(images))


def _check_images_cover(
    images: tuple[tuple[str, str], ...],
    families: tuple[str, ...],
    types: tuple[str, ...],
    source: str,
) -> None:
    """Every allowed family (and single type) has an image of its architecture and
    accelerator: an x86_64 image does not boot on Graviton, and GPUs need drivers."""
    kinds = {kind for kind, _ in images}
    for name in (*families, *(family_of(t) for t in types)):
        try:
            needed = image_kind(name)
        except UnsupportedFamily as exc:
            raise InputError(str(exc), source=source, where="[ec2]", field="families") from None
        if needed in kinds:
            continue
        hint = SUGGESTED_IMAGES.get(needed)
        if needed.endswith("_nvidia_proprietary"):
            why = (
                "its GPUs need the proprietary NVIDIA driver, and AWS's image with it is "
                "Amazon Linux 2 with Python 3.10, older than the worker's 3.11: build an "
                "image with the driver, the NVIDIA container toolkit and Python 3.11"
            )
        elif needed.endswith("_nvidia"):
            why = "NVIDIA GPUs need an image with the driver and the NVIDIA container toolkit"
        else:
            why = "an image of its architecture and accelerator"
        raise InputError(
            f"no image for {needed}, which {name} needs ({why}); add "
            + (f"{needed} = {hint!r}" if hint else f"{needed} = <image>")
            + f" to [ec2.ami], or remove {name} from the allowed families and types",
            source=source,
            where="[ec2]",
            field="ami",
        )


def _orphan_policy(value: Any) -> OrphanPolicy:
    if value == "report":
        return "report"
    if value == "terminate":
        return "terminate"
    raise _Invalid("must be 'report' or 'terminate'")


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid("must be a whole number >= 0")
    return value


def _money(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid("must be a number of US dollars per hour")
    number = float(value)
    if not number >= 0 or number == float("inf"):
        raise _Invalid("must be a finite number >= 0")
    return number


def _dollars(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid("must be a number of US dollars")
    number = float(value)
    if not number >= 0 or number == float("inf"):
        raise _Invalid("must be a finite number >= 0")
    return number


def _positive_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Invalid("must be a whole number >= 1")
    return value


def _path(text: str, base_dir: Path | None) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


# --- the commented tables `autoscaler init` writes ------------------------------------------


def ec2_config_template(
    cluster_id: str,
    region: str,
    *,
    subnet_ids: tuple[str, ...] = (),
    security_group_ids: tuple[str, ...] = (),
    iam_instance_profile: str | None = None,
) -> str:
    """The `[ec2]`, `[ec2.ami]` and `[guardrails]` tables, commented, with safe defaults.

    For `autoscaler init`: it starts in dry run, with no public IP, IMDSv2 at
    hop limit 1, an encrypted gp3 root volume, AWS's public images by
    `resolve:ssm:` and small guardrails. Settings only the account knows
    (subnets, security groups, instance profile) are written commented out
    unless given; `EC2Cloud` refuses to launch until they are set.
    `parse_config` accepts the result.
    """
    cluster = _checked(_cluster_id, cluster_id, "cluster_id")
    region = _checked(_region, region, "region")
    subnets = _checked(_list_of(_prefixed("subnet-")), list(subnet_ids), "subnet_ids")
    groups = _checked(_list_of(_prefixed("sg-")), list(security_group_ids), "security_group_ids")
    profile = (
        _checked(_string, iam_instance_profile, "iam_instance_profile")
        if iam_instance_profile is not None
        else None
    )

    def setting(key: str, value: str | None, example: str) -> str:
        return f"{key} = {value}" if value is not None else f"# {key} = {example}"

    def toml_list(items: tuple[str, ...]) -> str | None:
        return json.dumps(list(items)) if items else None

    example_subnets = '["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]'

    families = toml_list(DEFAULT_FAMILIES)
    return f"""\
# ---------------------------------------------------------------------------------------
# EC2: where and how the autoscaler launches its workers.
# ---------------------------------------------------------------------------------------
[ec2]
region = "{region}"

# The tag value (autoscaler:cluster) that marks this deployment's instances. Unique in the
# account: the autoscaler adopts, and may terminate, every instance that carries it. The
# daemon's IAM policy (`autoscaler deploy policy` writes it from this file) lets it
# launch, tag and terminate only instances carrying it.
cluster_id = "{cluster}"

# First run: EC2 evaluates every permission and parameter of each launch and termination
# (DryRun=True) and launches nothing. Run one round, read its log, then set this to false.
# Left out, it is true: a configuration that forgets it launches nothing.
dry_run = true

# Network. One subnet per zone you allow, in order of preference (a subnet's zone is where
# it launches); the workers' security groups must let the daemon reach the worker and the
# worker reach the daemon. Both are required: without them a launch would depend on the
# account's default VPC.
{setting("subnet_ids", toml_list(subnets), example_subnets)}
{setting("security_group_ids", toml_list(groups), '["sg-0123456789abcdef0"]')}

# No public IP by default. Workers reach the daemon and S3 (the agent and its dependencies
# come from the cluster's bucket, installed offline: an S3 gateway endpoint is enough) and
# the image's package mirror (Docker, Python; Amazon Linux 2023's is in S3 too).
associate_public_ip = false

# The workers' instance profile (name or ARN), optional: a worker calls no AWS API (it
# proves its instance with the signed identity document and moves its objects through
# URLs the daemon presigns), so its role needs no permission. Give one only to attach
# your own (Session Manager, say); `autoscaler deploy policy` then lets the daemon pass it.
# A profile created moments ago takes seconds to propagate: launches retry meanwhile.
{setting("iam_instance_profile", json.dumps(profile) if profile else None, '"autoscaler-worker"')}

# Instance metadata: IMDSv2 is always required. A hop limit of 1 keeps containers from
# reaching the metadata service (and the instance role's credentials); the worker runs on
# the host and needs no more.
metadata_hop_limit = 1

# Root volume: job images and build contexts live here (the NVIDIA image needs 75 GiB or
# more). Encrypted with the account's default EBS key, or with root_volume_kms_key (a
# customer-managed key: `autoscaler deploy policy` then lets the daemon use it through EC2).
root_volume_gb = 100
root_volume_type = "gp3"
root_volume_encrypted = true
# root_volume_kms_key = "alias/autoscaler-ebs"

# Instance types the planner may use: whole families and/or single types. Each family
# counts against an account quota per region (g6 against "Running On-Demand G and VT
# instances", 0 vCPUs on new accounts: a launch over a quota is reported with the page to
# raise it, and the family is left out for half an hour). NVIDIA families boot the
# x86_64_nvidia image below (g4dn, g5, g6, g6e, gr6, p4d, p4de, p5, p5e, p5en, p6-b200);
# p2, p3 and g3 need the proprietary driver: see x86_64_nvidia_proprietary.
families = {families}
# types = ["g6.xlarge"]
# Types or families launched as spot (none by default).
# spot = ["c7i"]

# Instances tagged with this cluster that the state does not know: "report" them, or
# "terminate" them after a grace period. Either way they count against the guardrails.
orphan_policy = "report"

# An SSH key pair, for debugging only.
# key_name = "ops"

# The image each kind of instance boots, by architecture (x86_64, arm64 for Graviton) and
# accelerator (_nvidia for NVIDIA GPU families: an image with the driver and the NVIDIA
# container toolkit). Every allowed family needs its kind; it is checked when this file is
# read. "resolve:ssm:<parameter>" follows AWS's public images (looked up before each
# launch and checked against the type's architecture); "ami-..." pins one image.
# x86_64_nvidia is AWS's Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux
# 2023). P2, P3 and G3 GPUs (K80, V100, M60) need the proprietary driver, and AWS's image
# with it is Amazon Linux 2 with Python 3.10, older than the worker's 3.11: to use those
# families, build an image with the driver, the container toolkit and Python 3.11, and
# name it as x86_64_nvidia_proprietary.
[ec2.ami]
x86_64 = "{SUGGESTED_IMAGES["x86_64"]}"
x86_64_nvidia = "{SUGGESTED_IMAGES["x86_64_nvidia"]}"
# arm64 = "{SUGGESTED_IMAGES["arm64"]}"
# x86_64_nvidia_proprietary = "ami-0123456789abcdef0"

# ---------------------------------------------------------------------------------------
# Guardrails: limits every launch is checked against before any money is spent. A daemon
# on EC2 refuses to start without max_instances, max_hourly_spend and max_daily_spend.
# ---------------------------------------------------------------------------------------
[guardrails]
# Instances running or requested (and instances tagged as ours the state does not
# know), at most.
max_instances = 4
# US dollars per hour of those instances, at catalog prices.
max_hourly_spend = 10.0
# US dollars over any 24 hours, from the ledger, plus the next hour at the rate a launch
# would bring: no launch that could pass it within the hour.
max_daily_spend = 100.0
# Launches of one instance type within any hour, whatever happens (a type whose workers
# never register also backs off, then is held, with the cause in `autoscaler status`).
max_launches_per_type_hour = {DEFAULT_LAUNCHES_PER_TYPE_HOUR}
# The daemon refuses to start in any other region.
allowed_regions = ["{region}"]
"""


def _checked(check: Callable[[Any], Any], value: Any, name: str) -> Any:
    try:
        return check(value)
    except _Invalid as exc:
        raise InputError(str(exc), where="[ec2]", field=name, value=value, has_value=True) from None
