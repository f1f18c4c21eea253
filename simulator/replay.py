"""Replay a job trace through the real control loop on a virtual clock.

The production round logic (`autoscaler.control.ControlLoop`) drives the
simulated cloud and executor; the planner learns interference only from the
throughputs the simulated executor reports. Rounds run every `interval`
seconds from t = 0; arrivals wait for the next round, as in Eva.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoscaler.catalog import Catalog
from autoscaler.cloud import Guardrails
from autoscaler.control import ControlLoop, ControlOptions, Planner
from autoscaler.fairshare import TeamPolicy
from autoscaler.jobs import JobSpec
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.planner import PLANNER_NAMES, planner_by_name
from autoscaler.store import Store
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputTable
from autoscaler.work import check_work, solo_seconds
from simulator.baselines import NoPackingPlanner, OwlPlanner, StratusPlanner, SynergyPlanner
from simulator.engine import ARRIVAL, ROUND, EventLoop
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
        }


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
    is refused before anything runs (`autoscaler.work`).
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
    )

    def new_loop() -> ControlLoop:
        planner = make_planner(scheduler, truth, **(planner_options or {}))
        return ControlLoop(planner, cloud, executor, store, engine, options)

    kept = new_loop()

    def loop() -> ControlLoop:
        return new_loop() if rebuild else kept

    def after_batch() -> None:
        if dirty[0]:
            dirty[0] = False
            loop().progress()

    engine.after_batch = after_batch
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
    return _result(
        scheduler, world, store, samples, planning, rounds[0], engine.now(), not stuck[0]
    )


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
