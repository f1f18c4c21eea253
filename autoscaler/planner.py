"""The planner: one scheduling decision from one snapshot.

Eva's ensemble (§4.5): compute both the Full and the Partial Reconfiguration
of the snapshot, value each by its provisioning saving over the expected
lifetime minus its migration cost, and adopt the better. The resulting `Plan`
carries both candidates, the numbers behind the choice and the LP lower bound,
so it can be explained to a user and recorded.

Variants by name (`planner_by_name`): `eva` packs with Algorithm 1 and with
LP-priced patterns and keeps the better; `eva-plain` is Algorithm 1 alone;
`eva-full-only` / `eva-partial-only` always adopt one candidate (the paper's
ablations).

Rounds with many distinct demand vectors (more than `fluid_min_classes`, no
anti-affinity) are packed by the fluid path
(`fluid.py`): the LP on grid-aggregated classes picks the type mix and best
fit packs the tasks, in time linear in the tasks; Full re-packs every task,
Partial keeps the instances still worth their cost and packs the rest. From
`fluid_also_min_classes` on, the default planner packs both ways and keeps,
for Full and for Partial, the candidate that saves more.

From `INCREMENTAL_MIN_TASKS` active tasks, a round after a planned one is
planned in proportion to its change (`EvaPlanner`): the instances the change
left alone are kept, the rest is planned as a sub-snapshot, and a fresh plan
is made on a stated rule.

Very large rounds can be split POP-style (Narayanan et al., SOSP '21): jobs
and instances are dealt at random into k sub-problems, planned in parallel
processes, and concatenated; the criterion then decides once for the whole
round on the summed savings and migration costs.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from autoscaler.catalog import Catalog
from autoscaler.configuration import Configuration, Instance
from autoscaler.criterion import MigrationCost, expected_duration_h, migration_cost
from autoscaler.fluid import fluid_pack
from autoscaler.jobs import Demands, JobSpec, TaskSpec
from autoscaler.lp import Demand, LPClass, PriceSolution, ShadowPricer
from autoscaler.patterns import PatternPricer
from autoscaler.pricing import (
    JobSlowdown,
    PriceBook,
    price_book_for,
    refused,
    slowdown_charge,
    tnrp,
    valued_tnrp,
)
from autoscaler.reconfiguration import FillMemory, Packer, Placement
from autoscaler.resources import EPSILON
from autoscaler.view import ClusterView

Mode = Literal["ensemble", "full", "partial"]
Packing = Literal["priced", "plain"]

PLANNER_NAMES = ("eva", "eva-plain", "eva-full-only", "eva-partial-only")

#: Distinct demand vectors above which the fluid path packs. Measured on random
#: distinct vectors (pai catalog, throughput 1.0): Algorithm 1 + patterns cost
#: 0.5–0.9% less from 1.5k to 4k but take 1.8 s → 9.1 s (growing as N^2.4) against
#: 0.2–0.4 s; at 10k they are 1.10× the bound against 1.03×. See also
#: the distinct-demand rows of `python -m benchmarks scale`.
FLUID_MIN_CLASSES = 2_000
#: Distinct demand vectors from which the fluid path also packs the round, beside
#: Algorithm 1 and the patterns, and the default planner keeps the better of each
#: candidate. Measured (five shapes of `benchmarks.workloads.SHAPES`, throughput
#: 1.0 and 0.95): from 250 to 2,000 vectors neither wins throughout — the fluid
#: path is 0.4–14% cheaper in 18 of 32 cases, equal in 2, up to 3% dearer in 12
#: (mostly GPU mixes) — in 2–27% of the time; at 100 it gains at most 1.5% and can
#: lose 78%, and the bundled traces (36–94 vectors) stay below.
FLUID_ALSO_MIN_CLASSES = 200
#: Active tasks from which a round may be planned incrementally (see `EvaPlanner`); below
#: it every round is a fresh plan. The bundled traces' replays stay below it, so their
#: figures are those of fresh plans.
INCREMENTAL_MIN_TASKS = 2_000
#: Share of the tasks at the last fresh plan that may arrive or leave before the next
#: round is planned fresh again.
FRESH_AFTER_CHANGE = 0.10
#: Incremental rounds in a row after which the next round is planned fresh.
FRESH_EVERY_ROUNDS = 10
#: How much dearer (hourly cost per no-packing cost) the last incremental plan may be
#: than the fresh plan that follows it before the next cycle's allowances are halved.
DRIFT_TOLERANCE = 0.0025
#: Largest share of the active tasks an incremental round re-plans (the instances the
#: change touched, their jobs' other instances, and the unplaced tasks); more, and the
#: round is planned fresh.
MAX_TOUCHED_SHARE = 0.25
#: Throughput lookups a planner keeps between rounds while the learned table stays the
#: same; past it they are dropped and gathered again.
MAX_REMEMBERED_THROUGHPUTS = 100_000


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
    lower_bound: PriceSolution | None = None  # LP relaxation, before interference
    partitions: int = 1  # POP sub-problems the round was split into

    @property
    def hourly_cost(self) -> float:
        return self.configuration.hourly_cost

    @property
    def lower_bound_hourly_cost(self) -> float | None:
        return None if self.lower_bound is None else self.lower_bound.lower_bound


class EvaPlanner:
    """Eva's planner: Full and/or Partial Reconfiguration, chosen by the migration criterion.

    Keeps state between rounds to make the next round faster: the bound's LP,
    last round's candidates (reused when nothing changed), Algorithm 1's fills
    (replayed where provably the same) and, from `incremental_min_tasks` active
    tasks, what an *incremental* round starts from.

    An incremental round plans in proportion to the change (Eva §4.4's Partial
    Reconfiguration, applied to the change alone): the running instances no
    task left, whose jobs did not change and whose saving is remembered are kept
    as they are; the rest of the running instances, for each task on no instance
    the kept instance whose free room it fits best (`_touch_room`), their jobs'
    other instances and the tasks on no instance form a sub-snapshot, whose Full and Partial
    Reconfiguration (the planner's own, on that sub-snapshot) are the round's
    candidates beside the kept instances. S and M are summed (M is exact: kept
    instances move nothing), and the criterion decides as usual. The bound is
    the last fresh LP's shadow prices applied to the tasks now active (valid by
    LP duality for any task set, `fluid.py`; looser than a fresh LP's).

    So a decision depends on the snapshot *and* on when the planner last planned
    fresh. A round is planned fresh (as by a new planner) when: the planner has
    no previous round (after a restart, the first round is fresh), fewer than
    `incremental_min_tasks` tasks are active, the catalog, prices or learned
    throughputs changed, a job limits its tasks per instance, POP splits the
    round, the tasks arrived and left since the last fresh plan exceed
    `FRESH_AFTER_CHANGE` of those planned then, `FRESH_EVERY_ROUNDS` incremental
    rounds ran in a row, or the sub-snapshot would exceed `MAX_TOUCHED_SHARE` of
    the tasks. At each fresh round the last incremental plan's cost per
    no-packing cost is compared with the fresh one's; beyond `DRIFT_TOLERANCE`
    the next cycle's two allowances are halved. The memory is only a speed-up:
    dropping it (a restart) makes the next round fresh, never wrong.
    """

    def __init__(
        self,
        mode: Mode = "ensemble",
        packing: Packing = "priced",
        *,
        lower_bound: bool = True,
        pattern_min_tasks: int = 400,
        pop_threshold: int | None = None,
        pop_parts: int = 2,
        pop_seed: int = 0,
        fluid_min_classes: int = FLUID_MIN_CLASSES,
        fluid_also_min_classes: int = FLUID_ALSO_MIN_CLASSES,
        price_interference: bool = True,
        job_slowdown: JobSlowdown = "by-job",
        min_throughput: float = 0.0,
        incremental_min_tasks: int | None = INCREMENTAL_MIN_TASKS,
    ) -> None:
        """`min_throughput`: the user's cap on slowdown. No task is co-located
        where the learned table expects it below this share of its full speed,
        however much it would save; 0 (default) leaves it to TNRP (Eva).
        `incremental_min_tasks`: active tasks from which rounds may be planned
        incrementally (None: every round fresh)."""
        if not 0.0 <= min_throughput <= 1.0:
            raise ValueError(f"min_throughput must be in [0, 1], got {min_throughput!r}")
        self.mode: Mode = mode
        self.packing: Packing = packing
        self.pattern_min_tasks = pattern_min_tasks
        self.pop_threshold = pop_threshold
        self.pop_parts = pop_parts
        self.pop_seed = pop_seed
        self.fluid_min_classes = fluid_min_classes
        self.fluid_also_min_classes = fluid_also_min_classes
        self.price_interference = price_interference
        self.job_slowdown: JobSlowdown = job_slowdown
        self.min_throughput = min_throughput
        self._pricer = PatternPricer() if packing == "priced" else None
        self._shadow = ShadowPricer() if lower_bound else None
        self._prices: PriceBook | None = None
        # Last round's candidates, and what they depended on.
        self._memo: (
            tuple[tuple[object, ...], list[_Outcome], PriceSolution | None, int, str] | None
        ) = None
        # What valued compositions when the pricer last solved (see `_valuation_epoch`).
        self._basis: tuple[object, ...] | None = None
        self._epoch = 0
        # The table's lookups in this epoch, shared by the rounds' packers.
        self._throughputs: dict[tuple[str, tuple[str, ...]], float] = {}
        # Algorithm 1's fills in this epoch, replayed where provably the same.
        self._fills = FillMemory()
        self.incremental_min_tasks = incremental_min_tasks
        # What the next incremental round starts from (None: plan the next one fresh).
        self._carried: _Carried | None = None
        self._valuer: Packer | None = None  # the last `_candidates`' Packer (Algorithm 1's)
        # The allowances of the current cycle (halved after a drift, see the docstring).
        self._allow_change = FRESH_AFTER_CHANGE
        self._allow_rounds = FRESH_EVERY_ROUNDS
        # The last incremental plan's hourly cost per no-packing cost (None: last was fresh).
        self._steady_ratio: float | None = None
        #: Rounds planned fresh / incrementally (for benchmarks and tests).
        self.fresh_rounds = 0
        self.incremental_rounds = 0
        base = {"ensemble": "eva", "full": "eva-full-only", "partial": "eva-partial-only"}[mode]
        self.name = base if packing == "priced" else f"{base}-plain"

    def plan(self, view: ClusterView) -> Plan:
        d_hat = expected_duration_h(view.history)
        prices = self._prices = price_book_for(view.catalog, self._prices)
        key = _memo_key(view)
        epoch = self._valuation_epoch(key)
        if self._pricer is not None:
            self._pricer.scope(epoch)
        self._fills.scope(epoch)
        incremental: bool | None = None  # None: last round's candidates, re-scored
        note = ""
        if self._memo is not None and self._memo[0] == key:
            # Same jobs, same instances, same learned throughputs as last round:
            # the candidates are the same; only D̂ moved, so only re-score them.
            _, outcomes, bound, parts, note = self._memo
        else:
            self._fills.next_round()
            steady = self._incremental(view, prices, epoch)
            incremental = steady is not None
            if steady is None:
                outcomes, bound, parts = self._candidates(view, prices)
                self._carry(view, prices, outcomes, bound, epoch)
                self.fresh_rounds += 1
            else:
                outcomes, bound, note = steady
                parts = 1
                self.incremental_rounds += 1
            self._memo = (key, outcomes, bound, parts, note)
        candidates = [_finish(o, d_hat) for o in outcomes]
        chosen, reason = _choose(candidates, d_hat, self.mode)
        if note:
            reason = f"{reason} ({note})"
        no_packing = prices.no_packing_hourly_cost(view.jobs)
        if incremental is not None:
            self._track_drift(incremental, chosen.hourly_cost, no_packing)
        return Plan(
            chosen.configuration,
            chosen.name,
            tuple(candidates),
            d_hat,
            no_packing,
            reason,
            bound,
            parts,
        )

    # -- incremental rounds ------------------------------------------------

    def _track_drift(self, steady: bool, hourly_cost: float, no_packing: float) -> None:
        """At a fresh round after incremental ones, compare their last cost per no-packing
        cost with the fresh one's: past `DRIFT_TOLERANCE`, halve the next cycle's
        allowances; within it, restore them."""
        ratio = hourly_cost / no_packing if no_packing > 0 else 1.0
        if steady:
            self._steady_ratio = ratio
            return
        if self._steady_ratio is not None:
            if self._steady_ratio > ratio * (1.0 + DRIFT_TOLERANCE):
                self._allow_change = max(self._allow_change / 2.0, 0.005)
                self._allow_rounds = max(self._allow_rounds // 2, 1)
            else:
                self._allow_change = FRESH_AFTER_CHANGE
                self._allow_rounds = FRESH_EVERY_ROUNDS
        self._steady_ratio = None

    def _carry(
        self,
        view: ClusterView,
        prices: PriceBook,
        outcomes: list[_Outcome],
        bound: PriceSolution | None,
        epoch: int,
    ) -> None:
        """Remember what the next incremental round starts from, after a fresh round."""
        self._carried = None
        n_tasks = sum(len(j.tasks) for j in view.jobs)
        if (
            self.incremental_min_tasks is None
            or n_tasks < self.incremental_min_tasks
            or (self.pop_threshold is not None and n_tasks > self.pop_threshold)
            or any(j.anti_affinity is not None for j in view.jobs)
        ):
            return
        # Valued when a next round first reads them (`_settle`), in this same epoch: a
        # plan made once (`autoscaler plan`, the scale benchmark) never pays for them.
        self._carried = _Carried(
            epoch,
            {j.job_id: j for j in view.jobs},
            n_tasks,
            pending=(view, prices, outcomes, bound, self._valuer),
        )

    def _settle(self, carried: _Carried) -> None:
        """Value what `_carry` remembered: each candidate instance's S, and each task's
        floor under the fresh round's shadow prices."""
        if carried.pending is None:
            return
        view, prices, outcomes, bound, valuer = carried.pending
        carried.pending = None
        if valuer is None:  # the fluid path or POP: no Packer of the whole view was built
            valuer = Packer(
                view, prices, None, **self._packer_options(), throughputs=self._throughputs
            )
        carried.savings = _savings(valuer, outcomes)
        if bound is not None:
            tasks = [t for j in view.jobs for t in j.tasks]
            values = _task_floors(view.catalog, tasks, bound)
            if values is not None:
                carried.floors = dict(zip((t.task_id for t in tasks), values.tolist(), strict=True))
                carried.floor_sum = float(values.sum())
                carried.bound = bound

    def _incremental(
        self, view: ClusterView, prices: PriceBook, epoch: int
    ) -> tuple[list[_Outcome], PriceSolution | None, str] | None:
        """This round planned in proportion to its change (see the class docstring) and a
        note saying how much was re-planned, or None where it must be planned fresh."""
        carried = self._carried
        if carried is None or carried.epoch != epoch or carried.rounds >= self._allow_rounds:
            return None
        last = carried.jobs
        jobs: dict[str, JobSpec] = {}
        changed_jobs: set[str] = set()
        arrived: list[TaskSpec] = []
        departed: list[TaskSpec] = []
        n_tasks = 0
        for job in view.jobs:
            if job.anti_affinity is not None:
                return None
            jobs[job.job_id] = job
            n_tasks += len(job.tasks)
            before = last.get(job.job_id)
            if before is job:
                continue
            if before is None:
                changed_jobs.add(job.job_id)
                arrived.extend(job.tasks)
            elif before != job:
                changed_jobs.add(job.job_id)
                was = {t.task_id for t in before.tasks}
                now = {t.task_id for t in job.tasks}
                arrived.extend(t for t in job.tasks if t.task_id not in was)
                departed.extend(t for t in before.tasks if t.task_id not in now)
        if self.incremental_min_tasks is None or n_tasks < self.incremental_min_tasks:
            return None
        if self.pop_threshold is not None and n_tasks > self.pop_threshold:
            return None
        for job_id, before in last.items():
            if job_id not in jobs:
                departed.extend(before.tasks)
        changed = carried.changed + len(arrived) + len(departed)
        if changed > self._allow_change * carried.fresh_tasks:
            return None
        self._settle(carried)

        # Which running instances the change touched, closed over their jobs.
        job_of_task: dict[str, str] = {}
        touched: list[bool] = []
        instances = view.current.instances
        where: dict[str, list[int]] = {}
        for i, inst in enumerate(instances):
            hit = (
                inst.instance_id is None
                or inst.instance_id in view.provisional
                or inst.type.name not in view.catalog
                or (inst.type.name, inst.tasks) not in carried.savings
            )
            for tid in inst.tasks:
                where.setdefault(tid, []).append(i)
            touched.append(hit)
        task_of: dict[str, TaskSpec] = {}
        for job in view.jobs:
            for task in job.tasks:
                job_of_task[task.task_id] = job.job_id
                task_of[task.task_id] = task
        _touch_room(task_of, instances, touched, where)
        for i, inst in enumerate(instances):
            if touched[i]:
                continue
            for tid in inst.tasks:
                owner = job_of_task.get(tid)
                if owner is None or owner in changed_jobs or len(where[tid]) > 1:
                    touched[i] = True
                    break
        sub_jobs: set[str] = set()
        new_jobs = set(changed_jobs)
        new_jobs.update(job_of_task[tid] for tid in job_of_task if tid not in where)
        frontier = [i for i, hit in enumerate(touched) if hit]
        while frontier or new_jobs:
            for i in frontier:
                new_jobs.update(
                    job_of_task[tid] for tid in instances[i].tasks if tid in job_of_task
                )
            new_jobs -= sub_jobs
            sub_jobs |= new_jobs
            frontier = []
            for j in new_jobs:
                for task in jobs[j].tasks:
                    for i in where.get(task.task_id, ()):
                        if not touched[i]:
                            touched[i] = True
                            frontier.append(i)
            new_jobs = set()
            sub_tasks = sum(len(jobs[j].tasks) for j in sub_jobs)
            if sub_tasks > MAX_TOUCHED_SHARE * n_tasks:
                return None

        kept = [inst for i, inst in enumerate(instances) if not touched[i]]
        kept_saving = sum(carried.savings[inst.type.name, inst.tasks] for inst in kept)
        sub_view = dataclasses.replace(
            view,
            jobs=tuple(j for j in view.jobs if j.job_id in sub_jobs),
            current=Configuration(tuple(inst for i, inst in enumerate(instances) if touched[i])),
        )
        if sub_view.jobs:
            sub_outcomes, _, _ = self._candidates(sub_view, prices, with_bound=False)
        else:
            empty = MigrationCost(0.0, 0.0, 0, 0, 0)
            names: list[Literal["full", "partial"]] = {
                "ensemble": ["full", "partial"],
                "full": ["full"],
                "partial": ["partial"],
            }[self.mode]  # type: ignore[assignment]
            sub_outcomes = [_Outcome(n, Configuration(()), 0.0, empty) for n in names]
        outcomes = [
            _Outcome(
                o.name,
                Configuration(tuple(kept) + o.configuration.instances),
                kept_saving + o.saving_per_hour,
                o.migration,
            )
            for o in sub_outcomes
        ]

        # Carry on: the kept instances' savings stay, the sub-snapshot's are new.
        savings = carried.savings
        for i, inst in enumerate(instances):
            if touched[i]:
                savings.pop((inst.type.name, inst.tasks), None)
        if sub_view.jobs:
            valuer = Packer(
                sub_view, prices, None, **self._packer_options(), throughputs=self._throughputs
            )
            savings.update(_savings(valuer, sub_outcomes))
        bound = None
        if carried.bound is not None:
            fresh = [t for t in arrived if t.task_id not in carried.floors]
            values = _task_floors(view.catalog, fresh, carried.bound) if fresh else None
            if fresh and values is None:
                carried.bound = None
            else:
                if values is not None:
                    carried.floors.update(
                        zip((t.task_id for t in fresh), values.tolist(), strict=True)
                    )
                carried.floor_sum += sum(carried.floors[t.task_id] for t in arrived)
                carried.floor_sum -= sum(carried.floors.pop(t.task_id, 0.0) for t in departed)
                bound = dataclasses.replace(
                    carried.bound,
                    lower_bound=carried.floor_sum,
                    class_prices=(),
                    type_usage={},
                    assignment={},
                    seconds=0.0,
                    warm_started=True,
                )
        carried.jobs = jobs
        carried.changed = changed
        carried.rounds += 1
        replanned = sum(len(j.tasks) for j in sub_view.jobs)
        note = (
            f"planned incrementally: {replanned} of {n_tasks} tasks re-planned, "
            f"{len(kept)} instances kept as they run"
        )
        return outcomes, bound, note

    def _valuation_epoch(self, key: tuple[object, ...]) -> int:
        """A number that changes whenever what values a composition may have changed: the
        catalog (its prices) or the learned throughputs (`_memo_key`'s last three)."""
        basis = (key[0], *key[4:])
        if self._basis is None or self._basis[0] is not basis[0] or self._basis[1:] != basis[1:]:
            self._basis = basis
            self._epoch += 1
            self._throughputs = {}
        elif len(self._throughputs) > MAX_REMEMBERED_THROUGHPUTS:
            self._throughputs = {}
        return self._epoch

    def _candidates(
        self, view: ClusterView, prices: PriceBook, with_bound: bool = True
    ) -> tuple[list[_Outcome], PriceSolution | None, int]:
        """Full and/or Partial Reconfiguration of the view, and the LP bound."""
        n_tasks = sum(len(j.tasks) for j in view.jobs)
        distinct = _distinct_demands(view)
        self._valuer = None
        if distinct > self.fluid_min_classes:
            return _fluid_candidates(
                view, prices, self.mode, self.job_slowdown, self.min_throughput, self._throughputs
            )
        if self.pop_threshold is not None and n_tasks > self.pop_threshold and self.pop_parts > 1:
            parts = _pop_split(view, self.pop_parts, self.pop_seed)
            solved = _solve_parts(parts, self.mode, self.packing, self._packer_options())
            outcomes = _combine_outcomes([outcomes for outcomes, _ in solved])
            lp_classes = _merge_lp_classes([c for _, classes in solved for c in classes])
        else:
            packer = Packer(
                view,
                prices,
                self._pricer,
                **self._packer_options(),
                throughputs=self._throughputs,
                fills=self._fills,
            )
            self._valuer = packer  # values instances as a Packer without pricer would
            outcomes = _evaluate(view, packer, prices, self.mode)
            lp_classes = _lp_classes(packer)
            parts = [view]
            if self.packing == "priced" and distinct > self.fluid_also_min_classes:
                fluid, _, _ = _fluid_candidates(
                    view,
                    prices,
                    self.mode,
                    self.job_slowdown,
                    self.min_throughput,
                    self._throughputs,
                )
                outcomes = [
                    f if f.saving_per_hour > o.saving_per_hour + 1e-9 else o
                    for o, f in zip(outcomes, fluid, strict=True)
                ]
        bound = None
        if self._shadow is not None and n_tasks and with_bound:
            bound = self._shadow.solve(view.catalog, lp_classes)
        return outcomes, bound, len(parts)

    def _packer_options(self) -> dict[str, Any]:
        return {
            "pattern_min_tasks": self.pattern_min_tasks,
            "price_interference": self.price_interference,
            "job_slowdown": self.job_slowdown,
            "min_throughput": self.min_throughput,
        }


@dataclass(slots=True)
class _Carried:
    """What an incremental round starts from, all valued in one epoch."""

    epoch: int
    jobs: dict[str, JobSpec]  # last round's active jobs by id
    fresh_tasks: int  # tasks planned at the last fresh round
    changed: int = 0  # tasks arrived or left since
    rounds: int = 0  # incremental rounds since
    # The fresh round's view, prices, candidates, LP and Packer (None: build one), until
    # `EvaPlanner._settle` values them into the four fields below.
    pending: (
        tuple[ClusterView, PriceBook, list[_Outcome], PriceSolution | None, Packer | None] | None
    ) = None
    savings: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)  # per task: its shadow price
    bound: PriceSolution | None = None  # the last fresh round's LP (None: none carried)
    floor_sum: float = 0.0  # Σ of `floors`: a valid lower bound on the active tasks


