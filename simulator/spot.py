"""Spot reclaims in the simulated world.

An instance of a spot offering is reclaimed either at a random time drawn from its
offering's `interruption_per_hour` (exponential lifetimes, seeded per instance so a
replay is reproducible whatever the event order), or by an availability trace in
Can't Be Late's format (NSDI '24): `{"metadata": {"gap_seconds": 600}, "data": [0,
1, …]}`, one sample per interval, 1 = no spot capacity — running instances of the
offering are reclaimed at the interval's start and none launches during it; a trace
shorter than the replay repeats.

A reclaim comes with EC2's two-minute notice, and the world does what the worker
agent does with one (`executor.agent`): it reports the notice, and checkpoints and
stops the instance's tasks at once — a planned stop, so nothing is lost when the
checkpoint is uploaded before the instance goes (the trace's kill and upload delays
take seconds; a notice given less than that before the reclaim, as for an instance
launched inside the window, can be too late). The agent sees the notice at its next
poll (`NOTICE_POLL_S`, the latest it can), and the daemon replans as it hears it.
Whatever still runs when the reclaim lands ends as an `infrastructure` failure
(never counted against the job) and resumes from its newest checkpoint. Checkpoints
are also periodic, every `checkpoint_every_s` of the job's running time (the job's
own, else the default); the work since the newest one is lost and counted
(`SpotStats`). Without checkpoints (the SkyPilot-like baseline) a notice saves
nothing: every stop loses all the work done, every restart starts from scratch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscaler.availability import AvailabilityTrace
from autoscaler.catalog import InstanceType
from autoscaler.errors import InputError
from autoscaler.jobs import DEFAULT_CHECKPOINT_EVERY_S, JobSpec
from autoscaler.spot import NOTICE_POLL_S, NOTICE_S

if TYPE_CHECKING:
    from simulator.world import SimInstance, SimJob, World


def parse_trace_flag(value: str) -> tuple[str, str]:
    """`TYPE[@ZONE]=FILE` -> (offering key, file)."""
    key, sep, path = value.partition("=")
    if not sep or not key or not path:
        raise InputError(f"--spot-trace takes TYPE[@ZONE]=FILE, not {value!r}")
    return key, path


def trace_key_matches(key: str, itype: InstanceType) -> bool:
    """`TYPE` names every zone's spot offering of that EC2 type; `TYPE@ZONE` one zone."""
    ec2_type, _, zone = key.partition("@")
    return ec2_type == itype.launch_type and (not zone or zone == itype.zone)


@dataclass(slots=True)
class SpotStats:
    """What reclaims cost a replay."""

    interruptions: int = 0
    lost_task_seconds: float = 0.0  # task-seconds of work redone
    lost_gpu_seconds: float = 0.0
    lost_cpu_seconds: float = 0.0


