"""Replay a job trace through the real control loop on a virtual clock.

The production round logic (`autoscaler.control.ControlLoop`) drives the
simulated cloud and executor; the planner learns interference only from the
throughputs the simulated executor reports. Rounds run every `interval`
seconds from t = 0; arrivals wait for the next round, as in Eva.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.catalog import Catalog
from autoscaler.cloud import Guardrails
from autoscaler.control import ControlLoop, ControlOptions, Planner
from autoscaler.decide import WaitPolicy
from autoscaler.fairshare import TeamPolicy
from autoscaler.jobs import JobSpec
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.planner import PLANNER_NAMES, planner_by_name
from autoscaler.spot import (
    RATE_HISTORY_S,
    RATE_PRIOR_HOURS,
    RATE_REFRESH_S,
    LearnedRates,
    SpotPolicy,
    job_deadline_s,
)
from autoscaler.store import Store
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputTable
from autoscaler.work import check_work, solo_seconds
from simulator.baselines import NoPackingPlanner, OwlPlanner, StratusPlanner, SynergyPlanner
from simulator.engine import ARRIVAL, ROUND, EventLoop
from simulator.spot import AvailabilityTrace, SpotWorld
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from state.memory import InMemoryStore

#: What `autoscaler replay` compares by default: Eva, its ablations, and the
#: baselines of Eva §6.1.
DEFAULT_SCHEDULERS = (
    "eva",
    "eva-full-only",
    "eva-partial-only",
    "no-packing",
    "stratus",
    "synergy",
    "owl",
)
SCHEDULERS = (*DEFAULT_SCHEDULERS, "eva-plain")

#: A replay that has not finished after this many simulated days is stuck
#: (e.g. a task no instance type can take under the budget): it stops and says so.
MAX_DAYS = 3650.0
#: ... or once the last job to arrive has had this many times the longest job's
#: duration (and a day for delays): a job still running then has averaged under
#: 1/20 of its speed, as when a scheduler blind to interference packs tasks that
#: crawl next to each other. Without it such a replay runs for simulated years.
MAX_SLOWDOWN = 20.0


def make_planner(name: str, truth: ThroughputTable, **options: Any) -> Planner:
    """A planner by scheduler name; Owl alone is given the ground-truth profile.
    `options` go to Eva's planners (`EvaPlanner`), e.g. `job_slowdown`."""
    if name in PLANNER_NAMES:
        return planner_by_name(name, lower_bound=False, **options)
    if name == "no-packing":
        return NoPackingPlanner()
    if name == "stratus":
        return StratusPlanner()
    if name == "synergy":
        return SynergyPlanner()
    if name == "owl":
        return OwlPlanner(truth)
    raise ValueError(f"unknown scheduler {name!r}; choose from {', '.join(SCHEDULERS)}")


@dataclass(slots=True)
class ReplayResult:
    """What one scheduler did with one trace."""

    scheduler: str
    total_cost: float  # from the store's ledger
    billed: float  # the simulated cloud's own bill (must equal total_cost)
    jobs_total: int
    jobs_completed: int
    avg_jct_hours: float
    instances_launched: int
    tasks: int
    migrations: int
    normalized_throughput: float  # mean over jobs of (time alone ÷ time taken while running)
    tasks_per_instance: float  # time-averaged, over rounds with instances
    allocation: tuple[float, float, float]  # GPU, CPU, RAM allocated ÷ provisioned
    rounds: int
    planned_rounds: int
    full_rounds: int
    planning_seconds: float  # mean per planned round (wall clock; not in the JSON)
    end_time_s: float
    finished: bool
    timeline: list[tuple[float, float, int]] = field(default_factory=list)  # t, $/h, instances
    jct_hours: dict[str, float] = field(default_factory=dict)
    spot: dict[str, Any] | None = None  # spot replays: share, interruptions, work lost

    def document(self) -> dict:
        """The JSON form: deterministic (no wall-clock timings)."""
        return {
            "total_cost": round(self.total_cost, 6),
            "avg_jct_hours": round(self.avg_jct_hours, 6),
            "jobs_completed": self.jobs_completed,
            "jobs_total": self.jobs_total,
            "instances_launched": self.instances_launched,
            "migrations": self.migrations,
            "migrations_per_task": round(self.migrations / self.tasks, 6) if self.tasks else 0.0,
            "normalized_throughput": round(self.normalized_throughput, 6),
            "tasks_per_instance": round(self.tasks_per_instance, 6),
            "allocation": {
                "gpu": round(self.allocation[0], 6),
                "cpu": round(self.allocation[1], 6),
                "ram": round(self.allocation[2], 6),
            },
            "rounds": self.rounds,
            "full_reconfiguration_share": round(self.full_rounds / self.planned_rounds, 6)
            if self.planned_rounds
            else 0.0,
            "makespan_hours": round(self.end_time_s / 3600.0, 6),
            "finished": self.finished,
            **({"spot": self.spot} if self.spot is not None else {}),
        }