def _savings(
    valuer: Packer, outcomes: Iterable[_Outcome]
) -> dict[tuple[str, tuple[str, ...]], float]:
    """S of each instance of the candidates (TNRP − cost), by (type, tasks)."""
    return {
        (inst.type.name, inst.tasks): valuer.tnrp_of(inst.tasks) - inst.type.hourly_cost
        for o in outcomes
        for inst in o.configuration
    }


def _touch_room(
    task_of: Mapping[str, TaskSpec],
    instances: Sequence[Instance],
    touched: list[bool],
    where: Mapping[str, list[int]],
) -> None:
    """Mark as touched, for each task to place (on no instance: arrived, or waiting), the
    running instance whose free room it fits best (least room left, in shares of the
    type's capacity), each instance's room shrinking as tasks are dealt to it. A fresh
    Partial Reconfiguration fills such room before it opens an instance; kept out of the
    sub-snapshot, that room would stay empty while the arrivals paid for instances of
    their own (seed 500109 of the steady-round test, 1,500 tasks: 0.69% dearer than a
    fresh plan one step after it). Best fit only, not every instance with room: at
    10,000 tasks most instances have some, and re-planning them all costs what a fresh
    round does."""
    waiting = [t for tid, t in task_of.items() if tid not in where]
    if not waiting:
        return
    found: dict[str, tuple[list[int], list[list[float]], list[tuple[float, float, float]]]] = {}
    for i, inst in enumerate(instances):
        if touched[i]:
            continue
        family = inst.type.family
        cap = inst.type.capacity.as_tuple()
        free = list(cap)
        for tid in inst.tasks:
            task = task_of.get(tid)
            demand = task.demand_on(family) if task is not None else None
            if demand is not None:
                for r, x in enumerate(demand.as_tuple()):
                    free[r] -= x
        members, frees, caps = found.setdefault(family, ([], [], []))
        members.append(i)
        frees.append(free)
        caps.append(cap)
    rooms = {
        family: (
            members,
            np.array(frees, dtype=float),
            np.maximum(np.array(caps, dtype=float), EPSILON),
        )
        for family, (members, frees, caps) in found.items()
    }
    for task in waiting:
        for family, (owners, room, scale) in rooms.items():
            demand = task.demand_on(family)
            if demand is None:
                continue
            d = np.array(demand.as_tuple(), dtype=float)
            fits = np.all(room >= d - EPSILON, axis=1)
            if not fits.any():
                continue
            left = np.where(fits, ((room - d) / scale).sum(axis=1), np.inf)
            pick = int(np.argmin(left))
            room[pick] -= d
            touched[owners[pick]] = True
            break


