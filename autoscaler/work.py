"""A job's work: the one definition the simulator, every bound and every report read.

A trace may state a job's work twice: `duration` (seconds alone at full speed)
and `total_iters` at `full_throughput` iterations per second. The simulated
world advances iterations, so when both are given the work is
`total_iters / full_throughput` and `duration` must agree with it to within
one iteration: `total_iters` is a whole count rounded from
`duration × full_throughput`. In Eva's bundled traces 194 of pai_200's 200 jobs
and 6,167 of the full trace's 6,274 differ, every one by less than one
iteration (up to 120 s for the slowest workload, at 0.0083 iterations/s); a
trace that disagrees by more says two different things, and is refused
rather than replayed under one reading and bounded under the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autoscaler.errors import InputError
from autoscaler.jobs import JobSpec

#: How far `total_iters` may sit from `duration × full_throughput`: one iteration,
#: the rounding of a whole iteration count (plus float noise on huge counts).
WORK_TOLERANCE_ITERS = 1.0


@dataclass(frozen=True, slots=True)
class Work:
    """A job's work alone at full speed: iterations, and iterations per second.

    A trace giving only `duration` is `duration` iterations at one per second.
    """

    iterations: float
    speed: float

    @property
    def seconds(self) -> float:
        """Running time alone at full speed."""
        return self.iterations / self.speed


def job_work(job: JobSpec, source: str | None = None) -> Work:
    """The job's work; InputError when the trace gives none, or two that disagree."""
    facts = job.trace
    speed = job.full_throughput
    if facts.total_iters is not None and speed is not None:
        if facts.duration_s is not None:
            gap = abs(facts.total_iters - facts.duration_s * speed)
            if gap > WORK_TOLERANCE_ITERS + 1e-9 * facts.total_iters:
                raise InputError(
                    f"'duration' = {facts.duration_s:g} s but 'total_iters' / "
                    f"'full_throughput' = {facts.total_iters:g} / {speed:g} = "
                    f"{facts.total_iters / speed:g} s; they must agree to within one "
                    "iteration (give one of them, or correct the other)",
                    source=source,
                    where=f"job {job.job_id!r}",
                )
        return Work(facts.total_iters, speed)
    if facts.duration_s is not None:
        return Work(facts.duration_s, 1.0)
    raise InputError(
        "has no work: a replay needs 'duration' or 'total_iters' and 'full_throughput'",
        source=source,
        where=f"job {job.job_id!r}",
        field="duration",
    )


def solo_seconds(job: JobSpec) -> float:
    """Seconds the job runs alone at full speed (see `job_work`)."""
    return job_work(job).seconds


def check_work(jobs: Iterable[JobSpec], source: str | None = None) -> None:
    """Refuse, before a replay or a bound starts, any job `job_work` would refuse."""
    for job in jobs:
        job_work(job, source)
