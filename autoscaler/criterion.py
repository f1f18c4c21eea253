"""Choosing between Full and Partial Reconfiguration (Eva §4.5).

Full is adopted when `S_F·D − M_F > S_P·D − M_P`: S is a configuration's
provisioning saving per hour (Σ over instances of TNRP − cost), M the one-off
cost of getting there (migrating jobs and starting new instances), D how long
the configuration will last. D is unknown; with events (job arrivals and
completions) as a Poisson process of rate λ, each triggering a Full
Reconfiguration with probability p, the expected time to the next Full is
`D̂ = −1 / (λ · ln(1 − p))`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscaler.configuration import Configuration
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.pricing import PriceBook
from autoscaler.view import MeasuredDelays, ReconfigurationHistory


def expected_duration_h(history: ReconfigurationHistory) -> float:
    """D̂ in hours: expected time until the next Full Reconfiguration.

    Before any event, or before any Full was adopted (p = 0, where the formula
    is infinite), Eva's reference uses the elapsed time. With p = 1 every event
    triggers a Full, so the configuration lasts until the next event: 1/λ.
    """
    elapsed_h = history.elapsed_s / 3600.0
    if history.event_rounds <= 0 or history.full_rounds <= 0 or elapsed_h <= 0:
        return elapsed_h
    rate = history.event_rounds / elapsed_h
    p = min(history.full_rounds / history.event_rounds, 1.0)
    if p >= 1.0:
        return 1.0 / rate
    return -1.0 / (rate * math.log(1.0 - p))


@dataclass(frozen=True, slots=True)
class MigrationCost:
    """What moving from the current configuration to a target costs, once ($)."""

    migration_dollars: float  # moved jobs' value lost while they checkpoint and relaunch
    launch_dollars: float  # new instances paid for while they start up
    moved_jobs: int
    moved_tasks: int
    launched_instances: int

    @property
    def dollars(self) -> float:
        return self.migration_dollars + self.launch_dollars


def move_delay_s(
    job: JobSpec, moves: Sequence[tuple[TaskSpec, str, str | None]], delays: MeasuredDelays
) -> float:
    """How long a job stalls while these of its tasks move (s), each (task, the type it
    leaves, the type it lands on — None when the target does not place it).

    Eva §4.5: the moved tasks checkpoint (kill, then upload the checkpoint), then
    relaunch (fetch, build the image, start) and the job initializes; the slowest
    task sets each stage's pace. Each delay is the one measured on the type it runs
    on where there is one (`MeasuredDelays`), else the job's assumed one (its spec,
    defaulting to Table 1's averages; a container start is assumed instant).
    """

    def phase(instance_type: str | None, name: str, assumed: float) -> float:
        measured = delays.seconds(instance_type, name)
        return assumed if measured is None else measured

    checkpoint = max(
        phase(src, "checkpoint", t.kill_s) + phase(src, "upload", t.upload_s) for t, src, _ in moves
    )
    init = max(phase(dst, "init", job.init_delay_s) for _, _, dst in moves)
    relaunch = max(
        phase(dst, "fetch", t.fetch_s)
        + phase(dst, "build", t.build_image_s)
        + phase(dst, "start", 0.0)
        for t, _, dst in moves
    )
    return checkpoint + init + relaunch


def migration_cost(
    current: Configuration,
    target: Configuration,
    jobs: Mapping[str, JobSpec],
    prices: PriceBook,
    delays: MeasuredDelays | None = None,
) -> MigrationCost:
    """M: Σ over moved jobs of (checkpoint + relaunch delay) × the job's hourly value,
    plus each newly launched instance's cost during its start-up delay.

    A job's hourly value is its reservation price RP(j) — what running it for an
    hour is worth — or, with spot offerings, its on-demand RP (`PriceBook.job_value`:
    a job's hour is not worth less because spot makes its instance cheaper). A task
    moves when it is on an instance now and the target puts it elsewhere; tasks not
    yet on any instance start anyway and cost no migration. `delays` are the phase
    durations measured per instance type (`move_delay_s`); none measured, the jobs'
    assumed delays price the move.
    """
    measured = delays or MeasuredDelays()
    now = current.assignment()
    then = target.assignment() if now else {}
    job_of = {t.task_id: j for j in jobs.values() for t in j.tasks} if now else {}
    moved: dict[str, list[tuple[TaskSpec, str, str | None]]] = {}
    for task_id, inst in now.items():
        if inst.instance_id is None or task_id not in job_of:
            continue
        dest = then.get(task_id)
        if dest is None or dest.instance_id != inst.instance_id:
            job = job_of[task_id]
            landing = None if dest is None else dest.type.name
            moved.setdefault(job.job_id, []).extend(
                (t, inst.type.name, landing) for t in job.tasks if t.task_id == task_id
            )
    migration = sum(
        move_delay_s(jobs[j], moves, measured) / 3600.0 * prices.job_value(jobs[j])
        for j, moves in moved.items()
    )
    moved_tasks = sum(len(moves) for moves in moved.values())
    new = [inst for inst in target if inst.instance_id is None]
    launch = sum(i.type.hourly_cost * i.type.launch_delays.startup_s / 3600.0 for i in new)
    return MigrationCost(migration, launch, len(moved), moved_tasks, len(new))
