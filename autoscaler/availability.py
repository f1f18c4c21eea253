"""Spot availability traces: when an offering had no spot capacity.

The format is the one "Can't Be Late" (NSDI '24) publishes its AWS spot traces in:
`{"metadata": {"gap_seconds": 600}, "data": [0, 1, ...]}`, one sample per interval
from the trace's epoch, **1 = no spot capacity** in that interval; a trace shorter
than the run repeats. The replay (`simulator.spot`) and the local cloud
(`provisioners.local_reclaims`) both read it through this one class, so a file
means the same, and is refused the same way, in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoscaler.errors import InputError

#: Samples in an availability trace at most (a year of 10-minute samples is ~53k).
MAX_TRACE_SAMPLES = 10_000_000


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """Spot capacity of one offering over time: `data[i]` is 1 when there was none in
    [i·gap_s, (i+1)·gap_s) from the epoch; the trace repeats past its end."""

    gap_s: float
    data: tuple[int, ...]

    @classmethod
    def from_document(cls, document: Any, source: str = "trace") -> AvailabilityTrace:
        """Read Can't Be Late's format, refusing anything else with where it is wrong.

        Keys inside `metadata` other than `gap_seconds` are accepted (published
        traces describe themselves there); any other top-level key is refused.
        """
        if not isinstance(document, dict) or set(document) - {"metadata", "data"}:
            raise InputError(
                'must be {"metadata": {"gap_seconds": ...}, "data": [...]} and nothing else',
                source=source,
            )
        metadata = document.get("metadata")
        gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 < gap < math.inf:
            raise InputError(
                "must be a positive number of seconds",
                source=source,
                field="metadata.gap_seconds",
                value=gap,
                has_value=True,
            )
        data = document.get("data")
        if not isinstance(data, list) or not data or len(data) > MAX_TRACE_SAMPLES:
            raise InputError(
                f"must be a list of 1 to {MAX_TRACE_SAMPLES} samples", source=source, field="data"
            )
        for i, sample in enumerate(data):
            if isinstance(sample, bool) or sample not in (0, 1):
                raise InputError(
                    "must be 0 (capacity) or 1 (no spot capacity)",
                    source=source,
                    field=f"data[{i}]",
                    value=sample,
                    has_value=True,
                )
        return cls(float(gap), tuple(int(s) for s in data))

    def available(self, t: float) -> bool:
        """Whether there is spot capacity `t` seconds after the epoch."""
        return self.data[int(max(t, 0.0) // self.gap_s) % len(self.data)] == 0

    def unavailable(self, t: float) -> bool:
        """Whether there is no spot capacity `t` seconds after the epoch."""
        return not self.available(t)

    def next_unavailable(self, t: float) -> float | None:
        """The start of the first interval without capacity after the one holding `t`
        (None: never)."""
        if 1 not in self.data:
            return None
        index = int(max(t, 0.0) // self.gap_s) + 1
        for step in range(len(self.data)):
            if self.data[(index + step) % len(self.data)] == 1:
                return (index + step) * self.gap_s
        return None  # pragma: no cover - unreachable: a 1 exists
