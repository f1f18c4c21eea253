"""A steady round against a from-scratch one: 10,000 active tasks, 1% churn.

The tasks are sampled from pai_200's demand vectors and workloads, plus a share
of held-out shapes (`workloads.HELD_OUT`, distinct vectors); a first plan onto
an empty cluster becomes the running configuration. Then 1% of the jobs finish
and as many new ones arrive (drawn the same way), and the same planner plans
the changed state — the steady round, incremental where `EvaPlanner` allows —
while a fresh planner plans it too, in the same process: its time is the
from-scratch cost of that very state. The ratio is CPU time
(`time.process_time`), each step timed on its own; the steady plan must be
feasible (every active task placed once, no capacity exceeded) and its hourly
cost is compared with the fresh plan's (the gap, in %).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from autoscaler.configuration import Configuration, Instance
from autoscaler.jobs import JobSpec
from autoscaler.planner import EvaPlanner, Plan
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView, ReconfigurationHistory
from benchmarks.feasibility import infeasibilities
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


def infeasible(view: ClusterView, plan: Plan) -> str | None:
    """Why `plan` is not a feasible configuration of `view` (None: it is): every
    active task placed exactly once, on a type its demand fits, within capacity
    (`feasibility.infeasibilities`, its first finding)."""
    problems = infeasibilities(plan, view.jobs, view.catalog)
    return problems[0] if problems else None


@dataclass(frozen=True, slots=True)
class Step:
    """One churn step: the steady planner's and a fresh planner's plan of one state."""

    steady_s: float
    fresh_s: float
    incremental: bool  # the steady planner planned it incrementally
    gap: float  # steady hourly cost ÷ fresh − 1
    steady_cost: float


def run(
    tasks: int,
    steps: int,
    churn: float = 0.01,
    held_out: float = 0.05,
    default_throughput: float = 0.95,
    seed: int = 1,
    elapsed_h: float = 0.0,
    planner: EvaPlanner | None = None,
    report: Callable[[int, Step], None] | None = None,
) -> list[Step]:
    """`steps` churn steps in a row, the steady planner carried along; raises if a
    steady plan is infeasible. `elapsed_h`: the history's elapsed time, which is
    D̂ before any Full (0: Full is never worth a move)."""
    catalog, _ = pai_catalog_and_jobs()
    table = ThroughputTable(default=default_throughput)
    jobs = churn_jobs(tasks, held_out, seed=seed, prefix="j")
    history = ReconfigurationHistory(elapsed_s=elapsed_h * 3600.0)
    view = ClusterView(catalog, tuple(jobs), throughput=table, history=history)
    planner = planner or EvaPlanner()
    plan = planner.plan(view)
    view = replace(view, current=as_running(plan, "i0-"))
    rng = random.Random(seed * 7)
    out = []
    for step in range(1, steps + 1):
        view = churned(view, churn, held_out, seed * 1_000 + step, rng)
        before = planner.incremental_rounds
        steady_s, steady = _cpu(partial(planner.plan, view))
        fresh_s, fresh = _cpu(partial(EvaPlanner().plan, view))
        why = infeasible(view, steady)
        if why is not None:
            raise AssertionError(f"step {step}: the steady plan is infeasible: {why}")
        result = Step(
            steady_s,
            fresh_s,
            planner.incremental_rounds > before,
            steady.hourly_cost / fresh.hourly_cost - 1.0,
            steady.hourly_cost,
        )
        out.append(result)
        if report is not None:
            report(step, result)
        view = replace(view, current=as_running(steady, f"i{step}-"))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks churn", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=0.01, help="share of jobs replaced")
    parser.add_argument("--held-out", type=float, default=0.05, help="share of held-out shapes")
    parser.add_argument("--default-throughput", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=3, help="churn steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--elapsed-h", type=float, default=0.0, help="hours of history (D̂ before any Full)"
    )
    args = parser.parse_args(argv)

    def report(step: int, s: Step) -> None:
        print(
            f"step {step}: steady {s.steady_s:.3f} CPU-s "
            f"({'incremental' if s.incremental else 'fresh'}), from scratch {s.fresh_s:.2f} "
            f"CPU-s, ratio {s.steady_s / s.fresh_s:.3f}; ${s.steady_cost:,.2f}/h, "
            f"gap {100 * s.gap:+.3f}%",
            flush=True,
        )

    steps = run(
        args.tasks,
        args.repeats,
        args.churn,
        args.held_out,
        args.default_throughput,
        args.seed,
        args.elapsed_h,
        report=report,
    )
    ratios = [s.steady_s / s.fresh_s for s in steps]
    inc = [s.steady_s / s.fresh_s for s in steps if s.incremental]
    gaps = [s.gap for s in steps]
    overall = sum(s.steady_s for s in steps) / sum(s.fresh_s for s in steps)
    print(
        f"\nsteady ÷ from-scratch CPU time: all steps {overall:.3f} "
        f"(best {min(ratios):.3f}, worst {max(ratios):.3f}); "
        + (
            f"incremental steps ({len(inc)}/{len(steps)}) best {min(inc):.3f}, worst {max(inc):.3f}"
            if inc
            else "no incremental step"
        )
    )
    print(
        f"hourly cost gap to the fresh plan: worst {100 * max(gaps):+.3f}%, "
        f"mean {100 * sum(gaps) / len(gaps):+.3f}%"
    )


if __name__ == "__main__":
    main()
