"""A random world with harsh interference, for replays that must still save money.

Odd catalogs (float capacities, tiny CPUs, equal prices), jobs of 1, 2, 4 or 16
tasks with unlike demands (exact capacities, family-specific and `any` vectors,
anti-affinity limits), and a contention matrix whose measured pairs run at 0.3–1
(`x`, unmeasured, elsewhere: the replay's default). Deterministic in `seed`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORKLOADS = ("resnet18", "sage", "gpt2", "wA", "wB")


def harsh_world(seed: int, directory: Path) -> tuple[Path, Path, Path]:
    """Writes and returns (catalog, trace, contention matrix) in Eva's formats."""
    rng = random.Random(seed)
    families = ["fa", "fb", "fc", "gpu1", "gpu2"][: rng.randint(1, 5)]
    types = {}
    for i in range(rng.randint(1, 40)):
        family = rng.choice(families)
        gpus = rng.choice([1, 2, 4, 8]) if family.startswith("gpu") else 0
        cpus = rng.choice([rng.randint(1, 64), round(rng.uniform(0.3, 64), 3), 0.3])
        ram = rng.choice([rng.randint(1, 512), round(rng.uniform(0.5, 512), 3)])
        cost = rng.choice([round(rng.uniform(0.01, 30), 4), 1.0, 0.5])
        types[f"t{i}"] = {
            "capacity": [gpus, cpus, ram], "cost": cost, "family": family,
            "instantiate_delay": 10, "run_worker_delay": 50, "worker_register_delay": 60,
            "terminate_delay": 1,
        }  # fmt: skip
    shapes = list(types.values())
    jobs = {}
    for j in range(rng.randint(1, 120)):
        n = rng.choice([1, 1, 1, 2, 4, 16])
        tasks = {}
        for k in range(n):
            shape = rng.choice(shapes)
            cap, family = shape["capacity"], shape["family"]
            r = rng.random()
            if r < 0.25:
                demand = {"any" if rng.random() < 0.5 else family: list(cap)}
            elif r < 0.4:
                demand = {family: [cap[0], round(cap[1] / 3, 6), round(cap[2] / 7, 6)]}
            elif r < 0.5:
                demand = {family: [0, 0.1, 0.1], "any": [cap[0], cap[1], 0.1]}
            else:
                demand = {
                    "any" if rng.random() < 0.6 else family: [
                        rng.randint(0, cap[0]),
                        round(rng.uniform(0, cap[1]), 4),
                        round(rng.uniform(0.01, cap[2]), 4),
                    ]
                }
            tasks[str(k)] = {"name": f"node{k % 2}", "demand": demand}
        spec = {
            "name": f"{rng.choice(WORKLOADS)}[{j}]", "arrival_time": rng.randint(0, 20000),
            "duration": rng.randint(60, 20000), "tasks": tasks,
        }  # fmt: skip
        if n > 1 and rng.random() < 0.3:
            spec["max_tasks_per_instance"] = rng.randint(1, n)
        jobs[str(j)] = spec
    keys = [f"{w}_node{n}" for w in WORKLOADS for n in (0, 1)]
    rows = [
        key + "," + ",".join(rng.choice(["x", "1", f"{rng.uniform(0.3, 1):.3f}"]) for _ in keys)
        for key in keys
    ]
    paths = directory / "catalog.json", directory / "jobs.json", directory / "matrix.csv"
    paths[0].write_text(json.dumps({"instance_types": types}))
    paths[1].write_text(json.dumps(jobs))
    paths[2].write_text("\n".join(["," + ",".join(keys), *rows]) + "\n")
    return paths
