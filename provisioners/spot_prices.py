"""Spot prices per (type, zone) from EC2's `DescribeSpotPriceHistory`: refreshed, cached, dated.

The same pattern as the on-demand price table (`provisioners.catalog`, SkyPilot's
self-refreshing catalog in small): the table is fetched when there is none or it
is older than `SPOT_PRICES_STALE_AFTER_S`, written atomically to the cache
directory with when and where it came from (`spot-prices-<region>.json`), and
kept when a refresh fails — a stale price with its date beats none. Spot prices
move within a day (AWS changes them gradually with supply and demand), so the
table is dated to the second, not the day.

One price per (type, zone): the newest `Linux/UNIX` entry of each, asked for
from `StartTime` = now, which EC2 answers with the price in force now (the
latest change before it). moto returns dummy prices: tests check the parsing
and the caching, never the figures.

The price an instance is bought at is recorded with its request (`instances.
hourly_price`) from the catalog, so the ledger, the budget guardrail and the
spend brakes charge what the instance costs, whatever the table says later.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoscaler.cloud import CloudError, CloudRequestError
from autoscaler.errors import InputError

if TYPE_CHECKING:
    from provisioners.aws import AwsCaller

log = logging.getLogger(__name__)

SPOT_PRICES_FORMAT = "ec2-batch-autoscaler spot prices v1"
#: Older than this, the table is fetched again (spot prices change gradually, hourly at most).
SPOT_PRICES_STALE_AFTER_S = 3600.0
#: The product whose prices are wanted: what the workers run (in a VPC, EC2 may name it
#: either way).
PRODUCT = "Linux/UNIX"
PRODUCTS = frozenset({PRODUCT, "Linux/UNIX (Amazon VPC)"})


@dataclass(frozen=True, slots=True)
class SpotPriceTable:
    """Spot USD/hour by type and zone in one region, with when and where they came from."""

    region: str
    prices: Mapping[str, Mapping[str, float]]  # type -> zone -> USD/hour
    retrieved_s: float  # epoch seconds of the fetch
    source: str = "EC2 DescribeSpotPriceHistory"

    def price(self, instance_type: str, zone: str | None = None) -> float | None:
        """The spot price of a type in a zone; without a zone, the cheapest zone's."""
        by_zone = self.prices.get(instance_type, {})
        if zone is not None:
            return by_zone.get(zone)
        return min(by_zone.values(), default=None)

    def age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.retrieved_s)

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.retrieved_s, UTC).isoformat(timespec="seconds")
        return f"{self.source}; retrieved {when}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SPOT_PRICES_FORMAT,
            "region": self.region,
            "currency": "USD",
            "unit": "per instance-hour, Linux/UNIX",
            "retrieved": datetime.fromtimestamp(self.retrieved_s, UTC).isoformat(),
            "source": self.source,
            "prices": {t: dict(sorted(z.items())) for t, z in sorted(self.prices.items())},
        }


def spot_prices_path(cache_dir: Path, region: str) -> Path:
    return cache_dir / f"spot-prices-{region}.json"


