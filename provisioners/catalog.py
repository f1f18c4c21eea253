"""The EC2 instance catalog: what each allowed type offers, what it costs, where it is offered.

Sources, each kept in one place:

- **Capacities** from `DescribeInstanceTypes`: GPUs, CPU and memory, converted to
  the project's units — CPU in **physical cores** (vCPUs divided by the threads
  per core EC2 reports: an x86 vCPU is a hyperthread, half a core; a Graviton
  vCPU is a whole core), RAM in GiB (MiB / 1024), GPUs as a count.
- **Prices** from a price table: the one `autoscaler catalog refresh` fetched
  from the AWS Pricing API, else the table bundled with the package
  (`provisioners/data/`, with its date). Types without a known price are left
  out with a warning — prices are never guessed.
- **Zones** from `DescribeInstanceTypeOfferings` (which zones offer each type).

The result is an `EC2Catalog`: the planner's own `Catalog` type plus the zones
and where the facts came from. It is cached on disk with its age, in Eva's
`ec2_config.json` format (so `autoscaler plan --catalog <cache>` reads it), and
used when AWS cannot be reached — SkyPilot's self-refreshing catalog, in small.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from autoscaler.catalog import ANY_FAMILY, SPOT, Catalog, InstanceType, LaunchDelays, offering_name
from autoscaler.cloud import CloudError, CloudRequestError
from autoscaler.errors import InputError
from autoscaler.limits import MAX_CAPACITY, MAX_DELAY_S, MAX_HOURLY_COST
from autoscaler.resources import Resources
from autoscaler.spot import hourly_rate
from provisioners.config import EC2Config, Region, family_of
from provisioners.documents import (
    MIB,
    FieldError,
    Strict,
    convert,
    decode_utf8,
    dotted,
    number,
    parse_json,
    read_regular_file,
    text,
    whole,
)
from provisioners.images import UnsupportedFamily, accelerator_of, architecture_of

if TYPE_CHECKING:
    from provisioners.aws import AwsCaller

log = logging.getLogger(__name__)

#: A cached catalog younger than this is used without asking AWS again.
DEFAULT_MAX_AGE_S = 24 * 3600.0

#: The Pricing API answers in these regions only; us-east-1 serves every region's prices.
PRICING_API_REGION = "us-east-1"

#: Prices retrieved longer ago than this are refreshed by the daemon (when the Pricing API
#: answers) and flagged wherever they are shown: AWS revises on-demand prices a few times a
#: year, and a budget guardrail reckoned on old prices may let more through than it says.
PRICES_STALE_AFTER_DAYS = 90

_PRICES_FORMAT = "ec2-batch-autoscaler prices v1"
PRICE_UNIT = "per instance-hour: on-demand, Linux, shared tenancy, no pre-installed software"
_CATALOG_FORMAT = "ec2-batch-autoscaler catalog v1"
#: The region of the Eva artifact, whose capacities back the offline catalog.
_BUNDLED_REGION = "us-east-1"

Origin = Literal["aws", "cache", "bundled"]


# --- the formats ------------------------------------------------------------------------------

#: The largest catalog, catalog cache or price table read: a region's whole catalog is ~1 MB.
CATALOG_LIMIT = 64 * MIB
#: How far in the future a cache's date may be (clocks disagree a little, not by days).
CLOCK_SKEW_S = 300.0

TypeName = Annotated[
    str,
    text(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="an instance type name such as 'c7i.large'",
    ),
]
FamilyName = Annotated[
    str,
    text(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$",
        description="an instance family such as 'c7i'",
    ),
]
Capacity = Annotated[
    tuple[
        Annotated[
            float,
            msgspec.Meta(
                ge=0,
                le=MAX_CAPACITY[0],
                multiple_of=1,
                description=f"a whole number of GPUs from 0 to {MAX_CAPACITY[0]:,.0f}",
            ),
        ],
        Annotated[float, number(ge=0, le=MAX_CAPACITY[1])],
        Annotated[float, number(ge=0, le=MAX_CAPACITY[2])],
    ],
    msgspec.Meta(description="a list [gpus, physical cores, GiB of RAM]"),
]
HourlyCost = Annotated[
    float,
    number(gt=0, le=MAX_HOURLY_COST, description=f"USD per hour in (0, {MAX_HOURLY_COST:,.0f}]"),
]
Delay = Annotated[float, number(ge=0, le=MAX_DELAY_S)]
Note = Annotated[str, text(max_length=4096)]


class EvaInstanceType(Strict, frozen=True):
    """One type of Eva's `ec2_config.json`: capacity, price and measured launch delays."""

    family: FamilyName
    capacity: Capacity
    cost: HourlyCost
    instantiate_delay: Delay | None = None
    run_worker_delay: Delay | None = None
    worker_register_delay: Delay | None = None
    terminate_delay: Delay | None = None
    # Eva's own launch settings, part of its format; the provisioner has its own.
    num_sockets: Annotated[int, whole(ge=1, le=64)] | None = None
    ssh_user: Annotated[str, text(max_length=64)] | None = None
    launch_cfg: (
        dict[Annotated[str, text(max_length=64)], Annotated[str, text(max_length=1024)]] | None
    ) = None

    def check(self) -> None:
        if self.family == ANY_FAMILY:
            raise FieldError(
                f"must not be {ANY_FAMILY!r} (a demand for {ANY_FAMILY!r} is one for every family)",
                "family",
                self.family,
            )
        gpu, *_ = self.capacity
        if gpu != int(gpu):
            raise FieldError("GPUs are whole devices", "capacity", list(self.capacity))
        if not any(self.capacity):
            raise FieldError("a type with no capacity hosts nothing", "capacity", [0, 0, 0])
        later = ("run_worker_delay", "worker_register_delay", "terminate_delay")
        given = [k for k in later if getattr(self, k) is not None]
        if given and self.instantiate_delay is None:
            raise FieldError(
                f"is required with {', '.join(given)}: a type's measured delays come together "
                "(without it the others would be ignored)",
                "instantiate_delay",
            )

    def instance_type(self, name: str) -> InstanceType:
        delays = None
        if self.instantiate_delay is not None:
            delays = LaunchDelays(
                float(self.instantiate_delay),
                float(self.run_worker_delay or 0.0) + float(self.worker_register_delay or 0.0),
                float(self.terminate_delay if self.terminate_delay is not None else 1.0),
            )
        return InstanceType(
            name=name,
            family=self.family,
            capacity=Resources(*map(float, self.capacity)),
            hourly_cost=float(self.cost),
            delays=delays,
        )