@dataclass(frozen=True)
class SpotReplay:
    """How a replay treats spot offerings: the planner's `policy`, and the world's
    reclaims — seeded from each offering's rate (or `rate_per_hour` for all), or from
    availability `traces` by `TYPE[@ZONE]`; `checkpoints` False restarts every
    reclaimed job from scratch (the SkyPilot-like baseline). With `learn_rates` the
    planner prices each spot offering at the rate the daemon would have learned from
    the replay's own reclaims and spot hours (`autoscaler.spot.LearnedRates`, with the
    daemon's `[spot]` defaults below); off, at the catalog's rates (the bands)."""

    policy: SpotPolicy | None = field(default_factory=SpotPolicy)  # None: plan prices as they are
    seed: int = 0
    traces: Mapping[str, AvailabilityTrace] = field(default_factory=dict)
    rate_per_hour: float | None = None
    checkpoints: bool = True
    learn_rates: bool = True
    prior_hours: float = RATE_PRIOR_HOURS  # `[spot] prior_hours`
    history_s: float = RATE_HISTORY_S  # `[spot] history_days`
    refresh_s: float = RATE_REFRESH_S  # `[spot] refresh_minutes`


#: What `replay --spot` compares: Eva pricing spot by its interruption risk; the same
#: co-locating no task it expects below full speed (`eva-full-speed`: what spot and the
#: choice of offerings save at the baselines' JCT, where co-location slowdown is what
#: eva trades for its deeper saving); Eva on on-demand capacity only; and two spot
#: baselines without packing planned at the raw spot price: SkyPilot-like managed jobs
#: restarting from scratch after a reclaim, and the same with periodic checkpoints.
SPOT_SCHEDULERS = ("eva", "eva-full-speed", "eva-on-demand", "spot-restart", "spot-checkpoint")


@dataclass(frozen=True)
class SpotVariant:
    """A `replay --spot` row: the scheduler it runs, whether it may use spot offerings,
    its spot settings, and planner options it sets over the command's."""

    scheduler: str
    on_spot: bool
    settings: SpotReplay
    planner_options: Mapping[str, Any] = field(default_factory=dict)


def spot_variant(name: str, base: SpotReplay) -> SpotVariant:
    """The row `name` of `replay --spot` (any other name: that scheduler, with spot)."""
    if name == "eva-full-speed":
        return SpotVariant("eva", True, base, {"min_throughput": 1.0})
    if name == "eva-on-demand":
        return SpotVariant("eva", False, replace(base, policy=None))
    if name == "spot-restart":  # L = 0: the raw spot price; no checkpoint to roll back to
        no_checkpoints = SpotPolicy(checkpoint_every_s=0.0, restart_s=0.0, from_scratch=True)
        return SpotVariant(
            "no-packing", True, replace(base, policy=no_checkpoints, checkpoints=False)
        )
    if name == "spot-checkpoint":
        # The raw spot price too, but its jobs checkpoint as eva's do, so the deadline
        # rule keeps the same margin for the interval one more reclaim can take back:
        # both rows run the same safety net, and differ in packing and pricing alone.
        raw = replace(base.policy or SpotPolicy(), prices_loss=False)
        return SpotVariant("no-packing", True, replace(base, policy=raw, checkpoints=True))
    if name == "no-packing":
        return SpotVariant("no-packing", False, replace(base, policy=None))
    return SpotVariant(name, True, base)


