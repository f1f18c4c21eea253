"""The simulated world: instances that boot with measured delays, tasks that run
with hidden interference, and the `Cloud` and `Executor` bindings the control
loop drives them through.

Timeline of an instance (Eva §5, Table 1; per-type delays from the catalog):
launch request → acquisition (`instantiate_delay`) → running → setup
(`run_worker_delay` + `worker_register_delay`) → worker ready → ... →
terminate request → `terminate_delay` → terminated. Billed per second from
the launch request until terminated.

Timeline of a task: start → fetch (+ image build unless this instance built
that image before) → running; a job progresses once all its tasks run and
its `init_delay` has passed, at `full_throughput` × its normalized
throughput, which is the slowest task's (§4.4). A stop checkpoints: the job
keeps progressing during `kill_delay`, then uploads its checkpoint
(`upload_delay`) and frees the instance; no completed work is lost.

Interference is ground truth the planner never sees: a task's throughput is
the product of its pairwise values with the tasks running beside it (Eva's
contention matrix; unknown pairs at a default).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.cloud import (
    AvailabilityCache,
    CloudInstance,
    InsufficientCapacity,
    LaunchRequest,
    UnavailableOffering,
)
from autoscaler.execution import (
    INSTANCE_ACTION,
    TERMINAL_TASK_STATES,
    ExecutorReport,
    FailureClass,
    InstanceNotice,
    TaskLaunch,
    TaskReport,
)
from autoscaler.jobs import JobSpec
from autoscaler.throughput import ThroughputTable
from autoscaler.work import job_work
from simulator.engine import EventLoop

if TYPE_CHECKING:
    from simulator.spot import SpotWorld


class SimulationError(AssertionError):
    """The world was asked to do something physically impossible (a bug upstream)."""


@dataclass(slots=True)
class SimInstance:
    cloud_id: str
    token: str
    itype: InstanceType
    launched_at: float
    state: str = "pending"  # pending → running → shutting-down → terminated
    ready: bool = False  # worker registered
    terminated_at: float | None = None
    tasks: dict[str, None] = field(default_factory=dict)  # tasks placed here (ordered set)
    running: dict[str, None] = field(default_factory=dict)  # of those, running
    images: set[str] = field(default_factory=set)
    used: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])


@dataclass(slots=True)
class SimTask:
    task_id: str
    job_id: str
    workload: str
    state: str = "new"  # new/stopped → starting → running → checkpointing → stopped; completed
    instance: str | None = None  # token
    starts: int = 0  # how many times it was started (migrations = starts - 1)
    attempt: int = 0  # the control loop's attempt number of the latest start
    reason: str = ""  # why its latest attempt failed
    failure: FailureClass | None = None  # and whose doing it was (None: not said)
    checkpoint: str | None = None  # where its latest checkpoint is
    epoch: int = 0  # invalidates pending events when the task is stopped or restarted
    on_spot: bool | None = None  # the market of its latest start (None: never started)
    market_moves: int = 0  # starts on the other market than the previous one (spot figures)


@dataclass(slots=True)
class SimJob:
    spec: JobSpec
    total: float  # iterations
    speed: float  # iterations per second alone
    done: float = 0.0
    active: bool = False  # progressing
    since: float = 0.0  # time `done` was last brought up to date
    rate: float = 0.0  # iterations per second now
    tput: float = 1.0  # normalized throughput now
    generation: int = 0  # invalidates a scheduled completion when the rate changes
    activation: int = 0  # invalidates a scheduled activation when a task stops
    completed_at: float | None = None
    active_seconds: float = 0.0
    saved: float = 0.0  # iterations in its newest checkpoint (spot replays)
    unsaved_seconds: float = 0.0  # active seconds since that checkpoint


class World:
    """Everything that physically exists in the simulation."""

    def __init__(
        self,
        engine: EventLoop,
        catalog: Catalog,
        truth: ThroughputTable,
        jobs: Sequence[JobSpec],
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.catalog = catalog
        self.truth = truth
        self.on_change = on_change or (lambda: None)
        self.instances: dict[str, SimInstance] = {}  # by token
        self.by_cloud_id: dict[str, SimInstance] = {}
        self.tasks: dict[str, SimTask] = {}
        self.jobs: dict[str, SimJob] = {}
        self.jobs_completed = 0
        self.live: dict[str, SimInstance] = {}  # not terminated, by token
        self.ready: set[str] = set()  # tokens of instances whose worker registered
        # Tasks the executor reports: started, until a terminal state is acknowledged.
        self.reported: dict[str, None] = {}
        self.no_capacity: set[str] = set()  # types the cloud refuses (tests of capacity errors)
        self.spot: SpotWorld | None = None  # reclaims of spot instances (spot replays)
        self._ids = 0
        for job in jobs:
            work = job_work(job)
            total, speed = work.iterations, work.speed
            self.jobs[job.job_id] = SimJob(job, total, speed)
            for t in job.tasks:
                self.tasks[t.task_id] = SimTask(t.task_id, job.job_id, t.workload)

    # -- instances ------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> SimInstance:
        existing = self.instances.get(request.instance_id)
        if existing is not None:
            return existing  # idempotent by token
        itype = self.catalog[request.instance_type]
        self._ids += 1
        inst = SimInstance(f"i-{self._ids:05d}", request.instance_id, itype, self.engine.now())
        self.instances[inst.token] = inst
        self.live[inst.token] = inst
        self.by_cloud_id[inst.cloud_id] = inst
        delays = itype.launch_delays
        self.engine.after(delays.acquisition_s, lambda: self._acquired(inst))
        return inst

    def _acquired(self, inst: SimInstance) -> None:
        if inst.state != "pending":
            return
        inst.state = "running"
        if self.spot is not None and inst.itype.is_spot:
            self.spot.acquired(inst)
        self.engine.after(inst.itype.launch_delays.setup_s, lambda: self._registered(inst))
        self.on_change()

    def _registered(self, inst: SimInstance) -> None:
        if inst.state != "running":
            return
        inst.ready = True
        self.ready.add(inst.token)
        self.on_change()

    def terminate(self, cloud_id: str) -> None:
        inst = self.by_cloud_id.get(cloud_id)
        if inst is None or inst.state in ("shutting-down", "terminated"):
            return
        if inst.tasks:
            raise SimulationError(f"terminating {inst.token} with tasks {list(inst.tasks)}")
        inst.state = "shutting-down"
        inst.ready = False
        self.ready.discard(inst.token)
        self.engine.after(inst.itype.launch_delays.terminate_s, lambda: self._terminated(inst))

    def _terminated(self, inst: SimInstance) -> None:
        inst.state = "terminated"
        inst.terminated_at = self.engine.now()
        self.live.pop(inst.token, None)
        self.on_change()

    def bill(self, until: float | None = None) -> float:
        """Dollars billed so far: per second from launch request to termination."""
        now = self.engine.now() if until is None else until
        return sum(
            ((i.terminated_at if i.terminated_at is not None else now) - i.launched_at)
            / 3600.0
            * i.itype.hourly_cost
            for i in self.instances.values()
        )

    # -- tasks ----------------------------------------------------------------

    def start(self, task_id: str, token: str, attempt: int = 0) -> None:
        task = self.tasks[task_id]
        if attempt and task.attempt == attempt:
            return  # the same attempt again: already started
        inst = self.instances.get(token)
        if inst is None or not inst.ready:
            raise SimulationError(f"starting {task_id} on {token}, which is not ready")
        if task.state not in ("new", "stopped", "failed"):
            raise SimulationError(f"starting {task_id} while it is {task.state}")
        spec = self.jobs[task.job_id].spec
        tspec = next(t for t in spec.tasks if t.task_id == task_id)
        demand = tspec.demand_on(inst.itype.family)
        if demand is None:
            raise SimulationError(f"{task_id} cannot run on family {inst.itype.family}")
        cap = inst.itype.capacity
        used = [u + d for u, d in zip(inst.used, demand, strict=True)]
        if any(u > c + 1e-9 for u, c in zip(used, cap, strict=True)):
            raise SimulationError(f"{task_id} does not fit on {token}: {used} > {tuple(cap)}")
        inst.used = used
        inst.tasks[task_id] = None
        task.state, task.instance = "starting", token
        task.starts += 1
        if task.on_spot is not None and task.on_spot != inst.itype.is_spot:
            task.market_moves += 1
        task.on_spot = inst.itype.is_spot
        task.attempt = attempt
        task.epoch += 1
        self.reported[task_id] = None
        image = tspec.run.image or tspec.run.build_context or tspec.task_id
        delay = tspec.fetch_s + (0.0 if image in inst.images else tspec.build_image_s)
        epoch = task.epoch
        self.engine.after(delay, lambda: self._started(task, inst, image, epoch))

    def _started(self, task: SimTask, inst: SimInstance, image: str, epoch: int) -> None:
        if task.epoch != epoch or task.state != "starting":
            return
        task.state = "running"
        inst.images.add(image)
        inst.running[task.task_id] = None
        self._reprice(inst)
        job = self.jobs[task.job_id]
        if all(self.tasks[t.task_id].state == "running" for t in job.spec.tasks):
            activation = job.activation
            self.engine.after(job.spec.init_delay_s, lambda: self._activate(job, activation))
        self.on_change()

    def _activate(self, job: SimJob, activation: int) -> None:
        if job.activation != activation or job.completed_at is not None:
            return
        if not all(self.tasks[t.task_id].state == "running" for t in job.spec.tasks):
            return
        job.active, job.since = True, self.engine.now()
        self._rate(job)

    def stop(self, task_id: str) -> None:
        task = self.tasks[task_id]
        if task.state == "starting":
            # not running yet: abandon the launch, nothing to checkpoint
            self._leave(task)
            task.state = "stopped"
            self.on_change()
            return
        if task.state != "running":
            raise SimulationError(f"stopping {task_id} while it is {task.state}")
        task.state = "checkpointing"
        spec = next(t for t in self.jobs[task.job_id].spec.tasks if t.task_id == task_id)
        epoch = task.epoch
        job = self.jobs[task.job_id]
        job.activation += 1  # a pending activation is void: a task is leaving

        def killed() -> None:
            # the job kept progressing while the task was being killed
            self._deactivate(job)
            self.engine.after(spec.upload_s, uploaded)

        def uploaded() -> None:
            if task.epoch != epoch:
                return
            if self.spot is not None:
                self.spot.checkpointed(job)
            task.checkpoint = f"sim://{task.job_id}/{task.task_id}@{job.done:.0f}"
            self._leave(task)
            task.state = "stopped"
            self.on_change()

        self.engine.after(spec.kill_s, killed)

    def crash(self, task_id: str, reason: str, failure: FailureClass | None = None) -> None:
        """The task's process dies (tests of failures): its attempt ends `failed` (of
        class `failure`, as a worker would say) and the job stops progressing until
        every task runs again."""
        task = self.tasks[task_id]
        if task.state not in ("starting", "running", "checkpointing"):
            raise SimulationError(f"crashing {task_id} while it is {task.state}")
        job = self.jobs[task.job_id]
        job.activation += 1
        self._deactivate(job)
        self._leave(task)
        task.state, task.reason, task.failure = "failed", reason, failure
        self.on_change()

    def _leave(self, task: SimTask) -> None:
        inst = self.instances[task.instance] if task.instance else None
        task.epoch += 1
        if inst is not None:
            spec = next(t for t in self.jobs[task.job_id].spec.tasks if t.task_id == task.task_id)
            demand = spec.demand_on(inst.itype.family)
            assert demand is not None
            inst.used = [u - d for u, d in zip(inst.used, demand, strict=True)]
            inst.tasks.pop(task.task_id, None)
            if inst.running.pop(task.task_id, "absent") != "absent":
                self._reprice(inst)
        task.instance = None

    def _deactivate(self, job: SimJob) -> None:
        if job.active:
            self._settle(job)
            job.active = False
            job.rate = 0.0
            job.generation += 1

    # -- progress -------------------------------------------------------------

    def _settle(self, job: SimJob) -> None:
        now = self.engine.now()
        if job.active:
            job.done += job.rate * (now - job.since)
            job.active_seconds += now - job.since
            job.unsaved_seconds += now - job.since
        job.since = now

    def _reprice(self, inst: SimInstance) -> None:
        """Throughputs changed on `inst`: update every job with a task running there."""
        for job_id in {self.tasks[t].job_id for t in inst.running}:
            job = self.jobs[job_id]
            if job.active:
                self._rate(job)

    def task_throughput(self, task_id: str) -> float:
        task = self.tasks[task_id]
        inst = self.instances[task.instance]  # type: ignore[index]
        others = [self.tasks[t].workload for t in inst.running if t != task_id]
        return self.truth.throughput(task.workload, others)

    def _rate(self, job: SimJob) -> None:
        """Bring the job up to date and reschedule its completion at the new pace."""
        self._settle(job)
        job.tput = min(self.task_throughput(t.task_id) for t in job.spec.tasks)
        job.rate = job.speed * job.tput
        job.generation += 1
        generation = job.generation
        remaining = max(0.0, job.total - job.done)
        delay = remaining / job.rate if job.rate > 0 else math.inf
        if math.isfinite(delay):
            self.engine.after(delay, lambda: self._complete(job, generation))

    def _complete(self, job: SimJob, generation: int) -> None:
        if job.generation != generation or not job.active:
            return
        self._settle(job)
        job.done = job.total
        job.active = False
        job.completed_at = self.engine.now()
        for t in job.spec.tasks:
            task = self.tasks[t.task_id]
            self._leave(task)
            task.state = "completed"
        self.jobs_completed += 1
        self.on_change()

    def progress_of(self, job: SimJob) -> float:
        if job.active:
            return job.done + job.rate * (self.engine.now() - job.since)
        return job.done


class SimulatedCloud:
    """`Cloud` binding over the simulated world."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.availability = AvailabilityCache()
        # Each live instance's view as last listed, with the state it was made in: a
        # view is immutable and the state is all of it that changes, so a listing
        # (every step's) makes a new one only for an instance whose state moved.
        self._views: dict[str, tuple[str, CloudInstance]] = {}

    def catalog(self) -> Catalog:
        return self.world.catalog

    def launch(self, request: LaunchRequest) -> CloudInstance:
        now = self.world.engine.now()
        if self.availability.is_unavailable(request.instance_type, None, now):
            raise InsufficientCapacity(request.instance_type, (), "cooling down")
        spot = self.world.spot
        if spot is not None and spot.unavailable(self.world.catalog[request.instance_type], now):
            # Backed off as the daemon's bindings do (`AvailabilityCache.mark`): the
            # trace's outage end is not something a client of a cloud can know.
            self.availability.mark(request.instance_type, None, now, "InsufficientInstanceCapacity")
            raise InsufficientCapacity(request.instance_type, (), "no spot capacity (trace)")
        if request.instance_type in self.world.no_capacity:
            self.availability.mark(request.instance_type, None, now, "InsufficientInstanceCapacity")
            raise InsufficientCapacity(request.instance_type, (), "InsufficientInstanceCapacity")
        return _cloud_view(self.world.launch(request))

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for cloud_id in instance_ids:
            self.world.terminate(cloud_id)

    def list(self) -> list[CloudInstance]:
        views = self._views
        listed = []
        for inst in self.world.live.values():
            known = views.get(inst.cloud_id)
            if known is None or known[0] != inst.state:
                known = views[inst.cloud_id] = (inst.state, _cloud_view(inst))
            listed.append(known[1])
        if len(views) > 2 * len(listed) + 64:  # forget the terminated ones, now and then
            live = {i.cloud_id for i in self.world.live.values()}
            self._views = {cid: v for cid, v in views.items() if cid in live}
        return listed

    def unavailable(self) -> builtins.list[UnavailableOffering]:
        return self.availability.offerings(self.world.engine.now())