def _task_floors(
    catalog: Catalog, tasks: Sequence[TaskSpec], bound: PriceSolution
) -> np.ndarray | None:
    """Each task's least price under the LP's shadow prices p over the types it fits,
    min_k Σ_r p_kr D_τk^r. Σ over any task set is a lower bound on its cost (LP
    duality: Σ_r p_kr Q_kr ≤ C_k for every type k). None if a type has no prices."""
    types = catalog.types
    if any(t.name not in bound.shadow_prices for t in types):
        return None
    families = sorted(catalog.families)
    nan = (np.nan, np.nan, np.nan)
    demand = np.array(
        [
            [(d.as_tuple() if (d := t.demand_on(f)) is not None else nan) for f in families]
            for t in tasks
        ],
        dtype=float,
    ).reshape(len(tasks), len(families), 3)
    best = np.full(len(tasks), np.inf)
    for t in types:
        on = demand[:, families.index(t.family), :]
        cap = np.array(t.capacity.as_tuple(), dtype=float)
        fits = np.all(on <= cap + EPSILON, axis=1)
        value = np.nan_to_num(on) @ np.array(bound.shadow_prices[t.name], dtype=float)
        best = np.where(fits, np.minimum(best, value), best)
    if not np.all(np.isfinite(best)):
        return None
    return best


