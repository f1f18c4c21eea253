"""Spot prices per (type, zone) from EC2's `DescribeSpotPriceHistory`: refreshed, cached, dated.

The same pattern as the on-demand price table (`provisioners.catalog`, SkyPilot's
self-refreshing catalog in small): the table is fetched when there is none or it
is older than `SPOT_PRICES_STALE_AFTER_S`, written atomically to the cache
directory with when and where it came from (`spot-prices-<region>.json`), and
kept when a refresh fails — a stale price with its date beats none. Spot prices
move within a day (AWS changes them gradually with supply and demand), so the
table is dated to the second, not the day.

One price per (type, zone): the newest `Linux/UNIX` entry of each. The table is
asked for from `StartTime` = the previous refresh (at most `SPOT_HISTORY_WINDOW_S`
back; now when there was none), which EC2 answers with every change since and the
price in force at that start (the last change before it, "DescribeSpotPriceHistory",
EC2 API Reference): the table keeps those entries, dated, as its `history`. moto
returns dummy prices: tests check the parsing and the caching, never the figures.

The price an instance lands at is recorded with it (`instances.hourly_price`); a
running spot instance is then billed at the price in effect, which moves while it
runs: the daemon turns each refresh's `history` into price segments of the ledger
(`autoscaler.spot.price_changes`, `Store.reprice_instances`), each change at the
history's time, so the ledger, the budget guardrail and the spend brakes charge what
EC2 bills.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
#: How far back a refresh asks for the changes since the previous one (a daemon down longer
#: bills the gap from the price in force at this bound; EC2 keeps 90 days).
SPOT_HISTORY_WINDOW_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class SpotPriceTable:
    """Spot USD/hour by type and zone in one region, with when and where they came from."""

    region: str
    prices: Mapping[str, Mapping[str, float]]  # type -> zone -> USD/hour
    retrieved_s: float  # epoch seconds of the fetch
    source: str = "EC2 DescribeSpotPriceHistory"
    # The fetch's entries: type -> zone (as EC2 names it, as instances report theirs) ->
    # ((epoch seconds the price took effect, USD/hour), ...) in time order; empty when the
    # table has no history (the bundled snapshot, a table cached before it was kept).
    history: Mapping[str, Mapping[str, tuple[tuple[float, float], ...]]] = field(
        default_factory=dict
    )

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
            "history": {
                t: {z: [list(e) for e in entries] for z, entries in sorted(zones.items())}
                for t, zones in sorted(self.history.items())
            },
        }


def spot_prices_path(cache_dir: Path, region: str) -> Path:
    return cache_dir / f"spot-prices-{region}.json"


def prices_from_history(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The newest price of each (type, zone) among `DescribeSpotPriceHistory` entries
    (`InstanceType`, `AvailabilityZone`, `SpotPrice` as a string, `Timestamp`); entries of
    other products (Windows, SUSE, ...), or without a positive price, are left out."""
    return {
        itype: {zone: changes[-1][1] for zone, changes in zones.items()}
        for itype, zones in history_from_entries(entries).items()
    }


def history_from_entries(
    entries: Iterable[Mapping[str, Any]],
) -> dict[str, dict[str, tuple[tuple[float, float], ...]]]:
    """Each (type, zone)'s prices among `DescribeSpotPriceHistory` entries, as (epoch
    seconds it took effect, USD/hour) in time order, one per time (a repeated entry, as
    paging can give, counts once; of two prices at one time the later listed wins);
    entries of other products, or without a positive price, are left out. An entry
    without a time is taken as the oldest."""
    found: dict[tuple[str, str], dict[float, float]] = {}
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
        found.setdefault((itype, zone), {})[_epoch(when)] = price
    history: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {}
    for (itype, zone), by_time in sorted(found.items()):
        history.setdefault(itype, {})[zone] = tuple(sorted(by_time.items()))
    return history


def _epoch(when: datetime) -> float:
    return -float("inf") if when == datetime.min.replace(tzinfo=UTC) else when.timestamp()


def fetch_spot_prices(
    ec2: AwsCaller,
    region: str,
    instance_types: Iterable[str],
    now_s: float,
    since_s: float | None = None,
) -> SpotPriceTable:
    """The region's current spot prices of `instance_types` (`ec2:DescribeSpotPriceHistory`),
    with the changes since `since_s` (none: now; at most `SPOT_HISTORY_WINDOW_S` back) and
    the price in force then as the table's `history`. An entry dated after `now_s` (a
    clock ahead of ours) is taken as of `now_s`."""
    types = sorted(set(instance_types))
    if not types:
        raise CloudRequestError("no instance types to ask spot prices for")
    entries: list[Mapping[str, Any]] = []
    since = now_s if since_s is None else min(now_s, max(since_s, now_s - SPOT_HISTORY_WINDOW_S))
    start = datetime.fromtimestamp(since, UTC)
    for first in range(0, len(types), 100):  # a generous batch per request
        for page in ec2.pages(
            "describe_spot_price_history",
            InstanceTypes=types[first : first + 100],
            ProductDescriptions=[PRODUCT],
            StartTime=start,
        ):
            entries.extend(page.get("SpotPriceHistory", []))
    history = {
        itype: {zone: _as_of(changes, now_s) for zone, changes in zones.items()}
        for itype, zones in history_from_entries(entries).items()
    }
    if not history:
        raise CloudRequestError(
            f"DescribeSpotPriceHistory returned no {PRODUCT} spot price in {region} for "
            f"{', '.join(types)}"
        )
    prices = {t: {z: c[-1][1] for z, c in zones.items()} for t, zones in history.items()}
    return SpotPriceTable(region, prices, now_s, history=history)


def _as_of(
    changes: tuple[tuple[float, float], ...], now_s: float
) -> tuple[tuple[float, float], ...]:
    """Changes no later than `now_s`: one dated after it is taken as of `now_s` (the
    last such wins), so no ledger segment starts in the future."""
    kept = [(at, price) for at, price in changes if at <= now_s]
    later = [price for at, price in changes if at > now_s]
    if later:
        kept = [c for c in kept if c[0] < now_s] + [(now_s, later[-1])]
    return tuple(kept)


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
        history = {
            str(t): {
                str(z): tuple((float(at), float(p)) for at, p in entries)
                for z, entries in zones.items()
            }
            for t, zones in dict(data.get("history") or {}).items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"malformed spot price table: {exc}", source=str(path)) from None
    if retrieved.tzinfo is None:
        retrieved = retrieved.replace(tzinfo=UTC)
    bad = [f"{t}@{z}" for t, zones in prices.items() for z, p in zones.items() if not p > 0]
    if bad:
        raise InputError(f"spot prices must be positive: {', '.join(bad)}", source=str(path))
    return SpotPriceTable(
        region, prices, retrieved.timestamp(), str(data.get("source", "")), history
    )


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
    since_s: float | None = None,
) -> tuple[SpotPriceTable | None, str | None]:
    """The cached spot prices of the region, fetched again first when there are none or
    they are older than `stale_after_s`; a failed fetch keeps the cached table. A fetch
    asks for the history since `since_s`, else since the cached table's retrieval (the
    changes in between). The second value is a warning to show with the prices (None
    when they are fresh)."""
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
        since = since_s if since_s is not None else (cached.retrieved_s if cached else None)
        fresh = fetch_spot_prices(ec2, region, instance_types, now_s, since)
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
    "history_from_entries",
    "load_spot_prices",
    "prices_from_history",
    "refreshed_spot_prices",
    "save_spot_prices",
    "spot_prices_path",
]
