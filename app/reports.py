"""What users read about a running cluster: status, jobs, one job, and costs.

Every report is a JSON-ready document computed from the `Store` alone (and an
offline catalog for prices): it works whether the daemon runs or not, and
makes no cloud call. The command line prints the same documents as tables,
or writes them with `--json`; the submission API returns them as they are.

**Who pays for a shared instance** is `autoscaler.spend`'s rule (dominant share of
each second of uptime; seconds with no task are idle): the same split the daily
budgets and `max_cost` read. Job costs plus idle equal the ledger's total.

**What no packing would have cost** is each task's reservation price (its
cheapest instance type alone, Eva §4.2) for as long as it occupied an
instance — the bill of one instance per task, start-up delays aside — on the
planner's footing (`NoPacking`): among the offerings its job may use (its
`capacity`, on-demand once pinned there) with spot at its effective price, the
problem the LP bound relaxes, so the baseline is never below the bound.

**Spot** (`spot_summary`): an instance's market is its offering's (the catalog
name it was bought as, `TYPE:spot[@ZONE]`); the spot share is spot instance-hours
over all instance-hours; savings against on-demand are each spot hour at the
on-demand price of its EC2 type recorded with its request (the catalog's then; the
catalog's now for an instance requested before that price was kept) minus the price
recorded with its request (what it was bought at), so a later price change leaves
past savings as they were; an interruption is a reclaim notice from the
interruption history; **work lost** is the task-time from a reclaim notice until
the task left the instance — the stretch its attempt spent being checkpointed
and stopped instead of working (what the job did since its last checkpoint is
saved by the checkpoint its worker takes on the notice, if the job answers it).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoscaler.catalog import ON_DEMAND, SPOT, Catalog
from autoscaler.cloud import offering_parts
from autoscaler.decide import (
    ControlOptions,
    Planner,
    capacity_view,
    decide,
    job_capacities,
    pinned_by_reclaims,
)
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.pricing import PriceBook
from autoscaler.spend import attribute, dominant_share
from autoscaler.spot import on_demand_price, restrict_job
from autoscaler.store import (
    BILLED_STATUSES,
    FINAL_JOB_STATUSES,
    JobRecord,
    Placement,
    StateSnapshot,
    Store,
    TaskRecord,
    UptimeInterval,
)


def hourly_cost_now(store: Store) -> float:
    """$/h of every instance billed now, at the prices recorded with their requests."""
    return sum(i.hourly_price for i in store.instances() if i.status in BILLED_STATUSES)


# -- spot -------------------------------------------------------------------------------------


def market_of(offering: str) -> str:
    """The market an offering name says (on-demand for a name that is not an offering's)."""
    try:
        return offering_parts(offering)[1]
    except ValueError:
        return "on-demand"


def ec2_type_of(offering: str) -> str:
    """The EC2 type an offering name says (the name itself for one that is not an
    offering's)."""
    try:
        return offering_parts(offering)[0]
    except ValueError:
        return offering


def _hours(start: float, end: float | None, t0: float, t1: float) -> float:
    return max(0.0, min(t1, end if end is not None else t1) - max(t0, start)) / 3600.0


def reclaims_of(store: Store, since: float | None = None) -> dict[str, float]:
    """Instance -> when its provider's reclaim notice came."""
    return {r.instance_id: r.at for r in store.interruptions(since) if r.kind == "reclaim"}


def was_interrupted(placement: Placement, reclaimed: Mapping[str, float]) -> bool:
    """Whether the task was on its instance when the provider's reclaim notice came."""
    at = reclaimed.get(placement.instance_id)
    return (
        at is not None and placement.start <= at and (placement.end is None or placement.end >= at)
    )


def interrupted_s(placement: Placement, reclaimed: Mapping[str, float], now: float) -> float:
    """Seconds of `placement` from its instance's reclaim notice until the task left
    (0: it was not there when the notice came)."""
    if not was_interrupted(placement, reclaimed):
        return 0.0
    end = placement.end if placement.end is not None else now
    return max(0.0, min(now, end) - reclaimed[placement.instance_id])


def spot_summary(store: Store, catalog: Catalog, since: float, now: float) -> dict[str, Any]:
    """Spot share, spend and savings against on-demand, interruptions and work lost, within
    [since, now] (see the module's docstring for each definition)."""
    hours = spot_hours = spot_spend = savings = 0.0
    unpriced: set[str] = set()
    priced_now: set[str] = set()
    at_launch: dict[str, float | None] | None = None
    for interval in store.uptime(since):
        h = _hours(interval.start, interval.end, since, now)
        hours += h
        if market_of(interval.instance_type) != SPOT:
            continue
        spot_hours += h
        spot_spend += interval.cost(since, now)
        if at_launch is None:
            at_launch = {
                i.instance_id: i.on_demand_price for i in store.instances(include_finished=True)
            }
        on_demand = at_launch.get(interval.instance_id)
        ec2_type = offering_parts(interval.instance_type)[0]
        if on_demand is None:  # requested before launch prices were kept: today's
            on_demand = on_demand_price(catalog, ec2_type)
            if on_demand is not None and h > 0:
                priced_now.add(interval.instance_id)
        if on_demand is None:
            unpriced.add(ec2_type)  # no on-demand price to compare with
            continue
        savings += (on_demand - interval.hourly_price) * h
    history = store.interruptions(since)
    reclaims = [r for r in history if r.kind == "reclaim"]
    by_offering: dict[str, int] = defaultdict(int)
    for r in reclaims:
        by_offering[r.offering] += 1
    reclaimed = reclaims_of(store)
    lost = sum(interrupted_s(p, reclaimed, now) for p in store.placements(since))
    return {
        "spot_share": round(spot_hours / hours, 6) if hours else 0.0,
        "spot_instance_hours": round(spot_hours, 6),
        "spot_spend": round(spot_spend, 6),
        "savings_vs_on_demand": round(savings, 6),
        "savings_unpriced_types": sorted(unpriced),  # no on-demand price in the catalog
        # Spot instances with no on-demand price kept from their launch: compared with
        # the catalog's price now.
        "savings_at_current_price": sorted(priced_now),
        "interruptions": len(reclaims),
        "interruptions_by_offering": dict(sorted(by_offering.items())),
        "rebalance_recommendations": len(history) - len(reclaims),
        "work_lost_task_hours": round(lost / 3600.0, 6),
    }


def cost_report(
    store: Store,
    catalog: Catalog,
    now: float,
    *,
    since: float = 0.0,
    planner: Planner | None = None,
    options: ControlOptions | None = None,
    hypothetical: Sequence[JobSpec] = (),
) -> dict[str, Any]:
    """Spend so far (per type, per job, idle), $/h now, what no packing would cost,
    the LP lower bound now, and — with `hypothetical` jobs — what adding them would do."""
    uptime = store.uptime(since)
    placements = store.placements(since)
    records = {j.job_id: j for j in store.jobs()}
    specs = {job_id: r.spec for job_id, r in records.items()}
    total = sum(i.cost(since, now) for i in uptime)
    per_type: dict[str, float] = defaultdict(float)
    for interval in uptime:
        per_type[interval.instance_type] += interval.cost(since, now)
    per_job, idle = attribute(uptime, placements, dominant_share(specs, catalog), since, now)
    snapshot = store.snapshot()
    active = [j.spec for j in snapshot.jobs]
    baseline = NoPacking(store, snapshot, catalog, options, now, specs, placements)
    no_packing_so_far = sum(
        baseline.placement_rp(p) * max(0.0, min(now, p.end or now) - max(since, p.start)) / 3600.0
        for p in placements
    )
    now_hourly = hourly_cost_now(store)
    no_packing_now = baseline.hourly_now()
    document: dict[str, Any] = {
        "since": since,
        "until": now,
        "spend": round(total, 6),
        "spend_by_type": {k: round(v, 6) for k, v in sorted(per_type.items()) if v > 0},
        "spend_by_job": {k: round(v, 6) for k, v in sorted(per_job.items())},
        "spend_by_user": _rounded(spend_by(per_job, records, "user")),
        "spend_by_team": _rounded(spend_by(per_job, records, "team")),
        "idle": round(idle, 6),
        "attribution": "each second of an instance's uptime split among the tasks on it by "
        "dominant resource share; seconds with no task are idle",
        "hourly_cost_now": round(now_hourly, 6),
        "no_packing_hourly_cost_now": round(no_packing_now, 6),
        "no_packing_spend": round(no_packing_so_far, 6),
        # Saved = what no packing would have cost − what was actually spent, idle spend
        # included: idle seconds are a cost of packing (booting, draining, waiting).
        "savings": round(no_packing_so_far - total, 6),
        "savings_parts": {
            "no_packing_spend": round(no_packing_so_far, 6),
            "spend_on_tasks": round(total - idle, 6),
            "idle": round(idle, 6),
        },
        "savings_hourly_now": round(no_packing_now - now_hourly, 6),
        "lower_bound_hourly_cost_now": None,
        "spot": spot_summary(store, catalog, since, now),
        "jobs": {
            k: {"name": records[k].spec.name, "status": records[k].status}
            for k in sorted(per_job)
            if k in records
        },
    }
    if planner is not None and active:
        view_decision = _plan(snapshot, catalog, planner, options, now, ())
        if view_decision.plan is not None:
            document["lower_bound_hourly_cost_now"] = view_decision.plan.lower_bound_hourly_cost
    if hypothetical:
        if planner is None:
            raise ValueError("a dry run needs a planner")
        document["dry_run"] = dry_run(snapshot, catalog, planner, options, now, hypothetical)
        document["dry_run"]["hourly_cost_before"] = round(now_hourly, 6)
    return document


class NoPacking:
    """What no packing would pay (each task alone on its cheapest offering, Eva §4.2),
    on the planner's footing: the catalog it plans on (spot at its effective price) and
    each job's offerings as the round decides them (`decide.capacity_view`: its
    `capacity`, or on-demand once pinned there). The LP bound relaxes the same problem,
    so the baseline is never below it.

    Now, each active job is priced under its capacity this round. In the past, a
    placement on an on-demand instance of a job pinned to on-demand (now, or for good
    by its reclaims, `decide.pinned_by_reclaims`, judged at its finish) is priced
    on-demand — it is taken to have run pinned — and any other under the job's own
    capacity (the ledger does not keep when a job was pinned).
    """

    def __init__(
        self,
        store: Store,
        snapshot: StateSnapshot,
        catalog: Catalog,
        options: ControlOptions | None,
        now: float,
        specs: Mapping[str, JobSpec] | None = None,
        placements: Sequence[Placement] = (),
    ) -> None:
        """`specs`: every job's spec by id, if already read from `store`; `placements`:
        those the past baseline will price (`placement_rp`)."""
        self._specs = dict(specs) if specs is not None else {j.job_id: j.spec for j in store.jobs()}
        self._active = {j.job_id: j.spec for j in snapshot.jobs}
        policy = None if options is None else options.spot
        self._policy = policy
        self._restricted: dict[tuple[str, str], dict[str, TaskSpec]] = {}
        self._rp: dict[tuple[str, str, str], float] = {}
        self._markets: dict[str, str] | None = None
        self._store = store
        if policy is None:
            self._prices = PriceBook(catalog)
            self._families: frozenset[str] = frozenset()
            self._now: dict[str, str] = {}
            self._pinned: set[str] = set()
            return
        progress = {
            j.job_id: max((snapshot.tasks[t.task_id].progress for t in j.spec.tasks), default=0.0)
            for j in snapshot.jobs
        }
        jobs = tuple(self._active.values())
        planning, restricted = capacity_view(policy, snapshot, catalog, jobs, progress, now)
        self._prices = PriceBook(planning)
        self._families = planning.families
        self._now = {}
        if restricted is not jobs:
            capacity = job_capacities(policy, snapshot, jobs, progress, now, catalog)
            self._now = dict(capacity)
            for job in restricted:
                self._restricted[(job.job_id, capacity[job.job_id])] = {
                    t.task_id: t for t in job.tasks
                }
        self._pinned = {
            job_id for job_id, c in self._now.items() if c != self._active[job_id].capacity
        }
        # Finished jobs that may have run pinned: those with a placement in the window on
        # an on-demand instance, whose own capacity allowed spot, when spot is offered.
        finished = sorted(
            {
                p.job_id
                for p in placements
                if p.job_id not in self._active
                and p.job_id in self._specs
                and self._specs[p.job_id].capacity != "on-demand"
                and self._market(p.instance_id) == ON_DEMAND
            }
            if any(t.is_spot for t in catalog)
            else ()
        )
        if finished:
            for job_id, tasks in store.tasks_of_jobs(finished).items():
                spec = self._specs[job_id]
                record = store.job(job_id)
                started = None if record is None else record.started_at or record.submitted_at
                ended = now if record is None or record.finished_at is None else record.finished_at
                if pinned_by_reclaims(policy, spec, tasks, started, ended, catalog):
                    self._pinned.add(job_id)

    def _task_rp(self, job_id: str, task_id: str, capacity: str) -> float:
        key = (job_id, task_id, capacity)
        hit = self._rp.get(key)
        if hit is not None:
            return hit
        spec = self._specs.get(job_id)
        task: TaskSpec | None = None
        if spec is not None:
            tasks = self._restricted.get((job_id, capacity))
            if tasks is None:
                job = spec if self._policy is None else restrict_job(spec, capacity, self._families)
                tasks = self._restricted[(job_id, capacity)] = {t.task_id: t for t in job.tasks}
            task = tasks.get(task_id)
        rp = 0.0 if task is None else _rp(self._prices, task)
        self._rp[key] = rp
        return rp

    def hourly_now(self) -> float:
        """$/h of every active task alone on its cheapest offering under its capacity now."""
        return sum(
            self._task_rp(job_id, t.task_id, self._now.get(job_id, spec.capacity))
            for job_id, spec in self._active.items()
            for t in spec.tasks
        )

    def placement_rp(self, placement: Placement) -> float:
        """$/h no packing would have paid for the task of `placement` while it ran."""
        spec = self._specs.get(placement.job_id)
        if spec is None:
            return 0.0
        capacity = spec.capacity
        if placement.job_id in self._pinned and self._market(placement.instance_id) == ON_DEMAND:
            capacity = "on-demand"
        return self._task_rp(placement.job_id, placement.task_id, capacity)

    def _market(self, instance_id: str) -> str:
        if self._markets is None:
            self._markets = {
                i.instance_id: market_of(i.instance_type)
                for i in self._store.instances(include_finished=True)
            }
        return self._markets.get(instance_id, ON_DEMAND)


#: The team column of a job whose owner had no team when it was submitted.
NO_TEAM_LABEL = "(no team)"


def spend_of_jobs(
    store: Store, catalog: Catalog, records: Mapping[str, JobRecord], since: float, now: float
) -> tuple[dict[str, float], float]:
    """({job: $ attributed}, idle $) within [since, now]: `cost_report`'s split."""
    specs = {job_id: r.spec for job_id, r in records.items()}
    return attribute(
        store.uptime(since), store.placements(since), dominant_share(specs, catalog), since, now
    )


def spend_by(
    per_job: Mapping[str, float], records: Mapping[str, JobRecord], key: str
) -> dict[str, float]:
    """Each job's attributed spend summed by its owner (`key` "user") or by the team it
    was submitted under ("team"): the same total as by job, grouped otherwise."""
    grouped: dict[str, float] = defaultdict(float)
    for job_id, spent in per_job.items():
        record = records.get(job_id)
        if record is None:
            name = "?"
        elif key == "user":
            name = record.owner
        else:
            name = record.team or NO_TEAM_LABEL
        grouped[name] += spent
    return dict(grouped)


def _rounded(spend: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(spend.items())}


def _rp(prices: PriceBook, task: Any) -> float:
    try:
        return prices.task_rp(task)
    except (KeyError, ValueError):
        return 0.0  # fits no type of today's catalog


def dry_run(
    snapshot: StateSnapshot,
    catalog: Catalog,
    planner: Planner,
    options: ControlOptions | None,
    now: float,
    jobs: Sequence[JobSpec],
) -> dict[str, Any]:
    """The next round's decision if `jobs` were submitted now — nothing recorded or done."""
    decision = _plan(snapshot, catalog, planner, options, now, jobs)
    launches: dict[str, int] = defaultdict(int)
    for launch in decision.launches:
        launches[launch.instance_type] += 1
    plan = decision.plan
    return {
        "jobs": [j.job_id for j in jobs],
        "tasks": sum(len(j.tasks) for j in jobs),
        "chosen": decision.chosen,
        "reason": decision.reason,
        "launch": dict(sorted(launches.items())),
        "launch_hourly_cost": round(sum(lc.hourly_price for lc in decision.launches), 6),
        "drain": [d.instance_id for d in decision.drains],
        "keep": [k.instance_id for k in decision.keeps],
        "moves": sum(1 for m in decision.moves if m.kind == "migrate"),
        "refused": [f"{r.instance_type}: {r.message}" for r in decision.refused],
        "infeasible": dict(decision.infeasible),
        "hourly_cost_after": None if plan is None else round(plan.hourly_cost, 6),
        "no_packing_hourly_cost_after": None
        if plan is None
        else round(plan.no_packing_hourly_cost, 6),
        "lower_bound_hourly_cost_after": None if plan is None else plan.lower_bound_hourly_cost,
    }


def quote(
    snapshot: StateSnapshot,
    catalog: Catalog,
    planner: Planner,
    options: ControlOptions | None,
    now: float,
    job: JobSpec,
    *,
    duration_s: float | None = None,
    iterations: float | None = None,
    throughput: float | None = None,
) -> dict[str, Any]:
    """What `job` would cost if submitted now, nothing submitted (`submit --quote`).

    - **at the current packing**: the next round's plan with the job added (the
      planner on the current state, as `dry_run`), each of its instances' price split
      among the tasks on it by dominant share (`autoscaler.spend`, the rule reports
      charge by): the job's part of the instances its tasks are placed on;
    - **without packing**: each task's reservation price, its cheapest type alone
      (Eva §4.2), on the planner's footing as `NoPacking` prices it: among the offerings
      the job's `capacity` allows this round (`decide.capacity_view`, which reads
      `job_capacities`), spot at its effective price — so a spot job is quoted at spot,
      an on-demand one never is;
    - **its share of the LP bound**: the plan's LP lower bound (the relaxation, Eva §4.2)
      split among the planned jobs in proportion to their reservation prices (on that
      same footing);
    - **total**: $/h × the duration, given or iterations ÷ iterations per second alone
      (`throughput`, else the spec's `full_throughput`) — co-location slowdowns aside.
    """
    decision = _plan(snapshot, catalog, planner, options, now, [job])
    specs = {j.job_id: j.spec for j in snapshot.jobs} | {job.job_id: job}
    prices, viewed, capacity = _planning_view(
        _with_jobs(snapshot, [job], now), catalog, options, now, specs
    )
    no_packing = sum(_rp(prices, t) for t in viewed[job.job_id].tasks)
    plan = decision.plan
    mine = {t.task_id for t in job.tasks}
    packed: float | None = None
    bound_share: float | None = None
    instances: list[dict[str, Any]] = []
    if plan is not None:
        weight = dominant_share(specs, catalog)
        placed = 0
        packed = 0.0
        for inst in plan.configuration:
            here = [t for t in inst.tasks if t in mine]
            if not here:
                continue
            weights = {
                t: weight(Placement(t, t.split("/", 1)[0], "", 0, 0.0), inst.type.name)
                for t in inst.tasks
            }
            part = sum(weights[t] for t in here) / sum(weights.values())
            packed += inst.type.hourly_cost * part
            placed += len(here)
            instances.append(
                {
                    "instance": inst.instance_id or "(new)",
                    "type": inst.type.name,
                    "hourly_price": inst.type.hourly_cost,
                    "tasks": len(inst.tasks),
                    "of_this_job": len(here),
                    "job_part": round(part, 6),
                }
            )
        if placed < len(job.tasks):
            packed = None  # not (all) placed: it would wait
        bound = plan.lower_bound_hourly_cost
        tasks = _tasks(viewed)
        planned_rp = sum(
            _rp(prices, tasks[t]) for inst in plan.configuration for t in inst.tasks if t in tasks
        )
        if bound is not None and planned_rp > 0 and packed is not None:
            bound_share = bound * no_packing / planned_rp
    speed = throughput or job.full_throughput
    hours = None
    if duration_s:
        hours = duration_s / 3600.0
    elif iterations and speed:
        hours = iterations / speed / 3600.0
    waiting = dict(decision.numbers.get("fair_share", {}).get("waiting", {}))
    return {
        "job": job.job_id,
        "tasks": len(job.tasks),
        "capacity": capacity.get(job.job_id, job.capacity),
        "hourly_cost_packed": None if packed is None else round(packed, 6),
        "hourly_cost_no_packing": round(no_packing, 6),
        "hourly_lower_bound_share": None if bound_share is None else round(bound_share, 6),
        "lower_bound_hourly_cost": None if plan is None else plan.lower_bound_hourly_cost,
        "hours": hours,
        "total_packed": None if hours is None or packed is None else round(packed * hours, 6),
        "total_no_packing": None if hours is None else round(no_packing * hours, 6),
        "total_lower_bound_share": None
        if hours is None or bound_share is None
        else round(bound_share * hours, 6),
        "instances": instances,
        "launch": sorted(lc.instance_type for lc in decision.launches if set(lc.tasks) & mine),
        "waiting": waiting.get(job.job_id),
        "infeasible": {t: why for t, why in decision.infeasible.items() if t in mine},
        "cluster_hourly_cost_after": None if plan is None else round(plan.hourly_cost, 6),
    }


def _tasks(specs: Mapping[str, JobSpec]) -> dict[str, Any]:
    return {t.task_id: t for spec in specs.values() for t in spec.tasks}


def _with_jobs(snapshot: StateSnapshot, extra: Sequence[JobSpec], now: float) -> StateSnapshot:
    """The snapshot with `extra` jobs added as if just submitted (queued, nothing run)."""
    if not extra:
        return snapshot
    taken = {j.job_id for j in snapshot.jobs}
    clash = [j.job_id for j in extra if j.job_id in taken]
    if clash:
        raise ValueError(f"job {clash[0]!r} is already in the cluster")
    jobs = snapshot.jobs + tuple(JobRecord(j, "queued", "dry-run", now) for j in extra)
    tasks = dict(snapshot.tasks)
    for job in extra:
        for t in job.tasks:
            tasks[t.task_id] = TaskRecord(t.task_id, job.job_id, updated_at=now)
    return replace(snapshot, jobs=jobs, tasks=tasks, job_events=snapshot.job_events + 1)


def _plan(
    snapshot: StateSnapshot,
    catalog: Catalog,
    planner: Planner,
    options: ControlOptions | None,
    now: float,
    extra: Sequence[JobSpec],
):
    """decide() on the snapshot, with `extra` jobs added as if just submitted."""
    snapshot = _with_jobs(snapshot, extra, now)
    return decide(snapshot, catalog, (), options or ControlOptions(), planner=planner, now=now)


def _planning_view(
    snapshot: StateSnapshot,
    catalog: Catalog,
    options: ControlOptions | None,
    now: float,
    specs: Mapping[str, JobSpec],
) -> tuple[PriceBook, dict[str, JobSpec], dict[str, str]]:
    """(prices, each job as the planner sees it, the capacity each is planned under) on the
    round's footing (`decide.capacity_view`, `job_capacities`): the catalog at effective
    spot prices and each job restricted to the offerings its capacity allows this round;
    the catalog and the jobs as they are with spot off."""
    policy = None if options is None else options.spot
    if policy is None:
        return PriceBook(catalog), dict(specs), {}
    jobs = tuple(specs.values())
    progress = {
        j.job_id: max(
            (snapshot.tasks[t.task_id].progress for t in j.tasks if t.task_id in snapshot.tasks),
            default=0.0,
        )
        for j in jobs
    }
    planning, restricted = capacity_view(policy, snapshot, catalog, jobs, progress, now)
    capacity = job_capacities(policy, snapshot, jobs, progress, now, catalog)
    return PriceBook(planning), {j.job_id: j for j in restricted}, capacity


# -- status and jobs -------------------------------------------------------------------------------


def cluster_status(store: Store, now: float) -> dict[str, Any]:
    """Instances, $/h, tasks by status, and the last round's choice and why."""
    snapshot = store.snapshot(with_throughput=False)
    on: dict[str, list[str]] = defaultdict(list)
    for task in snapshot.tasks.values():
        if task.instance_id is not None and task.status in ("starting", "running", "checkpointing"):
            on[task.instance_id].append(task.task_id)
    instances = [
        {
            "instance": i.instance_id,
            "type": i.instance_type,
            "status": i.status,
            "zone": i.zone,
            "hourly_price": i.hourly_price,
            "market": market_of(i.instance_type),
            "reclaimed_at": i.reclaimed_at,
            "worker": "lost" if i.lost_at else ("ready" if i.ready_at else "not registered"),
            "uptime_s": round(now - i.requested_at, 3),
            "tasks": sorted(on.get(i.instance_id, ())),
            "reason": i.reason,
        }
        for i in snapshot.instances
    ]
    by_status: dict[str, int] = defaultdict(int)
    for task in snapshot.tasks.values():
        by_status[task.status] += 1
    jobs: dict[str, int] = defaultdict(int)
    for job in store.jobs():
        jobs[job.status] += 1
    rounds = store.rounds(limit=1)
    last = None
    if rounds:
        r = rounds[-1]
        last = {
            "at": r.at,
            "planner": r.planner,
            "chosen": r.chosen,
            "reason": r.reason,
            "hourly_cost": r.numbers.get("hourly_cost"),
            "lower_bound_hourly_cost": r.numbers.get("lower_bound_hourly_cost"),
            "infeasible": r.numbers.get("infeasible", {}),
            # Types held back after boots that never registered, with the cause.
            "held": r.numbers.get("held", {}),
            "actions": [
                {"kind": a.kind, "target": a.target, "outcome": a.outcome, "reason": a.reason}
                for a in r.actions
                if a.kind in ("launch", "terminate", "report", "adopt")  # instances
            ],
        }
    billed = [i for i in snapshot.instances if i.status in BILLED_STATUSES]
    spot_hourly = sum(i.hourly_price for i in billed if market_of(i.instance_type) == SPOT)
    day = store.interruptions(now - 86400.0)
    spot = {
        "instances": sum(1 for i in billed if market_of(i.instance_type) == SPOT),
        "hourly_cost": round(spot_hourly, 6),
        "reclaimed_now": sorted(i.instance_id for i in snapshot.instances if i.reclaimed_at),
        "interruptions_last_day": sum(1 for r in day if r.kind == "reclaim"),
    }
    return {
        "at": now,
        "hourly_cost": round(hourly_cost_now(store), 6),
        "spot": spot,
        "instances": instances,
        "tasks": dict(sorted(by_status.items())),
        "jobs": dict(sorted(jobs.items())),
        "last_round": last,
    }


def job_list(
    store: Store,
    statuses: Iterable[str] | None = None,
    limit: int = 0,
    *,
    records: Sequence[JobRecord] | None = None,
) -> dict[str, Any]:
    """Every job (of `statuses`), oldest first; `records`: the store's jobs, if already read."""
    wanted = set(statuses or ())
    if records is None:
        records = store.jobs(sorted(wanted) if wanted else None)
    elif wanted:
        records = [r for r in records if r.status in wanted]
    if limit:
        records = records[-limit:]
    tasks = store.tasks_of_jobs(r.job_id for r in records)  # one query, not one a job
    return {"jobs": [_job_summary(r, tasks[r.job_id]) for r in records]}


def _job_summary(record: JobRecord, tasks: Sequence[TaskRecord]) -> dict[str, Any]:
    return {
        "job": record.job_id,
        "name": record.spec.name,
        "owner": record.owner,
        "status": record.status,
        "tasks": len(tasks),
        "running": sum(1 for t in tasks if t.status == "running"),
        "progress": max((t.progress for t in tasks), default=0.0),
        "attempts": sum(t.attempt for t in tasks),  # starts of all its tasks
        "moves": sum(t.moves for t in tasks),  # attempts the plan moved elsewhere
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "reason": record.reason,
    }


def job_detail(store: Store, job_id: str, catalog: Catalog, now: float) -> dict[str, Any] | None:
    """One job: its tasks, where each runs, progress, throughput, moves, cost so far."""
    record = store.job(job_id)
    if record is None:
        return None
    placements = [p for p in store.placements() if p.job_id == job_id]
    instances = {p.instance_id for p in placements}
    uptime = [i for i in store.uptime() if i.instance_id in instances]
    everyone = [p for p in store.placements() if p.instance_id in instances]
    specs = {j.job_id: j.spec for j in store.jobs()}
    per_job, _ = attribute(uptime, everyone, dominant_share(specs, catalog), 0.0, now)
    moves: dict[str, list[dict[str, Any]]] = defaultdict(list)
    reclaimed = reclaims_of(store)
    markets = {i.instance_id: market_of(i.instance_type) for i in uptime}
    lost: dict[str, float] = defaultdict(float)
    interruptions: dict[str, int] = defaultdict(int)
    on_spot = occupied = 0.0
    for p in placements:
        moves[p.task_id].append(
            {"instance": p.instance_id, "attempt": p.attempt, "start": p.start, "end": p.end}
        )
        seconds = max(0.0, min(now, p.end if p.end is not None else now) - p.start)
        occupied += seconds
        if markets.get(p.instance_id) == SPOT:
            on_spot += seconds
        if was_interrupted(p, reclaimed):
            interruptions[p.task_id] += 1
            lost[p.task_id] += interrupted_s(p, reclaimed, now)
    tasks = []
    for task in store.tasks_of(job_id):
        history = moves.get(task.task_id, [])
        tasks.append(
            {
                "task": task.task_id,
                "status": task.status,
                "instance": task.instance_id,
                "target": task.target_instance_id,
                "attempt": task.attempt,
                "failures": task.failures,  # those counted toward max_attempts
                "moves": task.moves,  # attempts the plan moved elsewhere
                "retries": task.retries,  # attempts that failed and were started again
                "failure": task.failure,  # class of the latest failure
                "retry_at": task.retry_at,  # a transient failure's back-off ends
                "progress": task.progress,
                "throughput": task.throughput,
                "checkpoint": task.checkpoint,
                "reason": task.reason,
                "migrations": max(0, len(history) - 1),  # instance changes, whatever the cause
                "interruptions": interruptions.get(task.task_id, 0),  # reclaims it was on
                "work_lost_s": round(lost.get(task.task_id, 0.0), 3),
                "placements": history,
            }
        )
    return {
        **_job_summary(record, store.tasks_of(job_id)),
        "full_throughput": record.spec.full_throughput or record.solo_throughput,
        "cost": round(per_job.get(job_id, 0.0), 6),
        "max_cost": record.spec.max_cost,
        "capacity": record.spec.capacity,  # the markets it asked for (auto, spot, on-demand)
        "team": record.team,
        "waiting": waiting_reason(store, record),
        # Of the time its tasks occupied instances, the share on spot ones.
        "spot_share": round(on_spot / occupied, 6) if occupied else 0.0,
        "interruptions": sum(interruptions.values()),
        "work_lost_s": round(sum(lost.values()), 3),
        "task_list": tasks,
    }


def waiting_reason(store: Store, record: JobRecord) -> str | None:
    """Why the latest round left an unfinished job unplanned, as it recorded it: its
    team's fair share or daily budget (`fair_share`), or its `max_cost` (None: it was
    not held back)."""
    if record.status in FINAL_JOB_STATUSES:
        return None
    latest = store.rounds(1)
    if not latest:
        return None
    numbers = latest[-1].numbers
    capped = numbers.get("max_cost", {}).get(record.job_id)
    if capped:
        return f"{capped['state']}: {capped['reason'].removeprefix('stopped: ')}"
    waiting: str | None = numbers.get("fair_share", {}).get("waiting", {}).get(record.job_id)
    return waiting


def timeline(
    uptime: Sequence[UptimeInterval], since: float, until: float
) -> list[tuple[float, float, float]]:
    """(time, $/h, cumulative $) at every change of the ledger, for plots."""
    events: list[tuple[float, float]] = []
    for i in uptime:
        start, end = max(i.start, since), min(i.end if i.end is not None else until, until)
        if end > start:
            events.append((start, i.hourly_price))
            if end < until:  # still billing at `until`: its rate shows there
                events.append((end, -i.hourly_price))
    events.sort()
    points: list[tuple[float, float, float]] = []
    rate = spent = 0.0
    last = since
    times = sorted({t for t, _ in events} | {since, until})
    for t in times:
        spent += rate * (t - last) / 3600.0
        lo = bisect.bisect_left(events, (t, float("-inf")))
        hi = bisect.bisect_right(events, (t, float("inf")))
        rate += sum(delta for _, delta in events[lo:hi])
        points.append((t, max(rate, 0.0), spent))
        last = t
    return points
