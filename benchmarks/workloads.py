"""Task sets for benchmarks, sampled from the bundled pai_200 trace."""

from __future__ import annotations

import random
from dataclasses import replace

from autoscaler.bundled import bundled
from autoscaler.catalog import Catalog
from autoscaler.files import load_catalog, load_jobs
from autoscaler.jobs import JobSpec


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
