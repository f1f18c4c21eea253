"""The immutable snapshot a planner decides from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autoscaler.catalog import Catalog
from autoscaler.configuration import Configuration
from autoscaler.jobs import JobSpec
from autoscaler.throughput import ThroughputTable


@dataclass(frozen=True, slots=True)
class ReconfigurationHistory:
    """What the migration criterion needs to estimate how long a configuration lasts.

    An *event round* is a scheduling round in which at least one job arrived
    or completed — the only moments a Full Reconfiguration can be worth
    anything (§4.5). `full_rounds` counts those that adopted Full.
    """

    elapsed_s: float = 0.0
    event_rounds: int = 0
    full_rounds: int = 0

    def after_round(
        self, elapsed_s: float, had_event: bool, chose_full: bool
    ) -> ReconfigurationHistory:
        return ReconfigurationHistory(
            elapsed_s=elapsed_s,
            event_rounds=self.event_rounds + int(had_event),
            full_rounds=self.full_rounds + int(had_event and chose_full),
        )


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything a planner may look at: no clock, no cloud, no database.

    `jobs` are the jobs whose tasks must be placed; `current` the instances
    that exist now (running or launching) with the tasks assigned to them.
    Tasks on `current` instances that belong to no job in `jobs` are ignored.
    `provisional` instances host a task only until its job is measured: Partial
    Reconfiguration re-places their tasks rather than keeping them there.
    """

    catalog: Catalog
    jobs: tuple[JobSpec, ...]
    current: Configuration = field(default_factory=Configuration)
    throughput: ThroughputTable = field(default_factory=ThroughputTable)
    history: ReconfigurationHistory = field(default_factory=ReconfigurationHistory)
    now_s: float = 0.0
    # Completed iterations of each job as last observed (runtime-aware baselines use it).
    progress: Mapping[str, float] = field(default_factory=dict)
    provisional: frozenset[str] = frozenset()