class EvaCatalogFile(Strict, frozen=True):
    """Eva's `ec2_config.json`: instance types by name, and the region they are of."""

    instance_types: Annotated[
        dict[TypeName, EvaInstanceType], msgspec.Meta(min_length=1, max_length=100_000)
    ]
    region: Region | None = None


class CachedInstanceType(Strict, frozen=True):
    """One type of a catalog cache: Eva's fields, and what AWS said of it."""

    family: FamilyName
    capacity: Capacity
    cost: HourlyCost
    vcpus: Annotated[int, whole(ge=1, le=100_000)] | None = None
    zones: Annotated[
        tuple[Annotated[str, text(max_length=64)], ...], msgspec.Meta(max_length=1000)
    ] = ()

    def check(self) -> None:
        EvaInstanceType(family=self.family, capacity=self.capacity, cost=self.cost)


class Selection(Strict, frozen=True):
    families: Annotated[tuple[FamilyName, ...], msgspec.Meta(max_length=1000)] = ()
    types: Annotated[tuple[TypeName, ...], msgspec.Meta(max_length=1000)] = ()


class CatalogCacheFile(Strict, frozen=True):
    """`catalog-<region>.json` in `[ec2] cache_dir`: what `catalog refresh` learnt from AWS."""

    format: Literal["ec2-batch-autoscaler catalog v1"]
    region: Region
    instance_types: Annotated[dict[TypeName, CachedInstanceType], msgspec.Meta(max_length=100_000)]
    fetched_at_s: Annotated[float, number(ge=0, le=1e11)] | None = None
    fetched_at: Annotated[str, text(max_length=64)] | None = None
    units: dict[
        Annotated[str, text(max_length=64)],
        Annotated[str, text(max_length=256)] | list[Annotated[str, text(max_length=64)]],
    ] = msgspec.field(default_factory=dict)
    prices: Annotated[str, text(max_length=4096)] = "unknown"
    selection: Selection = msgspec.field(default_factory=Selection)
    notes: Annotated[tuple[Note, ...], msgspec.Meta(max_length=1000)] = ()


class PriceTableFile(Strict, frozen=True):
    """`prices-<region>.json`: on-demand USD/hour by type, where and when they came from."""

    format: Literal["ec2-batch-autoscaler prices v1"]
    region: Region
    prices: Annotated[dict[TypeName, HourlyCost], msgspec.Meta(max_length=100_000)]
    retrieved: Annotated[
        str,
        text(
            max_length=10, pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", description="a date, YYYY-MM-DD"
        ),
    ]
    currency: Literal["USD"] = "USD"
    unit: Annotated[str, text(max_length=256)] = ""
    source: Annotated[str, text(max_length=1024)] = ""
    note: Note = ""

    def check(self) -> None:
        try:
            date.fromisoformat(self.retrieved)
        except ValueError:
            raise FieldError("must be a date, YYYY-MM-DD", "retrieved", self.retrieved) from None


def _catalog_where(path: Sequence[Any]) -> tuple[str | None, str | None]:
    if len(path) >= 2 and path[0] in ("instance_types", "prices"):
        if path[0] == "prices":
            return None, dotted(path)
        return f"instance type {str(path[1])!r}", dotted(path[2:]) or None
    return None, dotted(path) or None


