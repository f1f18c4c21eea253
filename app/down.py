"""`autoscaler down`, gracefully: every task checkpoints, nothing of the cluster is left.

What `down` means for unfinished work: **jobs stay queued**. Each task that ran
is asked to checkpoint and stop (bounded by a grace period; `--now` skips it),
its newest checkpoint is recorded, and the task goes back to pending; the next
`autoscaler daemon` says which jobs it resumes (its `resuming` event names them)
and starts each task from that checkpoint. `cancel` is how a job is given up.

How the tasks are asked, with the daemon stopped (`down` holds its leader lock,
so no daemon relaunches what it stops):

- **Local cloud**: every agent gets SIGTERM at once; started with `--stop-tasks`,
  each asks its jobs to checkpoint (the report socket, then SIGTERM, then
  SIGKILL after their grace) and, with no daemon to grant an upload, keeps each
  checkpoint on its disk beside its step. Agents still alive after the grace
  are killed. Then whatever is left of the cluster on this host is found by its
  marks — agent processes by their work directory under the cloud's root (a
  record lost or wrong does not hide one), containers by the instance label of
  any instance the cloud ever launched (an agent killed with SIGKILL leaves
  its containers running) — and stopped with the same grace (a container's job
  saves a checkpoint on SIGTERM) and removed. Last, `down` uploads the
  checkpoints left on disk (it has the storage's credentials; the agents never
  do) and records each for its task when it is newer than what the task has.
- **EC2**: every instance tagged with the cluster, known to the state or not and
  in any state, is terminated; the instance's shutdown stops its agent with
  SIGTERM (`--stop-tasks`). With no daemon to grant uploads, what a job saved
  since its last periodic upload stays on an instance disk that is then
  deleted: a task resumes from its newest uploaded checkpoint, at most one
  checkpoint interval old (the job's `checkpoint_every_s`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoscaler.cloud import Cloud, CloudInstance
from autoscaler.store import Store, TaskRecord, TaskUpdate

log = logging.getLogger(__name__)

#: How long `down` waits, by default, for tasks to checkpoint and stop.
DEFAULT_GRACE_S = 120.0


@dataclass(frozen=True, slots=True)
class StoppedTask:
    """A task `down` stopped: where it ran, and the checkpoint it resumes from."""

    task_id: str
    job_id: str
    instance_id: str
    attempt: int
    checkpoint_step: int | None  # None: it resumes from the start
    checkpoint: str | None
    saved: str  # "by down" (kept on disk, uploaded now), "while running", or "none"


@dataclass(frozen=True, slots=True)
class DownReport:
    """What `down` stopped: instances, tasks, and leftovers found beyond the records."""

    instances: tuple[dict[str, Any], ...] = ()
    tasks: tuple[StoppedTask, ...] = ()
    leftover_agents: tuple[int, ...] = ()
    leftover_containers: tuple[str, ...] = ()
    grace_s: float = 0.0
    waited_s: float = 0.0
    unuploaded: tuple[str, ...] = field(default=())  # kept checkpoints that failed to upload

    def to_json(self) -> dict[str, Any]:
        return {
            "terminated": [i["instance"] for i in self.instances],
            "instances": list(self.instances),
            "tasks": [asdict(t) for t in self.tasks],
            "leftovers": {
                "agents": list(self.leftover_agents),
                "containers": list(self.leftover_containers),
            },
            "grace_s": self.grace_s,
            "waited_s": round(self.waited_s, 3),
            "not_uploaded": list(self.unuploaded),
        }


def describe(instance: CloudInstance) -> dict[str, Any]:
    return {
        "instance": instance.instance_id or instance.cloud_id,
        "cloud_id": instance.cloud_id,
        "type": instance.instance_type,
        "state": instance.state,
    }


def graceful_down(
    store: Store,
    cloud: Cloud,
    storage: Any,
    clock: Callable[[], float],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    waiting: Callable[[int, float], None] | None = None,
) -> DownReport:
    """Stop every task with a checkpoint (bounded by `grace_s`), upload what they left
    on local disk, remove every leftover of the cluster, terminate every instance and
    record it all (see the module's docstring). The caller holds the leader lock."""
    from app.wiring import bring_down
    from executor.storage import checkpoint_step
    from provisioners.local import LocalCloud

    placed = {
        t.task_id: t
        for t in store.snapshot(with_throughput=False).tasks.values()
        if t.instance_id is not None
    }
    listed = cloud.list()
    began = time.monotonic()
    swept = None
    uploaded: dict[str, str] = {}
    failed: list[str] = []
    if isinstance(cloud, LocalCloud):  # agents and containers on this host
        cloud.terminate(
            [i.cloud_id for i in listed], grace_s=grace_s, waiting=waiting, remove_containers=False
        )
        # What the agents did not stop (one that died, or ran without --stop-tasks): asked
        # over its report socket, within what is left of the grace (a little at least).
        swept = cloud.sweep(max(grace_s - (time.monotonic() - began), min(grace_s, 10.0)))
        uploaded, failed = upload_kept(cloud.kept_checkpoints(), store, storage, clock)
    waited = time.monotonic() - began
    after = store.snapshot(with_throughput=False).tasks
    bring_down(store, cloud, clock)
    tasks = []
    for task_id, before in sorted(placed.items()):
        now = after.get(task_id, before)
        ref = now.checkpoint
        step = checkpoint_step(ref)
        saved = "by down" if task_id in uploaded else ("while running" if ref else "none")
        tasks.append(
            StoppedTask(
                task_id,
                before.job_id,
                before.instance_id or "",
                before.attempt,
                step,
                ref,
                saved,
            )
        )
    return DownReport(
        instances=tuple(describe(i) for i in listed),
        tasks=tuple(tasks),
        leftover_agents=swept.agents if swept else (),
        leftover_containers=tuple(c for c, _ in swept.containers) if swept else (),
        grace_s=grace_s,
        waited_s=waited,
        unuploaded=tuple(failed),
    )


def upload_kept(
    kept: Sequence[Any], store: Store, storage: Any, clock: Callable[[], float]
) -> tuple[dict[str, str], list[str]]:
    """Upload the checkpoints agents kept on disk (`LocalCloud.kept_checkpoints`) under
    their attempt's versioned key, and record each for its task when it is that task's
    current attempt and newer than the checkpoint the task has. Returns the references
    recorded by task, and the directories that could not be uploaded (kept for the next
    `down`). A directory that is uploaded, or stale (its task moved on), is removed."""
    from executor.attempts import load_launch
    from executor.packing import pack_directory
    from executor.storage import StorageError, checkpoint_key, checkpoint_step

    tasks: Mapping[str, TaskRecord] = store.snapshot(with_throughput=False).tasks
    recorded: dict[str, str] = {}
    failed: list[str] = []
    updates = []
    for item in kept:
        try:
            launch = load_launch(item.directory)
        except Exception:  # unreadable launch: nothing says whose checkpoint it is
            log.warning("%s: no readable launch; left as it is", item.directory)
            failed.append(str(item.directory))
            continue
        task = tasks.get(launch.task_id)
        current = (
            task is not None
            and task.attempt == launch.attempt
            and task.status not in ("completed", "cancelled", "failed")
            and (checkpoint_step(task.checkpoint) or -1) < item.step
        )
        if current:
            try:
                with tempfile.TemporaryDirectory() as scratch:
                    archive = Path(scratch) / "checkpoint.tar.gz"
                    pack_directory(item.checkpoint, archive)
                    key = checkpoint_key(launch.job_id, launch.task_id, launch.attempt, item.step)
                    storage.put_file(key, archive)
                    ref = storage.ref(key)
            except (StorageError, OSError) as exc:
                log.warning("checkpoint of %s not uploaded: %s", launch.task_id, exc)
                failed.append(str(item.directory))
                continue
            updates.append(TaskUpdate(launch.task_id, checkpoint=ref))
            recorded[launch.task_id] = ref
        shutil.rmtree(item.directory, ignore_errors=True)
    if updates:
        store.update_tasks(updates, clock())
    return recorded, failed
