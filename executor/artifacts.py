"""What an attempt takes from the cluster's storage and leaves in it (Eva §5: "all
instances in the cluster have access to a global storage") — through grants only.

The worker holds no storage credentials. A start brings presigned GETs of the
attempt's build context and checkpoint; every upload asks the daemon for a
presigned PUT of one object under the attempt's own prefix (`Uploads`, the
agent's `GrantUpload` call), which the daemon refuses once it has given the
attempt up (`Fenced`).

- **The image**: built from the task's build context, which is content-addressed
  (`contexts/<sha256>.tar.gz`): a context already built on this worker is neither
  fetched nor built again, and one build runs per context however many tasks start
  from it at once. A fetched context must hash to its address.
- **The checkpoint**: restored into the attempt's checkpoint directory before the
  container starts; each one the job completes while it runs is copied out of the
  directory (`snapshot`, so the job may go on writing) and uploaded, and what the
  directory holds when the attempt ends is uploaded if it is new, each under a key
  versioned by the job's step (the upload is atomic, so a half-uploaded checkpoint
  is never referenced).
- **The log**: the container's output (or the failed build's) kept per attempt,
  and its last lines for the report.

Each step records how long it took in the attempt's phases (fetch, build, upload),
reported with the attempt's status: the launch and checkpoint delays of Eva's
Table 1, measured (`benchmarks/migration.py` prints them beside it).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

from autoscaler.execution import TaskLaunch
from autoscaler.jobs import TaskRun
from executor.packing import file_digest, pack_directory, unpack_checkpoint
from executor.runtime import ContainerRuntime
from executor.storage import StorageError, context_digest, download, upload

log = logging.getLogger(__name__)

#: What a directory holds (relative path, size, modification time), to see if it changed.
Manifest = tuple[tuple[str, int, int], ...]

#: What a grant is for (the protocol's `ObjectKind`).
CHECKPOINT, LOG = "checkpoint", "log"


class Fenced(StorageError):
    """The daemon refused a grant: it gave this attempt up, which must stop at once."""


class Uploads(Protocol):
    """Asks the daemon for a presigned PUT of one object of an attempt (`GrantUpload`):
    returns (URL, the object's reference once written); Fenced when refused for good."""

    def __call__(self, task_id: str, attempt: int, kind: str, step: int) -> tuple[str, str]: ...


class Artifacts:
    """The worker's side of the storage: images from contexts, checkpoints, logs.

    Uploads need the daemon (`grants`, once the agent has enrolled: `ready`)."""

    def __init__(
        self, runtime: ContainerRuntime, work_dir: Path, log_tail_lines: int, grants: Uploads
    ) -> None:
        self.runtime = runtime
        self.work_dir = work_dir
        self.log_tail_lines = log_tail_lines
        self.grants = grants
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}

    def image(self, run: TaskRun, phases: dict[str, float], url: str = "") -> str:
        """The image an attempt runs: pulled by name, or built from its build context
        (fetched from `url`, the start's grant, unless built here before)."""
        if not run.build_context:
            began = time.monotonic()
            assert run.image is not None
            self.runtime.pull(run.image)
            phases["fetch"] = time.monotonic() - began
            return run.image
        digest = context_digest(run.build_context)
        tag = f"autoscaler/context:{digest}"
        with self._lock:
            lock = self._build_locks.setdefault(digest, threading.Lock())
        with lock:  # one build per context, however many tasks start from it at once
            if self.runtime.has_image(tag):
                return tag
            began = time.monotonic()
            # Named per download: agents sharing a work directory never share a file.
            archive = self.work_dir / "contexts" / f"{digest}.{uuid.uuid4().hex}.tar.gz"
            if not url:
                raise StorageError(f"no grant to read {run.build_context}")
            download(url, archive)
            try:
                if file_digest(archive) != digest:
                    raise StorageError(
                        f"{run.build_context}: the content does not match its sha256 address"
                    )
                phases["fetch"] = time.monotonic() - began
                began = time.monotonic()
                try:
                    self.runtime.build(archive, tag)
                finally:
                    phases["build"] = time.monotonic() - began
            finally:
                archive.unlink(missing_ok=True)
        return tag

    def restore(
        self, url: str, checkpoint_dir: Path, scratch: Path, phases: dict[str, float]
    ) -> Manifest:
        """Unpack the checkpoint at `url` (the start's grant, if it resumes) into
        `checkpoint_dir`; returns what the directory then holds, so the end of the attempt
        can tell whether it saved anew."""
        if url:
            began = time.monotonic()
            archive = scratch / "restore.tar.gz"
            download(url, archive)
            unpack_checkpoint(archive, checkpoint_dir)
            archive.unlink()
            phases["fetch"] = phases.get("fetch", 0.0) + time.monotonic() - began
        return manifest(checkpoint_dir)

    def upload_checkpoint(
        self, launch: TaskLaunch, checkpoint_dir: Path, scratch: Path, step: int
    ) -> str:
        """Pack and upload the checkpoint directory as the version of `step`; returns its
        reference. Fenced if the daemon gave the attempt up."""
        archive = scratch / "checkpoint.tar.gz"
        pack_directory(checkpoint_dir, archive)
        url, ref = self.grants(launch.task_id, launch.attempt, CHECKPOINT, max(0, step))
        upload(url, archive)
        return ref

    def snapshot(self, checkpoint_dir: Path, target: Path) -> Manifest:
        """Copy the checkpoint directory to `target` (replacing it) and return what it held:
        the copy is what gets uploaded, so the job may write its next checkpoint as soon
        as this returns. A copy, not hard links: a job that rewrites a file in place
        (`torch.save` does) would change a linked snapshot under the upload."""
        shutil.rmtree(target, ignore_errors=True)
        held = manifest(checkpoint_dir)
        shutil.copytree(
            checkpoint_dir,
            target,
            symlinks=True,
            ignore=_special_files,
            copy_function=shutil.copy2,
        )
        return held

    def save_log(self, launch: TaskLaunch, data: bytes, scratch: Path) -> tuple[str, ...]:
        """Keep an attempt's log in the storage; returns its last lines (for the report)."""
        lines = data.decode("utf-8", "replace").splitlines()
        tail = tuple(line[:500] for line in lines[-self.log_tail_lines :])
        scratch.mkdir(parents=True, exist_ok=True)
        path = scratch / f"output.{uuid.uuid4().hex}.log"
        try:
            path.write_bytes(data)
            url, _ref = self.grants(launch.task_id, launch.attempt, LOG, 0)
            upload(url, path)
        except (StorageError, OSError) as exc:
            log.warning("log of %s/%d not saved: %s", launch.task_id, launch.attempt, exc)
        finally:
            path.unlink(missing_ok=True)
        return tail


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Sockets, FIFOs and devices: never part of a checkpoint (reading a FIFO would block)."""
    skipped = set()
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            skipped.add(name)  # gone meanwhile
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skipped.add(name)
    return skipped


def manifest(directory: Path) -> Manifest:
    """What a directory holds (names, sizes, modification times), to see if it changed."""
    if not directory.is_dir():
        return ()
    entries = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))