def _memo_key(view: ClusterView) -> tuple[object, ...]:
    """What the candidates depend on: everything but the history, which only moves D̂.

    The learned throughputs enter as an unordered mapping: comparing it with last
    round's is linear in the (bounded) table and sorts nothing.
    """
    return (
        view.catalog,  # the object itself: an id could be reused once it is freed
        view.jobs,  # the specs, not just ids: a job's finished tasks leave its spec
        view.current,
        view.provisional,
        view.throughput.default,
        view.throughput.estimates(),
    )


def planner_by_name(name: str, **options: Any) -> EvaPlanner:
    """A planner by its user-facing name (see `PLANNER_NAMES`)."""
    table: dict[str, tuple[Mode, Packing]] = {
        "eva": ("ensemble", "priced"),
        "eva-plain": ("ensemble", "plain"),
        "eva-full-only": ("full", "priced"),
        "eva-partial-only": ("partial", "priced"),
    }
    if name not in table:
        raise ValueError(f"unknown planner {name!r}; choose from {', '.join(PLANNER_NAMES)}")
    mode, packing = table[name]
    planner = EvaPlanner(mode, packing, **options)
    planner.name = name
    return planner


@dataclass(frozen=True, slots=True)
class _Outcome:
    """A candidate before the criterion: its configuration, S and M."""

    name: Literal["full", "partial"]
    configuration: Configuration
    saving_per_hour: float
    migration: MigrationCost