def catalog_from_eva(data: object, source: str = "catalog") -> Catalog:
    """A catalog from Eva's `ec2_config.json` structure, checked against its schema."""
    if not isinstance(data, Mapping):
        raise InputError("must be a JSON object with an 'instance_types' object", source=source)
    document = convert(data, EvaCatalogFile, source=source, where_of=_catalog_where)
    return Catalog(
        [spec.instance_type(name) for name, spec in document.instance_types.items()],
        document.region,
    )


def catalog_from_document(data: object, source: str = "catalog") -> Catalog:
    """A catalog a user names: Eva's format, or our catalog cache (which extends it)."""
    if isinstance(data, Mapping) and "format" in data:
        cache = _cache_document(data, source)
        return _cache_catalog(cache)
    return catalog_from_eva(data, source)


def _cache_document(data: object, source: str) -> CatalogCacheFile:
    if not isinstance(data, Mapping) or data.get("format") != _CATALOG_FORMAT:
        raise InputError(
            f"not a catalog cache (expected format {_CATALOG_FORMAT!r}); delete it and run "
            "`autoscaler catalog refresh`",
            source=source,
        )
    document = convert(data, CatalogCacheFile, source=source, where_of=_catalog_where)
    fetched = document.fetched_at_s
    if fetched is not None and fetched > time.time() + CLOCK_SKEW_S:
        raise InputError(
            f"is dated in the future ({_iso(fetched)}), so it would never go stale; delete it "
            "and run `autoscaler catalog refresh`",
            source=source,
            field="fetched_at_s",
            value=fetched,
            has_value=True,
        )
    return document


def _cache_catalog(document: CatalogCacheFile) -> Catalog:
    return Catalog(
        [
            InstanceType(name, t.family, Resources(*map(float, t.capacity)), float(t.cost))
            for name, t in document.instance_types.items()
        ],
        document.region,
    )


# --- prices -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriceTable:
    """On-demand USD/hour of instance types in one region, with where and when they came from."""

    region: str
    prices: Mapping[str, float]
    retrieved: str  # ISO date the table was fetched (or copied, for the bundled one)
    source: str
    note: str = ""

    def describe(self, *, with_note: bool = True) -> str:
        """One line for users: where the prices come from and how old they are."""
        text = f"{self.source}; retrieved {self.retrieved}"
        return f"{text} — {self.note}" if self.note and with_note else text

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _PRICES_FORMAT,
            "region": self.region,
            "currency": "USD",
            "unit": PRICE_UNIT,
            "retrieved": self.retrieved,
            "source": self.source,
            "note": self.note,
            "prices": dict(sorted(self.prices.items())),
        }


def bundled_price_table_path(region: str) -> Path:
    return Path(str(resources.files("provisioners") / "data" / f"prices-{region}.json"))


#: Eva's 21 us-east-1 types with their measured delays, bundled with the core package.
BUNDLED_CATALOG = Path(str(resources.files("autoscaler") / "data" / "eva" / "ec2_config.json"))


def price_table_path(config: EC2Config) -> Path:
    """Where `catalog refresh` writes the prices it fetched for the configured region."""
    return config.cache_dir / f"prices-{config.region}.json"


def catalog_cache_path(config: EC2Config) -> Path:
    """Where the catalog built from AWS is cached for the configured region."""
    return config.cache_dir / f"catalog-{config.region}.json"


def load_price_table(path: Path) -> PriceTable:
    """Read and validate a price table file."""
    source = str(path)
    data = _read_document(path, "price table")
    if not isinstance(data, Mapping) or data.get("format") != _PRICES_FORMAT:
        raise InputError(f"not a price table (expected format {_PRICES_FORMAT!r})", source=source)
    document = convert(data, PriceTableFile, source=source, where_of=_catalog_where)
    return PriceTable(
        region=document.region,
        prices={name: float(price) for name, price in document.prices.items()},
        retrieved=document.retrieved,
        source=document.source or source,
        note=document.note,
    )


def save_price_table(table: PriceTable, path: Path) -> None:
    _write_json_atomically(path, table.to_json())


def current_price_table(config: EC2Config) -> PriceTable | None:
    """The refreshed table in the cache directory, else the bundled one, else None."""
    refreshed = price_table_path(config)
    if refreshed.exists() or refreshed.is_symlink():
        return _of_region(load_price_table(refreshed), config.region, refreshed)
    packaged = bundled_price_table_path(config.region)
    if packaged.exists():
        return _of_region(load_price_table(packaged), config.region, packaged)
    return None


def price_age_days(table: PriceTable, now_s: float) -> float | None:
    """Days since the table was retrieved (None: its date is unknown or not a date)."""
    try:
        day = datetime.fromisoformat(table.retrieved[:10]).replace(tzinfo=UTC)
    except ValueError:
        return None
    return max(0.0, (now_s - day.timestamp()) / 86400.0)


