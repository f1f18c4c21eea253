"""A CPU training loop: fits a line to noisy points by stochastic gradient descent.

It reports every iteration through the reporter (so the autoscaler learns how
fast it runs next to other jobs), checkpoints on its own schedule (the
reporter's `checkpoint_due()`: every `checkpoint_every_s` of its job file,
which the worker uploads while it runs) and when the worker asks (before a
move, then it exits), and resumes from its checkpoint: after a move or a crash
its iteration count continues where its last checkpoint stopped.

Environment: TOTAL (iterations, default 600), STEP_S (seconds of work per
iteration, default 0.05), SHARD / SHARDS (this task's part of the data, for
data-parallel jobs).
"""

import json
import os
import random
import sys
import time

from reporter import Reporter

directory = os.environ.get("AUTOSCALER_CHECKPOINT_DIR", "/tmp/checkpoint")
os.makedirs(directory, exist_ok=True)
checkpoint = os.path.join(directory, "model.json")
total = int(os.environ.get("TOTAL", "600"))
step_s = float(os.environ.get("STEP_S", "0.05"))
shard, shards = int(os.environ.get("SHARD", "0")), int(os.environ.get("SHARDS", "1"))
task = os.environ.get("AUTOSCALER_TASK_ID", "local")

state = {"step": 0, "w": 0.0, "b": 0.0}
if os.path.exists(checkpoint):
    with open(checkpoint) as handle:
        state = json.load(handle)
    print(f"{task}: resumed at step {state['step']} (w={state['w']:.3f})", flush=True)
else:
    print(
        f"{task}: starting from step 0 (attempt {os.environ.get('AUTOSCALER_ATTEMPT')})", flush=True
    )

rng = random.Random(shard)
points = [(x, 3.0 * x + 1.0 + rng.gauss(0, 0.1)) for x in (rng.random() for _ in range(256))]


def save() -> None:
    temporary = checkpoint + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(state, handle)
    os.replace(temporary, checkpoint)  # atomic: a checkpoint is whole or absent


reporter = Reporter(start=state["step"])
while state["step"] < total:
    deadline = time.monotonic() + step_s
    x, y = points[state["step"] % len(points)]
    error = state["w"] * x + state["b"] - y
    state["w"] -= 0.1 * error * x
    state["b"] -= 0.1 * error
    while time.monotonic() < deadline:  # the rest of the iteration's compute
        sum(i * i for i in range(200))
    state["step"] += 1
    reporter.step()
    if reporter.checkpoint_due():  # on schedule, or the worker asks
        save()
        reporter.checkpoint_done(state["step"])  # uploaded while the loop goes on
        if reporter.stop_requested:
            print(f"{task}: checkpointed at step {state['step']} for a move", flush=True)
            sys.exit(0)
save()
print(f"{task}: done at step {state['step']}: w={state['w']:.3f} b={state['b']:.3f}", flush=True)