def _evaluate(view: ClusterView, packer: Packer, prices: PriceBook, mode: Mode) -> list[_Outcome]:
    jobs = {j.job_id: j for j in view.jobs} if view.current.instances else {}

    def outcome(name: Literal["full", "partial"], placement: Placement) -> _Outcome:
        config = Configuration(tuple(placement.instances))
        return _Outcome(
            name,
            config,
            placement.saving,
            migration_cost(view.current, config, jobs, prices, view.delays),
        )

    outcomes: list[_Outcome] = []
    if mode in ("ensemble", "full"):
        outcomes.append(outcome("full", packer.full_placement()))
    if mode in ("ensemble", "partial"):
        if outcomes and not view.current.instances:
            # On an empty cluster Partial re-places everything: it is Full.
            outcomes.append(dataclasses.replace(outcomes[0], name="partial"))
        else:
            outcomes.append(outcome("partial", packer.partial_placement()))
    return outcomes


def _finish(o: _Outcome, d_hat: float) -> Candidate:
    return Candidate(
        o.name,
        o.configuration,
        o.configuration.hourly_cost,
        o.saving_per_hour,
        o.migration,
        o.saving_per_hour * d_hat - o.migration.dollars,
    )


def _choose(candidates: Sequence[Candidate], d_hat: float, mode: Mode) -> tuple[Candidate, str]:
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
    if full.configuration == partial.configuration or abs(full.score - partial.score) <= 1e-9:
        return partial, "partial: full reconfiguration would not do better"
    return partial, (
        f"partial: full would save ${full.saving_per_hour - partial.saving_per_hour:.2f}/h "
        f"more, but over the expected {d_hat:.2f} h that does not repay its extra one-off "
        f"cost of ${full.migration.dollars - partial.migration.dollars:.2f}"
    )