@contextlib.contextmanager
def simulated_logs() -> Iterator[None]:
    """The replayed control loop logs as the daemon does (a warning per spot notice):
    those lines are about simulated instances, so they are kept from Python's
    last-resort handler, which would print each to the command's stderr; a handler
    the caller configured still gets them."""
    quiet = logging.NullHandler()
    logger = logging.getLogger("autoscaler")
    logger.addHandler(quiet)
    try:
        yield
    finally:
        logger.removeHandler(quiet)


@simulated_logs()
def replay(
    jobs: Sequence[JobSpec],
    catalog: Catalog,
    truth: ThroughputTable,
    scheduler: str,
    interval_s: float = ROUND_INTERVAL_S,
    default_throughput: float = DEFAULT_THROUGHPUT,
    on_round: Callable[[float, int, int], None] | None = None,
    store: Store | None = None,
    rebuild: bool = False,
    planner_options: dict[str, Any] | None = None,
    max_hourly_spend: float | None = None,
    teams: TeamPolicy | None = None,
    spot: SpotReplay | None = None,
    waiting: WaitPolicy | None = None,
) -> ReplayResult:
    """Run the trace with one scheduler and measure cost, JCT and the rest.

    `on_round(now, jobs_completed, jobs_total)` is called after each round
    (progress display). `store` defaults to a fresh in-memory one; any empty
    `Store` binding works (the SQL one too: the round logic needs no SQL).
    With `rebuild`, the control loop and its planner are thrown away and built
    anew before every round and every step, as a daemon restarted there would
    be: the result must not change (nothing the loop needs lives in memory).
    `planner_options` go to Eva's planners (ablations: `job_slowdown="whole"`).
    `max_hourly_spend` is the cluster's budget (`Guardrails`); with `teams`, the trace's
    teams (`TraceFacts.team`) share it by weight when it binds (`autoscaler.fairshare`).
    A job whose work the trace does not give, or gives twice in disagreement,
    is refused before anything runs (`autoscaler.work`). With `spot`, spot offerings
    of the catalog are planned by their interruption risk and reclaimed as it says
    (`simulator.spot`); the result gains its `spot` figures. With `waiting`, newly
    arrived jobs may wait within a JCT budget for room rather than open a poorly filled
    instance (`autoscaler.decide.WaitPolicy`).
    """
    check_work(jobs)
    engine = EventLoop()
    dirty = [False]

    def mark() -> None:
        dirty[0] = True

    world = World(engine, catalog, truth, jobs, on_change=mark)
    store = store if store is not None else InMemoryStore()
    cloud, executor = SimulatedCloud(world), SimulatedExecutor(world)
    options = ControlOptions(
        default_throughput=default_throughput,
        instance_prefix="inst-",
        guardrails=Guardrails(max_hourly_spend=max_hourly_spend),
        teams=teams,
        spot=spot.policy if spot is not None else None,
        waiting=waiting,
    )

    priced: Callable[[Catalog, float], Catalog] | None = None
    learned: LearnedRates | None = None
    if spot is not None and spot.learn_rates:
        learned = LearnedRates(
            lambda since: world.spot.reclaims_since(since) if world.spot is not None else {},
            lambda since: ((u.instance_type, u.start, u.end) for u in store.uptime(since)),
            prior_hours=spot.prior_hours,
            history_s=spot.history_s,
            refresh_s=spot.refresh_s,
        )
        priced = learned.catalog

    def new_loop() -> ControlLoop:
        planner = make_planner(scheduler, truth, **(planner_options or {}))
        return ControlLoop(planner, cloud, executor, store, engine, options, catalog=priced)

    kept = new_loop()

    def loop() -> ControlLoop:
        return new_loop() if rebuild else kept

    def after_batch() -> None:
        if dirty[0]:
            dirty[0] = False
            loop().progress()

    engine.after_batch = after_batch
    if spot is not None:
        replans: set[float] = set()

        def replan() -> None:
            # the daemon replans as soon as a reclaimed instance is presumed gone
            at = engine.now() + options.unlisted_grace_s + 1.0
            if at not in replans:
                replans.add(at)
                engine.at(at, replan_now, priority=ROUND)

        def notified() -> None:
            # the agent reports a notice as it sees it; the daemon replans at once
            at = engine.now()
            if at not in replans:
                replans.add(at)
                engine.at(at, replan_now, priority=ROUND)

        def replan_now() -> None:
            if not over[0]:
                loop().schedule()

        world.spot = SpotWorld(
            world,
            seed=spot.seed,
            traces=spot.traces,
            rate_per_hour=spot.rate_per_hour,
            checkpoints=spot.checkpoints,
            on_reclaim=replan,
            on_notice=notified,
        )
    total_jobs = len(jobs)
    arrived = [0]
    for job in sorted(jobs, key=lambda j: (j.trace.arrival_time_s, j.job_id)):

        def submit(job: JobSpec = job) -> None:
            store.submit_job(job, owner="trace", at=engine.now(), team=job.trace.team)
            arrived[0] += 1

        engine.at(job.trace.arrival_time_s, submit, priority=ARRIVAL)

    horizon_s = MAX_DAYS * 86400
    if jobs:
        last = max(j.trace.arrival_time_s for j in jobs)
        longest = max(solo_seconds(j) for j in jobs)
        horizon_s = min(horizon_s, last + MAX_SLOWDOWN * longest + 86400)
    samples: list[tuple[float, float, int, tuple[float, float, float], int]] = []
    planning: list[float] = []
    rounds = [0]
    stuck = [False]
    over = [False]

    def round_() -> None:
        rounds[0] += 1
        outcome = loop().schedule()
        if outcome.plan is not None:
            planning.append(outcome.planning_seconds)
        samples.append(_sample(world, engine.now()))
        done = world.jobs_completed
        if on_round is not None:
            on_round(engine.now(), done, total_jobs)
        live = bool(world.live)
        if done < total_jobs or live or arrived[0] < total_jobs:
            if engine.now() > horizon_s:
                stuck[0] = over[0] = True
                return
            engine.at(engine.now() + interval_s, round_, priority=ROUND)
        else:
            over[0] = True

    engine.at(0.0, round_, priority=ROUND)
    # Events the world scheduled on projections since overtaken (a task's end at a
    # speed it no longer runs at) may lie long after the last round: they change
    # nothing, and the replay ends with that round.
    engine.run(until=lambda: over[0])
    result = _result(
        scheduler, world, store, samples, planning, rounds[0], engine.now(), not stuck[0]
    )
    if learned is not None and result.spot is not None:
        rates = learned.rates(catalog, engine.now())
        result.spot["learned_rates"] = {name: round(r, 9) for name, r in sorted(rates.items())}
    return result


