"""Plain-data builders for tests: catalogs, jobs and snapshots without files."""

from __future__ import annotations

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import JobSpec, TaskSpec, workload_key
from autoscaler.resources import Resources


def itype(
    name: str, gpu: float, cpu: float, ram: float, cost: float, family: str = "f"
) -> InstanceType:
    return InstanceType(name, family, Resources(gpu, cpu, ram), cost)


def table3_catalog() -> Catalog:
    """Instance types of Eva's Table 3(a)."""
    return Catalog(
        [
            itype("it1", 4, 16, 244, 12.0),
            itype("it2", 1, 4, 61, 3.0),
            itype("it3", 0, 8, 32, 0.8),
            itype("it4", 0, 4, 16, 0.4),
        ]
    )


def job(
    job_id: str,
    *demands: tuple[float, float, float],
    name: str | None = None,
    family: str = "any",
    **fields,
) -> JobSpec:
    """A job with one task per demand vector; task i is `<job_id>/<i>`."""
    name = name or f"w{job_id}"
    tasks = tuple(
        TaskSpec(
            task_id=f"{job_id}/{i}",
            job_id=job_id,
            name=f"node{i}",
            workload=workload_key(name, f"node{i}"),
            demands=((family, Resources(*d)),),
        )
        for i, d in enumerate(demands)
    )
    return JobSpec(job_id=job_id, name=name, tasks=tasks, **fields)


def table3_jobs() -> tuple[JobSpec, ...]:
    """Tasks τ1..τ4 of Eva's Table 3(b), one single-task job each (task ids `tN/0`)."""
    return (
        job("t1", (2, 8, 24)),
        job("t2", (1, 4, 10)),
        job("t3", (0, 6, 20)),
        job("t4", (0, 4, 12)),
    )


def running(instance_id: str, instance_type: InstanceType, *tasks: str) -> Instance:
    return Instance(instance_id, instance_type, tuple(tasks))


def configuration(*instances: Instance) -> Configuration:
    return Configuration(tuple(instances))


def placement(config: Configuration) -> list[tuple[str, tuple[str, ...]]]:
    """(type name, tasks) of every instance, sorted: compare plans without ids."""
    return sorted((i.type.name, tuple(sorted(i.tasks))) for i in config)


class KeepPlanner:
    """A planner that keeps the current configuration as it is (tests of the round's
    handling of the world, where planning is beside the point)."""

    name = "keep"

    def plan(self, view):
        from autoscaler.planner import Plan

        return Plan(view.current, "partial", (), 0.0, 0.0, "keep everything")


class NullExecutor:
    """An executor with no workers: it runs nothing and reports nothing."""

    def __init__(self) -> None:
        from autoscaler.execution import ExecutorReport

        self.calls: list[tuple] = []
        self._report = ExecutorReport()

    def start(self, launch) -> None:
        self.calls.append(("start", launch.task_id, launch.attempt))

    def stop(self, task_id: str, attempt: int) -> None:
        self.calls.append(("stop", task_id, attempt))

    def report(self):
        return self._report

    def acknowledge(self, task_id: str, attempt: int) -> None:
        self.calls.append(("acknowledge", task_id, attempt))

    def release(self, instance_id: str) -> None:
        self.calls.append(("release", instance_id))


class Ticking:
    """A `Clock` over a callable (the provisioner tests' hand-moved clock)."""

    def __init__(self, now) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()
