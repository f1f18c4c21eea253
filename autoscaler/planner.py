"""The planner: one scheduling decision from one snapshot.

Eva's ensemble (§4.5): compute both the Full and the Partial Reconfiguration
of the snapshot, value each by its provisioning saving over the expected
lifetime minus its migration cost, and adopt the better. The resulting `Plan`
carries both candidates and the numbers behind the choice so it can be
explained to a user and recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoscaler.configuration import Configuration
from autoscaler.criterion import MigrationCost, expected_duration_h, migration_cost
from autoscaler.pricing import PriceBook
from autoscaler.reconfiguration import Packer
from autoscaler.view import ClusterView

Mode = Literal["ensemble", "full", "partial"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate configuration and its valuation."""

    name: Literal["full", "partial"]
    configuration: Configuration
    hourly_cost: float
    saving_per_hour: float  # S: Σ over instances of (TNRP − cost)
    migration: MigrationCost  # M
    score: float  # S·D̂ − M

    def summary(self) -> dict[str, float | int | str]:
        return {
            "name": self.name,
            "hourly_cost": self.hourly_cost,
            "instances": len(self.configuration),
            "saving_per_hour": self.saving_per_hour,
            "migration_cost": self.migration.dollars,
            "moved_jobs": self.migration.moved_jobs,
            "launched_instances": self.migration.launched_instances,
            "score": self.score,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """A planner's decision: the target configuration, which candidate won and why."""

    configuration: Configuration
    chosen: Literal["full", "partial"]
    candidates: tuple[Candidate, ...]
    expected_duration_h: float  # D̂
    no_packing_hourly_cost: float
    reason: str

    @property
    def hourly_cost(self) -> float:
        return self.configuration.hourly_cost


class EvaPlanner:
    """Eva's planner: Full and/or Partial Reconfiguration, chosen by the migration criterion.

    `mode="full"` or `"partial"` always adopts that candidate (the paper's
    ablations); the ensemble is the default.
    """

    def __init__(self, mode: Mode = "ensemble") -> None:
        self.mode: Mode = mode
        self.name = {"ensemble": "eva", "full": "eva-full-only", "partial": "eva-partial-only"}[
            mode
        ]

    def plan(self, view: ClusterView) -> Plan:
        prices = PriceBook.build(view.jobs, view.catalog)
        packer = Packer(view, prices)
        d_hat = expected_duration_h(view.history)
        jobs = {j.job_id: j for j in view.jobs}

        def evaluate(name: Literal["full", "partial"], config: Configuration) -> Candidate:
            saving = sum(packer.tnrp_of(i.tasks) - i.type.hourly_cost for i in config)
            cost = migration_cost(view.current, config, jobs, prices)
            return Candidate(
                name, config, config.hourly_cost, saving, cost, saving * d_hat - cost.dollars
            )

        candidates: list[Candidate] = []
        if self.mode in ("ensemble", "full"):
            candidates.append(evaluate("full", packer.full()))
        if self.mode in ("ensemble", "partial"):
            candidates.append(evaluate("partial", packer.partial()))
        chosen, reason = _choose(candidates, d_hat, self.mode)
        return Plan(
            chosen.configuration,
            chosen.name,
            tuple(candidates),
            d_hat,
            prices.no_packing_hourly_cost(),
            reason,
        )


def _choose(candidates: list[Candidate], d_hat: float, mode: Mode) -> tuple[Candidate, str]:
    if len(candidates) == 1:
        only = candidates[0]
        return only, f"{only.name} reconfiguration only (planner mode {mode!r})"
    full, partial = candidates
    if full.score > partial.score + 1e-9:
        return full, (
            f"full: saves ${full.saving_per_hour - partial.saving_per_hour:.2f}/h more than "
            f"partial; over the expected {d_hat:.2f} h until the next full reconfiguration "
            f"that outweighs its extra one-off cost of "
            f"${full.migration.dollars - partial.migration.dollars:.2f}"
        )
    if full.configuration == partial.configuration or (abs(full.score - partial.score) <= 1e-9):
        return partial, "partial: full reconfiguration would not do better"
    return partial, (
        f"partial: full would save ${full.saving_per_hour - partial.saving_per_hour:.2f}/h "
        f"more, but over the expected {d_hat:.2f} h that does not repay its extra one-off "
        f"cost of ${full.migration.dollars - partial.migration.dollars:.2f}"
    )