def stale_prices_note(table: PriceTable | None, region: str, now_s: float) -> str | None:
    """What to tell users when the region has no prices, or old ones; None when fresh."""
    if table is None:
        return (
            f"no on-demand prices for {region}: no type can be planned until they are fetched "
            "from the Pricing API (`autoscaler catalog refresh`, or the daemon at start-up; "
            "its policy allows pricing:GetProducts)"
        )
    age = price_age_days(table, now_s)
    if age is None or age > PRICES_STALE_AFTER_DAYS:
        when = "at an unknown date" if age is None else f"{age:.0f} days ago"
        return (
            f"the prices of {region} were retrieved {when} ({table.retrieved}), longer ago "
            f"than {PRICES_STALE_AFTER_DAYS} days: run `autoscaler catalog refresh`"
        )
    return None


def refreshed_price_table(
    config: EC2Config, pricing: AwsCaller | None, now_s: float
) -> tuple[PriceTable | None, str | None]:
    """The region's price table, fetched again from the Pricing API first when there is
    none or it is older than `PRICES_STALE_AFTER_DAYS` — so a region other than us-east-1
    (which has no bundled table) is priced at the daemon's first start rather than left
    empty. A refresh that fails keeps what there is; the second value is the warning to
    show with the catalog (None when the prices are fresh)."""
    table = current_price_table(config)
    if pricing is None or stale_prices_note(table, config.region, now_s) is None:
        return table, stale_prices_note(table, config.region, now_s)
    today = datetime.fromtimestamp(now_s, UTC).date().isoformat()
    try:
        fresh = fetch_price_table(pricing, config.region, today)
    except CloudError as exc:
        note = stale_prices_note(table, config.region, now_s)
        log.warning("prices not refreshed from the Pricing API: %s", exc)
        return table, f"{note} (the Pricing API refused: {exc})"
    try:
        save_price_table(fresh, price_table_path(config))
    except InputError as exc:  # an unwritable cache must not stop the daemon
        log.warning("prices not saved: %s", exc)
    log.info("prices: %d on-demand prices for %s from the Pricing API", len(fresh.prices), today)
    return fresh, None


def _of_region(table: PriceTable, region: str, path: Path) -> PriceTable:
    """A price table of another region is refused: its prices are not this region's."""
    if table.region != region:
        raise InputError(
            f"holds the prices of {table.region}, and the cluster is in {region}; delete it "
            "and run `autoscaler catalog refresh`",
            source=str(path),
            field="region",
            value=table.region,
            has_value=True,
        )
    return table


