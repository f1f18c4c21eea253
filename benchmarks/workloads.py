"""Task sets for benchmarks, sampled from the bundled pai_200 trace."""

from __future__ import annotations

import random
from dataclasses import replace

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec, TaskSpec
from autoscaler.resources import Resources


def pai_catalog_and_jobs() -> tuple[Catalog, tuple[JobSpec, ...]]:
    catalog = load_catalog(bundled("ec2_config.json"))
    return catalog, load_jobs(bundled("pai_200.json"), catalog)


def sample_jobs(source: tuple[JobSpec, ...], n: int, seed: int = 0) -> tuple[JobSpec, ...]:
    """`n` single-task jobs whose demand vectors and workloads are drawn from `source`."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        template = rng.choice(source)
        job_id = str(i)
        tasks = tuple(
            replace(t, task_id=f"{job_id}/{k}", job_id=job_id) for k, t in enumerate(template.tasks)
        )
        base = template.name.split("[", 1)[0]
        jobs.append(replace(template, job_id=job_id, name=f"{base}[{i}]", tasks=tasks))
    return tuple(jobs)


def _users(rng: random.Random) -> tuple[float, float, float]:
    return rng.choice((0, 1)), round(rng.uniform(0.5, 16), 2), round(rng.uniform(1, 60), 2)


def _cpu(rng: random.Random) -> tuple[float, float, float]:
    return 0, round(rng.uniform(0.5, 48), 3), round(rng.uniform(1, 192), 3)


def _small(rng: random.Random) -> tuple[float, float, float]:
    return 0, round(rng.uniform(0.1, 1), 4), round(rng.uniform(0.1, 4), 4)


def _memory(rng: random.Random) -> tuple[float, float, float]:
    return 0, round(rng.uniform(1, 16), 3), round(rng.uniform(100, 1000), 3)


def _gpu_mix(rng: random.Random) -> tuple[float, float, float]:
    if rng.random() < 0.3:
        g = rng.choice((1, 2, 4, 8))
        return g, round(rng.uniform(1, 4 * g), 3), round(rng.uniform(4, 61 * g), 3)
    cpu = rng.uniform(0.25, 16)
    return 0, round(cpu, 3), round(cpu * rng.uniform(1, 16), 3)


#: Distributions of distinct demand vectors [GPU, CPU, RAM GB], each drawn uniformly:
#: `users` 0–1 GPU, 0.5–16 CPU, 1–60 GB, in hundredths, as users write them;
#: `cpu` 0.5–48 CPU, 1–192 GB (up to half the largest CPU type); `small` 0.1–1 CPU,
#: 0.1–4 GB; `memory` 1–16 CPU, 100–1,000 GB; `gpu-mix` 30% 1, 2, 4 or 8 GPUs with up
#: to 4 CPU and 61 GB per GPU (a p3's share), the rest 0.25–16 CPU at 1–16 GB per CPU.
SHAPES = {"users": _users, "cpu": _cpu, "small": _small, "memory": _memory, "gpu-mix": _gpu_mix}


def distinct_jobs(n: int, seed: int = 0, shape: str = "users") -> tuple[JobSpec, ...]:
    """`n` single-task jobs with (almost surely) pairwise distinct demand vectors drawn
    from one of `SHAPES`."""
    draw = SHAPES[shape]
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        job_id = str(i)
        task = TaskSpec(
            f"{job_id}/0", job_id, "node0", f"w{i % 7}_node0", (("any", Resources(*draw(rng))),)
        )
        jobs.append(JobSpec(job_id, f"w{i % 7}[{i}]", (task,)))
    return tuple(jobs)
