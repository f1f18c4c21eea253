"""Job traces: Eva's JSON format in and out, and seeded synthesis.

Synthesis follows Eva §6.1 and §6.7: Poisson arrivals; Gavel-style durations
(10^x minutes, x uniform in [1.5, 3] with probability 0.8 and in [3, 4]
otherwise); each job's demands, workload and delays copied from a job of a
source trace chosen at random; optionally, a share of jobs made multi-task by
duplicating their task into 2 or 4 tasks of the same workload.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from autoscaler.errors import InputError
from autoscaler.jobs import JobSpec
from autoscaler.work import job_work


def synthesize(
    source: Sequence[JobSpec],
    n_jobs: int,
    seed: int = 0,
    arrivals_per_hour: float = 3.0,
    multi_task_share: float = 0.0,
    task_counts: Sequence[int] = (2, 4),
) -> dict[str, Any]:
    """A trace of `n_jobs` jobs in Eva's JSON format, reproducible from `seed`.

    A `multi_task_share` of the single-task templates become data-parallel
    jobs of a task count drawn from `task_counts` (Eva §6.7 uses 2 and 4).
    """
    if n_jobs < 1:
        raise ValueError("n_jobs must be at least 1")
    if arrivals_per_hour <= 0:
        raise ValueError("arrivals_per_hour must be positive")
    if not 0.0 <= multi_task_share <= 1.0:
        raise ValueError("multi_task_share must be in [0, 1]")
    if not task_counts or min(task_counts) < 1:
        raise ValueError("task_counts must be positive")
    rng = random.Random(seed)
    trace: dict[str, Any] = {}
    clock = 0.0
    for n in range(n_jobs):
        clock += rng.expovariate(arrivals_per_hour / 3600.0)
        template = rng.choice(source)
        x = rng.uniform(1.5, 3.0) if rng.random() < 0.8 else rng.uniform(3.0, 4.0)
        duration = round(10**x * 60.0)
        speed = template.full_throughput or 1.0
        copies = rng.choice(tuple(task_counts)) if rng.random() < multi_task_share else 1
        base = template.name.split("[", 1)[0]
        job_id = str(n)
        tasks = {}
        for k in range(copies if len(template.tasks) == 1 else 1):
            for i, task in enumerate(template.tasks):
                task_key = f"{k * len(template.tasks) + i}"
                tasks[task_key] = {
                    # copies keep the workload of the task they copy
                    "name": task.name,
                    "demand": {family: list(d) for family, d in task.demands},
                    "fetch_delay": task.fetch_s,
                    "build_image_delay": task.build_image_s,
                    "kill_delay": task.kill_s,
                    "upload_delay": task.upload_s,
                    **({"image_id": task.run.image} if task.run.image is not None else {}),
                }
        trace[job_id] = {
            "name": f"{base}[{n}]",
            "arrival_time": round(clock),
            "duration": duration,
            "init_delay": template.init_delay_s,
            "full_throughput": speed,
            "total_iters": duration * speed,
            "tasks": tasks,
        }
    return trace


#: Arrivals later than this (about three years in seconds) are taken for Unix timestamps.
TIMESTAMP_LIKE_S = 1e8


def start_at_first_arrival(
    jobs: Sequence[JobSpec], threshold_s: float = TIMESTAMP_LIKE_S
) -> tuple[tuple[JobSpec, ...], float]:
    """Jobs whose arrivals look like Unix timestamps, shifted to start at the first
    arrival (a replay would otherwise simulate decades of empty rounds); returns the
    jobs and the offset taken off (0 when nothing was shifted)."""
    first = min((j.trace.arrival_time_s for j in jobs), default=0.0)
    if first < threshold_s:
        return tuple(jobs), 0.0
    shifted = tuple(
        replace(j, trace=replace(j.trace, arrival_time_s=j.trace.arrival_time_s - first))
        for j in jobs
    )
    return shifted, first


#: A replay simulates rounds every few minutes: a trace spanning more than this (a job
#: lasting decades, arrivals years apart) is a mistake that would run for hours.
MAX_REPLAY_SPAN_S = 366 * 86400.0


def check_replay_span(jobs: Sequence[JobSpec], source: str) -> None:
    """Refuse a trace a replay could not finish in reasonable time, naming the job and field."""
    for job in jobs:
        facts = job.trace
        # As the simulated world reads it (`autoscaler.work`).
        work = job_work(job, source).seconds
        iterated = facts.total_iters is not None and job.full_throughput is not None
        work_field = "total_iters / full_throughput" if iterated else "duration"
        for field, seconds in (("arrival_time", facts.arrival_time_s), (work_field, work)):
            if seconds is not None and seconds > MAX_REPLAY_SPAN_S:
                days = seconds / 86400
                shown = f"{days:,.0f}" if days < 1e6 else f"{days:.2g}"
                raise InputError(
                    f"is {shown} days; a replay covers at most a year "
                    "(are these milliseconds, or a Unix timestamp in a duration?)",
                    source=source,
                    where=f"job {job.job_id!r}",
                    field=field,
                    value=seconds,
                    has_value=True,
                )