def prices_from_products(price_list: Iterable[str], region: str) -> dict[str, float]:
    """On-demand hourly USD per instance type from Pricing API `GetProducts` items.

    Each item is a JSON *string* with `product.attributes` and
    `terms.OnDemand.<offer term>.priceDimensions.<rate code>.pricePerUnit.USD`.
    Only Linux, shared tenancy, no pre-installed software, capacity status
    "Used" in `region` count (the request filters on the same attributes; the
    check here keeps a broad response from mixing in Windows or dedicated
    prices). When one type has several hourly prices, the highest is kept so
    the budget guardrail errs on the safe side.
    """
    wanted = {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    prices: dict[str, float] = {}
    for item in price_list:
        offer = json.loads(item) if isinstance(item, str) else item
        attributes = offer.get("product", {}).get("attributes", {})
        name = attributes.get("instanceType")
        if not name or any(attributes.get(k) != v for k, v in wanted.items()):
            continue
        if attributes.get("regionCode", region) != region:
            continue
        for term in offer.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                if dimension.get("unit") != "Hrs":
                    continue
                try:
                    usd = float(dimension.get("pricePerUnit", {}).get("USD", "nan"))
                except ValueError:
                    continue
                if usd > 0:
                    prices[name] = max(usd, prices.get(name, 0.0))
    return prices


def fetch_price_table(pricing: AwsCaller, region: str, today: str) -> PriceTable:
    """Fetch the region's on-demand Linux prices from the Pricing API (`GetProducts`)."""
    filters = [
        {"Type": "TERM_MATCH", "Field": field, "Value": value}
        for field, value in (
            ("regionCode", region),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
        )
    ]
    items: list[str] = []
    for page in pricing.pages(
        "get_products", ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"
    ):
        items.extend(page.get("PriceList", []))
    prices = prices_from_products(items, region)
    if not prices:
        raise CloudRequestError(
            f"the Pricing API returned no on-demand Linux prices for region {region}; "
            "check [ec2] region"
        )
    return PriceTable(
        region=region,
        prices=prices,
        retrieved=today,
        source="AWS Pricing API (GetProducts)",
    )


# --- capacities -------------------------------------------------------------------------------


def physical_cores(vcpu_info: Mapping[str, Any], architectures: Iterable[str] = ()) -> float:
    """Physical cores of an instance type from its `VCpuInfo`.

    vCPUs divided by `DefaultThreadsPerCore` (2 on most x86 types, 1 on
    Graviton). When EC2 reports no threads per core, `DefaultCores` is used;
    failing both, x86 is assumed hyperthreaded, so capacity is never overstated.
    """
    vcpus = float(vcpu_info["DefaultVCpus"])
    threads = vcpu_info.get("DefaultThreadsPerCore")
    if threads:
        return vcpus / float(threads)
    cores = vcpu_info.get("DefaultCores")
    if cores:
        return float(cores)
    return vcpus / 2 if "x86_64" in set(architectures) else vcpus


def capacity_of(description: Mapping[str, Any]) -> Resources:
    """`Resources(gpu, cpu=physical cores, ram_gb=GiB)` of one `DescribeInstanceTypes` entry."""
    gpus = sum(int(g.get("Count", 0)) for g in description.get("GpuInfo", {}).get("Gpus", []))
    architectures = description.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    cores = physical_cores(description["VCpuInfo"], architectures)
    ram_gib = description["MemoryInfo"]["SizeInMiB"] / 1024
    return Resources(float(gpus), cores, ram_gib)


def _image_kind_mismatch(name: str, description: Mapping[str, Any]) -> bool:
    """True when EC2's description contradicts the image kind the type's name implies
    (`provisioners.images`): the image `[ec2.ami]` gives it might not boot or lack drivers."""
    family = family_of(name)
    try:
        arch = architecture_of(family)
    except UnsupportedFamily:
        return True
    architectures = description.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    if architectures and arch not in architectures:
        return True
    makers = {g.get("Manufacturer") for g in description.get("GpuInfo", {}).get("Gpus", [])}
    accelerator = accelerator_of(family)
    if accelerator == "nvidia":
        return "NVIDIA" not in makers
    return bool(makers) and accelerator is None


# --- the catalog ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EC2Catalog:
    """The planner's `Catalog` for one region, with zones and the provenance of every fact."""

    region: str
    catalog: Catalog
    zones: Mapping[str, tuple[str, ...]]  # type -> zones offering it (empty: unknown)
    vcpus: Mapping[str, int]  # type -> vCPUs, for display next to the cores
    origin: Origin
    prices: str  # where the prices come from and their date
    fetched_at_s: float | None = None  # epoch seconds of the AWS describe calls
    selection: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (families, types) asked for
    notes: tuple[str, ...] = field(default=())

    def age_s(self, now_s: float) -> float | None:
        return None if self.fetched_at_s is None else max(0.0, now_s - self.fetched_at_s)

    def with_note(self, note: str) -> EC2Catalog:
        return replace(self, notes=(*self.notes, note))

    def restricted_to(self, config: EC2Config) -> EC2Catalog:
        """Only the types the configuration allows (a cache may predate a config change)."""
        names = {t.name for t in self.catalog if config.allows(t.name)}
        if len(names) == len(self.catalog):
            return self
        return replace(self, catalog=self.catalog.restricted_to(names))


def _selection(config: EC2Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(sorted(config.families)), tuple(sorted(config.types)))


def describe_catalog(
    ec2: AwsCaller, config: EC2Config, prices: PriceTable | None, now_s: float
) -> EC2Catalog:
    """Build the catalog from AWS: allowed types, their capacities, zones and prices.

    Types the region does not have (moto has no `p3.*`, a real region may lack
    a new family) and types without a known price are skipped with a warning
    that names them.
    """
    patterns = [f"{family}.*" for family in config.families] + list(config.types)
    described: dict[str, Mapping[str, Any]] = {}
    for page in ec2.pages(
        "describe_instance_types", Filters=[{"Name": "instance-type", "Values": patterns}]
    ):
        for description in page.get("InstanceTypes", []):
            name = description["InstanceType"]
            if config.allows(name):
                described[name] = description

    zones: dict[str, set[str]] = {}
    names = sorted(described)
    for start in range(0, len(names), 100):  # exact names: not every endpoint expands wildcards
        for page in ec2.pages(
            "describe_instance_type_offerings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": names[start : start + 100]}],
        ):
            for offering in page.get("InstanceTypeOfferings", []):
                zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])

    price_of = dict(prices.prices) if prices is not None and prices.region == config.region else {}
    types: list[InstanceType] = []
    unpriced: list[str] = []
    unoffered: list[str] = []
    misnamed: list[str] = []
    for name, description in described.items():
        if _image_kind_mismatch(name, description):
            misnamed.append(name)
        elif name not in price_of:
            unpriced.append(name)
        elif not zones.get(name):
            unoffered.append(name)
        else:
            types.append(
                InstanceType(name, family_of(name), capacity_of(description), price_of[name])
            )
    expected = {n for n in (*price_of, *config.types) if config.allows(n)}
    missing = sorted(expected - set(described))

    notes: list[str] = []
    if missing:
        notes.append(_skipped(missing, f"not offered in {config.region}"))
    if unoffered:
        notes.append(_skipped(unoffered, f"offered in no zone of {config.region}"))
    if unpriced:
        notes.append(
            _skipped(unpriced, "no known price; run `autoscaler catalog refresh` to fetch prices")
        )
    if misnamed:
        notes.append(
            _skipped(
                misnamed,
                "EC2 reports another architecture or accelerator than its family name says, "
                "so no [ec2.ami] image is known to fit",
            )
        )
    for note in notes:
        log.warning("EC2 catalog: %s", note)
    kept = {t.name for t in types}
    return EC2Catalog(
        region=config.region,
        catalog=Catalog(types, config.region),
        zones={n: tuple(sorted(z)) for n, z in zones.items() if n in kept},
        vcpus={n: int(d["VCpuInfo"]["DefaultVCpus"]) for n, d in described.items() if n in kept},
        origin="aws",
        prices=prices.describe() if prices is not None else "no price table",
        fetched_at_s=now_s,
        selection=_selection(config),
        notes=tuple(notes),
    )


