"""A memory-heavy job: holds MEGABYTES of working set and sweeps it every iteration.

Its container's memory limit is its demand: ask for less than it holds and it is
killed for memory (the task fails with that reason). Reports and checkpoints like
the training loop.
"""

import json
import os
import sys
import time

from reporter import Reporter

directory = os.environ.get("AUTOSCALER_CHECKPOINT_DIR", "/tmp/checkpoint")
os.makedirs(directory, exist_ok=True)
checkpoint = os.path.join(directory, "sweep.json")
megabytes = int(os.environ.get("MEGABYTES", "600"))
total = int(os.environ.get("TOTAL", "400"))
step = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as handle:
        step = json.load(handle)["step"]
    print(f"resumed at step {step}", flush=True)

working_set = bytearray(megabytes << 20)
print(f"holding {megabytes} MB", flush=True)


def save() -> None:
    temporary = checkpoint + ".tmp"
    with open(temporary, "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(temporary, checkpoint)


reporter = Reporter(start=step)
page = 4096
while step < total:
    offset = (step * page) % len(working_set)
    for position in range(offset, len(working_set), 1 << 20):  # touch a byte per MB
        working_set[position] = (working_set[position] + 1) % 256
    time.sleep(0.05)
    step += 1
    reporter.step()
    if reporter.checkpoint_due():  # on schedule, or the worker asks
        save()
        reporter.checkpoint_done(step)
        if reporter.stop_requested:
            sys.exit(0)
save()
print(f"done at step {step}", flush=True)
