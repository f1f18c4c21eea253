"""The worker agent: one per instance, runs the tasks the daemon places there.

What it does (Eva §5, and what the Eva artifact's worker left undone), one
part a module:

- **Enrolls** with the daemon: proves which instance it is (EC2: the signed
  instance identity document from IMDSv2; the local cloud: the one-time secret
  left in its directory) with a certificate signing request — its key never
  leaves the instance — and gets a short-lived client certificate naming the
  instance. It keeps key and certificate in its work directory (0600), so a
  restarted agent carries on without a new proof, and **renews** the
  certificate at heartbeat before half its lifetime is up.
- **Dials out, only**: over mutual TLS to the daemon's worker port it
  **heart-beats** the state of every attempt it holds and holds a **command
  stream** open, on which starts and stops arrive at once. Nothing listens on
  the instance. When the daemon restarts, the agent reconnects and its
  containers keep running; an attempt the daemon gave up (its answer says stop,
  or a grant is refused) is killed at once, without uploading anything, and a
  worker the daemon declared lost kills them all (their tasks run elsewhere).
  A job's progress is heart-beaten as it moves (at most one a poll), so the
  daemon's view is at most one poll old. This module: the `Agent`, which also
  composes the parts below.
- **Stops its instance when the daemon is gone** (the spend brake): with no
  task running and no word from the daemon for `orphan_timeout_s` (30 min by
  default), or with tasks running for `orphan_max_s` (2 h) after checkpointing
  them (kept on local disk when they cannot be uploaded), it runs the shutdown
  command (`shutdown -h now` on EC2; by default elsewhere it ends its
  containers and itself). Nothing bills for long without a daemon to use it.
- **Heeds the provider's notices** (`interruption`): with `notice_endpoint` (IMDS on
  EC2; the local cloud's stand-in) it polls for a spot interruption notice and a
  rebalance recommendation every `notice_interval_s`. On an interruption notice it
  checkpoints and stops its tasks at once, within the two-minute window (the path of
  `close(stop_tasks=True)`; checkpoints taken while the job ran are uploaded already),
  accepts no new start, and heart-beats the notice with the attempts' ends — which
  are the infrastructure's doing, never the job's. A rebalance recommendation is only
  reported: the daemon decides.
- **Goes down gracefully**: `close(stop_tasks=True)` (`--stop-tasks`, for
  `down`) checkpoints and stops its tasks first, bounded by their grace; a
  daemon that released the instance (scale-in, drain, down) is a normal end,
  logged at INFO.
- **Runs attempts** (`attempts`): start, watch, stop (checkpoint request,
  SIGTERM, SIGKILL), the final state, and adoption of the containers a
  previous agent process of the instance left running.
- **Moves artifacts** (`artifacts`) with grants only: presigned GETs from the
  start, presigned PUTs asked for each upload. It holds no storage credentials.

Each attempt's phases (fetch, build, start, init, checkpoint, upload) are
measured and reported with its status.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.resources import Resources
from executor.artifacts import CHECKPOINT, Artifacts, Fenced
from executor.attempts import AttemptRunner, Rejected
from executor.enrollment import IMDS_ENDPOINT, imds_identity, read_secret_file
from executor.interruption import DEFAULT_POLL_S, INSTANCE_ACTION, Notice, NoticeWatcher
from executor.messages import ENDED_KEY, LOST, RELEASED, BadMessage, launch_from_pb
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.runtime import LABEL_INSTANCE, RuntimeFailure
from executor.security import (
    DAEMON_NAME,
    certificate_window,
    read_secret,
    secure_channel,
    signing_request,
    write_secret,
)
from executor.storage import StorageError

log = logging.getLogger(__name__)

#: Channel arguments for the links to the daemon: reconnect quickly after it restarts,
#: and notice a dead connection (a vanished daemon host) within a minute.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)

#: The distributions the agent may be installed from: the light worker's, or the whole one.
DISTRIBUTIONS = ("ec2-batch-autoscaler-worker", "ec2-batch-autoscaler")

#: Where the agent keeps its identity inside its work directory (mode 0700, files 0600).
IDENTITY_DIR = "identity"

#: The jobs' watchdog when neither the agent's flag nor the daemon says otherwise.
DEFAULT_JOB_WATCHDOG_S = 120.0


def agent_version() -> str:
    """`<distribution>/<version>` of the installed agent (what it heart-beats with)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in DISTRIBUTIONS:
        try:
            return f"{name}/{version(name)}"
        except PackageNotFoundError:
            continue
    return "ec2-batch-autoscaler/unknown"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """How one agent runs; `capacity` is what it advertises (GPUs, physical cores, GiB).

    The proof of its instance is the one-time secret in `enrollment_secret` (the local
    cloud), else the identity document at `imds_endpoint` (EC2)."""

    instance_id: str
    daemon: str  # host:port of the daemon's API port, where workers enroll
    ca_pem: bytes  # the cluster's server CA: the only one the agent trusts
    work_dir: Path
    capacity: Resources
    enrollment_secret: Path | None = None
    imds_endpoint: str = IMDS_ENDPOINT
    daemon_server_name: str = DAEMON_NAME  # the name the daemon's certificate must carry
    threads_per_core: float = 1.0  # logical CPUs per physical core on this machine
    host_cpus: int = 1  # logical CPUs a container may be given at most
    gpu_devices: int = 0  # physical GPU devices (0: GPU indices are not passed to Docker)
    checkpoint_wait_s: float = 10.0  # for the job to acknowledge a checkpoint request
    stop_grace_s: float = 30.0  # after SIGTERM, before SIGKILL
    throughput_window_s: float = ROUND_INTERVAL_S
    rpc_timeout_s: float = 10.0
    poll_timeout_s: float = 2.0  # per report-socket request
    poll_interval_s: float = 1.0  # how often running jobs are asked how far they got
    progress_interval_s: float = 1.0  # at most one heartbeat this often for progress alone
    log_tail_lines: int = 20
    # A job whose agent has not polled it this long stops itself (the reporter's watchdog).
    # None: twice the daemon's heartbeat timeout (a worker silent that long is lost and its
    # tasks run elsewhere), DEFAULT_JOB_WATCHDOG_S until the daemon says; 0: no watchdog.
    job_watchdog_s: float | None = None
    upload_patience_s: float = 60.0  # a final upload is tried this long while storage fails
    # The spend brake: no word from the daemon this long with no task running (or with
    # tasks, for `orphan_max_s`, after checkpointing them) stops the instance; 0: never.
    orphan_timeout_s: float = 1800.0
    orphan_max_s: float = 7200.0
    # What stops the instance: `shutdown -h now` on EC2; empty: end the agent and its
    # containers (the local cloud's instance is nothing more).
    shutdown_command: tuple[str, ...] = ()
    # Where to poll for spot interruption notices (IMDS: EC2's, or the local cloud's
    # stand-in); empty: not polled (an on-demand instance gets none).
    notice_endpoint: str = ""
    notice_interval_s: float = DEFAULT_POLL_S


