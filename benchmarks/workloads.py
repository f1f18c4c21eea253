"""Task sets for benchmarks, sampled from the bundled pai_200 trace."""

from __future__ import annotations

import random
from dataclasses import replace

from autoscaler.bundled import bundled
from autoscaler.catalog import Catalog
from autoscaler.files import load_catalog, load_jobs
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


def distinct_jobs(n: int, seed: int = 0) -> tuple[JobSpec, ...]:
    """`n` single-task jobs with (almost surely) pairwise distinct demand vectors:
    0 or 1 GPU, 0.5–16 CPU and 1–60 GB in hundredths, as users write them."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        demand = Resources(
            rng.choice((0, 1)), round(rng.uniform(0.5, 16), 2), round(rng.uniform(1, 60), 2)
        )
        job_id = str(i)
        task = TaskSpec(f"{job_id}/0", job_id, "node0", f"w{i % 7}_node0", (("any", demand),))
        jobs.append(JobSpec(job_id, f"w{i % 7}[{i}]", (task,)))
    return tuple(jobs)