def bundled_catalog(config: EC2Config, prices: PriceTable | None) -> EC2Catalog:
    """The catalog without AWS: Eva's measured capacities and the bundled prices.

    Covers Eva's 21 us-east-1 types only; zones are unknown until a refresh.
    """
    notes: list[str] = []
    vcpus: dict[str, int] = {}
    if config.region != _BUNDLED_REGION:
        types: list[InstanceType] = []
        notes.append(
            f"no bundled catalog for {config.region} (only {_BUNDLED_REGION}); "
            "run `autoscaler catalog refresh`"
        )
    else:
        price_of = dict(prices.prices) if prices is not None else {}
        eva = catalog_from_eva(_read_document(BUNDLED_CATALOG, "catalog"), str(BUNDLED_CATALOG))
        allowed = [t for t in eva if config.allows(t.name)]
        if not allowed:
            selection = ", ".join([*config.families, *config.types]) or "nothing"
            notes.append(
                f"[ec2] allows {selection}, and no type of the bundled catalog matches "
                f"(its families: {', '.join(sorted(eva.families))}); change [ec2] families "
                "or types, or run `autoscaler catalog refresh` to describe them from AWS"
            )
        types = [replace(t, hourly_cost=price_of[t.name]) for t in allowed if t.name in price_of]
        unpriced = sorted(t.name for t in allowed if t.name not in price_of)
        if unpriced:
            notes.append(_skipped(unpriced, "no known price"))
    return EC2Catalog(
        region=config.region,
        catalog=Catalog(types, config.region),
        zones={},
        vcpus=vcpus,
        origin="bundled",
        prices=prices.describe() if prices is not None else "no price table",
        selection=_selection(config),
        notes=tuple(notes),
    )


def _skipped(names: Iterable[str], why: str) -> str:
    names = sorted(names)
    return f"skipped {len(names)} type{'s' if len(names) != 1 else ''} ({why}): {', '.join(names)}"


# --- the on-disk cache ------------------------------------------------------------------------


def save_catalog_cache(catalog: EC2Catalog, path: Path) -> None:
    """Write the catalog in Eva's `ec2_config.json` format plus zones and provenance."""
    fetched = catalog.fetched_at_s
    document = {
        "format": _CATALOG_FORMAT,
        "region": catalog.region,
        "fetched_at_s": fetched,
        "fetched_at": None if fetched is None else _iso(fetched),
        "units": {"capacity": ["gpus", "physical cores", "GiB"], "cost": "USD per hour"},
        "prices": catalog.prices,
        "selection": {"families": catalog.selection[0], "types": catalog.selection[1]},
        "notes": list(catalog.notes),
        "instance_types": {
            t.name: {
                "family": t.family,
                "capacity": list(t.capacity.as_tuple()),
                "cost": t.hourly_cost,
                "vcpus": catalog.vcpus.get(t.name),
                "zones": list(catalog.zones.get(t.name, ())),
            }
            for t in sorted(catalog.catalog, key=lambda t: t.name)
        },
    }
    _write_json_atomically(path, document)


def load_catalog_cache(path: Path, region: str | None = None) -> EC2Catalog | None:
    """The cached catalog, or None when there is none. A damaged cache, one dated in the
    future, or (given `region`) one of another region is an `InputError`."""
    if not path.exists() and not path.is_symlink():
        return None
    source = str(path)
    document = _cache_document(_read_document(path, "catalog cache"), source)
    if region is not None and document.region != region:
        raise InputError(
            f"is the catalog of {document.region}, and the cluster is in {region}; delete it "
            "and run `autoscaler catalog refresh`",
            source=source,
            field="region",
            value=document.region,
            has_value=True,
        )
    raw = document.instance_types
    return EC2Catalog(
        region=document.region,
        catalog=_cache_catalog(document),
        zones={n: tuple(t.zones) for n, t in raw.items()},
        vcpus={n: t.vcpus for n, t in raw.items() if t.vcpus is not None},
        origin="cache",
        prices=document.prices,
        fetched_at_s=None if document.fetched_at_s is None else float(document.fetched_at_s),
        selection=(tuple(document.selection.families), tuple(document.selection.types)),
        notes=tuple(document.notes),
    )