def prices_from_history(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The newest price of each (type, zone) among `DescribeSpotPriceHistory` entries
    (`InstanceType`, `AvailabilityZone`, `SpotPrice` as a string, `Timestamp`); entries of
    other products (Windows, SUSE, ...), or without a positive price, are left out."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for entry in entries:
        if entry.get("ProductDescription", PRODUCT) not in PRODUCTS:
            continue
        itype, zone = entry.get("InstanceType"), entry.get("AvailabilityZone")
        try:
            price = float(entry.get("SpotPrice", "nan"))
        except (TypeError, ValueError):
            continue
        if not itype or not zone or not price > 0 or price == float("inf"):
            continue
        when = entry.get("Timestamp")
        if isinstance(when, str):
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        if not isinstance(when, datetime):
            when = datetime.min.replace(tzinfo=UTC)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        key = (itype, zone)
        if key not in newest or when > newest[key][0]:
            newest[key] = (when, price)
    prices: dict[str, dict[str, float]] = {}
    for (itype, zone), (_, price) in sorted(newest.items()):
        prices.setdefault(itype, {})[zone] = price
    return prices


def fetch_spot_prices(
    ec2: AwsCaller, region: str, instance_types: Iterable[str], now_s: float
) -> SpotPriceTable:
    """The region's current spot prices of `instance_types` (`ec2:DescribeSpotPriceHistory`)."""
    types = sorted(set(instance_types))
    if not types:
        raise CloudRequestError("no instance types to ask spot prices for")
    entries: list[Mapping[str, Any]] = []
    start = datetime.fromtimestamp(now_s, UTC)
    for first in range(0, len(types), 100):  # a generous batch per request
        for page in ec2.pages(
            "describe_spot_price_history",
            InstanceTypes=types[first : first + 100],
            ProductDescriptions=[PRODUCT],
            StartTime=start,
        ):
            entries.extend(page.get("SpotPriceHistory", []))
    prices = prices_from_history(entries)
    if not prices:
        raise CloudRequestError(
            f"DescribeSpotPriceHistory returned no {PRODUCT} spot price in {region} for "
            f"{', '.join(types)}"
        )
    return SpotPriceTable(region, prices, now_s)


def load_spot_prices(path: Path) -> SpotPriceTable:
    """Read a cached table (InputError, naming the file, when it is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the spot price table: {exc}", source=str(path)) from None
    if not isinstance(data, dict) or data.get("format") != SPOT_PRICES_FORMAT:
        raise InputError(
            f"not a spot price table (expected format {SPOT_PRICES_FORMAT!r})", source=str(path)
        )
    try:
        retrieved = datetime.fromisoformat(str(data["retrieved"]))
        prices = {
            str(t): {str(z): float(p) for z, p in zones.items()}
            for t, zones in dict(data["prices"]).items()
        }
        region = str(data["region"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"malformed spot price table: {exc}", source=str(path)) from None
    if retrieved.tzinfo is None:
        retrieved = retrieved.replace(tzinfo=UTC)
    bad = [f"{t}@{z}" for t, zones in prices.items() for z, p in zones.items() if not p > 0]
    if bad:
        raise InputError(f"spot prices must be positive: {', '.join(bad)}", source=str(path))
    return SpotPriceTable(region, prices, retrieved.timestamp(), str(data.get("source", "")))


def save_spot_prices(table: SpotPriceTable, path: Path) -> None:
    """Write the table atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(table.to_json(), out, indent=1)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def refreshed_spot_prices(
    cache_dir: Path,
    region: str,
    ec2: AwsCaller | None,
    instance_types: Iterable[str],
    now_s: float,
    *,
    stale_after_s: float = SPOT_PRICES_STALE_AFTER_S,
) -> tuple[SpotPriceTable | None, str | None]:
    """The cached spot prices of the region, fetched again first when there are none or
    they are older than `stale_after_s`; a failed fetch keeps the cached table. The second
    value is a warning to show with the prices (None when they are fresh)."""
    path = spot_prices_path(cache_dir, region)
    cached: SpotPriceTable | None = None
    if path.exists():
        try:
            cached = load_spot_prices(path)
        except InputError as exc:
            log.warning("ignoring the cached spot prices: %s", exc)
        if cached is not None and cached.region != region:
            cached = None
    if cached is not None and cached.age_s(now_s) <= stale_after_s:
        return cached, None
    if ec2 is None:
        return cached, _stale_note(cached, region, now_s, "no EC2 client to refresh them")
    try:
        fresh = fetch_spot_prices(ec2, region, instance_types, now_s)
    except CloudError as exc:
        log.warning("spot prices not refreshed: %s", exc)
        return cached, _stale_note(cached, region, now_s, f"DescribeSpotPriceHistory: {exc}")
    try:
        save_spot_prices(fresh, path)
    except OSError as exc:  # an unwritable cache must not stop the daemon
        log.warning("spot prices not saved: %s", exc)
    return fresh, None


def _stale_note(table: SpotPriceTable | None, region: str, now_s: float, why: str) -> str:
    if table is None:
        return f"no spot prices for {region} ({why})"
    return f"the spot prices of {region} are {table.age_s(now_s) / 3600:.1f} h old ({why})"


__all__ = [
    "SpotPriceTable",
    "fetch_spot_prices",
    "load_spot_prices",
    "prices_from_history",
    "refreshed_spot_prices",
    "save_spot_prices",
    "spot_prices_path",
]
