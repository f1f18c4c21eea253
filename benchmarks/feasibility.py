"""An independent check of a plan, for benchmarks and tests that must not take the
planner's word for it."""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec
from autoscaler.planner import Plan


def infeasibilities(plan: Plan, jobs: Sequence[JobSpec], catalog: Catalog) -> list[str]:
    """What is wrong with `plan` for `jobs`: a task placed other than exactly once or not
    among them, an instance over a capacity, a type not the catalog's, a task on a family
    it cannot run on, or an hourly cost that is not the sum of its instances' prices."""
    types = {t.name: t for t in catalog.types}
    tasks = {t.task_id: t for j in jobs for t in j.tasks}
    placed: dict[str, int] = {}
    problems = []
    total = 0.0
    for inst in plan.configuration.instances:
        itype = types.get(inst.type.name)
        if itype != inst.type:
            problems.append(f"type {inst.type.name} is not the catalog's")
            continue
        total += itype.hourly_cost
        used = [0.0, 0.0, 0.0]
        for task_id in inst.tasks:
            placed[task_id] = placed.get(task_id, 0) + 1
            task = tasks.get(task_id)
            if task is None:
                problems.append(f"{task_id} is not active but placed on {itype.name}")
                continue
            demand = task.demand_on(itype.family)
            if demand is None:
                problems.append(f"{task_id} on family {itype.family}")
                continue
            used = [u + d for u, d in zip(used, demand.as_tuple(), strict=True)]
        capacity = itype.capacity.as_tuple()
        if any(u > c + 1e-9 * max(1.0, c) for u, c in zip(used, capacity, strict=True)):
            problems.append(f"{itype.name} holds {used} > {capacity}")
    problems += [f"{t} placed {placed.get(t, 0)} times" for t in tasks if placed.get(t, 0) != 1]
    if abs(total - plan.hourly_cost) > 1e-6 * max(1.0, total):
        problems.append(f"hourly cost {plan.hourly_cost} is not the instances' {total}")
    return problems
