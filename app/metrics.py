"""Prometheus metrics of the daemon (prometheus-client), refreshed after every round and step.

What an operator watches: the bill now, instances by type, capacity type and
status, jobs and tasks by status (the queue), how long rounds take and which
candidate they choose, the planned $/h beside the LP lower bound (Eva §4.2: the
bound no packing can beat), launches refused by guardrails, capacity errors,
lost workers, spot interruptions, webhook deliveries. `deploy/grafana/` charts
every one of them (its test checks each name against a rendered registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from autoscaler.catalog import ON_DEMAND, SPOT
from autoscaler.decide import StepDecision
from autoscaler.store import RoundRecord, StateCounts, StateSnapshot


class Metrics:
    """One registry per daemon (tests build several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.hourly_cost = Gauge(
            "autoscaler_hourly_cost_dollars", "$/h of the instances billed now", registry=r
        )
        self.instances = Gauge(
            "autoscaler_instances",
            "instances by offering (catalog name), capacity type and status",
            ["type", "capacity_type", "status"],
            registry=r,
        )
        self.jobs = Gauge(
            "autoscaler_jobs",
            "jobs not finished, by status (queued: the queue)",
            ["status"],
            registry=r,
        )
        self.tasks = Gauge(
            "autoscaler_tasks", "tasks of active jobs by status", ["status"], registry=r
        )
        self.round_seconds = Histogram(
            "autoscaler_round_duration_seconds",
            "wall time of a scheduling round",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.rounds = Counter(
            "autoscaler_rounds_total", "rounds by the candidate they chose", ["chosen"], registry=r
        )
        self.planned_cost = Gauge(
            "autoscaler_planned_hourly_cost_dollars",
            "$/h of the configuration the latest round adopted",
            registry=r,
        )
        self.lower_bound = Gauge(
            "autoscaler_lower_bound_hourly_cost_dollars",
            "$/h of the LP lower bound for the latest round's tasks (no packing beats it)",
            registry=r,
        )
        self.bound_gap = Gauge(
            "autoscaler_lower_bound_gap_ratio",
            "planned $/h over the LP lower bound, minus one",
            registry=r,
        )
        self.refused = Counter(
            "autoscaler_refused_launches_total", "launches a guardrail refused", registry=r
        )
        self.capacity_errors = Counter(
            "autoscaler_capacity_errors_total", "launches that found no capacity", registry=r
        )
        self.lost_workers = Counter(
            "autoscaler_lost_workers_total", "workers declared lost", registry=r
        )
        self.interruptions = Counter(
            "autoscaler_interruptions_total",
            "spot instances the cloud reclaimed, by offering and capacity type",
            ["type", "capacity_type"],
            registry=r,
        )
        self.notifications = Counter(
            "autoscaler_notifications_total",
            "webhook delivery attempts by outcome (delivered, retry, failed)",
            ["outcome"],
            registry=r,
        )
        self.infeasible = Gauge(
            "autoscaler_infeasible_tasks", "tasks nothing available can host", registry=r
        )
        self.held = Gauge(
            "autoscaler_held_instance_types",
            "instance types held back after launches that never registered a worker",
            registry=r,
        )

    def observe_round(self, record: RoundRecord, seconds: float) -> None:
        self.round_seconds.observe(seconds)
        self.rounds.labels(record.chosen).inc()
        cost = record.numbers.get("hourly_cost")
        bound = record.numbers.get("lower_bound_hourly_cost")
        if cost is not None:
            self.planned_cost.set(cost)
        if bound is not None:
            self.lower_bound.set(bound)
        if cost is not None and bound:
            self.bound_gap.set(cost / bound - 1.0)
        self.infeasible.set(len(record.numbers.get("infeasible", {})))
        self.held.set(len(record.numbers.get("held", {})))
        for action in record.actions:
            if action.kind != "launch":
                continue
            if action.outcome == "refused":
                self.refused.inc()
            elif action.outcome == "failed" and "InsufficientCapacity" in action.message:
                self.capacity_errors.inc()

    def observe_step(self, step: StepDecision) -> None:
        for action in step.terminations:
            if action.reason.startswith("worker lost"):
                self.lost_workers.inc()

    def observe_interruption(self, instance_type: str) -> None:
        """The cloud reclaimed an instance of `instance_type` (a spot interruption)."""
        self.interruptions.labels(instance_type, capacity_type(instance_type)).inc()

    def observe_state(self, snapshot: StateSnapshot, hourly_cost: float) -> None:
        """The state's counts from a snapshot already read (`observe_counts`)."""
        self.observe_counts(replace(StateCounts.of(snapshot), hourly_cost=hourly_cost))

    def observe_counts(self, counts: StateCounts) -> None:
        """The bill now, the live instances, the active jobs and their tasks by status."""
        self.hourly_cost.set(counts.hourly_cost)
        self._set(
            self.instances,
            {
                (itype, capacity_type(itype), status): n
                for (itype, status), n in counts.instances.items()
            },
        )
        self._set(self.jobs, {(status,): n for status, n in counts.jobs.items()})
        self._set(self.tasks, {(status,): n for status, n in counts.tasks.items()})

    @staticmethod
    def _set(gauge: Gauge, counts: Mapping[tuple[str, ...], int]) -> None:
        gauge.clear()
        for key, n in counts.items():
            gauge.labels(*key).set(n)


def capacity_type(offering: str) -> str:
    """The market of a catalog name as `autoscaler.catalog.offering_name` writes it
    (`TYPE`, `TYPE@ZONE`: on-demand; `TYPE:spot`, `TYPE:spot@ZONE`: spot)."""
    return SPOT if offering.partition("@")[0].endswith(f":{SPOT}") else ON_DEMAND
