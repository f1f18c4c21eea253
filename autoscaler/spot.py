"""Spot capacity priced into the reservation price (Eva §4.2–4.5 with interruptions).

A spot offering is another catalog entry (`InstanceType.market == "spot"`), cheaper
than on-demand and reclaimed by the provider at `interruption_per_hour`. A reclaim
costs the work done since the task's last checkpoint — half the checkpoint interval
in expectation — plus the restart (a new instance's start-up, the job's init). That
loss is the job's time, priced at its on-demand value V(τ) as a slowdown is
(`pricing.valued_tnrp`), so a task's value on a spot offering is

    TNRP(τ) − λ · (C/2 + R) · V(τ)            (`spot_task_value`)

with λ the offering's interruption rate per hour, C the checkpoint interval and R the
restart delay (hours). Summed over the tasks filling an instance, the expected loss
per hour is λ·L·V with V the on-demand price of the capacity they fill, so the planner
is handed the **effective price** `p + λ·L·V` (`effective_price`), and
everything that compares costs — Algorithm 1's cost-efficiency test, Full/Partial
(§4.5), the migration criterion, the fluid LP and the clairvoyant bound — compares
on-demand and spot on that one footing, with no other change. An offering with
λ·L ≥ 1 is expected to lose more work than it does and is left out.

Per job, `capacity` restricts offerings ("on-demand", "spot", "auto"); a `deadline`
pins it to on-demand once its slack runs out (`pinned_on_demand`, after Can't Be
Late's uniform-progress safety net, NSDI '24). Restrictions reach the planner as
families: spot offerings plan under `FAMILY+spot`, and a job's demands list the
families its capacity allows. Launches spread over a type's zones (`spread`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from autoscaler.catalog import ANY_FAMILY, ON_DEMAND, TABLE1_LAUNCH_DELAYS, Catalog, InstanceType
from autoscaler.cloud import offering_parts
from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import (
    DEFAULT_BUILD_IMAGE_S,
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_FETCH_S,
    DEFAULT_INIT_S,
    Demands,
    JobSpec,
)
from autoscaler.store import PriceChange, UptimeInterval

#: Hours in the month the Spot Instance Advisor's frequency-of-interruption bands count.
MONTH_HOURS = 730.0
#: A spot offering's family as the planner sees it: its type's family and this suffix.
SPOT_FAMILY_SUFFIX = "+spot"
#: Capacity a job may ask for.
CAPACITIES = ("auto", "spot", "on-demand")


def hourly_rate(monthly_fraction: float) -> float:
    """Interruptions per instance-hour from the fraction of instances interrupted in a
    month (the advisor's bands): a Poisson rate with that chance of one or more in
    `MONTH_HOURS`, `−ln(1 − p) / 730`."""
    if not 0.0 <= monthly_fraction < 1.0:
        raise ValueError(f"a monthly interruption fraction is in [0, 1), not {monthly_fraction}")
    return -math.log1p(-monthly_fraction) / MONTH_HOURS


def expected_loss_hours(checkpoint_every_s: float | None, restart_s: float) -> float:
    """L: hours of a task's time one reclaim costs — the work since its last periodic
    checkpoint (half the interval, in expectation) plus the restart delay. Without
    periodic checkpoints (None) the loss is unbounded (the whole attempt)."""
    if checkpoint_every_s is None:
        return math.inf
    return (checkpoint_every_s / 2.0 + restart_s) / 3600.0


def interruption_cost_per_hour(rate_per_hour: float, loss_hours: float, rp: float) -> float:
    """Expected dollars per hour a task loses to reclaims: λ · L · RP(τ)."""
    if rate_per_hour == 0.0:
        return 0.0
    return rate_per_hour * loss_hours * rp


def spot_task_value(
    tnrp: float, rp: float, rate_per_hour: float, checkpoint_every_s: float | None, restart_s: float
) -> float:
    """A task's hourly value on a spot offering: its TNRP minus the expected
    interruption cost, `λ · (C/2 + R) · rp` (`rp`: the value its time is priced at, its
    on-demand value V(τ) when spot is offered)."""
    loss = expected_loss_hours(checkpoint_every_s, restart_s)
    return tnrp - interruption_cost_per_hour(rate_per_hour, loss, rp)


def effective_price(
    price: float, rate_per_hour: float, loss_hours: float, value: float | None
) -> float:
    """What an hour on the offering costs once reclaims are paid for: `p + λ·L·V`.

    Each hour on the offering loses λ·L hours of its tasks' time to reclaims. An hour
    of a job's time is worth its on-demand value V — what running it without the risk
    costs — as a slowdown is charged at V (`pricing.valued_tnrp`), not at the cheaper
    price spot happens to give its instance: so the lost time is charged λ·L·V, with V
    for the offering alone the cheapest on-demand price of its capacity (`value`; None:
    no on-demand offering holds it, and the tasks' value is this very effective price,
    `p_eff = p + λ·L·p_eff`, that is `p / (1 − λ·L)`, as before). Charged at the spot
    price instead, the loss was undercharged by the spot discount (p/V, a half to a
    tenth), so spot looked cheap at rates where its reclaims cost more than it saves.
    An offering is worth its risk only while `p + λ·L·V < V`. Infinite when λ·L ≥ 1
    (it loses more than it runs)."""
    if rate_per_hour == 0.0:
        return price  # never reclaimed: nothing to lose, whatever the loss per reclaim
    exposure = rate_per_hour * loss_hours
    if exposure >= 1.0:
        return math.inf
    if value is None:
        return price / (1.0 - exposure)
    return price + exposure * value


def on_demand_value_of(itype: InstanceType, catalog: Catalog) -> float | None:
    """V of a spot offering alone: the cheapest on-demand offering of its family whose
    capacity holds its capacity, else its EC2 type's on-demand price (None: neither)."""
    best = None
    for t in catalog:
        if (
            not t.is_spot
            and t.family == itype.family
            and itype.capacity.fits_in(t.capacity)
            and (best is None or t.hourly_cost < best)
        ):
            best = t.hourly_cost
    return best if best is not None else on_demand_price(catalog, itype.launch_type)


def restart_seconds(itype: InstanceType) -> float:
    """R: a replacement instance's start-up, then the job's fetch, build and init (the
    assumed delays of Eva's Table 1 unless the offering's are measured)."""
    return itype.launch_delays.startup_s + DEFAULT_FETCH_S + DEFAULT_BUILD_IMAGE_S + DEFAULT_INIT_S


@dataclass(frozen=True)
class SpotPolicy:
    """How spot offerings are planned.

    `checkpoint_every_s`: the periodic checkpoint interval the loss is priced at (the
    jobs' default; None prices no checkpoints, so spot is planned only where λ = 0).
    `restart_s`: R (None: `restart_seconds` of the offering). `deadline_margin_s`:
    slack kept beyond the restart when deciding to pin a deadline job to on-demand
    (a round interval and a reclaim's loss, by default). `spread_fraction`: at most
    this share of a type's spot instances on one offering when another one of that
    type is within `price_tolerance` of it. `reclaim_alpha`, `max_reclaims`: when a
    job's own reclaims move it to on-demand (`reclaims_pin`), `max_delay_share` and
    `max_lost_share` how far the ceiling rises for a long job (`reclaim_ceiling`).
    `prices_loss` False plans each offering at its raw spot price (L = 0, the spot
    baselines'), while the checkpoint interval still counts where a reclaim's rollback
    is a fact, not a price: the deadline margin (`rollback_s`) and the reclaim test's
    exposure."""

    checkpoint_every_s: float | None = DEFAULT_CHECKPOINT_EVERY_S
    restart_s: float | None = None
    prices_loss: bool = True
    deadline_margin_s: float = 900.0
    spread_fraction: float = 0.5
    price_tolerance: float = 0.10
    # A job runs on on-demand once its own reclaims are more than the rate it was
    # planned at explains, at this significance level (`reclaims_pin`) ...
    reclaim_alpha: float = 0.01
    # ... and, whatever the test says, once one of its tasks lost this many attempts to
    # the infrastructure (reclaims, lost workers): the hard ceiling that makes every job
    # finish (None: no ceiling) ...
    max_reclaims: int | None = 10
    # ... raised for a long job to as many reclaims as delay it by `max_delay_share` of
    # its run (restarts), and lose no more than `max_lost_share` of its work (the
    # interval a reclaim takes back when its checkpoint cannot fit the notice window):
    # `reclaim_ceiling`; None: that budget does not raise the count.
    max_delay_share: float | None = 0.05
    max_lost_share: float | None = 0.015
    # A reclaim loses the job's whole attempt (no checkpoints: the SkyPilot-like
    # baseline): a reclaimed job of known length then moves as soon as its price says
    # spot no longer pays (`from_scratch_pins`).
    from_scratch: bool = False
    _catalogs: dict[tuple[str, ...], tuple[Catalog, Catalog]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _jobs: dict[tuple[str, str, frozenset[str]], tuple[JobSpec, JobSpec]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def loss_hours(self, itype: InstanceType) -> float:
        if not self.prices_loss:
            return 0.0
        restart = self.restart_s if self.restart_s is not None else restart_seconds(itype)
        return expected_loss_hours(self.checkpoint_every_s, restart)

    def restricted(self, job: JobSpec, capacity: str, families: frozenset[str]) -> JobSpec:
        """`restrict_job`, memoized for the very spec object (a job's spec is the same
        object round after round until one of its tasks ends)."""
        key = (job.job_id, capacity, families)
        hit = self._jobs.get(key)
        if hit is not None and hit[0] is job:
            return hit[1]
        out = restrict_job(job, capacity, families)
        if len(self._jobs) > 100_000:
            self._jobs.clear()
        self._jobs[key] = (job, out)
        return out

    def planning_catalog(self, catalog: Catalog) -> Catalog:
        """The catalog the planner prices against: spot offerings at their effective
        price and under their spot family; on-demand ones unchanged. The same object
        for the same offerings, round after round (planners recognise a catalog by
        identity to reuse what they derived from it)."""
        if not any(t.is_spot for t in catalog):
            return catalog
        key = tuple(t.name for t in catalog)
        cached = self._catalogs.get(key)
        if cached is not None and cached[0] is catalog:
            return cached[1]
        if cached is not None and tuple(cached[0]) == tuple(catalog):
            return cached[1]
        types = []
        for t in catalog:
            if not t.is_spot:
                types.append(t)
                continue
            price = effective_price(
                t.hourly_cost,
                t.interruption_per_hour,
                self.loss_hours(t),
                on_demand_value_of(t, catalog),
            )
            if math.isfinite(price):
                types.append(replace(t, hourly_cost=price, family=t.family + SPOT_FAMILY_SUFFIX))
        planned = Catalog(types, catalog.region)
        self._catalogs[key] = (catalog, planned)
        return planned


def poisson_sf(k: int, mean: float) -> float:
    """P(X ≥ k) for X ~ Poisson(`mean`)."""
    if k <= 0:
        return 1.0
    if mean <= 0.0:
        return 0.0
    term = math.exp(-mean)
    below = term
    for i in range(1, k):
        term *= mean / i
        below += term
    return max(0.0, 1.0 - below)


#: EC2's interruption notice: the instance goes this long after it is given.
NOTICE_S = 120.0
#: How often the worker asks the metadata service for a notice (`executor.interruption`,
#: as AWS recommends): the latest it sees one.
NOTICE_POLL_S = 5.0


def restart_s(job: JobSpec) -> float:
    """A restart of the job elsewhere: a replacement's start-up (Eva's Table 1) and the
    job's init."""
    return TABLE1_LAUNCH_DELAYS.startup_s + job.init_delay_s


def reclaim_loss_s(job: JobSpec, policy: SpotPolicy) -> float:
    """The job time one reclaim costs: its worker checkpoints and stops its tasks on the
    notice, so the restart and that checkpoint when every task's fits the notice window
    (after the poll); else also the work the reclaim takes back (`reclaim_lost_s`)."""
    restart = restart_s(job)
    lost = reclaim_lost_s(job, policy)
    if lost > 0.0:
        return restart + lost
    return restart + max((t.checkpoint_s for t in job.tasks), default=0.0)


def reclaim_lost_s(job: JobSpec, policy: SpotPolicy) -> float:
    """The work one reclaim takes back: none when every task's checkpoint fits the notice
    window after the poll; else half its periodic checkpoint interval (`rollback_s`),
    the work since the last periodic checkpoint on average."""
    stop = max((t.checkpoint_s for t in job.tasks), default=0.0)
    if stop <= NOTICE_S - NOTICE_POLL_S:
        return 0.0
    return rollback_s(job, policy) / 2.0


def reclaim_ceiling(
    solo_s: float | None, loss_s: float, lost_s: float, policy: SpotPolicy
) -> int | None:
    """The reclaims after which a job runs on on-demand whatever its rate (None: none).

    `max_reclaims`, or for a job of known length (`solo_s` alone at full speed), if
    more, as many reclaims as fit both budgets: they delay it by at most
    `max_delay_share` of that run at `loss_s` each (`reclaim_loss_s`), and take back at
    most `max_lost_share` of its work at `lost_s` each (`reclaim_lost_s`; no budget
    when nothing is lost). A count alone treats a 200-hour job like a 2-hour one: at
    the rate its price accounts for, the long one meets its tenth reclaim early and
    finishes on on-demand, having lost well under 1% of its run; under bursty
    availability traces that pinned most long GPU jobs and made on-demand four fifths
    of eva's bill. The delay's budget is looser than the work's: a reclaim whose
    checkpoint fits the notice loses no work, only a restart, and 5% of the run (by
    default) is a third of the JCT eva's spot replays are held to (1.15× on-demand's).
    A budget of 1.5% for both, as before the notice was honoured, kept eva at 0.56×
    on-demand eva's cost at 0.5 reclaims an hour; 5% makes it 0.22×, at 1.02× its JCT."""
    ceiling = policy.max_reclaims
    delay_share, lost_share = policy.max_delay_share, policy.max_lost_share
    if ceiling is None or solo_s is None or delay_share is None or loss_s <= 0.0:
        return ceiling
    allowed = math.floor(delay_share * solo_s / loss_s)
    if lost_s > 0.0 and lost_share is not None:
        allowed = min(allowed, math.floor(lost_share * solo_s / lost_s))
    return max(ceiling, allowed)


def reclaims_pin(
    reclaims: int,
    exposure_hours: float,
    rate_per_hour: float,
    tasks: int,
    policy: SpotPolicy,
    ceiling: int | None = None,
) -> bool:
    """Whether a job's own reclaims move it to on-demand for good.

    `reclaims` is the most attempts one of its `tasks` lost to the infrastructure,
    `exposure_hours` the hours each task could have spent on spot, `rate_per_hour` the
    interruption rate it was planned at. The rule: pin when that many reclaims are
    unlikely at the planned rate — a one-sided Poisson test, `tasks · P(X ≥ k) <
    reclaim_alpha` with X ~ Poisson(λ · exposure) (Bonferroni over the tasks, each
    reclaimed at λ on its own) — or when `reclaims ≥ ceiling`, the hard ceiling
    (`reclaim_ceiling`; None: the policy's `max_reclaims`).
    A job reclaimed as often as its price assumed stays on spot, whose price already
    pays for its reclaims; one reclaimed more often has the rate wrong, and moves.

    Every job finishes: with checkpoints, each reclaim loses at most a checkpoint
    interval and a restart, and after `max_reclaims` the job runs on on-demand, which is
    never reclaimed. A job that loses everything on a reclaim is pinned sooner when that
    is what its price says (`from_scratch_pins`; and without periodic checkpoints,
    `checkpoint_every_s` None, an offering is planned only at λ = 0, where one reclaim
    already fails the test). The test is not also required to find spot dearer than
    on-demand at the rate the job saw: on bursty availability traces that kept jobs on
    capacity that kept vanishing, moving back and forth and idle for hours."""
    if reclaims <= 0:
        return False
    if ceiling is None:
        ceiling = policy.max_reclaims
    if ceiling is not None and reclaims >= ceiling:
        return True
    mean = rate_per_hour * max(0.0, exposure_hours)
    return max(1, tasks) * poisson_sf(reclaims, mean) < policy.reclaim_alpha


def from_scratch_pins(
    solo_h: float, restart_h: float, rate_per_hour: float, discount: float
) -> bool:
    """Whether a job that restarts from scratch on a reclaim, just reclaimed (its
    progress back at zero, so moving now loses nothing more), should finish on on-demand.

    On spot its `solo_h` hours expect λ·solo_h reclaims, each losing about half the run
    and a restart: λ·(solo_h/2 + R) of its time per hour, worth its on-demand value V.
    So spot costs `p + λ·(solo_h/2 + R)·V` an hour against on-demand's V: pin when
    `λ·(solo_h/2 + R) ≥ 1 − p/V` (`discount`) — the effective price of `effective_price`
    with the loss of a job that keeps no checkpoint."""
    return rate_per_hour * (solo_h / 2.0 + restart_h) >= discount


def spot_discount(job: JobSpec, catalog: Catalog) -> float | None:
    """1 − p/V over the job's tasks: each task's cheapest spot offering against its
    cheapest on-demand one (None: some task has no spot or no on-demand offering)."""
    spot = value = 0.0
    for task in job.tasks:
        prices: dict[bool, float] = {}
        for itype in catalog:
            demand = task.demand_on(itype.family)
            if demand is not None and demand.fits_in(itype.capacity):
                best = prices.get(itype.is_spot)
                if best is None or itype.hourly_cost < best:
                    prices[itype.is_spot] = itype.hourly_cost
        if True not in prices or False not in prices:
            return None
        spot += prices[True]
        value += prices[False]
    return 1.0 - spot / value if value > 0.0 else None


def exposure_hours(
    solo_s: float | None, reclaims: int, started_at: float | None, now: float, policy: SpotPolicy
) -> float:
    """The hours a job's task is taken to be exposed to reclaims in `reclaims_pin`.

    When the job's length is known: its whole run — its time alone at full speed plus a
    checkpoint interval redone per reclaim — so that the test asks whether the job has
    had more reclaims than its *whole* run on spot plausibly brings. That exposure
    never changes as the job runs on, so the verdict only changes with a new reclaim:
    a job pinned stays pinned (its hours on on-demand are no evidence for spot) without
    the store having to keep when it was pinned. Unknown length: the hours since it
    first ran (`started_at`; its submission when no moment saw all its tasks run), an
    upper bound on its spot hours so far."""
    if solo_s is not None:
        redone = policy.checkpoint_every_s or 0.0
        return (solo_s + reclaims * redone) / 3600.0
    if started_at is None:
        return 0.0
    return max(0.0, now - started_at) / 3600.0


def planned_rate(job: JobSpec, catalog: Catalog) -> float:
    """The interruption rate a job was planned at: the highest of the spot offerings of
    `catalog` that one of its tasks fits (0: none)."""
    rate = 0.0
    for itype in catalog:
        if itype.is_spot and itype.interruption_per_hour > rate:
            for task in job.tasks:
                demand = task.demand_on(itype.family)
                if demand is not None and demand.fits_in(itype.capacity):
                    rate = itype.interruption_per_hour
                    break
    return rate


def is_spot_family(family: str) -> bool:
    return family.endswith(SPOT_FAMILY_SUFFIX)


def restricted_demands(demands: Demands, capacity: str, families: frozenset[str]) -> Demands:
    """A task's demands as the planner sees them under `capacity`: "auto" adds each
    family's spot twin, "spot" keeps only the twins, "on-demand" only the plain
    families; `any` is spelled out over the catalog's `families` where it must be."""
    plain = sorted(f for f in families if not is_spot_family(f))
    spot = sorted(f for f in families if is_spot_family(f))
    out: dict[str, object] = {}
    for family, demand in demands:
        if family == ANY_FAMILY:
            if capacity == "auto":
                out[ANY_FAMILY] = demand
            else:
                for f in spot if capacity == "spot" else plain:
                    out.setdefault(f, demand)
            continue
        if capacity in ("auto", "on-demand"):
            out[family] = demand
        if capacity in ("auto", "spot"):
            out[family + SPOT_FAMILY_SUFFIX] = demand
    return tuple(sorted(out.items()))  # type: ignore[arg-type]


def job_capacity(job: JobSpec, pinned: bool) -> str:
    """The capacity a job is planned under this round: on-demand once pinned."""
    return "on-demand" if pinned else job.capacity


def restrict_job(job: JobSpec, capacity: str, families: frozenset[str]) -> JobSpec:
    """The job with every task's demands restricted to `capacity` (itself for "auto"
    when the catalog has no spot offering)."""
    if capacity == "auto" and not any(is_spot_family(f) for f in families):
        return job
    tasks = tuple(
        replace(t, demands=restricted_demands(t.demands, capacity, families)) for t in job.tasks
    )
    return replace(job, tasks=tasks)


def job_deadline_s(job: JobSpec, solo_s: float | None) -> float | None:
    """Seconds after submission the job must finish by: its `deadline_s`, else
    `max_jct_factor` × its running time alone when that is known; None: no deadline."""
    if job.deadline_s is not None:
        return job.deadline_s
    if job.max_jct_factor is not None and solo_s is not None:
        return job.max_jct_factor * solo_s
    return None


def rollback_s(job: JobSpec, policy: SpotPolicy) -> float:
    """The most running time a reclaim can take back from the job: its periodic
    checkpoint interval (its tasks' shortest, else the policy's; 0 when the policy
    prices no checkpoint loss). What `pinned_on_demand` keeps beyond the restart: the
    rule promises the job can still finish on on-demand after one more reclaim, and
    that reclaim can land just before a checkpoint — kept at half the interval (the
    expectation) or not at all, short jobs reclaimed near their end missed their
    deadlines by minutes."""
    if not policy.checkpoint_every_s:
        return 0.0
    every = [t.run.checkpoint_every_s for t in job.tasks if t.run.checkpoint_every_s]
    return min(every) if every else policy.checkpoint_every_s


def pinned_on_demand(
    *,
    now: float,
    submitted_at: float,
    deadline_s: float,
    remaining_s: float | None,
    restart_s: float,
    margin_s: float,
) -> bool:
    """Whether a deadline job must run on on-demand from now on.

    The rule (Can't Be Late's safety net, NSDI '24 §4): stay on spot while the job
    could still finish on on-demand after one more reclaim — switch when
    `remaining work at full speed + restart + margin ≥ time left to the deadline`.
    Work whose size is unknown (`remaining_s` None) cannot be promised on spot: pinned."""
    if remaining_s is None:
        return True
    left = submitted_at + deadline_s - now
    return remaining_s + restart_s + margin_s >= left


def without_misfits(current: Configuration, specs: Mapping[str, JobSpec]) -> Configuration:
    """The current configuration without the tasks its instances can no longer host
    under their job's capacity (a job just pinned to on-demand, on a spot instance):
    the planner places them afresh, and the move is an ordinary migration."""
    demands = {t.task_id: t for j in specs.values() for t in j.tasks}
    changed = False
    kept: list[Instance] = []
    for inst in current:
        stays = tuple(
            t for t in inst.tasks if t not in demands or demands[t].demand_on(inst.type.family)
        )
        if len(stays) != len(inst.tasks):
            changed = True
            inst = Instance(inst.instance_id, inst.type, stays)
        kept.append(inst)
    return Configuration(tuple(kept)) if changed else current


def spread(
    target: Configuration,
    catalog: Catalog,
    live_types: Sequence[str],
    policy: SpotPolicy,
) -> Configuration:
    """New spot instances spread over their EC2 type's zones.

    The rule: a new spot instance goes to the offering of its EC2 type, among those
    whose (effective) price is within `price_tolerance` of the planner's pick, that
    holds the fewest of that type's spot instances (live and launching; ties: the
    cheaper, then the name). With k such offerings none holds more than ⌈n/k⌉ of n —
    at most `spread_fraction` (½) once k ≥ 2 and n ≥ 2 — so one reclaim wave in
    one zone takes at most that share of a type's spot capacity, and of a job's tasks
    on that type."""
    by_type: dict[str, list[InstanceType]] = {}
    for t in catalog:
        if t.is_spot:
            by_type.setdefault(t.launch_type, []).append(t)
    if not any(len(v) > 1 for v in by_type.values()):
        return target
    counts: dict[str, int] = {}
    for name in live_types:
        if name in catalog:
            counts[name] = counts.get(name, 0) + 1
    out: list[Instance] = []
    changed = False
    for inst in target:
        t = inst.type
        if inst.instance_id is None and t.is_spot and len(by_type.get(t.launch_type, ())) > 1:
            limit = t.hourly_cost * (1.0 + policy.price_tolerance)
            options = [o for o in by_type[t.launch_type] if o.hourly_cost <= limit]
            best = min(options, key=lambda o: (counts.get(o.name, 0), o.hourly_cost, o.name))
            if best is not t:
                inst = Instance(None, best, inst.tasks)
                changed = True
            counts[best.name] = counts.get(best.name, 0) + 1
        out.append(inst)
    return Configuration(tuple(out)) if changed else target


def planning_inputs(
    jobs: Sequence[JobSpec], catalog: Catalog, policy: SpotPolicy
) -> tuple[Catalog, tuple[JobSpec, ...]]:
    """The catalog at effective prices and the jobs under their own capacity: what the
    fluid LP and the clairvoyant bound are given so that they include spot offerings
    at `effective_price` (deadlines, which only pin jobs as they run, are left out)."""
    planning = policy.planning_catalog(catalog)
    families = planning.families
    return planning, tuple(restrict_job(j, j.capacity, families) for j in jobs)


def on_demand_price(catalog: Catalog, ec2_type: str) -> float | None:
    """The on-demand price of an EC2 type in `catalog` (its bare offering's, else the
    cheapest of its zonal ones): what a spot hour of it is compared with. None: the
    catalog offers it on-demand nowhere."""
    if ec2_type in catalog and not catalog[ec2_type].is_spot:
        return catalog[ec2_type].hourly_cost
    prices = [t.hourly_cost for t in catalog if not t.is_spot and t.launch_type == ec2_type]
    return min(prices, default=None)


def capacity_of(market: str) -> str:
    """The job capacity that admits an offering of this market."""
    return "on-demand" if market == ON_DEMAND else "spot"


#: How the daemon learns an offering's interruption rate (`[spot]`'s defaults, and the
#: replay's): its band counts as this many spot instance-hours of evidence, beside the
#: reclaims and hours of the last `RATE_HISTORY_S`, recomputed at most every `RATE_REFRESH_S`.
RATE_PRIOR_HOURS = 100.0
RATE_HISTORY_S = 30 * 86400.0
RATE_REFRESH_S = 600.0


def blended_rate(prior_per_hour: float, reclaims: int, hours: float, prior_hours: float) -> float:
    """An offering's interruption rate from its band and the cluster's own history: the
    Gamma–Poisson posterior mean `(λ_band · H0 + n) / (H0 + h)` — the band counted as
    `prior_hours` (H0) instance-hours of evidence, `n` reclaims seen over `h` spot
    instance-hours of our own — so a handful of hours cannot swing the price, and a long
    history outweighs the band."""
    if prior_hours <= 0.0 and hours <= 0.0:
        return prior_per_hour
    return (prior_per_hour * prior_hours + reclaims) / (prior_hours + hours)


def spot_hours(
    intervals: Iterable[tuple[str, float, float | None]], since: float, now: float
) -> dict[str, float]:
    """Instance-hours per offering within [since, now] from billed uptime intervals
    (offering, start, end; end None: still running)."""
    hours: dict[str, float] = {}
    for offering, start, end in intervals:
        seconds = min(now, end if end is not None else now) - max(start, since)
        if seconds > 0.0:
            hours[offering] = hours.get(offering, 0.0) + seconds / 3600.0
    return hours


def observed_rates(
    catalog: Catalog,
    reclaims: Mapping[str, int],
    hours: Mapping[str, float],
    prior_hours: float,
) -> dict[str, float]:
    """`blended_rate` of every spot offering of the catalog, its own rate (the band's) as
    the prior: the mapping `provisioners.catalog.spot_offerings(observed=)` takes, which
    the daemon applies (`with_rates`) to whatever catalog its cloud gives."""
    return {
        t.name: blended_rate(
            t.interruption_per_hour, reclaims.get(t.name, 0), hours.get(t.name, 0.0), prior_hours
        )
        for t in catalog
        if t.is_spot
    }


def with_rates(catalog: Catalog, rates: Mapping[str, float]) -> Catalog:
    """The catalog with the spot offerings named in `rates` at those interruption rates
    (itself when none changes)."""
    changed = False
    types = []
    for t in catalog:
        rate = rates.get(t.name) if t.is_spot else None
        if rate is not None and rate != t.interruption_per_hour:
            t = replace(t, interruption_per_hour=rate)
            changed = True
        types.append(t)
    return Catalog(types, catalog.region) if changed else catalog


class LearnedRates:
    """A catalog's spot offerings at their learned rates, as the daemon's rounds see them.

    Each offering's rate is `blended_rate` of its band and the history over the last
    `history_s`: the reclaims `reclaims(since)` counts per offering and the spot
    instance-hours of the billed uptime intervals `uptime(since)` gives (`spot_hours`), the
    very computation of the daemon's `observed` rates; recomputed at most every
    `refresh_s`. A replay hands it the simulated reclaims and its ledger, so a harsh
    availability trace raises the rate its planner prices spot at, as it would the
    daemon's. `catalog(base, now)` is the same object while the rates are the same
    (planners reuse what they derived from a catalog object)."""

    def __init__(
        self,
        reclaims: Callable[[float], Mapping[str, int]],
        uptime: Callable[[float], Iterable[tuple[str, float, float | None]]],
        *,
        prior_hours: float = RATE_PRIOR_HOURS,
        history_s: float = RATE_HISTORY_S,
        refresh_s: float = RATE_REFRESH_S,
    ) -> None:
        self.reclaims = reclaims
        self.uptime = uptime
        self.prior_hours = prior_hours
        self.history_s = history_s
        self.refresh_s = refresh_s
        self._at = -math.inf
        self._base: Catalog | None = None
        self._out: Catalog | None = None

    def rates(self, base: Catalog, now: float) -> dict[str, float]:
        """The blended rate of each spot offering of `base` at `now` (no caching)."""
        since = now - self.history_s
        hours = spot_hours(self.uptime(since), since, now)
        return observed_rates(base, self.reclaims(since), hours, self.prior_hours)

    def catalog(self, base: Catalog, now: float) -> Catalog:
        """`base` at the rates of the newest refresh."""
        if not any(t.is_spot for t in base):
            return base
        if self._out is not None and base is self._base and 0.0 <= now - self._at < self.refresh_s:
            return self._out
        out = with_rates(base, self.rates(base, now))
        if (
            self._out is not None
            and base is self._base
            and tuple(t.interruption_per_hour for t in out)
            == tuple(t.interruption_per_hour for t in self._out)
        ):
            out = self._out
        self._base, self._out, self._at = base, out, now
        return out


# --- billing at the price in effect ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Repricing:
    """What one price change does to an instance's open ledger stretch: close it at
    `closes_at` and open `opens`; `closes_at` None re-prices the open stretch in place."""

    closes_at: float | None
    opens: UptimeInterval


def repriced(stretch: UptimeInterval, change: PriceChange) -> Repricing | None:
    """The ledger rule of a running instance's price change (what AWS bills a spot
    instance: the spot price in effect, hour by hour, "Spot Instance pricing", EC2 User
    Guide). A change after the open stretch's start closes it then and opens one at the
    new price; a change at its very start re-prices it in place (it landed at a price
    already superseded); one before its start (older than the stretch: a replay), at the
    price already billed, or to a closed stretch does nothing — so applying a refresh
    twice writes nothing twice."""
    if (
        stretch.end is not None
        or change.instance_id != stretch.instance_id
        or change.hourly_price == stretch.hourly_price
        or change.at < stretch.start
    ):
        return None
    if change.at == stretch.start:
        return Repricing(None, replace(stretch, hourly_price=change.hourly_price))
    return Repricing(
        change.at,
        UptimeInterval(stretch.instance_id, stretch.instance_type, change.hourly_price, change.at),
    )


#: A spot price history: EC2 type -> zone -> ((epoch seconds it took effect, USD/hour), ...)
#: in time order (`DescribeSpotPriceHistory`'s entries, the zone as the instance reports it).
PriceHistory = Mapping[str, Mapping[str, Sequence[tuple[float, float]]]]


def price_changes(
    open_stretches: Iterable[tuple[UptimeInterval, str | None]], history: PriceHistory
) -> list[PriceChange]:
    """The price changes a history means for running spot instances, each given by its
    open ledger stretch and the zone it runs in. Per instance: the history's last entry at
    or before the stretch's start is the price in effect when it began (a change at that
    start when it differs from the one billed); each later entry is a change at **the
    history's time** (when EC2 says the price moved, not when we asked). On-demand
    offerings, instances without a zone and types or zones the history lacks get none.
    In time order per instance, for `Store.reprice_instances`."""
    changes: list[PriceChange] = []
    for stretch, zone in open_stretches:
        ec2_type, market, _ = offering_parts(stretch.instance_type)
        if stretch.end is not None or market == ON_DEMAND or zone is None:
            continue
        entries = sorted(history.get(ec2_type, {}).get(zone, ()))
        if not entries:
            continue
        before = [price for at, price in entries if at <= stretch.start]
        if before and before[-1] != stretch.hourly_price:
            changes.append(PriceChange(stretch.instance_id, before[-1], stretch.start))
        changes.extend(
            PriceChange(stretch.instance_id, price, at)
            for at, price in entries
            if at > stretch.start
        )
    return changes