@dataclass
class SpotWorld:
    """Reclaims and checkpoints for a `World` (installed as `world.spot`)."""

    world: World
    seed: int = 0
    traces: Mapping[str, AvailabilityTrace] = field(default_factory=dict)
    rate_per_hour: float | None = None  # every spot offering's rate (None: its own)
    checkpoints: bool = True  # periodic checkpoints (False: restart from scratch)
    on_reclaim: Callable[[], None] | None = None  # the daemon's immediate replan
    on_notice: Callable[[], None] | None = None  # the daemon's replan on a notice
    stats: SpotStats = field(default_factory=SpotStats)

    def __post_init__(self) -> None:
        self._intervals: dict[str, float | None] = {}
        # (when, offering) of every reclaim, oldest first: the interruption history the
        # daemon keeps in its state, which the replay's learned rates read (`reclaims_since`)
        self.reclaimed: list[tuple[float, str]] = []
        # live instances under a notice (token -> when the reclaim lands), which their
        # agents report (`SimulatedExecutor.report`)
        self.noticed: dict[str, float] = {}

    def reclaims_since(self, since: float) -> dict[str, int]:
        """Reclaims per offering at or after `since` (as `Store.interruption_counts`)."""
        counts: dict[str, int] = {}
        for at, offering in self.reclaimed:
            if at >= since:
                counts[offering] = counts.get(offering, 0) + 1
        return counts

    def _trace(self, itype: InstanceType) -> AvailabilityTrace | None:
        for key, trace in self.traces.items():
            if "@" in key and trace_key_matches(key, itype):
                return trace
        for key, trace in self.traces.items():
            if "@" not in key and trace_key_matches(key, itype):
                return trace
        return None

    def unavailable(self, itype: InstanceType, now: float) -> bool:
        """No spot capacity for this offering now (its trace says 1)."""
        if not itype.is_spot:
            return False
        trace = self._trace(itype)
        return trace is not None and trace.unavailable(now)

    def interval(self, job: JobSpec) -> float | None:
        """Seconds of running time between the job's periodic checkpoints (None: none)."""
        if not self.checkpoints:
            return None
        cached = self._intervals.get(job.job_id, -1.0)
        if cached != -1.0:
            return cached
        every = [t.run.checkpoint_every_s for t in job.tasks if t.run.checkpoint_every_s]
        value = min(every) if every else DEFAULT_CHECKPOINT_EVERY_S
        self._intervals[job.job_id] = value
        return value

    # -- events -----------------------------------------------------------------------

    def acquired(self, inst: SimInstance) -> None:
        """A spot instance is running: schedule its reclaim."""
        now = self.world.engine.now()
        trace = self._trace(inst.itype)
        if trace is not None:
            at = trace.next_unavailable(now)
            if at is None:
                return
            notice = max(now, at - NOTICE_S)
        else:
            rate = (
                self.rate_per_hour
                if self.rate_per_hour is not None
                else inst.itype.interruption_per_hour
            )
            if rate <= 0:
                return
            draw = random.Random(f"{self.seed}:{inst.token}").random()
            notice = now + -math.log1p(-draw) / rate * 3600.0
            at = notice + NOTICE_S
        engine = self.world.engine

        def noticed() -> None:
            self.notice(inst, at)
            engine.at(max(at, engine.now()), lambda: self.reclaim(inst))

        # the agent sees the notice at its next poll of the metadata service
        engine.at(min(notice + NOTICE_POLL_S, max(at, now)), noticed)

    def notice(self, inst: SimInstance, at: float) -> None:
        """The two-minute notice: the agent reports it, and checkpoints and stops the
        instance's tasks (abandoning those still starting; a job that does not
        checkpoint loses its work there)."""
        world = self.world
        if inst.state in ("shutting-down", "terminated"):
            return
        self.noticed[inst.token] = at
        # counted here: the instance is lost from now on, even when the daemon
        # terminates it, emptied, before the provider takes it
        self.stats.interruptions += 1
        self.reclaimed.append((world.engine.now(), inst.itype.name))
        for task_id in list(inst.tasks):
            if world.tasks[task_id].state in ("starting", "running"):
                world.stop(task_id)
        world.on_change()
        if self.on_notice is not None:
            self.on_notice()

    def checkpointed(self, job: SimJob) -> None:
        """A planned stop uploaded a checkpoint: nothing before it is lost."""
        if self.checkpoints:
            job.saved = job.done
            job.unsaved_seconds = 0.0
        else:
            self._lose(job, job.done - job.saved, job.unsaved_seconds, ())

    def reclaim(self, inst: SimInstance) -> None:
        """The provider takes the instance back: its tasks end (infrastructure), each
        job goes back to its newest checkpoint, and the instance is gone."""
        world = self.world
        if inst.state in ("shutting-down", "terminated"):
            return
        hit: dict[str, SimJob] = {}
        for task_id in list(inst.tasks):
            task = world.tasks[task_id]
            if task.state in ("starting", "running", "checkpointing"):
                hit.setdefault(task.job_id, world.jobs[task.job_id])
        rates = {job_id: job.rate for job_id, job in hit.items()}
        families = {job_id: inst.itype.family for job_id in hit}
        for task_id in list(inst.tasks):
            task = world.tasks[task_id]
            if task.state in ("starting", "running", "checkpointing"):
                world.crash(task_id, "spot instance reclaimed", "infrastructure")
        for job_id, job in hit.items():
            self._rollback(job, rates[job_id], families[job_id])
        inst.state = "terminated"
        inst.ready = False
        inst.terminated_at = world.engine.now()
        world.ready.discard(inst.token)
        world.live.pop(inst.token, None)
        world.on_change()
        if self.on_reclaim is not None:
            self.on_reclaim()

    def _rollback(self, job: SimJob, rate: float, family: str) -> None:
        """Back to the newest checkpoint: the periodic one within the unsaved running
        time, else the last saved one; the work since is lost."""
        unsaved = job.unsaved_seconds
        every = self.interval(job.spec)
        lost_s = unsaved if every is None or unsaved < every else unsaved % every
        if every is not None and unsaved >= every:
            lost_iters = min(job.done - job.saved, rate * lost_s)
        else:
            lost_iters = job.done - job.saved
        self._lose(job, lost_iters, lost_s, (family,))

    def _lose(
        self, job: SimJob, iterations: float, seconds: float, families: tuple[str, ...]
    ) -> None:
        job.done = max(0.0, job.done - max(0.0, iterations))
        job.saved = job.done
        job.unsaved_seconds = 0.0
        if seconds <= 0:
            return
        tasks = job.spec.tasks
        self.stats.lost_task_seconds += seconds * len(tasks)
        for t in tasks:
            demand = t.demand_on(families[0]) if families else None
            if demand is None:
                demand = t.demands[0][1]
            self.stats.lost_gpu_seconds += seconds * demand.gpu
            self.stats.lost_cpu_seconds += seconds * demand.cpu
