"""The provisioner's part of the daemon's TOML configuration: the `[ec2]` and `[guardrails]` tables.

Example (every key optional; the defaults are enough for `autoscaler catalog show`):

    [ec2]
    region = "us-east-1"
    zones = ["us-east-1a", "us-east-1b"]      # allowed zones, in order of preference
    cluster_id = "research-batch"             # tag value that marks this cluster's instances
    subnet_ids = ["subnet-0abc", "subnet-0def"]
    security_group_ids = ["sg-0123"]
    iam_instance_profile = "autoscaler-worker"  # name or ARN
    ami = "ami-0123456789abcdef0"
    key_name = "ops"
    families = ["c7i", "r7i", "p3"]           # allowed instance families ...
    types = ["g5.xlarge"]                     # ... and/or single types (the union is allowed)
    spot = ["c7i"]                            # types or families launched as spot (none by default)
    orphan_policy = "report"                  # or "terminate"
    dry_run = false
    cache_dir = "~/.cache/ec2-batch-autoscaler"

    [guardrails]
    max_instances = 20
    max_hourly_spend = 50.0                   # USD per hour, running plus requested
    allowed_regions = ["us-east-1"]

Other tables of the file belong to other parts of the daemon and are ignored
here; an unknown key inside `[ec2]` or `[guardrails]` is an error, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autoscaler.cloud import Guardrails
from autoscaler.errors import InputError
from autoscaler.files import read_config_file

OrphanPolicy = Literal["report", "terminate"]

#: The families of the bundled price table (Eva's 21 types), allowed by default.
DEFAULT_FAMILIES: tuple[str, ...] = ("c7i", "p3", "r7i")

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_FAMILY = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_TYPE = re.compile(r"^[a-z0-9][a-z0-9-]*\.[a-z0-9-]+$")


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ec2-batch-autoscaler`, else `~/.cache/ec2-batch-autoscaler`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ec2-batch-autoscaler"


@dataclass(frozen=True, slots=True)
class EC2Config:
    """Where and how the EC2 provisioner launches instances (the `[ec2]` table)."""

    region: str = "us-east-1"
    zones: tuple[str, ...] = ()
    cluster_id: str = "default"
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    iam_instance_profile: str | None = None
    ami: str | None = None
    key_name: str | None = None
    families: tuple[str, ...] = DEFAULT_FAMILIES
    types: tuple[str, ...] = ()
    spot: tuple[str, ...] = ()
    orphan_policy: OrphanPolicy = "report"
    dry_run: bool = False
    cache_dir: Path = field(default_factory=default_cache_dir)

    def allows(self, instance_type: str) -> bool:
        """True when the type is listed in `types` or its family in `families`."""
        return instance_type in self.types or family_of(instance_type) in self.families

    def spot_for(self, instance_type: str) -> bool:
        """True when `spot` lists the type or its family."""
        return instance_type in self.spot or family_of(instance_type) in self.spot


@dataclass(frozen=True, slots=True)
class ProvisionerConfig:
    """Both tables, as parsed from one configuration file."""

    ec2: EC2Config = field(default_factory=EC2Config)
    guardrails: Guardrails = field(default_factory=Guardrails)
    source: str | None = None


def family_of(instance_type: str) -> str:
    """`c7i` for `c7i.large`: EC2 names a type `<family>.<size>`."""
    return instance_type.split(".", 1)[0]


def load_config(path: str | Path | None) -> ProvisionerConfig:
    """Read the configuration file, or return the defaults when `path` is None."""
    if path is None:
        return ProvisionerConfig()
    p = Path(path)
    data = read_config_file(p)
    return parse_config(data, source=str(p), base_dir=p.parent)


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
    ec2_config = EC2Config(
        region=region,
        zones=zones,
        cluster_id=ec2.get("cluster_id", _cluster_id, "default"),
        subnet_ids=ec2.get("subnet_ids", _list_of(_prefixed("subnet-")), ()),
        security_group_ids=ec2.get("security_group_ids", _list_of(_prefixed("sg-")), ()),
        iam_instance_profile=ec2.get("iam_instance_profile", _string, None),
        ami=ec2.get("ami", _prefixed("ami-"), None),
        key_name=ec2.get("key_name", _string, None),
        families=families,
        types=types,
        spot=ec2.get("spot", _list_of(_family_or_type), ()),
        orphan_policy=ec2.get("orphan_policy", _orphan_policy, "report"),
        dry_run=ec2.get("dry_run", _bool, False),
        cache_dir=_path(cache_dir, base_dir) if cache_dir is not None else default_cache_dir(),
    )
    ec2.reject_unknown()

    rails = _Table(data, "guardrails", source)
    guardrails = Guardrails(
        max_instances=rails.get("max_instances", _count, None),
        max_hourly_spend=rails.get("max_hourly_spend", _money, None),
        allowed_regions=rails.get("allowed_regions", _list_of(_region), ()),
    )
    rails.reject_unknown()
    return ProvisionerConfig(ec2_config, guardrails, source)


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
                "iam_instance_profile",
                "ami",
                "key_name",
                "families",
                "types",
                "spot",
                "orphan_policy",
                "dry_run",
                "cache_dir",
            }
        ),
        "guardrails": frozenset({"max_instances", "max_hourly_spend", "allowed_regions"}),
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


def _path(text: str, base_dir: Path | None) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path
