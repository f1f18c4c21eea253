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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from msgspec import Meta

from autoscaler.cloud import Guardrails
from autoscaler.errors import InputError
from provisioners.documents import FieldError, Strict, convert, dotted, number, text, whole
from provisioners.images import (
    SUGGESTED_IMAGES,
    UnsupportedFamily,
    check_image_reference,
    check_kind,
    image_kind,
)

OrphanPolicy = Literal["report", "terminate"]
TableT = TypeVar("TableT", bound=Strict)

#: The CPU families of the bundled price table (Eva's types), allowed by default. Its p3
#: types are not: their V100 GPUs need the proprietary NVIDIA driver, and AWS's image with
#: it runs a Python older than the worker's (`provisioners.images`).
DEFAULT_FAMILIES: tuple[str, ...] = ("c7i", "r7i")

#: Launches of one instance type within any hour, unless `[guardrails]` says otherwise.
DEFAULT_LAUNCHES_PER_TYPE_HOUR = 10

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
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
    # Spot, from the cluster's `[spot]` table (`app.config`): on or off, and the types or
    # families that get spot offerings (empty: every allowed type). One setting read by
    # the catalog (which offerings exist), the launch (which may be spot) and the policy
    # generator (which spot launches IAM allows), so they cannot disagree.
    spot_enabled: bool = False
    spot_types: tuple[str, ...] = ()
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
        """True when the type may launch as spot: spot is enabled, the type is allowed, and
        `spot_types` is empty or lists the type or its family."""
        if not self.spot_enabled or not self.allows(instance_type):
            return False
        listed = self.spot_types
        return not listed or instance_type in listed or family_of(instance_type) in listed

    def spot_type_patterns(self) -> tuple[str, ...]:
        """The `ec2:InstanceType` patterns of the types `spot_for` accepts, for the IAM
        policy: a type as it is, a family as `FAMILY.*` (`spot_types`, else the allowed
        families and types; `spot_for` also requires `allows`, which the launch checks)."""
        entries = self.spot_types or (*self.families, *self.types)
        return tuple(sorted({e if "." in e else f"{e}.*" for e in entries}))

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
    guardrails: Guardrails = field(default_factory=lambda: default_guardrails())
    source: str | None = None


def default_guardrails() -> Guardrails:
    """The limits of a file without `[guardrails]`: only the launch rate bound (a daemon
    on EC2 refuses to start without its spending limits)."""
    return Guardrails(max_launches_per_type_hour=DEFAULT_LAUNCHES_PER_TYPE_HOUR)


def family_of(instance_type: str) -> str:
    """`c7i` for `c7i.large`: EC2 names a type `<family>.<size>`."""
    return instance_type.split(".", 1)[0]


def parse_config(
    data: Mapping[str, Any], source: str = "config", base_dir: Path | None = None
) -> ProvisionerConfig:
    """Validate the `[ec2]` and `[guardrails]` tables of a parsed TOML document."""
    ec2 = _table(data, "ec2", EC2Table, source)
    try:
        ec2.check_zones(ec2.effective_region)
    except FieldError as exc:
        raise InputError(
            exc.message,
            source=source,
            where="[ec2]",
            field="zones",
            value=list(ec2.zones),
            has_value=True,
        ) from None
    rails = _table(data, "guardrails", GuardrailsTable, source)
    return build_provisioner_config(ec2, rails, source=source, base_dir=base_dir)


def build_provisioner_config(
    ec2: EC2Table, rails: GuardrailsTable, *, source: str, base_dir: Path | None
) -> ProvisionerConfig:
    """The configuration the tables say (both already checked by their schemas)."""
    if ec2.cluster_id is None:
        raise InputError(
            "missing: every deployment needs its own cluster id (its instances are tagged "
            "with it, and two deployments sharing one would adopt and terminate each other's "
            "instances); run `autoscaler init` or set cluster_id",
            source=source,
            where="[ec2]",
            field="cluster_id",
        )
    ec2_config = EC2Config(
        region=ec2.effective_region,
        zones=tuple(ec2.zones),
        cluster_id=ec2.cluster_id,
        subnet_ids=tuple(ec2.subnet_ids),
        security_group_ids=tuple(ec2.security_group_ids),
        associate_public_ip=ec2.associate_public_ip,
        iam_instance_profile=ec2.iam_instance_profile,
        ami=tuple(sorted(ec2.ami.items())) if ec2.ami is not None else (),
        key_name=ec2.key_name,
        families=tuple(ec2.families),
        types=tuple(ec2.types),
        orphan_policy=ec2.orphan_policy,
        dry_run=ec2.dry_run,
        cache_dir=_path(ec2.cache_dir, base_dir)
        if ec2.cache_dir is not None
        else default_cache_dir(),
        metadata_hop_limit=ec2.metadata_hop_limit,
        root_volume_gb=ec2.root_volume_gb,
        root_volume_type=ec2.root_volume_type,
        root_volume_encrypted=ec2.root_volume_encrypted,
        root_volume_kms_key=ec2.root_volume_kms_key,
        identity_certificates=_path(ec2.identity_certificates, base_dir)
        if ec2.identity_certificates is not None
        else None,
    )
    guardrails = Guardrails(
        max_instances=rails.max_instances,
        max_hourly_spend=None if rails.max_hourly_spend is None else float(rails.max_hourly_spend),
        allowed_regions=tuple(rails.allowed_regions),
        max_daily_spend=None if rails.max_daily_spend is None else float(rails.max_daily_spend),
        max_launches_per_type_hour=rails.max_launches_per_type_hour,
    )
    return ProvisionerConfig(ec2_config, guardrails, source)