def task_classes(view: ClusterView) -> list[LPClass]:
    """The view's tasks as the LP sees them: classes of equal demands (and anti-affinity
    group), the input of the static bounds (`autoscaler.bounds`)."""
    return _lp_classes(Packer(view))


def _lp_classes(packer: Packer) -> list[LPClass]:
    """The packer's classes, as the LP sees them."""
    return _merge_lp_classes(
        LPClass(
            tuple(
                packer.demand[k][c] if c in packer.candidate_set[k] else None
                for k in range(len(packer.types))
            ),
            len(tasks),
            packer.group[c],
            packer.group_limit[c] or None,
        )
        for c, tasks in enumerate(packer.class_tasks)
    )


def _merge_lp_classes(classes: Iterable[LPClass]) -> list[LPClass]:
    """Merge classes the LP cannot tell apart (equal demands and group)."""
    merged: dict[tuple[tuple[Demand | None, ...], str | None, int | None], int] = {}
    for cls in classes:
        key = (cls.demands, cls.group, cls.group_limit)
        merged[key] = merged.get(key, 0) + cls.count
    return [LPClass(demands, n, group, limit) for (demands, group, limit), n in merged.items()]


# -- many distinct demands: the fluid path ------------------------------------


def _distinct_demands(view: ClusterView) -> int:
    """Distinct demand vectors among the view's tasks, which decide whether the fluid
    path packs; 0 where a job limits its tasks per instance (that path cannot)."""
    distinct: set[Demands] = set()
    for job in view.jobs:
        if job.anti_affinity is not None:
            return 0
        for task in job.tasks:
            distinct.add(task.demands)
    return len(distinct)