def cached_or_bundled_catalog(config: EC2Config) -> EC2Catalog:
    """What `catalog show` prints without calling AWS: the cache, else the bundled catalog."""
    cached = load_catalog_cache(catalog_cache_path(config), config.region)
    if cached is not None:
        return cached.restricted_to(config)
    return bundled_catalog(config, current_price_table(config))


def current_catalog(
    ec2: AwsCaller,
    config: EC2Config,
    *,
    now_s: float,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    pricing: AwsCaller | None = None,
) -> EC2Catalog:
    """The catalog the daemon launches from: the cache while fresh, else rebuilt from AWS,
    with prices fetched from the Pricing API first when the region has none or old ones
    (`refreshed_price_table`, given `pricing`).

    When AWS cannot be reached (or refuses), the cached catalog is used
    whatever its age, with a note saying so; with no cache the error is raised.
    """
    path = catalog_cache_path(config)
    try:
        cached = load_catalog_cache(path, config.region)
    except InputError as exc:
        log.warning("ignoring the damaged catalog cache: %s", exc)
        cached = None
    if cached is not None:
        age = cached.age_s(now_s)
        if age is not None and age <= max_age_s and cached.selection == _selection(config):
            return cached.restricted_to(config)
    try:
        prices, warning = refreshed_price_table(config, pricing, now_s)
        fresh = describe_catalog(ec2, config, prices, now_s)
        if warning is not None:
            log.warning("EC2 catalog: %s", warning)
            fresh = fresh.with_note(warning)
    except CloudError as exc:
        if cached is None:
            raise
        note = f"AWS unavailable ({exc}); using the catalog cached {_age_text(cached, now_s)}"
        log.warning("EC2 catalog: %s", note)
        return cached.restricted_to(config).with_note(note)
    try:
        save_catalog_cache(fresh, path)
    except InputError as exc:  # an unwritable cache must not stop the daemon
        log.warning("EC2 catalog not cached: %s", exc)
    return fresh


def _age_text(catalog: EC2Catalog, now_s: float) -> str:
    age = catalog.age_s(now_s)
    if age is None or catalog.fetched_at_s is None:
        return "at an unknown time"
    return f"{format_age(age)} ago ({_iso(catalog.fetched_at_s)})"