# --- the schema -------------------------------------------------------------------------------

_KMS_KEY = re.compile(
    r"^(arn:aws[a-z-]*:kms:\S+|alias/[A-Za-z0-9/_-]+|[0-9a-f-]{36}|mrk-[0-9a-f]{32})$"
)

Region = Annotated[
    str,
    text(
        max_length=32, pattern=_REGION.pattern, description="an AWS region name such as 'us-east-1'"
    ),
]
ClusterId = Annotated[
    str,
    text(
        max_length=63,
        pattern=_CLUSTER_ID.pattern,
        description="1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
]
Family = Annotated[
    str,
    text(max_length=64, pattern=_FAMILY.pattern, description="an instance family such as 'c7i'"),
]
TypeName = Annotated[
    str,
    text(max_length=64, pattern=_TYPE.pattern, description="an instance type such as 'c7i.large'"),
]
FamilyOrType = Annotated[
    str,
    text(
        max_length=64,
        pattern=f"({_FAMILY.pattern})|({_TYPE.pattern})",
        description="an instance type ('c7i.large') or family ('c7i')",
    ),
]
Zone = Annotated[
    str,
    text(
        max_length=40,
        pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+[a-z](-[a-z0-9]+)?$",
        description="an availability zone such as 'us-east-1a'",
    ),
]
SubnetId = Annotated[
    str,
    text(
        max_length=64, pattern=r"^subnet-[0-9A-Za-z]+$", description="an id starting with 'subnet-'"
    ),
]
GroupId = Annotated[
    str, text(max_length=64, pattern=r"^sg-[0-9A-Za-z]+$", description="an id starting with 'sg-'")
]
Name = Annotated[str, text(max_length=2048, pattern=r"\S", description="a non-empty string")]
KmsKey = Annotated[
    str,
    text(
        max_length=2048,
        pattern=_KMS_KEY.pattern,
        description="a KMS key id, key ARN, alias ARN or 'alias/<name>'",
    ),
]
#: The most entries a list of the [ec2] table may have.
MAX_ENTRIES = 1000
#: A budget no cluster reaches: US dollars per hour.
MAX_HOURLY_SPEND = 10_000_000.0


#: Why `[ec2] spot` is refused: it launched a listed bare type as spot at the on-demand
#: price, while the catalog offered spot for other types; spot is now one setting.
SPOT_MOVED = (
    "has moved: spot is one setting, `[spot] enabled = true`, with `[spot] types = [...]` "
    "to give only some types or families spot offerings; a bare type now always launches "
    "on-demand, a TYPE:spot offering as spot"
)


class EC2Table(Strict, frozen=True):
    """The `[ec2]` table as written (see the module docstring for each key)."""

    region: Region | None = None  # us-east-1; in a cluster's file, [cluster] region
    cluster_id: ClusterId | None = None
    zones: Annotated[tuple[Zone, ...], Meta(max_length=MAX_ENTRIES)] = ()
    subnet_ids: Annotated[tuple[SubnetId, ...], Meta(max_length=MAX_ENTRIES)] = ()
    security_group_ids: Annotated[tuple[GroupId, ...], Meta(max_length=MAX_ENTRIES)] = ()
    associate_public_ip: bool = False
    iam_instance_profile: Name | None = None
    ami: dict[Annotated[str, text(max_length=64)], Annotated[str, text(max_length=2048)]] | None = (
        None
    )
    metadata_hop_limit: Annotated[
        int, whole(ge=1, le=64, description="a whole number from 1 to 64")
    ] = 1
    root_volume_gb: Annotated[
        int, whole(ge=8, le=16384, description="a whole number from 8 to 16384")
    ] = 100
    root_volume_type: Literal["gp3", "gp2", "io1", "io2"] = "gp3"
    root_volume_encrypted: bool = True
    root_volume_kms_key: KmsKey | None = None
    key_name: Name | None = None
    families: Annotated[tuple[Family, ...], Meta(max_length=MAX_ENTRIES)] = DEFAULT_FAMILIES
    types: Annotated[tuple[TypeName, ...], Meta(max_length=MAX_ENTRIES)] = ()
    # Moved to `[spot]` (enabled, types): refused with the replacement, never reinterpreted.
    spot: Annotated[tuple[FamilyOrType, ...], Meta(max_length=MAX_ENTRIES)] = ()
    orphan_policy: Literal["report", "terminate"] = "report"
    dry_run: bool = True  # left out: a configuration that forgets it launches nothing
    cache_dir: Name | None = None
    # PEM certificates of AWS's instance-identity signing keys, one file per region
    # (default: the bundled ones; tests point this at their own).
    identity_certificates: Name | None = None

    def check_zones(self, region: str) -> None:
        """Every zone is one of `region` (the table's, or in a cluster's file [cluster]'s)."""
        for zone in self.zones:
            if not zone.startswith(region) or zone == region:
                raise FieldError(
                    f"entry {zone!r} must be an availability zone of region {region}, "
                    f"such as '{region}a'",
                    "zones",
                    self.zones,
                )

    @property
    def effective_region(self) -> str:
        return self.region or "us-east-1"

    def check(self) -> None:
        if self.spot:
            raise FieldError(SPOT_MOVED, "spot", self.spot)
        for name in ("zones", "subnet_ids", "security_group_ids", "families", "types"):
            items = getattr(self, name)
            if len(set(items)) != len(items):
                raise FieldError("must not repeat an entry", name)
        if self.region is not None:
            self.check_zones(self.region)
        if not self.families and not self.types:
            raise FieldError(
                "at least one of 'families' and 'types' must be non-empty "
                "(an unrestricted catalog would let the planner pick any of ~800 types)"
            )
        if self.root_volume_kms_key and not self.root_volume_encrypted:
            raise FieldError(
                "a KMS key encrypts the root volume: set root_volume_encrypted = true or remove it",
                "root_volume_kms_key",
            )
        if self.ami is not None:
            _check_images(self.ami, self.families, self.types)


class GuardrailsTable(Strict, frozen=True):
    """The `[guardrails]` table as written."""

    max_instances: (
        Annotated[int, whole(ge=0, le=1_000_000, description="a whole number >= 0")] | None
    ) = None
    max_hourly_spend: (
        Annotated[
            float,
            number(ge=0, le=MAX_HOURLY_SPEND, description="a number of US dollars per hour, >= 0"),
        ]
        | None
    ) = None
    allowed_regions: Annotated[tuple[Region, ...], Meta(max_length=MAX_ENTRIES)] = ()
    max_daily_spend: (
        Annotated[
            float,
            number(ge=0, le=24 * MAX_HOURLY_SPEND, description="a number of US dollars, >= 0"),
        ]
        | None
    ) = None
    max_launches_per_type_hour: Annotated[
        int, whole(ge=1, le=1_000_000, description="a whole number >= 1")
    ] = DEFAULT_LAUNCHES_PER_TYPE_HOUR

    def check(self) -> None:
        if len(set(self.allowed_regions)) != len(self.allowed_regions):
            raise FieldError("must not repeat an entry", "allowed_regions")


def _table(data: Mapping[str, Any], name: str, schema: type[TableT], source: str) -> TableT:
    raw = data.get(name, {})
    if not isinstance(raw, Mapping):
        raise InputError("must be a table", source=source, field=name, value=raw, has_value=True)
    where = f"[{name}]"
    return convert(raw, schema, source=source, where_of=lambda path: (where, dotted(path)))


def _check_images(images: Mapping[str, str], families: Sequence[str], types: Sequence[str]) -> None:
    """Every allowed family (and single type) has an image of its architecture and
    accelerator: an x86_64 image does not boot on Graviton, and GPUs need drivers."""
    if not images:
        raise FieldError("must name at least one image", "ami")
    for kind, reference in images.items():
        try:
            check_kind(kind)
            check_image_reference(reference)
        except ValueError as exc:
            raise FieldError(f"entry {kind!r}: {exc}", "ami") from None
    kinds = set(images)
    for name in (*families, *(family_of(t) for t in types)):
        try:
            needed = image_kind(name)
        except UnsupportedFamily as exc:
            raise FieldError(str(exc), "families", shown=False) from None
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
        raise FieldError(
            f"no image for {needed}, which {name} needs ({why}); add "
            + (f"{needed} = {hint!r}" if hint else f"{needed} = <image>")
            + f" to [ec2.ami], or remove {name} from the allowed families and types",
            "ami",
            shown=False,
        )


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
    settings = convert(
        {
            "cluster_id": cluster_id,
            "region": region,
            "subnet_ids": list(subnet_ids),
            "security_group_ids": list(security_group_ids),
            **({"iam_instance_profile": iam_instance_profile} if iam_instance_profile else {}),
        },
        EC2Table,
        source=None,
        where_of=lambda path: ("[ec2]", dotted(path)),
    )
    cluster, region = settings.cluster_id, settings.effective_region
    subnets, groups = tuple(settings.subnet_ids), tuple(settings.security_group_ids)
    profile = settings.iam_instance_profile

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
# Spot is set in [spot] (enabled, types), for the catalog, the launches and the policy.

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