class AgentError(RuntimeError):
    """The agent cannot run (its configuration is wrong)."""


class _Identity:
    """The agent's key and certificate, and the address they are good for."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key: bytes | None = None
        self.cert: bytes | None = None
        self.registry: str | None = None
        self.received_at = 0.0  # when the certificate came (its start is backdated)

    def load(self) -> bool:
        """The identity a previous agent process left, if still usable."""
        try:
            key = read_secret(self.directory / "key.pem")
            cert = (self.directory / "cert.pem").read_bytes()
            registry = (self.directory / "registry").read_text().strip()
            received_at = (self.directory / "cert.pem").stat().st_mtime
        except OSError:
            return False
        self.key, self.cert, self.registry = key, cert, registry
        self.received_at = received_at
        return self.remaining() > 0

    def save(self, key: bytes, cert: bytes, registry: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_secret(self.directory / "key.pem", key, overwrite=True)
        write_secret(self.directory / "cert.pem", cert, overwrite=True)
        write_secret(self.directory / "registry", registry, overwrite=True)
        self.key, self.cert, self.registry = key, cert, registry
        self.received_at = time.time()

    def forget(self) -> None:
        for name in ("key.pem", "cert.pem", "registry"):
            (self.directory / name).unlink(missing_ok=True)
        self.key = self.cert = self.registry = None

    def remaining(self) -> float:
        """Seconds until the certificate expires (0 without one)."""
        if self.cert is None:
            return 0.0
        return max(0.0, certificate_window(self.cert)[1] - time.time())

    def due(self) -> bool:
        """Past half its lifetime (from when it came): time to renew. The old certificate
        stays valid until it ends, so nothing in flight is cut short."""
        if self.cert is None:
            return True
        end = certificate_window(self.cert)[1]
        return time.time() >= self.received_at + (end - self.received_at) / 2


class Agent:
    """The worker agent of one instance. `serve()` starts it; `close()` stops the agent
    (its containers keep running, as they would across a restart, unless asked to stop
    them first).

    `clock` (monotonic seconds) times the spend brake; `shutdown` is what the brake calls,
    with its reason, to stop the instance (default: `config.shutdown_command`). Tests
    inject both."""

    def __init__(
        self,
        config: AgentConfig,
        runtime: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        shutdown: Callable[[str], None] | None = None,
    ) -> None:
        # Docker takes a relative bind-mount source for a volume name: paths are absolute.
        self.config = config = replace(config, work_dir=config.work_dir.absolute())
        self.runtime = runtime
        self.version = agent_version()
        self._lock = threading.RLock()
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._clock = clock
        self._shutdown = shutdown or self._stop_instance
        self._last_contact = clock()  # the daemon's last answer (or the agent's start)
        self._reachable = False  # the last heartbeat was answered
        self._daemon_timeout_s = 0.0  # the daemon's heartbeat timeout, once it said
        self.beats = 0  # heartbeats answered (tests and `close` wait on it)
        self.stopped_instance: str | None = None  # why the spend brake stopped it
        self.artifacts = Artifacts(runtime, config.work_dir, config.log_tail_lines, self._grant)
        self.attempts = AttemptRunner(
            config,
            runtime,
            self.artifacts,
            changed=self._changed.set,
            closing=self._closing,
            daemon_silent_s=self._daemon_silent_s,
            watchdog_s=self._watchdog_s,
        )
        self.identity = _Identity(config.work_dir / IDENTITY_DIR)
        self._interval = 5.0
        self.enrolled = threading.Event()
        self.connected = threading.Event()  # heard by the daemon since the last (re)connect
        self.lost_reason: str | None = None
        self._channel: grpc.Channel | None = None
        self._registry: pb_grpc.RegistryStub | None = None
        self._stream: Any = None
        self._threads: list[threading.Thread] = []
        self.notices: list[Notice] = []  # what the provider announced, heart-beaten until the end
        self.watcher = (
            NoticeWatcher(
                config.notice_endpoint, self._noticed, interval_s=config.notice_interval_s
            )
            if config.notice_endpoint
            else None
        )

    # -- lifecycle ------------------------------------------------------------------------

    def serve(self) -> None:
        """Adopt the containers a previous agent left, then enroll and heart-beat."""
        config = self.config
        config.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(config.work_dir, 0o700)
        if config.enrollment_secret is None and not config.imds_endpoint:
            raise AgentError("no proof of the instance: an enrollment secret or IMDS")
        self._last_contact = self._clock()
        self.attempts.adopt()
        loops: list[tuple[Callable[[], None], str]] = [
            (self._heartbeat_loop, "heartbeat"),
            (self._command_loop, "commands"),
        ]
        if self.watcher is not None:
            watcher = self.watcher
            loops.append((lambda: watcher.run(self._closing), "notices"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _noticed(self, notice: Notice) -> None:
        """A notice from the provider: reported at once; on an interruption notice the tasks
        are checkpointed and stopped first thing (in a thread of its own: polling goes on)."""
        with self._lock:
            self.notices.append(notice)
        self._changed.set()
        if notice.kind == INSTANCE_ACTION:
            thread = threading.Thread(
                target=self._stop_tasks, args=(notice.describe(),), name="reclaim", daemon=True
            )
            thread.start()

    def close(self, grace_s: float = 1.0, *, stop_tasks: bool = False) -> None:
        """Stop heart-beating; containers keep running (the next agent of the instance adopts
        them) — unless `stop_tasks`: then each task is first asked to checkpoint and stop
        (bounded by its checkpoint wait, grace and upload patience), and the daemon told how
        they ended."""
        if stop_tasks and not self._closing.is_set():
            self._stop_tasks("the worker agent is shutting down")
        self._closing.set()
        self._changed.set()
        with self._lock:
            channel, self._channel = self._channel, None
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        if channel is not None:
            channel.close()  # cancels a heartbeat in flight
        for thread in self._threads:
            thread.join(timeout=self.config.rpc_timeout_s + 5)

    def _stop_tasks(self, reason: str) -> None:
        config = self.config
        asked = self.attempts.stop_all(reason)
        if not asked:
            return
        log.info("%s: checkpointing and stopping %d task(s)", reason, len(asked))
        bound = config.checkpoint_wait_s + config.stop_grace_s + config.upload_patience_s + 5
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and not all(a.terminal for a in asked):
            if not self._reachable and all(a.exited.is_set() for a in asked):
                # Every container has stopped and no daemon can grant an upload (`down`
                # with the daemon stopped): waiting would only spend the grace. Closing
                # makes the final uploads give up: each checkpoint is kept on this disk,
                # beside its step (`KEPT_FILE`), for `down` to upload.
                log.info("no daemon to grant uploads: the checkpoints stay on this disk")
                self._closing.set()
                settle = time.monotonic() + 10.0
                while time.monotonic() < settle and not all(a.terminal for a in asked):
                    time.sleep(0.05)
                return
            time.sleep(0.1)
        beats = self.beats
        self._changed.set()  # tell the daemon how they ended, if it can hear
        deadline = time.monotonic() + min(config.rpc_timeout_s, 5.0)
        while self._reachable and self.beats == beats and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait(self) -> None:
        """Block until `close()` (the command runs until SIGTERM)."""
        self._closing.wait()

    def statuses(self) -> list[pb.TaskStatus]:
        """The state of every attempt this worker holds (what a heartbeat carries)."""
        return self.attempts.statuses()

    # -- enrollment and the certificate ----------------------------------------------------

    def _proof(self, request: pb.EnrollRequest) -> None:
        config = self.config
        if config.enrollment_secret is not None:
            request.local_secret = read_secret_file(config.enrollment_secret)
        else:
            request.ec2.CopyFrom(imds_identity(config.imds_endpoint))

    def _enroll(self) -> None:
        """Make sure the agent has a valid certificate and a channel to the registry."""
        if self.identity.key is None and self.identity.load():
            log.info("using the certificate this instance enrolled with before")
        elif self.identity.remaining() <= 60:
            csr, key = signing_request(self.config.instance_id)
            request = pb.EnrollRequest(
                instance_id=self.config.instance_id,
                csr_pem=csr,
                held=[pb.AttemptRef(task_id=t, attempt=a) for t, a in self.attempts.held()],
            )
            self._proof(request)
            with secure_channel(
                self.config.daemon,
                self.config.ca_pem,
                server_name=self.config.daemon_server_name,
                options=RECONNECT_OPTIONS,
            ) as channel:
                response = pb_grpc.EnrollmentStub(channel).Enroll(
                    request, timeout=self.config.rpc_timeout_s, wait_for_ready=True
                )
            self.identity.save(key, response.certificate_pem, response.registry_address)
            self._interval = response.heartbeat_interval_s or self._interval
            self._daemon_timeout_s = response.heartbeat_timeout_s or self._daemon_timeout_s
            self._last_contact = self._clock()
            # A restarted agent keeps only the attempts the daemon still wants.
            self.attempts.abandon(response.stop, "the daemon gave this attempt up")
            log.info(
                "enrolled %s with the daemon at %s", self.config.instance_id, self.config.daemon
            )
        self._connect()
        self.enrolled.set()

    def _connect(self) -> None:
        """A channel to the registry with the current certificate; the previous one (and the
        command stream on it) is closed once replaced, so nothing in flight is cut short
        but the stream, which the command loop opens again at once (commands are resent)."""
        identity = self.identity
        assert identity.key is not None and identity.cert is not None
        assert identity.registry is not None
        channel = secure_channel(
            identity.registry,
            self.config.ca_pem,
            server_name=self.config.daemon_server_name,
            client=(identity.cert, identity.key),
            options=RECONNECT_OPTIONS,
        )
        with self._lock:
            old, self._channel = self._channel, channel
            self._registry = pb_grpc.RegistryStub(channel)
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        if old is not None:
            old.close()
        self.artifacts.ready.set()

    def _renew(self) -> None:
        """A new key and certificate before the current one is half through its life."""
        csr, key = signing_request(self.config.instance_id)
        response = self._stub().Renew(
            pb.RenewRequest(csr_pem=csr), timeout=self.config.rpc_timeout_s, wait_for_ready=True
        )
        assert self.identity.registry is not None
        self.identity.save(key, response.certificate_pem, self.identity.registry)
        self._connect()
        log.info("renewed the certificate of %s", self.config.instance_id)

    def _stub(self) -> pb_grpc.RegistryStub:
        with self._lock:
            registry = self._registry
        if registry is None:
            raise ValueError("not connected to the daemon")
        return registry

    # -- grants ----------------------------------------------------------------------------

    def _grant(self, task_id: str, attempt: int, kind: str, step: int) -> tuple[str, str]:
        """A presigned PUT for one object of an attempt (`artifacts.Uploads`): asked of the
        daemon, retried while it cannot be reached; Fenced when it refuses for good."""
        request = pb.GrantUploadRequest(
            task_id=task_id,
            attempt=attempt,
            kind=pb.OBJECT_KIND_CHECKPOINT if kind == CHECKPOINT else pb.OBJECT_KIND_LOG,
            step=step,
        )
        deadline = time.monotonic() + 120.0
        delay = 0.5
        while True:
            try:
                grant = self._stub().GrantUpload(
                    request, timeout=self.config.rpc_timeout_s, wait_for_ready=True
                )
                return grant.url, grant.ref
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED):
                    raise Fenced(exc.details()) from None  # type: ignore[attr-defined]
                why = f"{code.name} {exc.details()}"  # type: ignore[attr-defined]
            except ValueError as exc:  # not connected yet, or the channel was replaced
                why = str(exc)
            if time.monotonic() > deadline or self._closing.is_set():
                raise StorageError(f"no upload grant from the daemon: {why}")
            self._closing.wait(delay)
            delay = min(delay * 2, 5.0)

    # -- heartbeats -------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        """Enroll, then heart-beat every interval — at once when an attempt changes state or
        a job reports its first iteration, and as a job's count moves (at most one beat a
        `progress_interval_s`) — polling the jobs every `poll_interval_s`, and minding the
        spend brake."""
        backoff = 0.5
        next_beat = last_beat = 0.0
        unreachable_since: float | None = None
        while not self._closing.is_set():
            self.check_spend_brake()
            if self._closing.is_set():
                return
            if not self.enrolled.is_set():
                self.attempts.poll()  # the jobs' watchdog hears the agent meanwhile
                try:
                    self._enroll()
                    backoff, next_beat = 0.5, 0.0
                except (grpc.RpcError, OSError, ValueError) as exc:
                    if self._closing.is_set():
                        return
                    self._enrollment_failed(exc)
                    self._closing.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
            polled = self.attempts.poll()
            now = time.monotonic()
            moved = polled.progressed and now - last_beat >= self.config.progress_interval_s
            if polled.first_iteration or moved or self._changed.is_set() or now >= next_beat:
                self._changed.clear()
                next_beat, last_beat = now + self._interval, now
                try:
                    if self.identity.due():
                        self._renew()
                    self._beat()
                    if unreachable_since is not None:
                        log.info("the daemon answers again")
                    unreachable_since = None
                except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed
                    self._reachable = False
                    if self._closing.is_set():
                        return
                    code = exc.code() if isinstance(exc, grpc.RpcError) else None  # type: ignore[attr-defined]
                    details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)  # type: ignore[attr-defined]
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        self._declared_lost(details or "declared lost", _ended_how(exc))
                        continue
                    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        log.warning("the daemon refuses this worker's certificate (%s)", details)
                        self.identity.forget()
                        self.enrolled.clear()
                        continue
                    if unreachable_since is None:
                        unreachable_since = time.monotonic()
                        log.warning(
                            "heartbeat failed (%s); containers keep running, retrying",
                            code.name if code else details,
                        )
            wait = min(self.config.poll_interval_s, max(next_beat - time.monotonic(), 0.0))
            self._changed.wait(wait)

    def _beat(self) -> None:
        capacity = self.config.capacity
        response = self._stub().Heartbeat(
            pb.HeartbeatRequest(
                capacity=pb.Capacity(
                    gpus=capacity.gpu, cpus=capacity.cpu, memory_gb=capacity.ram_gb
                ),
                agent_version=self.version,
                gpu_devices=self.config.gpu_devices,
                tasks=self.statuses(),
                notices=[
                    pb.InterruptionNotice(kind=n.kind, action=n.action, time=n.time)
                    for n in self._notices()
                ],
            ),
            timeout=self.config.rpc_timeout_s,
            wait_for_ready=True,
        )
        with self._lock:
            self.lost_reason = None
            self._last_contact = self._clock()
            self._reachable = True
            self.beats += 1
        self.connected.set()
        self._forget(response.acknowledged)
        self.attempts.abandon(response.stop, "the daemon gave this attempt up")
        self._interval = response.heartbeat_interval_s or self._interval
        self._daemon_timeout_s = response.heartbeat_timeout_s or self._daemon_timeout_s

    def _notices(self) -> list[Notice]:
        with self._lock:
            return list(self.notices)

    def _enrollment_failed(self, exc: BaseException) -> None:
        if isinstance(exc, grpc.RpcError):
            code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                self._declared_lost(details or "declared lost", _ended_how(exc))
                return
            log.warning("cannot enroll with %s: %s %s", self.config.daemon, code.name, details)
        else:
            log.warning("cannot enroll with %s: %s", self.config.daemon, exc)

    def _declared_lost(self, reason: str, how: str = LOST) -> None:
        """The daemon gave this worker up: released (scale-in, drain, `down`: a normal end,
        its tasks were stopped before) or lost (its tasks run elsewhere now). Either way
        what still runs here is fenced: kill it."""
        with self._lock:
            first = self.lost_reason is None
            self.lost_reason = reason
        self.connected.clear()
        live = self.attempts.live()
        if first:
            if how == RELEASED:
                log.info("the daemon released this instance (%s)", reason)
                if live:
                    log.warning("killing %d task(s) still running here (fenced)", len(live))
            elif live:
                log.error(
                    "the daemon declared this worker lost (%s); killing its %d task(s)",
                    reason,
                    len(live),
                )
            else:
                log.warning("the daemon declared this worker lost (%s)", reason)
        self.attempts.abandon_all(f"the daemon gave this instance up: {reason}")
        self._closing.wait(5.0)

    # -- the spend brake --------------------------------------------------------------------

    def _daemon_silent_s(self) -> float:
        """0 while the daemon answers; else how long it has not (at least a little)."""
        if self._reachable:
            return 0.0
        return max(self._clock() - self._last_contact, 1e-3)

    def _watchdog_s(self) -> float:
        """What a job's watchdog is set to when it starts (see `AgentConfig.job_watchdog_s`)."""
        if self.config.job_watchdog_s is not None:
            return self.config.job_watchdog_s
        if self._daemon_timeout_s:
            return 2 * self._daemon_timeout_s
        return DEFAULT_JOB_WATCHDOG_S

    def check_spend_brake(self) -> None:
        """Stop the instance when the daemon has been out of reach too long: `orphan_timeout_s`
        with no task running, `orphan_max_s` with tasks (checkpointed and stopped first;
        what cannot be uploaded stays on this disk). Nothing runs up a bill unwatched."""
        config = self.config
        silent = self._daemon_silent_s()  # 0 while the last heartbeat was answered
        live = self.attempts.live()
        if live:
            if not config.orphan_max_s or silent < config.orphan_max_s:
                return
            reason = (
                f"no word from the daemon for {silent:.0f} s with {len(live)} task(s) "
                "running (their checkpoints are kept)"
            )
            if not self._brake_once(reason):
                return
            log.warning("%s: checkpointing and stopping them", reason)
            asked = self.attempts.stop_all(reason)
            deadline = time.monotonic() + config.checkpoint_wait_s + config.stop_grace_s + 30
            for attempt in asked:
                attempt.exited.wait(max(0.0, deadline - time.monotonic()))
        else:
            if not config.orphan_timeout_s or silent < config.orphan_timeout_s:
                return
            reason = f"no word from the daemon for {silent:.0f} s and no task running"
            if not self._brake_once(reason):
                return
        self.attempts.draining = reason
        log.warning("stopping this instance: %s", reason)
        self._closing.set()  # uploads still trying give up: their checkpoints stay on disk
        self._changed.set()
        self._shutdown(reason)

    def _brake_once(self, reason: str) -> bool:
        """Record why the instance is being stopped; False if it already is (the heartbeat
        loop and a caller may both find the brake due)."""
        with self._lock:
            if self.stopped_instance is not None:
                return False
            self.stopped_instance = reason
            return True

    def _stop_instance(self, reason: str) -> None:
        """The default shutdown: run `shutdown_command`, or (none) end this agent's
        containers — the agent itself ends as its loop sees it is closing."""
        command = self.config.shutdown_command
        if command:
            log.warning("running %s", shlex.join(command))
            try:
                subprocess.run(command, check=True, timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                log.error("cannot stop this instance with %s: %s", shlex.join(command), exc)
            return
        for info in self.runtime.containers({LABEL_INSTANCE: self.config.instance_id}):
            try:
                self.runtime.remove(info.container_id)
            except RuntimeFailure as exc:
                log.warning("removing container %s: %s", info.container_id[:12], exc)

    def _forget(self, refs: Iterable[Any]) -> None:
        self.attempts.forget(refs)

    # -- commands ---------------------------------------------------------------------------

    def _command_loop(self) -> None:
        """Hold the command stream open (after the first heartbeat, which introduces this
        worker), carrying out each start and stop as it arrives."""
        backoff = 0.2
        while not self._closing.is_set():
            if not self.connected.wait(timeout=0.5):
                continue
            try:
                stream = self._stub().Commands(pb.CommandsRequest(), wait_for_ready=True)
            except ValueError:
                self._closing.wait(backoff)
                continue
            with self._lock:
                self._stream = stream
            try:
                for command in stream:
                    backoff = 0.2
                    self._carry_out(command)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    self.connected.clear()  # the next heartbeat says why
                elif code != grpc.StatusCode.CANCELLED:
                    log.info("command stream ended (%s); opening it again", code.name)
            except ValueError:
                pass  # the channel was closed under it (replaced, or the agent is closing)
            self._closing.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _carry_out(self, command: pb.Command) -> None:
        which = command.WhichOneof("command")
        if which == "start":
            order = command.start
            try:
                launch = launch_from_pb(order)
            except BadMessage as exc:
                log.error("start of %s/%d refused: %s", order.task_id, order.attempt, exc)
                return
            try:
                self.attempts.start(
                    launch,
                    context_url=order.build_context_url,
                    checkpoint_url=order.checkpoint_url,
                )
            except Rejected as exc:
                self.attempts.refuse(launch, str(exc))
        elif which == "stop":
            self.attempts.stop(command.stop.task_id, command.stop.attempt)


def _ended_how(exc: BaseException) -> str:
    """How the daemon says it gave this instance up (the protocol's trailing metadata):
    RELEASED or LOST (also when it does not say: an older daemon)."""
    trailing = getattr(exc, "trailing_metadata", None)
    try:
        pairs = trailing() if callable(trailing) else ()
    except Exception:  # a channel-side error carries no metadata
        pairs = ()
    for key, value in pairs or ():
        if key == ENDED_KEY and value == RELEASED:
            return RELEASED
    return LOST


__all__ = ["Agent", "AgentConfig", "AgentError", "agent_version"]