def _fluid_candidates(
    view: ClusterView,
    prices: PriceBook,
    mode: Mode,
    job_slowdown: JobSlowdown,
    min_throughput: float,
    throughputs: dict[tuple[str, tuple[str, ...]], float] | None = None,
) -> tuple[list[_Outcome], PriceSolution | None, int]:
    """Full and Partial Reconfiguration by the fluid packer.

    `throughputs`: the table's lookups by (workload, all co-located workloads
    sorted), as `Packer` keeps them, shared with it and filled in here.

    Under interference, instances hold at most 1/(1 − t) tasks for the default
    throughput t — where Algorithm 1 stops too: with equal RPs, one more task
    adds TNRP only below t/(1 − t) tasks (§4.2, line 10) — each instance is
    valued by its TNRP, and one whose TNRP falls short of its cost is dissolved:
    its tasks go alone onto their reservation-price types, which are worth
    their cost by definition.
    """
    catalog = view.catalog
    table = view.throughput
    families = sorted(catalog.families)
    family_of_type = np.array([families.index(t.family) for t in catalog.types])
    tasks = [t for j in view.jobs for t in j.tasks]
    spec = {t.task_id: t for t in tasks}
    job_of = {t.task_id: j for j in view.jobs for t in j.tasks}
    # a job's slowdown charge, priced when first asked for (only under interference):
    # by then `pack` has remembered its tasks' cheapest types, found vectorized
    charges: dict[str, float | None] = {}

    def charge(job: JobSpec) -> float | None:
        if job.job_id not in charges:
            charges[job.job_id] = slowdown_charge(job, prices.job_rp(job), job_slowdown)
        return charges[job.job_id]

    rp: dict[str, float] = {}
    cheapest: dict[str, int] = {}
    jobs = {j.job_id: j for j in view.jobs} if view.current.instances else {}
    cap = None if table.is_neutral else max(1, int(1.0 / (1.0 - table.default + 1e-12)))
    # A fresh LP each round: tasks are dealt by its primal, which a warm start
    # from an earlier round can move to another optimal vertex, and the plan must
    # depend on the snapshot alone. Full and Partial share it, in a fixed order.
    shadow = ShadowPricer()
    tputs = {} if throughputs is None else throughputs

    def value(task_ids: Sequence[str]) -> float:
        """TNRP of tasks sharing one instance (§4.3–4.4)."""
        if table.is_neutral:
            return sum(rp[t] for t in task_ids)
        workloads = [spec[t].workload for t in task_ids]
        together = tuple(sorted(workloads))
        total = 0.0
        for i, t in enumerate(task_ids):
            job = job_of[t]
            w = workloads[i]
            tput = tputs.get((w, together))
            if tput is None:
                # the table sorts the co-located set: the same lookup as `Packer.value`'s
                tput = tputs[w, together] = table.throughput(w, workloads[:i] + workloads[i + 1 :])
            if tput < min_throughput:
                return refused(rp[other] for other in task_ids)
            if prices.valued:
                stake = charge(job)
                at_stake = prices.task_value(spec[t]) if stake is None else prices.job_value(job)
                total += valued_tnrp(rp[t], tput, at_stake)
            else:
                total += tnrp(rp[t], tput, charge(job))
        return total

    def pack(subset: list[TaskSpec]) -> tuple[list[Instance], float, PriceSolution | None]:
        if not subset:
            return [], 0.0, None
        nan = (np.nan, np.nan, np.nan)
        demand = np.array(
            [
                [(d.as_tuple() if (d := t.demand_on(f)) is not None else nan) for f in families]
                for t in subset
            ],
            dtype=float,
        )
        try:
            packing = fluid_pack(
                catalog,
                demand,
                family_of_type,
                pricer=shadow,
                max_items=cap,
                throughput=1.0 if table.is_neutral else table.default,
            )
        except ValueError:
            for task in subset:
                prices.cheapest_type(task)  # raises the InputError naming the task
            raise
        for task, k in zip(subset, packing.cheapest.tolist(), strict=True):
            if task.task_id not in rp:
                prices.remember(task, catalog.types[k])
                rp[task.task_id] = catalog.types[k].hourly_cost
                cheapest[task.task_id] = k
        instances: list[Instance] = []
        saving = 0.0
        for k, members in packing.instances:
            ids = tuple(subset[i].task_id for i in members)
            worth = value(ids)
            if len(ids) > 1 and worth < catalog.types[k].hourly_cost - 1e-6:
                instances += [Instance(None, catalog.types[cheapest[t]], (t,)) for t in ids]
                continue
            instances.append(Instance(None, catalog.types[k], ids))
            saving += worth - catalog.types[k].hourly_cost
        return instances, saving, packing.prices

    outcomes: list[_Outcome] = []
    full_instances, full_saving, bound = pack(tasks)

    def outcome(name: Literal["full", "partial"], instances: list[Instance], s: float) -> _Outcome:
        config = Configuration(tuple(instances))
        cost = migration_cost(view.current, config, jobs, prices, view.delays)
        return _Outcome(name, config, s, cost)

    if mode in ("ensemble", "full"):
        outcomes.append(outcome("full", full_instances, full_saving))
    if mode in ("ensemble", "partial"):
        kept, placed, kept_saving = [], set(), 0.0
        for inst in view.current:
            mine = [t for t in inst.tasks if t in rp]
            worth = value(mine) if mine else 0.0
            # Provisional instances (`ClusterView`) are kept too: this path would
            # move their tasks to new instances, never beside the kept ones.
            if mine and inst.type.name in catalog and worth >= inst.type.hourly_cost - 1e-6:
                kept.append(Instance(inst.instance_id, inst.type, tuple(mine)))
                placed.update(mine)
                kept_saving += worth - inst.type.hourly_cost
        if kept:
            rest, saving, _ = pack([t for t in tasks if t.task_id not in placed])
            outcomes.append(outcome("partial", kept + rest, kept_saving + saving))
        else:
            outcomes.append(outcome("partial", full_instances, full_saving))
    return outcomes, bound, 1