def _sample(world: World, now: float) -> tuple[float, float, int, tuple[float, float, float], int]:
    live = list(world.live.values())
    cap = [sum(i.itype.capacity[r] for i in live) for r in range(3)]
    used = [sum(i.used[r] for i in live) for r in range(3)]
    running = sum(len(i.running) for i in live)
    allocation = tuple(u / c if c else 0.0 for u, c in zip(used, cap, strict=True))
    return now, sum(i.itype.hourly_cost for i in live), len(live), allocation, running  # type: ignore[return-value]


def _result(
    scheduler: str,
    world: World,
    store: Store,
    samples: list,
    planning: list,
    rounds: int,
    end: float,
    finished: bool,
) -> ReplayResult:
    jct: dict[str, float] = {}
    ratios = []
    for job_id, job in world.jobs.items():
        if job.completed_at is None:
            continue
        jct[job_id] = (job.completed_at - job.spec.trace.arrival_time_s) / 3600.0
        if job.active_seconds > 0:
            ratios.append(min(1.0, (job.total / job.speed) / job.active_seconds))
    with_instances = [s for s in samples if s[2] > 0]
    per_instance = [s[4] / s[2] for s in with_instances]
    allocation = tuple(
        sum(s[3][r] for s in with_instances) / len(with_instances) if with_instances else 0.0
        for r in range(3)
    )
    planned = [r for r in store.rounds() if r.chosen != "none"]
    return ReplayResult(
        spot=_spot_figures(world, jct) if world.spot is not None else None,
        scheduler=scheduler,
        total_cost=store.cost_between(0.0, end),
        billed=world.bill(end),
        jobs_total=len(world.jobs),
        jobs_completed=len(jct),
        avg_jct_hours=sum(jct.values()) / len(jct) if jct else 0.0,
        instances_launched=len(world.instances),
        tasks=len(world.tasks),
        migrations=sum(max(0, t.starts - 1) for t in world.tasks.values()),
        normalized_throughput=sum(ratios) / len(ratios) if ratios else 0.0,
        tasks_per_instance=sum(per_instance) / len(per_instance) if per_instance else 0.0,
        allocation=allocation,  # type: ignore[arg-type]
        rounds=rounds,
        planned_rounds=len(planned),
        full_rounds=sum(1 for r in planned if r.chosen == "full"),
        planning_seconds=sum(planning) / len(planning) if planning else 0.0,
        end_time_s=end,
        finished=finished and len(jct) == len(world.jobs),
        timeline=[(s[0], s[1], s[2]) for s in samples],
        jct_hours=jct,
    )


