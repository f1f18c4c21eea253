"""Spot prices that move on the local cloud: a `DescribeSpotPriceHistory` dump, replayed.

So the local walk-through can show what EC2 does to a running spot instance's bill
(`provisioners.spot_prices`: each refresh's history becomes price segments of the
ledger) without an AWS account. The file is what the AWS CLI prints, so a real week
can be dumped and replayed as it is:

    aws ec2 describe-spot-price-history --instance-types c7i.large \\
        --product-descriptions Linux/UNIX --start-time 2026-11-01T00:00:00Z > prices.json

    {"SpotPriceHistory": [{"AvailabilityZone": "us-east-1a", "InstanceType": "c7i.large",
      "ProductDescription": "Linux/UNIX", "SpotPrice": "0.031200",
      "Timestamp": "2026-11-01T00:00:00+00:00"}, ...]}

The rules:

- **Time.** The earliest `Timestamp` of the file's kept entries (below) is the local cloud's
  epoch — the one its availability traces start at (`app.wiring._epoch`, kept in the
  cloud's directory, so a restarted daemon replays the same prices at the same
  times); an entry takes effect at epoch + (its Timestamp − the earliest). After the
  last entry its prices hold; the trace does not repeat (a price that moves back is
  in the file or it is not). A type is at its catalog price until its first entry.
- **Zones.** The local cloud has one zone, `LOCAL_ZONE` ("local"), which its
  instances report. A type's zones in the file fold into it: its price at any time
  is the median of the prices in force then in the zones the file names for it (the
  rule a regional spot offering is planned by, `provisioners.catalog.spot_offerings`),
  so a one-zone file replays exactly and a whole region's dump replays as its
  regional price. Every spot offering of the type, whatever zone it names, is priced
  and billed at it (`app.wiring.local_cloud`).
- **What is kept.** Only `Linux/UNIX` entries (`spot_prices.PRODUCTS`, what the
  workers run and what EC2's refresh asks for); other products' entries are checked,
  then left out. Types without a spot offering in the cluster's catalog are left
  out by the cloud (`LocalCloud.spot_prices`).
- **Strict.** Only the CLI's keys (`SpotPriceHistory`; per entry `AvailabilityZone`,
  `InstanceType`, `ProductDescription`, `SpotPrice`, `Timestamp`, and the optional
  `AvailabilityZoneId`); a price is a positive decimal USD/hour (the CLI prints it
  as a string), a time ISO 8601 (UTC when it names no offset). Anything else is one
  `InputError` naming the file, the entry's field and its value. The file is read
  bounded (`app.files.load_spot_price_trace`).

`SpotPriceTrace.served` gives what `LocalCloud.spot_prices` answers with, in the shape
EC2's refresh has (`fetch_spot_prices`): the prices in force now and, as `history`,
the entries since the previous answer with the price in force then.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autoscaler.errors import InputError
from autoscaler.limits import MAX_HOURLY_COST
from provisioners.spot_prices import PRODUCTS, history_from_entries

#: The one zone of the local cloud, as its instances report it.
LOCAL_ZONE = "local"
#: Entries in a trace at most (a week of every type of a region is ~10^5).
MAX_TRACE_ENTRIES = 2_000_000

_REQUIRED = ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp")
_KEYS = frozenset({*_REQUIRED, "AvailabilityZoneId"})


@dataclass(frozen=True, slots=True)
class SpotPriceTrace:
    """Each type's spot price on the local cloud over time: `changes[type]` is
    ((seconds after the epoch it took effect, USD/hour), ...), in time order, each a
    change from the one before."""

    changes: Mapping[str, tuple[tuple[float, float], ...]]
    source: str = "spot price trace"

    @classmethod
    def from_document(cls, document: Any, source: str = "spot price trace") -> SpotPriceTrace:
        """Read the AWS CLI's `describe-spot-price-history` JSON, refusing anything else
        with the field and value at fault."""
        if not isinstance(document, dict) or set(document) != {"SpotPriceHistory"}:
            extra = (
                sorted(set(document) - {"SpotPriceHistory"}) if isinstance(document, dict) else []
            )
            why = (
                " (a NextToken: the dump is cut short; dump without --max-items)"
                if "NextToken" in extra
                else ""
            )
            raise InputError(
                f'must be {{"SpotPriceHistory": [...]}} and nothing else{why}',
                source=source,
                field=extra[0] if extra else None,
            )
        entries = document["SpotPriceHistory"]
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_TRACE_ENTRIES:
            raise InputError(
                f"must be a list of 1 to {MAX_TRACE_ENTRIES:,} entries",
                source=source,
                field="SpotPriceHistory",
            )
        times = [_checked(entry, i, source) for i, entry in enumerate(entries)]
        kept = [i for i, e in enumerate(entries) if e["ProductDescription"] in PRODUCTS]
        if not kept:
            raise InputError(
                f"has no entry of {' or '.join(sorted(PRODUCTS))}: nothing to replay",
                source=source,
                field="SpotPriceHistory",
            )
        start = min(times[i] for i in kept)
        history = history_from_entries(entries[i] for i in kept)
        return cls(
            {
                itype: _folded({z: _shifted(c, start) for z, c in zones.items()})
                for itype, zones in history.items()
            },
            source,
        )

    def served(
        self, types: frozenset[str] | set[str], since_s: float | None, now_s: float
    ) -> tuple[dict[str, float], dict[str, tuple[tuple[float, float], ...]]]:
        """For `types`, at `now_s` seconds after the epoch: (the price in force of each
        type that has one, each type's changes in (since_s, now_s] preceded by the one in
        force at since_s — all those up to now_s without a since_s), as EC2 answers a
        refresh asked from `since_s`."""
        prices: dict[str, float] = {}
        history: dict[str, tuple[tuple[float, float], ...]] = {}
        for itype in sorted(types & self.changes.keys()):
            changes = self.changes[itype]
            upto = bisect.bisect_right(changes, now_s, key=lambda c: c[0])
            if upto == 0:
                continue
            first = (
                0
                if since_s is None
                else max(0, bisect.bisect_right(changes, since_s, key=lambda c: c[0]) - 1)
            )
            prices[itype] = changes[upto - 1][1]
            history[itype] = changes[first:upto]
        return prices, history

    def newest(self, types: frozenset[str] | set[str], now_s: float) -> float | None:
        """When the newest change of `types` in force at `now_s` took effect (None: none)."""
        found = [
            changes[i - 1][0]
            for itype in types & self.changes.keys()
            if (i := bisect.bisect_right(changes := self.changes[itype], now_s, key=lambda c: c[0]))
        ]
        return max(found, default=None)


def _checked(entry: Any, i: int, source: str) -> float:
    """Check one entry's keys and values; its Timestamp in epoch seconds."""
    where = f"SpotPriceHistory[{i}]"
    if not isinstance(entry, dict):
        raise InputError(
            "must be an object", source=source, field=where, value=entry, has_value=True
        )
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise InputError(
            f"unknown key (expected {', '.join(sorted(_KEYS))})",
            source=source,
            field=f"{where}.{unknown[0]}",
        )
    for key in _REQUIRED:
        if key not in entry:
            raise InputError("is required", source=source, field=f"{where}.{key}")
    for key in ("AvailabilityZone", "InstanceType", "ProductDescription"):
        value = entry[key]
        if not isinstance(value, str) or not value.strip() or len(value) > 128:
            raise InputError(
                "must be a non-empty string",
                source=source,
                field=f"{where}.{key}",
                value=value,
                has_value=True,
            )
    price = entry["SpotPrice"]
    try:
        if isinstance(price, bool) or not isinstance(price, str | int | float):
            raise ValueError
        usd = float(price)
    except ValueError:
        usd = math.nan
    if not 0 < usd <= MAX_HOURLY_COST:
        raise InputError(
            f"must be a price in USD/hour above 0 and at most {MAX_HOURLY_COST:g}, "
            'such as "0.0312"',
            source=source,
            field=f"{where}.SpotPrice",
            value=price,
            has_value=True,
        )
    stamp = entry["Timestamp"]
    try:
        if not isinstance(stamp, str):
            raise ValueError
        when = datetime.fromisoformat(stamp)
    except ValueError:
        raise InputError(
            "must be an ISO 8601 time, such as 2026-11-01T00:00:00+00:00",
            source=source,
            field=f"{where}.Timestamp",
            value=stamp,
            has_value=True,
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _shifted(
    changes: tuple[tuple[float, float], ...], start: float
) -> tuple[tuple[float, float], ...]:
    return tuple((at - start, price) for at, price in changes)


def _folded(
    zones: Mapping[str, tuple[tuple[float, float], ...]],
) -> tuple[tuple[float, float], ...]:
    """One zone's prices from several: at each time any of them changes, the median of
    those in force then; a time that leaves the median where it was is no change."""
    times = sorted({at for changes in zones.values() for at, _ in changes})
    out: list[tuple[float, float]] = []
    for at in times:
        in_force = [
            changes[i - 1][1]
            for changes in zones.values()
            if (i := bisect.bisect_right(changes, at, key=lambda c: c[0]))
        ]
        price = statistics.median(in_force)
        if not out or out[-1][1] != price:
            out.append((at, price))
    return tuple(out)


__all__ = ["LOCAL_ZONE", "MAX_TRACE_ENTRIES", "SpotPriceTrace"]
