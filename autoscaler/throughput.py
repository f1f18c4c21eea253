"""The co-location throughput table (Eva §4.3–4.4).

It records the normalized throughput (1.0 = alone) a workload achieved when
co-located with a multiset of other workloads, and estimates what it has not
seen. Lookup of workload `w` with co-located multiset `T`:

1. the recorded value if exactly `T` was observed;
2. else the product over `w'` in `T` of the pairwise value `tput(w, {w'})`,
   where an unrecorded pair counts as the default `t` (0.95 unless configured;
   smaller means more conservative packing).

Keys are workload keys (`resnet18_node0`), not task ids, so what one job
teaches carries over to every job of the same kind.

The table is immutable: an observation returns a new table. Planning reads a
snapshot; the round that observes builds the next one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

#: Eva's default throughput for a pair never observed together (§4.3).
DEFAULT_THROUGHPUT = 0.95

#: Most entries the learned table keeps (see `ThroughputTable.bounded`).
MAX_ENTRIES = 4096

Colocated = tuple[str, ...]  # sorted multiset of co-located workload keys
Key = tuple[str, Colocated]


@dataclass(frozen=True, slots=True)
class ThroughputEntry:
    """One recorded co-location: the latest observed throughput and how often it was seen."""

    throughput: float
    observations: int = 1
    updated_at_s: float | None = None


def _key(workload: str, colocated: Iterable[str]) -> Key:
    return workload, tuple(sorted(colocated))


def _clean(throughput: float) -> float:
    if not throughput == throughput or throughput < 0:  # NaN or negative
        raise ValueError(f"throughput must be a non-negative number, got {throughput!r}")
    # A co-location cannot make a task faster than running alone; measured
    # values above 1 are noise and are recorded as 1.
    return min(float(throughput), 1.0)


class ThroughputTable:
    """Recorded and estimated co-location throughputs; immutable."""

    __slots__ = ("_default", "_entries", "_estimates", "_neutral")

    def __init__(
        self,
        entries: Mapping[Key, ThroughputEntry] | None = None,
        default: float = DEFAULT_THROUGHPUT,
    ) -> None:
        if not 0.0 < default <= 1.0:
            raise ValueError(f"default throughput must be in (0, 1], got {default!r}")
        self._entries: dict[Key, ThroughputEntry] = dict(entries or {})
        self._default = float(default)
        self._neutral = default == 1.0 and all(e.throughput == 1.0 for e in self._entries.values())
        self._estimates: dict[Key, float] | None = None

    @property
    def default(self) -> float:
        return self._default

    @property
    def is_neutral(self) -> bool:
        """True when every lookup returns 1.0 (no interference is assumed anywhere)."""
        return self._neutral

    def __len__(self) -> int:
        return len(self._entries)

    def estimates(self) -> Mapping[Key, float]:
        """Recorded throughput per key, unordered: what lookups depend on besides the
        default (not how often or when it was seen). Built once per table; comparing
        two of these is a C-level dict comparison, with no sorting."""
        if self._estimates is None:
            self._estimates = {k: e.throughput for k, e in self._entries.items()}
        return self._estimates

    def items(self) -> Iterator[tuple[Key, ThroughputEntry]]:
        return iter(sorted(self._entries.items()))

    def entry(self, workload: str, colocated: Iterable[str]) -> ThroughputEntry | None:
        """The recorded entry for exactly this co-location, or None."""
        return self._entries.get(_key(workload, colocated))

    def recorded(self, workload: str, colocated: Iterable[str]) -> float | None:
        """The value recorded for exactly this co-location, or None."""
        entry = self._entries.get(_key(workload, colocated))
        return None if entry is None else entry.throughput

    def throughput(self, workload: str, colocated: Iterable[str]) -> float:
        """Estimated normalized throughput of `workload` next to `colocated`."""
        key = _key(workload, colocated)
        if not key[1]:
            return 1.0
        entry = self._entries.get(key)
        if entry is not None:
            return entry.throughput
        product = 1.0
        for other in key[1]:
            pair = self._entries.get((workload, (other,)))
            product *= self._default if pair is None else pair.throughput
        return product

    def bounded(self, limit: int = MAX_ENTRIES) -> tuple[ThroughputTable, list[Key]]:
        """This table kept within `limit` entries, and the keys it forgot.

        Exact co-located sets key the table, and over a long trace (or a daemon's
        life) their number grows without bound. The rule: when the table holds
        more than `limit` entries, it forgets down to 7/8 of the limit — first
        sets of two or more co-located workloads, then (only if pairs alone
        overflow) pairs; within each, the least recently observed first (never
        observed at a known time counts as oldest), then the least observed,
        then the larger set. A forgotten set is estimated as an unseen one (the
        product of its pairs, §4.3) and is learned again if it recurs; pairs,
        at most workloads², carry what generalises and go last. Costs nothing
        below the limit; above it, one sort every `limit`/8 new keys.
        """
        if len(self._entries) <= limit:
            return self, []
        keep = limit - limit // 8

        def age(item: tuple[Key, ThroughputEntry]) -> tuple[bool, float, int, int, str, Colocated]:
            (workload, colocated), entry = item
            at = -math.inf if entry.updated_at_s is None else entry.updated_at_s
            return (
                len(colocated) == 1,
                at,
                entry.observations,
                -len(colocated),
                workload,
                colocated,
            )

        oldest_first = sorted(self._entries.items(), key=age)
        forgotten = [key for key, _ in oldest_first[: len(oldest_first) - keep]]
        entries = dict(self._entries)
        for key in forgotten:
            del entries[key]
        return ThroughputTable(entries, self._default), forgotten

    def revised(
        self, upserts: Iterable[tuple[Key, ThroughputEntry]], forget: Iterable[Key] = ()
    ) -> ThroughputTable:
        """This table with the keys in `forget` dropped, then `upserts` recorded as given:
        what a store's table becomes after it records a round's learning. Equal to a
        table built from the resulting entries, but its `estimates` are carried over
        and patched rather than rebuilt from every entry (a store revises its table
        every round that learns, and the planner reads the estimates every round)."""
        entries = dict(self._entries)
        estimates = dict(self.estimates())
        for key in forget:
            entries.pop(key, None)
            estimates.pop(key, None)
        for key, entry in upserts:
            entries[key] = entry
            estimates[key] = entry.throughput
        table = ThroughputTable(entries, self._default)
        table._estimates = estimates
        return table

    def with_default(self, default: float) -> ThroughputTable:
        return ThroughputTable(self._entries, default)

    def observe(
        self, workload: str, colocated: Iterable[str], throughput: float, at_s: float | None = None
    ) -> ThroughputTable:
        """A new table with this observation recorded (the latest observation wins)."""
        key = _key(workload, colocated)
        if not key[1]:
            return self  # alone is 1.0 by definition: nothing to learn
        entries = dict(self._entries)
        _record(entries, key, _clean(throughput), at_s)
        return ThroughputTable(entries, self._default)

    def observe_job(
        self,
        placements: Sequence[tuple[str, Iterable[str]]],
        throughput: float,
        at_s: float | None = None,
    ) -> tuple[ThroughputTable, int | None]:
        """Record a job's observed throughput, attributing it to one task (§4.4).

        `placements[i]` is task i's workload and the workloads co-located with
        it. A multi-task job runs at its slowest task's pace, so the observation
        bounds every task's throughput from below and is recorded for exactly
        one task — the likely straggler:

        1. nothing recorded yet for any task -> the task co-located with the most tasks;
        2. some recorded value is lower than the observation -> that value is
           too pessimistic: raise the lowest one;
        3. every recorded value is higher -> the straggler is a task not yet
           recorded: the unrecorded task co-located with the most tasks.

        Two cases the paper leaves open are decided here: a recorded value equal
        to the observation already explains it and is refreshed; if every task
        is recorded and higher, the lowest is lowered (it is the closest
        candidate). Tasks running alone cannot be slowed by co-location and are
        never blamed. Returns the new table and the index updated (None if none).
        """
        table, chosen = self.observe_jobs([(placements, throughput)], at_s)
        return table, chosen[0]

    def observe_jobs(
        self,
        observations: Sequence[tuple[Sequence[tuple[str, Iterable[str]]], float]],
        at_s: float | None = None,
    ) -> tuple[ThroughputTable, list[int | None]]:
        """`observe_job` for many jobs at once (one round's reports), in order."""
        entries = dict(self._entries)
        chosen: list[int | None] = []
        for placements, throughput in observations:
            keys = [_key(w, c) for w, c in placements]
            index = _attribute(entries, keys, _clean(throughput))
            if index is not None:
                _record(entries, keys[index], _clean(throughput), at_s)
            chosen.append(index)
        return ThroughputTable(entries, self._default), chosen


def _record(
    entries: dict[Key, ThroughputEntry], key: Key, value: float, at_s: float | None
) -> None:
    previous = entries.get(key)
    entries[key] = ThroughputEntry(
        value, 1 if previous is None else previous.observations + 1, at_s
    )


def _attribute(entries: Mapping[Key, ThroughputEntry], keys: list[Key], value: float) -> int | None:
    """Which task of a job an observed job throughput is recorded for (see observe_job)."""
    candidates = [i for i, k in enumerate(keys) if k[1]]
    if not candidates:
        return None
    if len(keys) == 1:
        return 0
    recorded = [i for i in candidates if keys[i] in entries]
    unrecorded = [i for i in candidates if keys[i] not in entries]

    def most_colocated(indices: list[int]) -> int:
        return max(indices, key=lambda i: (len(keys[i][1]), -i))

    def lowest(indices: list[int]) -> int:
        return min(indices, key=lambda i: (entries[keys[i]].throughput, i))

    if not recorded:
        return most_colocated(candidates)  # rule 1
    lower = [i for i in recorded if entries[keys[i]].throughput < value]
    equal = [i for i in recorded if entries[keys[i]].throughput == value]
    if lower:
        return lowest(lower)  # rule 2
    if equal:
        return equal[0]
    if unrecorded:
        return most_colocated(unrecorded)  # rule 3
    return lowest(recorded)