def _spot_figures(world: World, jct: Mapping[str, float]) -> dict[str, Any]:
    """The spot figures of a replay: the share of instance-hours (and of dollars) on
    spot, reclaims, work lost (task-, GPU- and CPU-hours, and its share of the jobs'
    task-hours alone), deadlines met, and market moves — a job's restarts on the other
    market than its previous start (spot to on-demand or back; the most of its tasks'),
    per job on average and the most of one job: each is a restart the job waits out,
    which a reclaim forces one way and the planner chooses the other."""
    assert world.spot is not None
    end = world.engine.now()
    hours = {False: 0.0, True: 0.0}
    dollars = {False: 0.0, True: 0.0}
    for inst in world.instances.values():
        until = inst.terminated_at if inst.terminated_at is not None else end
        h = (until - inst.launched_at) / 3600
        hours[inst.itype.is_spot] += h
        dollars[inst.itype.is_spot] += h * inst.itype.hourly_cost
    task_hours = sum(solo_seconds(j.spec) * len(j.spec.tasks) for j in world.jobs.values()) / 3600
    stats = world.spot.stats
    with_deadline = met = 0
    for job_id, job in world.jobs.items():
        deadline = job_deadline_s(job.spec, solo_seconds(job.spec))
        if deadline is None:
            continue
        with_deadline += 1
        if job_id in jct and jct[job_id] * 3600.0 <= deadline + 1e-6:
            met += 1
    moves = [
        max(world.tasks[t.task_id].market_moves for t in j.spec.tasks) for j in world.jobs.values()
    ]
    total_h = hours[False] + hours[True]
    total_d = dollars[False] + dollars[True]
    return {
        "spot_share": round(hours[True] / total_h, 6) if total_h else 0.0,
        "spot_cost_share": round(dollars[True] / total_d, 6) if total_d else 0.0,
        "interruptions": stats.interruptions,
        "lost_task_hours": round(stats.lost_task_seconds / 3600, 6),
        "lost_share": round(stats.lost_task_seconds / 3600 / task_hours, 6) if task_hours else 0.0,
        "lost_gpu_hours": round(stats.lost_gpu_seconds / 3600, 6),
        "lost_cpu_hours": round(stats.lost_cpu_seconds / 3600, 6),
        "jobs_with_deadline": with_deadline,
        "deadlines_met": met,
        "market_moves_per_job": round(sum(moves) / len(moves), 6) if moves else 0.0,
        "max_market_moves": max(moves, default=0),
    }
