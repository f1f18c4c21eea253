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
  `InputError` naming the file, the entry's field and its value (a `Strict` schema,
  `provisioners.documents`). The file is read bounded (`app.files.load_spot_price_trace`).

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
from typing import Annotated, Any

import msgspec

from autoscaler.errors import InputError
from autoscaler.limits import MAX_HOURLY_COST
from provisioners.documents import FieldError, Strict, convert, text
from provisioners.spot_prices import PRODUCTS, history_from_entries

#: The one zone of the local cloud, as its instances report it.
LOCAL_ZONE = "local"
#: Entries in a trace at most (a week of every type of a region is ~10^5).
MAX_TRACE_ENTRIES = 2_000_000

#: A zone, type or product name as the CLI prints it.
_NAME = text(min_length=1, max_length=128, pattern=r"\S", description="a non-empty name")


class _Entry(Strict, frozen=True, rename="pascal"):
    """One entry of the CLI's `SpotPriceHistory`, keys as it spells them."""

    availability_zone: Annotated[str, _NAME]
    instance_type: Annotated[str, _NAME]
    product_description: Annotated[str, _NAME]
    spot_price: str | float  # the CLI prints a decimal string: "0.031200"
    timestamp: str
    availability_zone_id: Annotated[str, _NAME] | None = None

    def check(self) -> None:
        _usd(self.spot_price)
        _epoch_s(self.timestamp)


class _Dump(Strict, frozen=True, rename="pascal"):
    """What `aws ec2 describe-spot-price-history` prints, whole."""

    spot_price_history: Annotated[
        list[_Entry], msgspec.Meta(min_length=1, max_length=MAX_TRACE_ENTRIES)
    ]


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
        if isinstance(document, dict) and "NextToken" in document:
            raise InputError(
                'must be {"SpotPriceHistory": [...]} and nothing else (a NextToken: the dump '
                "is cut short; dump without --max-items)",
                source=source,
                field="NextToken",
            )
        dump = convert(document, _Dump, source=source)
        kept = [e for e in dump.spot_price_history if e.product_description in PRODUCTS]
        if not kept:
            raise InputError(
                f"has no entry of {' or '.join(sorted(PRODUCTS))}: nothing to replay",
                source=source,
                field="SpotPriceHistory",
            )
        start = min(_epoch_s(e.timestamp) for e in kept)
        history = history_from_entries(
            e for e in document["SpotPriceHistory"] if e["ProductDescription"] in PRODUCTS
        )
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


def _usd(price: str | float) -> float:
    """A SpotPrice as USD/hour, or a FieldError naming it."""
    try:
        usd = float(price)
    except ValueError:
        usd = math.nan
    if not 0 < usd <= MAX_HOURLY_COST:
        raise FieldError(
            f"must be a price in USD/hour above 0 and at most {MAX_HOURLY_COST:g}, "
            'such as "0.0312"',
            "SpotPrice",
        )
    return usd


def _epoch_s(stamp: str) -> float:
    """A Timestamp (ISO 8601, UTC when it names no offset) in epoch seconds, or a
    FieldError naming it."""
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        raise FieldError(
            "must be an ISO 8601 time, such as 2026-11-01T00:00:00+00:00", "Timestamp"
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