def _cloud_view(inst: SimInstance) -> CloudInstance:
    return CloudInstance(
        inst.cloud_id,
        inst.itype.name,
        inst.state,  # type: ignore[arg-type]
        None,
        inst.token,
        inst.launched_at,
    )


class SimulatedExecutor:
    """`Executor` binding over the simulated world (instances are named by token).

    Throughput is reported raw (iterations per second), as a worker would; the
    world computes it from the hidden interference the planner never sees.
    """

    def __init__(self, world: World) -> None:
        self.world = world

    def start(self, launch: TaskLaunch) -> None:
        self.world.start(launch.task_id, launch.instance_id, launch.attempt)

    def stop(self, task_id: str, attempt: int) -> None:
        task = self.world.tasks[task_id]
        if task.attempt == attempt and task.state in ("starting", "running"):
            self.world.stop(task_id)

    def report(self) -> ExecutorReport:
        world = self.world
        tasks: dict[str, TaskReport] = {}
        world_tasks, jobs = world.tasks, world.jobs
        progress: dict[str, float] = {}  # per job: its tasks report the same progress
        for task_id in world.reported:
            task = world_tasks[task_id]
            job_id = task.job_id
            job = jobs[job_id]
            done = progress.get(job_id)
            if done is None:
                done = progress[job_id] = world.progress_of(job)
            state = task.state
            if state == "failed":
                reason, failure = task.reason, task.failure
            else:
                reason, failure = "", None
            tasks[task_id] = TaskReport(
                task_id,
                "stopped" if state == "new" else state,  # type: ignore[arg-type]
                task.instance,
                task.attempt,
                done,
                job.rate if job.active and state == "running" else None,
                task.checkpoint,
                reason=reason,
                failure=failure,
            )
        notices = {}
        if world.spot is not None:
            noticed = world.spot.noticed
            for token in [t for t in noticed if t not in world.live]:
                del noticed[token]  # gone: nothing more to say about it
            notices = {
                token: (InstanceNotice(INSTANCE_ACTION, "terminate", f"{at:.0f} s"),)
                for token, at in noticed.items()
            }
        return ExecutorReport(tasks, frozenset(world.ready), notices=notices)

    def acknowledge(self, task_id: str, attempt: int) -> None:
        task = self.world.tasks[task_id]
        if task.attempt == attempt and task.state in TERMINAL_TASK_STATES:
            self.world.reported.pop(task_id, None)

    def release(self, instance_id: str) -> None:
        """Nothing to forget: the simulated workers go with their instances."""


def ground_truth(contention: ThroughputTable | None, default: float = 0.95) -> ThroughputTable:
    """The hidden interference model: the contention matrix's pairs, `default` elsewhere."""
    if contention is None:
        return ThroughputTable(default=default)
    return contention.with_default(default)
