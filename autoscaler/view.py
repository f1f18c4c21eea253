"""The immutable snapshot a planner decides from, and what the migration criterion reads
beside it: the reconfiguration history (for D̂) and the measured delays (for M)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


#: (instance type, phase, seconds): one phase of one attempt, as its worker measured it.
PhaseSample = tuple[str, str, float]

#: Observations a measured delay's mean counts at most. Past it each new one weighs
#: 1/MAX_DELAY_OBSERVATIONS, so the mean follows a type whose delays drift (a new
#: machine image, larger job images) and its table stays one row per type and phase.
MAX_DELAY_OBSERVATIONS = 20


@dataclass(frozen=True, slots=True)
class MeasuredDelay:
    """The running mean of one phase's duration on one instance type (seconds)."""

    mean_s: float
    observations: int

    def observed(self, seconds: float) -> MeasuredDelay:
        """This mean with one more observation (bounded: see MAX_DELAY_OBSERVATIONS)."""
        n = min(self.observations + 1, MAX_DELAY_OBSERVATIONS)
        return MeasuredDelay(self.mean_s + (seconds - self.mean_s) / n, n)


@dataclass(frozen=True, slots=True)
class MeasuredDelays:
    """How long each phase of a task's attempt took on each instance type, as measured.

    Workers time every attempt's phases (`autoscaler.execution.TaskReport.phases`):
    `fetch` (the image or build context, and the checkpoint to resume from), `build`
    (the image), `start` (the container), `init` (from its start to its first
    iteration), `checkpoint` (from the stop request until it stopped, checkpointed)
    and `upload` (the checkpoint). Eva prices a migration with these delays (§4.5;
    Table 1 gives their averages); where a type has a measured mean it replaces the
    job's assumed delay (`autoscaler.criterion.move_delay_s`).
    """

    means: Mapping[tuple[str, str], MeasuredDelay] = field(default_factory=dict)

    def seconds(self, instance_type: str | None, phase: str) -> float | None:
        """The measured mean of `phase` on `instance_type` (None: never measured)."""
        found = self.means.get((instance_type, phase)) if instance_type is not None else None
        return None if found is None else found.mean_s

    def observed(self, samples: Iterable[PhaseSample]) -> MeasuredDelays:
        """These delays with `samples` folded in, in order."""
        means = dict(self.means)
        for instance_type, phase, seconds in samples:
            key = (instance_type, phase)
            known = means.get(key)
            means[key] = MeasuredDelay(seconds, 1) if known is None else known.observed(seconds)
        return MeasuredDelays(means)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything a planner may look at: no clock, no cloud, no database.

    `jobs` are the jobs whose tasks must be placed; `current` the instances
    that exist now (running or launching) with the tasks assigned to them.
    Tasks on `current` instances that belong to no job in `jobs` are ignored.
    `provisional` instances host a task only until its job is measured: Partial
    Reconfiguration re-places their tasks rather than keeping them there.
    `delays` are the phase durations measured per instance type: the migration
    criterion prices a move with them where they exist (Eva §4.5).
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
    delays: MeasuredDelays = field(default_factory=MeasuredDelays)
