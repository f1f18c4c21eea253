"""A steady round against a from-scratch one: 10,000 active tasks, 1% churn.

The tasks are sampled from pai_200's demand vectors and workloads, plus a share
of held-out shapes (`workloads.HELD_OUT`, distinct vectors); a first plan onto
an empty cluster becomes the running configuration. Then 1% of the jobs finish
and as many new ones arrive (drawn the same way), and the same planner plans
the changed state — the steady round — while a fresh planner plans it too, in
the same process: its time is the from-scratch cost of that very state. The
ratio is CPU time (`time.process_time`), best of `--repeats` churn steps, each
timed on its own; both plans must agree to the cent.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TypeVar

from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import JobSpec
from autoscaler.planner import EvaPlanner, Plan
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from benchmarks.workloads import HELD_OUT, distinct_jobs, pai_catalog_and_jobs, sample_jobs

T = TypeVar("T")


def churn_jobs(n: int, held_out: float, seed: int, prefix: str) -> list[JobSpec]:
    """`n` single-task jobs: a `held_out` share of held-out shapes, the rest from pai_200."""
    _, source = pai_catalog_and_jobs()
    rng = random.Random(seed)
    n_held = round(n * held_out)
    shapes = sorted(HELD_OUT)
    out = list(sample_jobs(source, n - n_held, seed=seed))
    for i in range(n_held):
        out.extend(distinct_jobs(1, seed=seed * 100_003 + i, shape=rng.choice(shapes)))
    renamed = []
    for i, job in enumerate(out):
        job_id = f"{prefix}{i}"
        tasks = tuple(
            replace(t, task_id=f"{job_id}/{k}", job_id=job_id) for k, t in enumerate(job.tasks)
        )
        renamed.append(replace(job, job_id=job_id, tasks=tasks))
    return renamed


def as_running(plan: Plan, prefix: str) -> Configuration:
    """The plan as it runs: every instance it wants has an id."""
    return Configuration(
        tuple(
            Instance(inst.instance_id or f"{prefix}{i}", inst.type, inst.tasks)
            for i, inst in enumerate(plan.configuration)
        )
    )


def churned(
    view: ClusterView, fraction: float, held_out: float, step: int, rng: random.Random
) -> ClusterView:
    """`view` after `fraction` of its jobs finished and as many new ones arrived."""
    jobs = list(view.jobs)
    n = max(1, round(len(jobs) * fraction))
    done = set(rng.sample(range(len(jobs)), n))
    finished = {t.task_id for i in done for t in jobs[i].tasks}
    kept = [j for i, j in enumerate(jobs) if i not in done]
    arrived = churn_jobs(n, held_out, seed=10_000 + step, prefix=f"s{step}-")
    current = Configuration(
        tuple(
            Instance(inst.instance_id, inst.type, rest)
            for inst in view.current
            if (rest := tuple(t for t in inst.tasks if t not in finished))
        )
    )
    return replace(view, jobs=tuple(kept + arrived), current=current)


def _cpu(fn: Callable[[], T]) -> tuple[float, T]:
    """(CPU seconds of this process, result) of one call of `fn`."""
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks churn", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=0.01, help="share of jobs replaced")
    parser.add_argument("--held-out", type=float, default=0.05, help="share of held-out shapes")
    parser.add_argument("--default-throughput", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=3, help="churn steps")
    args = parser.parse_args(argv)

    catalog, _ = pai_catalog_and_jobs()
    table = ThroughputTable(default=args.default_throughput)
    jobs = churn_jobs(args.tasks, args.held_out, seed=1, prefix="j")
    view = ClusterView(catalog, tuple(jobs), throughput=table)
    planner = EvaPlanner()
    first_s, plan = _cpu(lambda: planner.plan(view))
    print(f"first round (empty cluster): {first_s:.2f} CPU-s, ${plan.hourly_cost:,.2f}/h")
    view = replace(view, current=as_running(plan, "i0-"))
    rng = random.Random(7)
    ratios = []
    for step in range(1, args.repeats + 1):
        view = churned(view, args.churn, args.held_out, step, rng)
        steady_s, steady = _cpu(partial(planner.plan, view))
        fresh_s, fresh = _cpu(partial(EvaPlanner().plan, view))
        same = (
            round(steady.hourly_cost, 2) == round(fresh.hourly_cost, 2)
            and steady.configuration == fresh.configuration
        )
        ratios.append(steady_s / fresh_s)
        print(
            f"step {step}: steady {steady_s:.2f} CPU-s, from scratch {fresh_s:.2f} CPU-s, "
            f"ratio {steady_s / fresh_s:.3f}; ${steady.hourly_cost:,.2f}/h "
            f"({'same plan' if same else 'DIFFERENT PLAN'})",
            flush=True,
        )
        view = replace(view, current=as_running(steady, f"i{step}-"))
    print(f"\nsteady ÷ from-scratch CPU time: best {min(ratios):.3f}, worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()
