"""The attempt runner: each task attempt on this worker, from its start to how it ended.

- **Start** (Eva §5): refuse what does not fit beside the attempts already here;
  then, in the background, the image (`artifacts`), the checkpoint restored, and
  the container run unprivileged with the task's limits, the checkpoint
  directory and the report socket bind-mounted, and its environment (how often
  to checkpoint, its watchdog).
- **Watch**: each running job is asked over its report socket how far it got;
  its count, throughput and first iteration go into the attempt's status.
- **Checkpoints while it runs**: each checkpoint the job completes (the
  reporter's `checkpoint_done()`) is copied out of its directory, the job told
  it may write the next, and the copy uploaded through a grant, versioned by
  step; the attempt's status then names it as its latest complete checkpoint,
  so any crash loses at most one interval. An upload that fails is kept on
  local disk and tried again.
- **Stop**: a checkpoint request on the report socket, SIGTERM after a short
  wait, SIGKILL after a grace period (Eva §5: checkpoint, then stop); `stop_all`
  does it for every attempt (the agent going down, or its spend brake).
- **End**: the final state, its reason and its failure class from how the
  container exited (`ending`); a checkpoint saved since the last upload is
  uploaded, whether asked for or not (nothing checkpointed is lost), retried
  while the daemon cannot be reached and kept on disk if the agent goes first;
  the log is kept.
- **Adopt**: containers outlive the agent process. Each attempt's directory
  holds its launch (`launch.pb`: the worker protocol's own `StartTask`, encoded
  by `executor.messages` and nothing else), what its restore left and its
  latest upload, so a restarted agent takes over the containers labelled with
  its instance; the daemon then says which of them it still wants.
- **Fence**: an attempt the daemon gave up (its heartbeat answer says stop, or a
  grant is refused) is killed at once, with nothing uploaded (`abandon`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from autoscaler.execution import TERMINAL_TASK_STATES, FailureClass, ResourceLimits, TaskLaunch
from autoscaler.jobs import DEFAULT_CHECKPOINT_EVERY_S
from executor import reporter
from executor.artifacts import Artifacts, Fenced, Manifest, manifest
from executor.messages import (
    BadMessage,
    failure_to_pb,
    launch_from_pb,
    launch_to_pb,
    state_to_pb,
)
from executor.protos import worker_pb2 as pb
from executor.runtime import (
    GIB,
    LABEL_ATTEMPT,
    LABEL_INSTANCE,
    LABEL_JOB,
    LABEL_TASK,
    BuildFailed,
    CommandNotFound,
    ContainerExit,
    ContainerRuntime,
    ContainerSpec,
    ImageUnavailable,
    RuntimeFailure,
    job_user,
)
from executor.storage import StorageError

if TYPE_CHECKING:
    from executor.agent import AgentConfig

log = logging.getLogger(__name__)

#: Where the job finds its checkpoint directory and report socket inside the container.
CHECKPOINT_MOUNT = "/checkpoint"
REPORT_MOUNT = "/run/autoscaler"
REPORT_SOCKET = f"{REPORT_MOUNT}/report.sock"

#: What an attempt's directory keeps for an agent that adopts its container.
LAUNCH_FILE = "launch.pb"
RESTORED_FILE = "restored.json"
UPLOADED_FILE = "uploaded.json"  # the latest checkpoint uploaded while it ran
#: Beside a checkpoint kept on local disk (not uploaded): its step, for whoever uploads
#: it later (`autoscaler down` on the local cloud, which has the storage's credentials).
KEPT_FILE = "kept.json"
#: Where the copy of a completed checkpoint waits for (or retries) its upload.
SNAPSHOT_DIR = "snapshot"

#: Exit codes that say the command could not be run at all (POSIX shells, tini): not
#: executable (126) or not found (127). A retry would meet the same.
NOT_EXECUTABLE_EXITS = {126: "not executable", 127: "not found"}
#: Seconds between tries of a checkpoint upload that failed (then doubling, up to a minute).
UPLOAD_RETRY_S = 2.0

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


class Rejected(Exception):
    """A start the worker refuses outright (another instance's, or an older attempt)."""


@dataclass(eq=False)
class Attempt:
    """One attempt of a task on this worker, as it stands."""

    launch: TaskLaunch
    directory: Path
    window_s: float
    state: str = "starting"
    reason: str = ""
    exit_code: int | None = None
    checkpoint: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    log_tail: tuple[str, ...] = ()
    iterations: float = 0.0
    throughput: float | None = None
    container: str | None = None
    started_wall: float | None = None  # Unix time the container started
    stop_requested_at: float | None = None  # monotonic
    abandoned: str | None = None  # why it is being killed without a checkpoint
    asked: bool = False  # the checkpoint request reached the job
    acknowledged: bool = False  # the job said its checkpoint is saved
    sigterm_sent: bool = False
    restored: Manifest = ()  # what the checkpoint directory held after the restore
    context_url: str = ""  # the start's grants: presigned GETs of its inputs
    checkpoint_url: str = ""
    exited: threading.Event = field(default_factory=threading.Event)
    stopper: threading.Thread | None = None  # carrying out the stop, once it began
    failure: FailureClass | None = None
    reported: float = 0.0  # iterations as of the last status taken for a heartbeat
    # Checkpoints while it runs: the last one the job completed that was copied out
    # (`collected`, the reporter's seq), what the directory held when the last upload was
    # copied (or restored), and a copy whose upload failed (retried at `retry_at`).
    collected: int = 0
    uploaded: Manifest | None = None
    pending_step: int | None = None
    retry_at: float = 0.0
    retry_s: float = UPLOAD_RETRY_S
    pending: Manifest = ()
    shipper: threading.Thread | None = None
    watchdog_s: float | None = None  # what its job's watchdog was set to (None: unknown)
    kept: bool = False  # its checkpoint stays on local disk: the directory is not removed

    @property
    def key(self) -> tuple[str, int]:
        return (self.launch.task_id, self.launch.attempt)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_TASK_STATES

    @property
    def checkpoint_dir(self) -> Path:
        return self.directory / "checkpoint"

    @property
    def report_dir(self) -> Path:
        return self.directory / "report"

    @property
    def socket_path(self) -> str:
        return str(self.report_dir / "report.sock")

    def status(self) -> pb.TaskStatus:
        status = pb.TaskStatus(
            task_id=self.launch.task_id,
            attempt=self.launch.attempt,
            job_id=self.launch.job_id,
            state=state_to_pb(self.state),  # type: ignore[arg-type]
            iterations=self.iterations,
            window_s=self.window_s,
            checkpoint=self.checkpoint or "",
            reason=self.reason,
            phases=self.phases,
            log_tail=self.log_tail,
        )
        if self.throughput is not None and self.state == "running":
            status.throughput = self.throughput
        if self.exit_code is not None:
            status.exit_code = self.exit_code
        if self.state in ("failed", "stopped"):
            status.failure = failure_to_pb(self.failure)  # type: ignore[assignment]
        return status

    @property
    def snapshot_dir(self) -> Path:
        return self.directory / SNAPSHOT_DIR

    def baseline(self) -> Manifest:
        """What the checkpoint directory held when it was last uploaded (or restored)."""
        return self.restored if self.uploaded is None else self.uploaded


@dataclass(frozen=True, slots=True)
class Polled:
    """What a round of polls found worth a heartbeat: a job's first iteration (it runs
    now: tell the daemon at once), or a count that moved since the last heartbeat."""

    first_iteration: bool = False
    progressed: bool = False


class AttemptRunner:
    """The attempts of one worker: started, watched, stopped, ended, adopted.

    `changed` is called whenever an attempt's state changes (the agent then
    heart-beats at once); while `closing` is set, an attempt whose container
    exits is left for the next agent process to finish. `daemon_silent_s` says
    how long the daemon has not answered (a failed upload is retried without
    end while it is out of reach: nothing else could take it), and `watchdog_s`
    what the jobs' watchdog is set to when they start."""

    def __init__(
        self,
        config: AgentConfig,
        runtime: ContainerRuntime,
        artifacts: Artifacts,
        *,
        changed: Callable[[], None],
        closing: threading.Event,
        daemon_silent_s: Callable[[], float] = lambda: 0.0,
        watchdog_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.artifacts = artifacts
        self._changed = changed
        self._closing = closing
        self._daemon_silent_s = daemon_silent_s
        self._watchdog_s = watchdog_s
        self._lock = threading.RLock()
        self._attempts: dict[tuple[str, int], Attempt] = {}
        self.draining: str | None = None  # why no start is accepted any more

    # -- the attempts held ------------------------------------------------------------------

    def statuses(self) -> list[pb.TaskStatus]:
        """The status of every attempt held (what a heartbeat carries)."""
        with self._lock:
            for attempt in self._attempts.values():
                attempt.reported = attempt.iterations
            return [a.status() for a in self._attempts.values()]

    def live(self) -> list[Attempt]:
        """The attempts whose containers may run (not ended)."""
        with self._lock:
            return [a for a in self._attempts.values() if not a.terminal]

    def forget(self, refs: Iterable[Any]) -> None:
        """Drop the ended attempts the daemon acknowledged (`AttemptRef`s)."""
        with self._lock:
            for ref in refs:
                attempt = self._attempts.get((ref.task_id, ref.attempt))
                if attempt is not None and attempt.terminal:
                    del self._attempts[attempt.key]

    def abandon_all(self, reason: str) -> None:
        """Kill every live attempt without a checkpoint (their tasks run elsewhere now)."""
        with self._lock:
            live = [a for a in self._attempts.values() if not a.terminal]
        for attempt in live:
            self._abandon(attempt, reason)

    def abandon(self, refs: Iterable[Any], reason: str) -> None:
        """Kill these attempts (`AttemptRef`s) without a checkpoint: the daemon gave them up,
        so they may upload and report nothing more (they are fenced)."""
        with self._lock:
            doomed = [self._attempts.get((r.task_id, r.attempt)) for r in refs]
        for attempt in doomed:
            if attempt is not None and not attempt.terminal:
                log.warning(
                    "attempt %d of %s: %s; killing it",
                    attempt.launch.attempt,
                    attempt.launch.task_id,
                    reason,
                )
                self._abandon(attempt, reason)

    def held(self) -> list[tuple[str, int]]:
        """Every attempt this worker has, ended or not."""
        with self._lock:
            return list(self._attempts)

    def poll(self) -> Polled:
        """Ask each running job how far it got (the report socket), and collect the
        checkpoint it has just completed, if any."""
        with self._lock:
            running = [
                a
                for a in self._attempts.values()
                if a.state in ("running", "checkpointing")
                and a.container is not None
                and not a.exited.is_set()
            ]
        first = False
        for attempt in running:
            try:
                answer = reporter.ask(
                    attempt.socket_path, {"op": "status"}, timeout=self.config.poll_timeout_s
                )
            except (OSError, ValueError):
                continue  # no reporter (yet): nothing to say
            initialized = "init" in attempt.phases
            self._absorb_answer(attempt, answer)
            self._ship(attempt, answer)
            first = first or (not initialized and "init" in attempt.phases)
        with self._lock:
            progressed = any(a.iterations != a.reported for a in running)
        return Polled(first, progressed)

    def _absorb_answer(self, attempt: Attempt, answer: Mapping[str, Any]) -> None:
        if not answer.get("ok"):
            return
        with self._lock:
            iterations = answer.get("iterations")
            if isinstance(iterations, (int, float)):
                attempt.iterations = float(iterations)
            rate = answer.get("throughput")
            attempt.throughput = float(rate) if isinstance(rate, (int, float)) else None
            window = answer.get("window_s")
            if isinstance(window, (int, float)):
                attempt.window_s = float(window)
            first = answer.get("first_iteration_at")
            if (
                "init" not in attempt.phases
                and isinstance(first, (int, float))
                and attempt.started_wall is not None
            ):
                attempt.phases["init"] = max(0.0, float(first) - attempt.started_wall)

    # -- checkpoints while the job runs ---------------------------------------------------

    def _ship(self, attempt: Attempt, answer: Mapping[str, Any]) -> None:
        """Collect the checkpoint the job completed since the last one collected (copied out,
        the job told it may write the next) and upload it, in the background; or try again
        an upload that failed. One at a time per attempt, newest first."""
        seq = answer.get("checkpoint_seq")
        if not answer.get("ok") or not isinstance(seq, int) or isinstance(seq, bool):
            return  # a reporter of protocol 1: what it saved goes up when it ends
        told = answer.get("checkpoint_collected")
        with self._lock:
            if attempt.terminal or attempt.abandoned or attempt.exited.is_set():
                return
            if attempt.shipper is not None and attempt.shipper.is_alive():
                return
            if seq > attempt.collected:
                step = answer.get("checkpoint_step")
                if not isinstance(step, (int, float)) or not step >= 0:
                    step = attempt.iterations
                work: Callable[[], None] = partial(self._collect, attempt, seq, int(step))
            elif isinstance(told, int) and told < attempt.collected:
                # The job did not hear that its checkpoint was collected: say it again.
                work = partial(self._tell_collected, attempt, attempt.collected)
            elif attempt.pending_step is not None and time.monotonic() >= attempt.retry_at:
                work = partial(self._upload_pending, attempt)
            else:
                return
            thread = threading.Thread(target=work, name="checkpoint", daemon=True)
            # started before it is published: `_finish` joins whatever shipper it sees, and
            # joining a thread not yet started raises (it did, once, as a job exited)
            thread.start()
            attempt.shipper = thread

    def _collect(self, attempt: Attempt, seq: int, step: int) -> None:
        try:
            held = self.artifacts.snapshot(attempt.checkpoint_dir, attempt.snapshot_dir)
        except OSError as exc:
            log.warning(
                "checkpoint %d of %s/%d cannot be copied (%s); trying again",
                seq,
                attempt.launch.task_id,
                attempt.launch.attempt,
                exc,
            )
            return
        with self._lock:
            attempt.collected = seq
            attempt.pending_step, attempt.pending = step, held
            attempt.retry_s = UPLOAD_RETRY_S
            _save_uploaded(attempt)
        self._tell_collected(attempt, seq)
        self._upload_pending(attempt)

    def _tell_collected(self, attempt: Attempt, seq: int) -> None:
        """The job may write its next checkpoint (if this is lost, the next poll says it
        again)."""
        with contextlib.suppress(OSError, ValueError):
            reporter.ask(
                attempt.socket_path, {"op": "collected", "seq": seq}, self.config.poll_timeout_s
            )

    def _upload_pending(self, attempt: Attempt) -> None:
        """Upload the collected copy; on success it is the attempt's latest complete
        checkpoint (the next heartbeat says so at once), on failure it stays on disk."""
        launch = attempt.launch
        with self._lock:
            step = attempt.pending_step
        if step is None:
            return
        try:
            ref = self.artifacts.upload_checkpoint(
                launch, attempt.snapshot_dir, attempt.directory, step
            )
        except Fenced as exc:
            log.warning(
                "attempt %d of %s is fenced (%s); killing it", launch.attempt, launch.task_id, exc
            )
            self._abandon(attempt, f"fenced: {exc}")
            return
        except (StorageError, OSError, tarfile.TarError) as exc:
            with self._lock:
                wait = attempt.retry_s
                attempt.retry_at = time.monotonic() + wait
                attempt.retry_s = min(wait * 2, 60.0)
            log.warning(
                "checkpoint at step %d of %s/%d not uploaded (%s); kept on local disk, "
                "trying again in %g s",
                step,
                launch.task_id,
                launch.attempt,
                exc,
                wait,
            )
            return
        with self._lock:
            if attempt.pending_step != step:
                return  # a newer one was collected meanwhile (cannot happen: one at a time)
            attempt.checkpoint = ref
            attempt.uploaded, attempt.pending_step, attempt.pending = attempt.pending, None, ()
            attempt.retry_s = UPLOAD_RETRY_S
            _save_uploaded(attempt)
        shutil.rmtree(attempt.snapshot_dir, ignore_errors=True)
        log.info("checkpoint at step %d of %s/%d uploaded", step, launch.task_id, launch.attempt)
        self._changed()

    # -- starting -------------------------------------------------------------------------

    def start(
        self, launch: TaskLaunch, *, context_url: str = "", checkpoint_url: str = ""
    ) -> pb.TaskStatus:
        """Accept an attempt (idempotent) and start it in the background; the URLs are the
        start's grants to read its build context and checkpoint."""
        if launch.instance_id and launch.instance_id != self.config.instance_id:
            raise Rejected(
                f"this worker runs instance {self.config.instance_id}, not {launch.instance_id}"
            )
        with self._lock:
            existing = self._attempts.get((launch.task_id, launch.attempt))
            if existing is None and self.draining is not None:
                raise Rejected(self.draining)
            existing = self._attempts.get((launch.task_id, launch.attempt))
            if existing is not None:
                return existing.status()
            others = [a for a in self._attempts.values() if a.launch.task_id == launch.task_id]
            newer = [a.launch.attempt for a in others if a.launch.attempt > launch.attempt]
            if newer:
                raise Rejected(
                    f"attempt {max(newer)} of {launch.task_id} is newer than {launch.attempt}"
                )
            attempt = Attempt(
                launch,
                self._directory(launch.task_id, launch.attempt),
                self.config.throughput_window_s,
                checkpoint=launch.checkpoint,
                context_url=context_url,
                checkpoint_url=checkpoint_url,
            )
            misfit = self._misfit(launch)
            self._attempts[attempt.key] = attempt
            if misfit:
                attempt.state, attempt.reason, attempt.failure = "failed", misfit, "infrastructure"
                attempt.exited.set()
            status = attempt.status()
        for older in others:
            self._request_stop(older)  # superseded: one attempt of a task runs at a time
        if not misfit:
            threading.Thread(
                target=self._run, args=(attempt,), name=f"attempt-{launch.task_id}", daemon=True
            ).start()
        self._changed()
        return status

    def refuse(self, launch: TaskLaunch, reason: str) -> None:
        """Hold an attempt this worker will not start as failed, with the reason, so the
        daemon learns it at the next heartbeat instead of waiting for a start timeout."""
        with self._lock:
            if launch.task_id and (launch.task_id, launch.attempt) not in self._attempts:
                attempt = Attempt(
                    launch,
                    self._directory(launch.task_id, launch.attempt),
                    self.config.throughput_window_s,
                    state="failed",
                    reason=reason,
                    checkpoint=launch.checkpoint,
                    failure="infrastructure",  # placed where it cannot run: not the job's doing
                )
                attempt.exited.set()
                self._attempts[attempt.key] = attempt
        self._changed()

    def _misfit(self, launch: TaskLaunch) -> str:
        """Why the attempt does not fit next to the others (empty: it fits)."""
        capacity = self.config.capacity
        used_cpu = sum(a.launch.limits.cpus for a in self._attempts.values() if not a.terminal)
        used_ram = sum(a.launch.limits.memory_gb for a in self._attempts.values() if not a.terminal)
        limits = launch.limits
        if used_cpu + limits.cpus > capacity.cpu + 1e-6:
            return (
                f"does not fit on {self.config.instance_id}: {limits.cpus:g} cores asked, "
                f"{max(capacity.cpu - used_cpu, 0):g} of {capacity.cpu:g} free"
            )
        if used_ram + limits.memory_gb > capacity.ram_gb + 1e-6:
            return (
                f"does not fit on {self.config.instance_id}: {limits.memory_gb:g} GiB asked, "
                f"{max(capacity.ram_gb - used_ram, 0):g} of {capacity.ram_gb:g} free"
            )
        bad = [g for g in limits.gpus if not 0 <= g < capacity.gpu]
        if bad:
            return f"no GPU {bad[0]} on {self.config.instance_id} ({capacity.gpu:g} GPUs)"
        return ""

    def _directory(self, task_id: str, number: int) -> Path:
        return attempt_directory(self.config.work_dir, task_id, number)

    def _run(self, attempt: Attempt) -> None:
        """One attempt, start to end: image, restore, run, wait, finish."""
        launch = attempt.launch
        phase = "fetch"
        try:
            attempt.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            attempt.report_dir.mkdir(parents=True, exist_ok=True)
            # The job's own two directories are its user's alone (`runtime.job_user`).
            for directory in (attempt.checkpoint_dir, attempt.report_dir):
                os.chmod(directory, 0o700)
                _hand_to_job(directory)
            save_launch(attempt.directory, launch)
            image = self.artifacts.image(launch.run, attempt.phases, attempt.context_url)
            phase = "restore"
            if not self._stop_before_start(attempt):
                if launch.checkpoint and not attempt.checkpoint_url:
                    raise StorageError(f"no grant to read the checkpoint {launch.checkpoint}")
                attempt.restored = self.artifacts.restore(
                    attempt.checkpoint_url,
                    attempt.checkpoint_dir,
                    attempt.directory,
                    attempt.phases,
                )
                _write_json(attempt.directory / RESTORED_FILE, attempt.restored)
                _hand_to_job(attempt.checkpoint_dir)
            if self._stop_before_start(attempt):
                if attempt.abandoned:
                    reason, state = attempt.abandoned, "failed"
                else:
                    reason, state = "stopped before it started", "stopped"
                self._end(attempt, state, reason, launch.checkpoint, failure="infrastructure")
                self._cleanup(attempt)
                return
            phase = "start"
            began = time.monotonic()
            container = self.runtime.run(self._container_spec(attempt, image))
            attempt.phases["start"] = time.monotonic() - began
            attempt.started_wall = time.time()
            with self._lock:
                attempt.container = container
                stop_now = attempt.stop_requested_at is not None or attempt.abandoned
                if attempt.state == "starting":
                    attempt.state = "running"
            self._changed()
            if stop_now:
                self._begin_stop(attempt)
            self._watch(attempt)
        except BuildFailed as exc:
            self._save_log(attempt, exc.log.encode())  # the build's output
            reason = f"build failed: {exc}"
            self._end(attempt, "failed", reason, launch.checkpoint, failure="deterministic")
            self._cleanup(attempt)
        except (ImageUnavailable, CommandNotFound) as exc:
            reason = f"{phase} failed: {exc}"
            self._end(attempt, "failed", reason, launch.checkpoint, failure="deterministic")
            self._cleanup(attempt)
        except (StorageError, OSError, RuntimeFailure, tarfile.TarError) as exc:
            reason = f"{phase} failed: {exc}"
            self._end(attempt, "failed", reason, launch.checkpoint, failure="transient")
            self._cleanup(attempt)
        except Exception as exc:  # a bug of ours must still end the attempt, with its reason
            log.exception("attempt %s/%d", launch.task_id, launch.attempt)
            # Transient, not infrastructure: a bug that repeats must not retry forever.
            reason = f"worker error: {type(exc).__name__}: {exc}"
            self._end(attempt, "failed", reason, launch.checkpoint, failure="transient")
            self._cleanup(attempt)

    def _stop_before_start(self, attempt: Attempt) -> bool:
        with self._lock:
            return attempt.stop_requested_at is not None or attempt.abandoned is not None

    def _container_spec(self, attempt: Attempt, image: str) -> ContainerSpec:
        launch, config = attempt.launch, self.config
        limits: ResourceLimits = launch.limits
        shm = limits.shm_size_gb if limits.shm_size_gb is not None else launch.run.shm_size_gb
        every = launch.run.checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S
        attempt.watchdog_s = self._watchdog_s()
        env = dict(launch.run.env)
        env.update(
            {
                "AUTOSCALER_JOB_ID": launch.job_id,
                "AUTOSCALER_TASK_ID": launch.task_id,
                "AUTOSCALER_ATTEMPT": str(launch.attempt),
                "AUTOSCALER_INSTANCE_ID": config.instance_id,
                "AUTOSCALER_WORKLOAD": launch.workload,
                "AUTOSCALER_CHECKPOINT_DIR": CHECKPOINT_MOUNT,
                "AUTOSCALER_RESUMED": "1" if launch.checkpoint else "0",
                "AUTOSCALER_REPORT_SOCKET": REPORT_SOCKET,
                "AUTOSCALER_THROUGHPUT_WINDOW_S": f"{config.throughput_window_s:g}",
                "AUTOSCALER_GPUS": ",".join(str(g) for g in limits.gpus),
                reporter.CHECKPOINT_EVERY_ENV: f"{every:g}",
                reporter.WORKER_PROTOCOL_ENV: str(reporter.PROTOCOL),
                reporter.WATCHDOG_ENV: f"{attempt.watchdog_s:g}",
                # As long as a stop would give it: the checkpoint wait, then the grace.
                reporter.WATCHDOG_GRACE_ENV: f"{config.checkpoint_wait_s + config.stop_grace_s:g}",
            }
        )
        return ContainerSpec(
            # Several agents may share an engine (the local cloud): names carry the instance.
            name=f"autoscaler-{_SLUG.sub('_', config.instance_id)}-"
            f"{_slug(launch.task_id)}-{launch.attempt}",
            image=image,
            command=launch.run.command,
            env=env,
            labels={
                LABEL_INSTANCE: config.instance_id,
                LABEL_TASK: launch.task_id,
                LABEL_JOB: launch.job_id,
                LABEL_ATTEMPT: str(launch.attempt),
            },
            cpus=min(limits.cpus * config.threads_per_core, float(config.host_cpus)),
            memory_bytes=int(limits.memory_gb * GIB),
            shm_bytes=int(shm * GIB) if shm else None,
            gpus=limits.gpus if config.gpu_devices else (),
            network=launch.run.network,
            mounts={
                str(attempt.checkpoint_dir): CHECKPOINT_MOUNT,
                str(attempt.report_dir): REPORT_MOUNT,
            },
        )

    # -- stopping -------------------------------------------------------------------------

    def stop(self, task_id: str, attempt_number: int) -> pb.TaskStatus | None:
        """Ask an attempt to checkpoint and stop; None when this worker never saw it."""
        with self._lock:
            attempt = self._attempts.get((task_id, attempt_number))
        if attempt is None:
            return None
        self._request_stop(attempt)
        with self._lock:
            return attempt.status()

    def stop_all(self, reason: str) -> list[Attempt]:
        """Ask every live attempt to checkpoint and stop, and accept no new start (the agent
        is going down, or stopping its instance); returns the attempts asked."""
        with self._lock:
            self.draining = reason
            live = [a for a in self._attempts.values() if not a.terminal]
        for attempt in live:
            self._request_stop(attempt)
        return live

    def _request_stop(self, attempt: Attempt) -> None:
        with self._lock:
            if attempt.terminal or attempt.stop_requested_at is not None:
                return
            attempt.stop_requested_at = time.monotonic()
            attempt.state = "checkpointing"
            attempt.throughput = None
            begin = attempt.container is not None
        self._changed()
        if begin:
            self._begin_stop(attempt)

    def _begin_stop(self, attempt: Attempt) -> None:
        thread = threading.Thread(
            target=self._stop_container, args=(attempt,), name="stop", daemon=True
        )
        attempt.stopper = thread
        thread.start()

    def _stop_container(self, attempt: Attempt) -> None:
        """Checkpoint request on the report socket, a short wait, SIGTERM, the grace, SIGKILL."""
        config = self.config
        container = attempt.container
        assert container is not None
        if attempt.abandoned is None:
            deadline = time.monotonic() + config.checkpoint_wait_s
            # The job may not listen yet (it is starting): ask until the deadline. A job
            # without a reporter gets SIGTERM as its request once the wait is over.
            while not attempt.exited.is_set() and time.monotonic() < deadline:
                try:
                    reporter.ask(attempt.socket_path, {"op": "checkpoint"}, config.poll_timeout_s)
                    attempt.asked = True
                    break
                except TimeoutError:
                    # Connected and sent, but no answer in time (a busy job): the request
                    # may well have reached it. Count it as asked; the status polls tell.
                    attempt.asked = True
                    break
                except (OSError, ValueError):
                    attempt.exited.wait(0.2)  # nobody listening (yet)
            while attempt.asked and not attempt.exited.is_set() and time.monotonic() < deadline:
                try:
                    answer = reporter.ask(
                        attempt.socket_path, {"op": "status"}, config.poll_timeout_s
                    )
                except (OSError, ValueError):
                    attempt.exited.wait(0.1)  # the job is closing its socket: exiting
                    continue
                self._absorb_answer(attempt, answer)
                self._ship(attempt, answer)  # a checkpoint completed before: collect it first
                if answer.get("checkpoint_done"):
                    attempt.acknowledged = True
                    break
                attempt.exited.wait(0.1)
            # A job that saved its checkpoint usually exits by itself; give it a moment.
            if attempt.acknowledged:
                attempt.exited.wait(min(config.checkpoint_wait_s, 2.0))
        if attempt.exited.is_set():
            return
        attempt.sigterm_sent = True
        try:
            grace = 0.0 if attempt.abandoned else config.stop_grace_s
            if grace:
                self.runtime.stop(container, grace)
            else:
                self.runtime.kill(container)
        except RuntimeFailure as exc:
            log.warning("stopping %s: %s; killing it", attempt.launch.task_id, exc)
            self.runtime.kill(container)

    def _abandon(self, attempt: Attempt, reason: str) -> None:
        with self._lock:
            if attempt.terminal or attempt.abandoned:
                return
            attempt.abandoned = reason
            container = attempt.container
        if container is not None:
            self.runtime.kill(container)

    # -- the end of an attempt ------------------------------------------------------------

    def _watch(self, attempt: Attempt) -> None:
        assert attempt.container is not None
        exit_ = self.runtime.wait(attempt.container)
        if self._closing.is_set():
            return  # this agent is gone: the next one adopts the container and finishes it
        attempt.exited.set()
        self._finish(attempt, exit_)

    def _finish(self, attempt: Attempt, exit_: ContainerExit) -> None:
        """Decide how the attempt ended, keep its checkpoint and its log, report it."""
        launch, config = attempt.launch, self.config
        self.artifacts.ready.wait()  # an adopted container may end before the agent enrolled
        with self._lock:
            stop_at = attempt.stop_requested_at
        if stop_at is not None:
            attempt.phases["checkpoint"] = time.monotonic() - stop_at
        if attempt.stopper is not None:
            # The job may exit before the stopping thread has heard its answer: wait for
            # it (it returns at once now that the container has exited) to know how it went.
            attempt.stopper.join(timeout=config.checkpoint_wait_s + config.stop_grace_s + 30)
        if attempt.shipper is not None:
            attempt.shipper.join()  # an upload in flight ends first (its grant bounds it)
        final = self._read_final(attempt)
        state, reason, failure = self._ending(attempt, exit_, final)
        checkpoint = attempt.checkpoint  # the latest uploaded while it ran, or where it began
        # Whatever the job saved is kept, on request or not: nothing checkpointed is lost.
        if (
            state != "completed"
            and not attempt.abandoned
            and manifest(attempt.checkpoint_dir) != attempt.baseline()
        ):
            step = final.get("checkpoint_step")
            if not (
                isinstance(step, (int, float))
                and step >= 0
                and final.get("checkpoint_seq", 0) > attempt.collected
            ):
                step = attempt.iterations  # saved without a word: its count is the best step
            began = time.monotonic()
            try:
                checkpoint = self._upload_final(attempt, int(step))
                attempt.phases["upload"] = time.monotonic() - began
            except Fenced as exc:
                state, reason, failure = "failed", f"fenced: {exc}", "infrastructure"
                attempt.abandoned = reason
            except (StorageError, OSError, tarfile.TarError) as exc:
                note = f" ({reason})" if reason else ""
                if self._closing.is_set():
                    # The agent goes down with the daemon out of reach: the checkpoint stays
                    # where it is, on this instance's disk.
                    attempt.kept = True
                    with contextlib.suppress(OSError):
                        _write_json(attempt.directory / KEPT_FILE, {"step": int(step)})
                    reason = (
                        f"{reason or state}; its last checkpoint is kept on this instance "
                        f"in {attempt.checkpoint_dir} (not uploaded: {exc})"
                    )
                    log.warning("attempt %d of %s: %s", launch.attempt, launch.task_id, reason)
                else:
                    state, reason = "failed", f"checkpoint upload failed: {exc}{note}"
                    failure = "infrastructure"
        self._save_log(attempt)
        self._end(attempt, state, reason, checkpoint, exit_.code, failure)
        self._cleanup(attempt)

    def _ending(
        self, attempt: Attempt, exit_: ContainerExit, final: Mapping[str, Any]
    ) -> tuple[str, str, FailureClass | None]:
        """How an attempt ended — its state, the reason, and whose doing it was — from how
        its container exited and what its reporter left (`final.json`)."""
        launch = attempt.launch
        if attempt.abandoned:
            return "failed", attempt.abandoned, "infrastructure"
        if attempt.stop_requested_at is not None and not (
            exit_.code == 0 and not attempt.asked and not attempt.sigterm_sent
        ):
            return "stopped", self._how_it_stopped(attempt, exit_), "infrastructure"
        if final.get("orphaned") is True:
            after = f" for {attempt.watchdog_s:g} s" if attempt.watchdog_s else ""
            return (
                "failed",
                f"stopped by its watchdog: no worker agent asked after it{after} "
                f"(exit code {exit_.code})",
                "infrastructure",
            )
        if exit_.oom_killed:
            # Transient: a memory peak depends on data order, timing and the resume point;
            # calling it deterministic would fail a long job for good on one unlucky peak.
            return "failed", f"out of memory (limit {launch.limits.memory_gb:g} GiB)", "transient"
        if exit_.code == 0:  # (also when a stop came too late to reach it: it finished)
            return "completed", "", None
        command = " ".join(launch.run.command) or "the image's command"
        lowered = exit_.error.lower()
        if exit_.code in NOT_EXECUTABLE_EXITS or (
            "exec" in lowered and "executable file not found" in lowered
        ):
            what = NOT_EXECUTABLE_EXITS.get(exit_.code, "not found")
            error = f": {exit_.error}" if exit_.error else ""
            return (
                "failed",
                f"exit code {exit_.code}: command {what} ({command}){error}",
                "deterministic",
            )
        if exit_.code in launch.run.fatal_exit_codes:
            return (
                "failed",
                f"exit code {exit_.code}, which the job declares fatal" + _signal_note(exit_.code),
                "deterministic",
            )
        if exit_.error:
            return "failed", f"exit code {exit_.code}: {exit_.error}", "transient"
        return "failed", f"exit code {exit_.code}" + _signal_note(exit_.code), "transient"

    def _upload_final(self, attempt: Attempt, step: int) -> str:
        """Upload what the checkpoint directory holds as the version of `step`, trying again
        while it fails: for `upload_patience_s` while the daemon answers (storage is down),
        without end while it does not (nothing else could take it: the checkpoint stays on
        this disk meanwhile), never once the agent is closing."""
        launch = attempt.launch
        with self._lock:
            if attempt.state in ("starting", "running"):
                attempt.state, attempt.throughput = "checkpointing", None
        self._changed()
        began = time.monotonic()
        delay = UPLOAD_RETRY_S
        while True:
            try:
                return self.artifacts.upload_checkpoint(
                    launch, attempt.checkpoint_dir, attempt.directory, step
                )
            except Fenced:
                raise
            except (StorageError, OSError, tarfile.TarError) as exc:
                if self._closing.is_set():
                    raise
                reachable = self._daemon_silent_s() == 0.0
                if reachable and time.monotonic() - began >= self.config.upload_patience_s:
                    raise
                log.warning(
                    "the checkpoint of %s/%d is not uploaded yet (%s); trying again in %g s",
                    launch.task_id,
                    launch.attempt,
                    exc,
                    delay,
                )
            self._closing.wait(delay)
            delay = min(delay * 2, 60.0)

    def _read_final(self, attempt: Attempt) -> Mapping[str, Any]:
        """What the job's reporter left when it exited (`final.json`: polls miss the last
        seconds), its count taken into the attempt; empty if it left nothing."""
        try:
            final = json.loads((attempt.report_dir / reporter.FINAL_FILE).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(final, dict):
            return {}
        iterations = final.get("iterations")
        if isinstance(iterations, (int, float)) and iterations >= 0:
            with self._lock:
                attempt.iterations = max(attempt.iterations, float(iterations))
        return final

    def _how_it_stopped(self, attempt: Attempt, exit_: ContainerExit) -> str:
        wait, grace = self.config.checkpoint_wait_s, self.config.stop_grace_s
        if attempt.acknowledged or (attempt.asked and exit_.code == 0):
            return "checkpointed on request"
        if not attempt.sigterm_sent:
            return f"exited with code {exit_.code} before acknowledging the checkpoint request"
        if not attempt.asked:
            how = "no report socket answered; stopped with SIGTERM"
        else:
            how = f"did not acknowledge the checkpoint request within {wait:g} s; sent SIGTERM"
        if exit_.code == 137 and not exit_.oom_killed:
            return f"{how}; killed after a {grace:g} s grace period"
        return f"{how} (exit code {exit_.code})"

    def _save_log(self, attempt: Attempt, data: bytes | None = None) -> None:
        """Keep the container's log (or `data`) in the storage, and its last lines."""
        container, launch = attempt.container, attempt.launch
        if attempt.abandoned or (container is None and data is None):
            return  # a fenced attempt uploads nothing (its grants are refused)
        if data is None:
            assert container is not None
            try:
                data = self.runtime.logs(container)
            except RuntimeFailure as exc:
                log.warning("log of %s/%d: %s", launch.task_id, launch.attempt, exc)
                return
        attempt.log_tail = self.artifacts.save_log(launch, data, attempt.directory)

    def _end(
        self,
        attempt: Attempt,
        state: str,
        reason: str,
        checkpoint: str | None,
        exit_code: int | None = None,
        failure: FailureClass | None = None,
    ) -> None:
        """Publish how the attempt ended, once its container is gone (its resources free)."""
        if attempt.container is not None:
            try:
                self.runtime.remove(attempt.container)
            except RuntimeFailure as exc:
                log.warning("removing the container of %s: %s", attempt.launch.task_id, exc)
        with self._lock:
            attempt.state, attempt.reason = state, reason
            attempt.checkpoint, attempt.exit_code = checkpoint, exit_code
            attempt.throughput = None
            attempt.failure = None if state == "completed" else failure
        attempt.exited.set()
        log.info(
            "attempt %d of %s %s%s%s",
            attempt.launch.attempt,
            attempt.launch.task_id,
            state,
            f" ({failure})" if attempt.failure else "",
            f": {reason}" if reason else "",
        )
        self._changed()

    def _cleanup(self, attempt: Attempt) -> None:
        if attempt.kept:
            # Only the checkpoint is worth keeping: the rest (report socket, copies) goes.
            for name in ("report", SNAPSHOT_DIR):
                shutil.rmtree(attempt.directory / name, ignore_errors=True)
            return
        shutil.rmtree(attempt.directory, ignore_errors=True)

    # -- adoption after a restart ---------------------------------------------------------

    def adopt(self) -> None:
        """Take over the containers a previous agent process of this instance started."""
        found = self.runtime.containers({LABEL_INSTANCE: self.config.instance_id})
        for info in found:
            labels = info.labels
            try:
                number = int(labels.get(LABEL_ATTEMPT, ""))
                task_id = labels[LABEL_TASK]
            except (KeyError, ValueError):
                continue
            directory = self._directory(task_id, number)
            try:
                launch = load_launch(directory)
            except (OSError, DecodeError, BadMessage):
                log.warning("container %s has no saved launch: removing it", info.container_id)
                self.runtime.remove(info.container_id)
                continue
            attempt = Attempt(
                launch,
                directory,
                self.config.throughput_window_s,
                state="running",
                checkpoint=launch.checkpoint,
                container=info.container_id,
            )
            restored = directory / RESTORED_FILE
            if restored.exists():
                attempt.restored = tuple(tuple(x) for x in json.loads(restored.read_text()))  # type: ignore[misc]
            _load_uploaded(attempt)
            with self._lock:
                self._attempts[attempt.key] = attempt
            log.info("adopted attempt %d of %s (%s)", number, task_id, info.container_id[:12])
            threading.Thread(target=self._watch, args=(attempt,), daemon=True).start()


def save_launch(directory: Path, launch: TaskLaunch) -> None:
    """Keep an attempt's launch beside it, in the worker protocol's own encoding."""
    (directory / LAUNCH_FILE).write_bytes(launch_to_pb(launch).SerializeToString())


def load_launch(directory: Path) -> TaskLaunch:
    """The launch `save_launch` kept (OSError, DecodeError or BadMessage if there is none)."""
    return launch_from_pb(pb.StartTask.FromString((directory / LAUNCH_FILE).read_bytes()))


def _save_uploaded(attempt: Attempt) -> None:
    """Keep what was uploaded while the attempt ran (and what waits to be) beside it, for an
    agent that adopts its container: the latest checkpoint is never reported older."""
    document = {
        "checkpoint": attempt.checkpoint,
        "collected": attempt.collected,
        "uploaded": attempt.uploaded,
        "pending_step": attempt.pending_step,
        "pending": attempt.pending,
    }
    path = attempt.directory / UPLOADED_FILE
    with contextlib.suppress(OSError):
        path.with_suffix(".tmp").write_text(json.dumps(document))
        os.replace(path.with_suffix(".tmp"), path)


def _load_uploaded(attempt: Attempt) -> None:
    try:
        document = json.loads((attempt.directory / UPLOADED_FILE).read_text())
        collected = int(document["collected"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    attempt.checkpoint = document.get("checkpoint") or attempt.checkpoint
    attempt.collected = collected
    if document.get("uploaded") is not None:
        attempt.uploaded = tuple(tuple(entry) for entry in document["uploaded"])
    step = document.get("pending_step")
    if isinstance(step, int) and attempt.snapshot_dir.is_dir():
        attempt.pending_step = step
        attempt.pending = tuple(tuple(entry) for entry in document.get("pending") or ())


def attempt_directory(work_dir: Path, task_id: str, attempt: int) -> Path:
    """Where an agent with `work_dir` keeps an attempt: its launch, checkpoint directory
    and report socket (what `autoscaler down` reaches when the agent is gone)."""
    return work_dir / "attempts" / f"{_slug(task_id)}.{attempt}"


def ask_to_checkpoint(directories: Iterable[Path], deadline: float, timeout_s: float = 2.0) -> None:
    """Do what a gone agent would: ask each job (over its report socket, in its attempt
    directory) to checkpoint and stop, and wait until each has saved or `deadline`
    (monotonic) passes. The step of each saved checkpoint is written beside it
    (`KEPT_FILE`), for whoever uploads it; checkpoints a job completed before are marked
    collected (the newest is what matters), so it may write the one asked for."""
    waiting = {}
    for directory in directories:
        socket = str(directory / "report" / "report.sock")
        try:
            reporter.ask(socket, {"op": "checkpoint"}, timeout_s)
        except (OSError, ValueError):
            continue  # no reporter listening: nothing to ask
        waiting[directory] = socket
    while waiting and time.monotonic() < deadline:
        for directory, socket in list(waiting.items()):
            try:
                answer = reporter.ask(socket, {"op": "status"}, timeout_s)
            except (OSError, ValueError):
                del waiting[directory]  # exited (its final.json says how far it got)
                continue
            step, seq = answer.get("checkpoint_step"), answer.get("checkpoint_seq")
            if isinstance(step, int | float) and not isinstance(step, bool) and step >= 0:
                with contextlib.suppress(OSError):
                    _write_json(directory / KEPT_FILE, {"step": int(step)})
            if answer.get("checkpoint_done"):
                del waiting[directory]
            elif isinstance(seq, int) and seq > int(answer.get("checkpoint_collected") or 0):
                with contextlib.suppress(OSError, ValueError):
                    reporter.ask(socket, {"op": "collected", "seq": seq}, timeout_s)
        time.sleep(0.1)


def _slug(task_id: str) -> str:
    """A name for files and containers: readable, and unique by a short hash."""
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:8]
    return f"{_SLUG.sub('_', task_id)[:60]}-{digest}"


def _signal_note(code: int) -> str:
    names = {137: "SIGKILL", 143: "SIGTERM", 139: "SIGSEGV", 134: "SIGABRT"}
    return f" (killed by {names[code]})" if code in names else ""


def _write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document))


def _hand_to_job(directory: Path) -> None:
    """Make a restored checkpoint the job's: an agent running as root restores it as
    root, and the job runs as `nobody` (`runtime.job_user`)."""
    if os.getuid() != 0:
        return  # the job runs as the agent's own user: the files are its already
    uid, gid = (int(part) for part in job_user().split(":"))
    for root, dirs, files in os.walk(directory):
        for name in (root, *(os.path.join(root, n) for n in dirs + files)):
            os.lchown(name, uid, gid)
