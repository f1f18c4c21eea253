"""The test job: a training loop that reports its iterations, checkpoints when asked and on
the reporter's schedule (AUTOSCALER_CHECKPOINT_EVERY_S), resumes.

Environment (besides the worker's AUTOSCALER_* variables):
  STEP_S       seconds per iteration (default 0.01)
  TOTAL        iterations to do in all, then exit 0 (default: a million)
  SAVE_EVERY   also save on its own every N iterations, without telling (default: never)
  IGNORE_STOP  1: ignore checkpoint requests and SIGTERM (only SIGKILL stops it)
  EXIT_AFTER   exit with EXIT_CODE after this many iterations of this run
  ALLOCATE_MB  allocate this many MB more at every iteration (runs out of memory)
"""

import json
import os
import signal
import sys
import time

from reporter import Reporter

checkpoint = os.path.join(os.environ["AUTOSCALER_CHECKPOINT_DIR"], "state.json")
step = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as handle:
        step = json.load(handle)["step"]
print(f"resumed at {step}" if step else "starting from 0", flush=True)

step_s = float(os.environ.get("STEP_S", "0.01"))
total = int(os.environ.get("TOTAL", "1000000"))
save_every = int(os.environ.get("SAVE_EVERY", "0"))
ignore_stop = os.environ.get("IGNORE_STOP") == "1"
exit_after = int(os.environ.get("EXIT_AFTER", "0"))
allocate = int(os.environ.get("ALLOCATE_MB", "0"))
if ignore_stop:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def save(at):
    temporary = checkpoint + ".tmp"
    with open(temporary, "w") as handle:
        json.dump({"step": at}, handle)
    os.replace(temporary, checkpoint)  # atomic: a checkpoint is complete or absent


reporter = Reporter(start=step)
hoard = []
done_here = 0
while step < total:
    time.sleep(step_s)
    step += 1
    done_here += 1
    reporter.step()
    if allocate:
        hoard.append(bytearray(allocate << 20))
    if save_every and step % save_every == 0:
        save(step)
        print(f"saved at {step}", flush=True)
    if exit_after and done_here >= exit_after:
        print(f"giving up at {step}", flush=True)
        sys.exit(int(os.environ.get("EXIT_CODE", "1")))
    if not ignore_stop and reporter.checkpoint_due():
        save(step)
        reporter.checkpoint_done(step)
        if reporter.stop_requested:
            print(f"checkpointed at {step}", flush=True)
            sys.exit(0)
print(f"done at {step}", flush=True)