def format_age(seconds: float) -> str:
    """`45 s`, `12 min`, `5.2 h`, `3.0 days`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise InputError(
            f"cannot write here ({exc.strerror or exc}); check [ec2] cache_dir", source=str(path)
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_document(path: Path, what: str) -> Any:
    """A JSON file this binding wrote (cache, price table) or bundles, read by the rules
    of `provisioners.documents`: a regular file, within `CATALOG_LIMIT`, no duplicate key."""
    source = str(path)
    return parse_json(
        decode_utf8(read_regular_file(path, what, CATALOG_LIMIT), what, source), source
    )


# --- spot offerings ---------------------------------------------------------------------------

_SPOT_FORMAT = "ec2-batch-autoscaler spot prices v1"
#: The Spot Instance Advisor's frequency-of-interruption bands (share of a type's
#: instances interrupted over a month), each taken at its midpoint (">20%": 25%).
ADVISOR_BANDS: Mapping[str, float] = {
    "<5%": 0.025,
    "5-10%": 0.075,
    "10-15%": 0.125,
    "15-20%": 0.175,
    ">20%": 0.25,
}


@dataclass(frozen=True, slots=True)
class SpotSnapshot:
    """Spot prices per type and zone in one region, and the interruption band of each
    type (the file's own `types`, else the advisor's, else `default_band`), with where and
    when they came from."""

    region: str
    prices: Mapping[str, Mapping[str, float]]  # type -> zone -> USD/hour
    retrieved: str
    source: str
    bands: Mapping[str, float] = field(default_factory=lambda: dict(ADVISOR_BANDS))
    default_band: str = "5-10%"
    type_bands: Mapping[str, str] = field(default_factory=dict)
    # The Spot Instance Advisor's own band per type, dated (`advisor_as_of`) and with its
    # source: what a type's rate starts from unless `[spot.bands]` or the file's `types`
    # name it; the cluster's own interruption history refines it (`LearnedRates`).
    advisor_bands: Mapping[str, str] = field(default_factory=dict)
    advisor_as_of: str = ""
    advisor_source: str = ""

    def band_of(self, ec2_type: str, overrides: Mapping[str, str] | None = None) -> str:
        if overrides and ec2_type in overrides:
            return overrides[ec2_type]
        if ec2_type in self.type_bands:
            return self.type_bands[ec2_type]
        return self.advisor_bands.get(ec2_type, self.default_band)

    def monthly_fraction(self, ec2_type: str, overrides: Mapping[str, str] | None = None) -> float:
        band = self.band_of(ec2_type, overrides)
        if band not in self.bands:
            raise InputError(
                f"unknown interruption band {band!r} for {ec2_type}; "
                f"choose from {', '.join(self.bands)}"
            )
        return self.bands[band]


def bundled_spot_snapshot_path(region: str) -> Path:
    return Path(str(resources.files("provisioners") / "data" / f"spot-{region}.json"))


def load_spot_snapshot(path: Path) -> SpotSnapshot:
    """Read and check a spot price snapshot (`provisioners/data/spot-<region>.json`)."""
    source = str(path)
    data = _read_document(path, "spot price snapshot")
    if not isinstance(data, Mapping) or data.get("format") != _SPOT_FORMAT:
        raise InputError(f"not a spot price snapshot (expected {_SPOT_FORMAT!r})", source=source)
    try:
        prices = {
            str(t): {str(z): float(p) for z, p in zones.items()}
            for t, zones in data["prices"].items()
        }
        interruption = data.get("interruption") or {}
        bands = {str(k): float(v) for k, v in (interruption.get("bands") or ADVISOR_BANDS).items()}
        default = str(interruption.get("default_band", "5-10%"))
        types = {str(k): str(v) for k, v in (interruption.get("types") or {}).items()}
        advisor = interruption.get("advisor") or {}
        advised = {str(k): str(v) for k, v in (advisor.get("types") or {}).items()}
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"malformed spot price snapshot: {exc}", source=source) from exc
    if any(not 0 < p <= MAX_HOURLY_COST for zones in prices.values() for p in zones.values()):
        raise InputError("a spot price is not a positive USD/hour", source=source)
    for band in (default, *types.values(), *advised.values()):
        if band not in bands:
            raise InputError(f"unknown interruption band {band!r}", source=source)
    return SpotSnapshot(
        region=str(data.get("region", "")),
        prices=prices,
        retrieved=str(data.get("retrieved", "")),
        source=str(data.get("source") or source),
        bands=bands,
        default_band=default,
        type_bands=types,
        advisor_bands=advised,
        advisor_as_of=str(advisor.get("as_of", "")),
        advisor_source=str(advisor.get("source", "")),
    )


def bundled_spot_snapshot(region: str) -> SpotSnapshot | None:
    """The snapshot bundled for `region` (None: none is)."""
    path = bundled_spot_snapshot_path(region)
    return load_spot_snapshot(path) if path.exists() else None


def spot_offerings(
    catalog: Catalog,
    snapshot: SpotSnapshot,
    *,
    zones: Sequence[str] | None = None,
    bands: Mapping[str, str] | None = None,
    observed: Mapping[str, float] | None = None,
    only: Callable[[str], bool] | None = None,
) -> Catalog:
    """The catalog with a spot offering beside each on-demand type the snapshot prices
    (and `only` accepts: the cluster's spot setting, `EC2Config.spot_for`, the same test
    its launches and its IAM policy follow).

    `zones` None: one regional offering per type (`TYPE:spot`) at the median of its
    zones' prices (where EC2 places it is not ours to choose); else one per listed zone
    the snapshot prices (`TYPE:spot@ZONE`; `["all"]`: every zone it prices). Each
    offering's `interruption_per_hour` comes from its type's advisor band (`bands`
    overrides per type, e.g. `[spot.bands]`) as a Poisson rate
    (`autoscaler.spot.hourly_rate`), unless `observed` — interruptions per hour the
    cluster measured, by offering name — gives one."""
    observed = observed or {}
    extra: list[InstanceType] = []
    for t in catalog:
        if t.is_spot or t.name not in snapshot.prices or (only is not None and not only(t.name)):
            continue
        by_zone = snapshot.prices[t.name]
        if not by_zone:
            continue
        rate = hourly_rate(snapshot.monthly_fraction(t.name, bands))
        if zones is None:
            ordered = sorted(by_zone.values())
            mid = len(ordered) // 2
            price = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            picks: list[tuple[str | None, float]] = [(None, price)]
        else:
            wanted = (
                sorted(by_zone) if list(zones) == ["all"] else [z for z in zones if z in by_zone]
            )
            picks = [(z, by_zone[z]) for z in wanted]
        for zone, price in picks:
            name = offering_name(t.name, SPOT, zone)
            extra.append(
                replace(
                    t,
                    name=name,
                    hourly_cost=price,
                    market=SPOT,
                    zone=zone,
                    ec2_type=t.name,
                    interruption_per_hour=observed.get(name, rate),
                )
            )
    if not extra:
        return catalog
    return Catalog((*catalog.types, *extra), catalog.region)