# -- POP ---------------------------------------------------------------------


def _pop_split(view: ClusterView, parts: int, seed: int) -> list[ClusterView]:
    """Deal instances and jobs at random into `parts` self-similar sub-problems.

    A job follows the instance hosting its first placed task, so running tasks
    are not moved just because of the split; unplaced jobs are dealt at random.
    """
    rng = random.Random(seed)
    instance_part = {inst.instance_id: rng.randrange(parts) for inst in view.current}
    where = {t: instance_part[inst.instance_id] for inst in view.current for t in inst.tasks}
    job_parts: list[list[JobSpec]] = [[] for _ in range(parts)]
    for job in view.jobs:
        placed = [where[t.task_id] for t in job.tasks if t.task_id in where]
        job_parts[placed[0] if placed else rng.randrange(parts)].append(job)
    return [
        ClusterView(
            catalog=view.catalog,
            jobs=tuple(job_parts[p]),
            current=Configuration(
                tuple(i for i in view.current if instance_part[i.instance_id] == p)
            ),
            throughput=view.throughput,
            history=view.history,
            now_s=view.now_s,
            provisional=view.provisional,
            delays=view.delays,
        )
        for p in range(parts)
    ]


#: A candidate as a worker sends it back: its name, (type index, instance id, tasks) of
#: each instance, S and M.
_CompactOutcome = tuple[
    Literal["full", "partial"], list[tuple[int, str | None, tuple[str, ...]]], float, MigrationCost
]

_PARTS: list[ClusterView] = []  # inherited by forked workers, so views are not pickled


def _solve_part(
    args: tuple[int, Mode, Packing, dict[str, Any]],
) -> tuple[list[_CompactOutcome], list[LPClass]]:
    """Plan one part in a worker; results travel back as plain tuples (cheap to pickle)."""
    index, mode, packing, options = args
    view = _PARTS[index]
    prices = PriceBook(view.catalog)
    pricer = PatternPricer() if packing == "priced" else None
    packer = Packer(view, prices, pricer, **options)
    type_index = {t.name: k for k, t in enumerate(view.catalog.types)}
    compact = [
        (
            o.name,
            [(type_index[i.type.name], i.instance_id, i.tasks) for i in o.configuration],
            o.saving_per_hour,
            o.migration,
        )
        for o in _evaluate(view, packer, prices, mode)
    ]
    return compact, _lp_classes(packer)


def _solve_parts(
    parts: list[ClusterView],
    mode: Mode,
    packing: Packing,
    options: dict[str, Any],
) -> list[tuple[list[_Outcome], list[LPClass]]]:
    """Each part planned in its own process; `options` go to its `Packer`."""
    global _PARTS
    _PARTS = parts
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=len(parts), mp_context=context) as pool:
            args = [(i, mode, packing, options) for i in range(len(parts))]
            results = list(pool.map(_solve_part, args))
    finally:
        _PARTS = []
    types = parts[0].catalog.types

    def outcome(
        name: Literal["full", "partial"],
        rows: list[tuple[int, str | None, tuple[str, ...]]],
        saving: float,
        migration: MigrationCost,
    ) -> _Outcome:
        instances = tuple(Instance(iid, types[k], tasks) for k, iid, tasks in rows)
        return _Outcome(name, Configuration(instances), saving, migration)

    return [([outcome(*row) for row in compact], classes) for compact, classes in results]


def _combine_outcomes(outcomes: list[list[_Outcome]]) -> list[_Outcome]:
    """Concatenate the parts' candidates of each kind and sum their S and M."""
    combined = []
    for i, first in enumerate(outcomes[0]):
        same = [part[i] for part in outcomes]
        config = Configuration(tuple(inst for o in same for inst in o.configuration))
        migration = MigrationCost(
            sum(o.migration.migration_dollars for o in same),
            sum(o.migration.launch_dollars for o in same),
            sum(o.migration.moved_jobs for o in same),
            sum(o.migration.moved_tasks for o in same),
            sum(o.migration.launched_instances for o in same),
        )
        combined.append(
            _Outcome(first.name, config, sum(o.saving_per_hour for o in same), migration)
        )
    return combined
