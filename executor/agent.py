"""The worker agent: one per instance, runs the tasks the daemon places there.

What it does (Eva §5, and what the Eva artifact's worker left undone):

- **Registers** with the daemon (instance id, capacity, agent version, the
  address it serves on, a certificate signing request: its key never leaves
  the instance) and **heart-beats**; every heartbeat carries the state of
  every attempt it holds. When the daemon restarts it registers again and
  its containers keep running; a daemon that declared it lost gets its
  containers killed (their tasks already run elsewhere).
- **Starts** an attempt: fetches the task's build context from the storage
  (content-addressed: a context already built is neither fetched nor built
  again), builds the image, restores the checkpoint it resumes from, and runs
  the container unprivileged with the task's limits, the checkpoint
  directory and the report socket bind-mounted, and its environment.
- **Stops** an attempt: asks the job to checkpoint over the report socket,
  sends SIGTERM after a short wait, SIGKILL after a grace period, then
  uploads the checkpoint directory (atomically) and reports its reference.
  The container's log is saved at every end.
- **Measures** each phase (fetch, build, start, init, checkpoint, upload) so
  the daemon can replace a trace's assumed delays with measured ones.

Containers outlive the agent: a restarted agent adopts the containers
labelled with its instance id from the launch it saved beside them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from autoscaler.execution import TERMINAL_TASK_STATES, ResourceLimits, TaskLaunch
from autoscaler.jobs import TaskRun
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.resources import Resources
from executor import reporter
from executor.messages import BadMessage, launch_from_pb, state_to_pb
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.runtime import (
    GIB,
    LABEL_ATTEMPT,
    LABEL_INSTANCE,
    LABEL_JOB,
    LABEL_TASK,
    BuildFailed,
    ContainerExit,
    ContainerRuntime,
    ContainerSpec,
    RuntimeFailure,
)
from executor.security import (
    Authority,
    TokenAuth,
    secure_channel,
    server_options,
    signing_request,
)
from executor.storage import (
    Storage,
    StorageError,
    checkpoint_key,
    context_digest,
    file_digest,
    log_key,
    open_storage,
    pack_directory,
)

log = logging.getLogger(__name__)

#: What the daemon may call on a worker (the worker's `TokenAuth`).
DAEMON_METHODS = ("/autoscaler.worker.v1.Worker/",)

#: Where the job finds its checkpoint directory and report socket inside the container.
CHECKPOINT_MOUNT = "/checkpoint"
REPORT_MOUNT = "/run/autoscaler"
REPORT_SOCKET = f"{REPORT_MOUNT}/report.sock"

#: Channel arguments for the link to the daemon: reconnect quickly after it restarts.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
)

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


def agent_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"ec2-batch-autoscaler/{version('ec2-batch-autoscaler')}"
    except PackageNotFoundError:
        return "ec2-batch-autoscaler/unknown"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """How one agent runs; `capacity` is what it advertises (GPUs, physical cores, GiB)."""

    instance_id: str
    daemon: str  # host:port of the daemon's worker registry
    ca_pem: bytes
    worker_token: str
    work_dir: Path
    capacity: Resources
    listen: str = "0.0.0.0:7444"
    advertise: str | None = None  # the host the daemon dials; default: the route to it
    daemon_server_name: str | None = None  # the daemon certificate's name, if not its host
    threads_per_core: float = 1.0  # logical CPUs per physical core on this machine
    host_cpus: int = 1  # logical CPUs a container may be given at most
    gpu_devices: int = 0  # physical GPU devices (0: GPU indices are not passed to Docker)
    checkpoint_wait_s: float = 10.0  # for the job to acknowledge a checkpoint request
    stop_grace_s: float = 30.0  # after SIGTERM, before SIGKILL
    throughput_window_s: float = ROUND_INTERVAL_S
    rpc_timeout_s: float = 10.0
    poll_timeout_s: float = 2.0  # per report-socket request
    poll_interval_s: float = 1.0  # how often running jobs are asked how far they got
    log_tail_lines: int = 20
    storage_options: Mapping[str, Any] = field(default_factory=dict)


class AgentError(RuntimeError):
    """The agent cannot run (it cannot listen, or its configuration is wrong)."""


class _Rejected(Exception):
    """A start the agent refuses outright (FAILED_PRECONDITION)."""


@dataclass(eq=False)
class _Attempt:
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
    restored: tuple = ()  # what the checkpoint directory held after the restore
    exited: threading.Event = field(default_factory=threading.Event)
    stopper: threading.Thread | None = None  # carrying out the stop, once it began

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
        return status


class Agent:
    """The worker agent of one instance. `serve()` starts it; `close()` stops the agent
    (its containers keep running, as they would across a restart)."""

    def __init__(self, config: AgentConfig, runtime: ContainerRuntime) -> None:
        # Docker takes a relative bind-mount source for a volume name: paths are absolute.
        self.config = config = replace(config, work_dir=config.work_dir.absolute())
        self.runtime = runtime
        self.version = agent_version()
        self._lock = threading.RLock()
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._build_locks: dict[str, threading.Lock] = {}
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._session: str | None = None
        self._daemon_token: str | None = None
        self._storage: Storage | None = None
        self._interval = 5.0
        self._csr, self._key = signing_request(config.instance_id)
        self._pending_certificate: Any = None
        self.registered = threading.Event()
        self.lost_reason: str | None = None
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._registry: pb_grpc.WorkerRegistryStub | None = None
        self._heartbeat_thread: threading.Thread | None = None
        self.port: int | None = None
        self.address: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def serve(self) -> None:
        """Listen, adopt the containers a previous agent left, and start heart-beating."""
        config = self.config
        config.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(config.work_dir, 0o700)
        # Until the daemon signs our certificate we serve a throwaway one nobody trusts;
        # gRPC asks `_next_certificate` on every handshake and switches when it changes.
        cert, key = Authority.create("unregistered worker").issue(["unregistered.invalid"])
        credentials = grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(key, cert)]), self._next_certificate
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="worker-rpc"),
            interceptors=[TokenAuth(self._tokens, {"daemon": DAEMON_METHODS})],
            options=server_options(),
        )
        pb_grpc.add_WorkerServicer_to_server(_WorkerService(self), server)
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for service in ("", "autoscaler.worker.v1.Worker"):
            health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        try:
            port = server.add_secure_port(config.listen, credentials)
        except RuntimeError as exc:
            raise AgentError(f"cannot listen on {config.listen}: {exc}") from None
        if not port:
            raise AgentError(f"cannot listen on {config.listen}")
        server.start()
        self._server, self.port = server, port
        host = config.advertise or _route_to(config.daemon)
        self.address = f"{host}:{port}"
        self._channel = secure_channel(
            config.daemon,
            config.ca_pem,
            config.worker_token,
            server_name=config.daemon_server_name,
            options=RECONNECT_OPTIONS,
        )
        self._registry = pb_grpc.WorkerRegistryStub(self._channel)
        self._adopt()
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="heartbeat", daemon=True
        )
        self._heartbeat_thread.start()

    def close(self, grace_s: float = 1.0) -> None:
        """Stop serving and heart-beating; containers keep running."""
        self._closing.set()
        self._changed.set()
        if self._channel is not None:
            self._channel.close()  # cancels a heartbeat in flight
        if self._server is not None:
            self._server.stop(grace_s).wait()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=self.config.rpc_timeout_s + 5)

    def wait(self) -> None:
        """Block until `close()` (the command runs until SIGTERM)."""
        self._closing.wait()

    def _tokens(self) -> dict[str, str]:
        token = self._daemon_token
        return {token: "daemon"} if token else {}

    def _next_certificate(self) -> Any:
        with self._lock:
            update, self._pending_certificate = self._pending_certificate, None
        return update

    # -- registration and heartbeats ------------------------------------------------------

    def _register(self) -> None:
        assert self._registry is not None
        capacity = self.config.capacity
        response = self._registry.Register(
            pb.RegisterRequest(
                instance_id=self.config.instance_id,
                capacity=pb.Capacity(
                    gpus=capacity.gpu, cpus=capacity.cpu, memory_gb=capacity.ram_gb
                ),
                agent_version=self.version,
                address=self.address,
                csr_pem=self._csr,
                tasks=self.statuses(),
                gpu_devices=self.config.gpu_devices,
            ),
            timeout=self.config.rpc_timeout_s,
            wait_for_ready=True,  # the daemon may be starting (or restarting) too
        )
        storage = self._storage
        if storage is None or storage.url != response.storage_url.rstrip("/"):
            storage = open_storage(response.storage_url, **self.config.storage_options)
        with self._lock:
            self._pending_certificate = grpc.ssl_server_certificate_configuration(
                [(self._key, response.certificate_pem)]
            )
            self._daemon_token = response.daemon_token
            self._storage = storage
            self._session = response.session
            self._interval = response.heartbeat_interval_s or self._interval
            self.lost_reason = None
        self._forget(response.acknowledged)
        self.registered.set()
        log.info(
            "registered %s with the daemon at %s (serving on %s)",
            self.config.instance_id,
            self.config.daemon,
            self.address,
        )

    def _heartbeat_loop(self) -> None:
        """Register, then heart-beat every interval — at once when an attempt changes state
        or a job reports its first iteration — polling the jobs every `poll_interval_s`."""
        backoff = 0.5
        next_beat = 0.0
        unreachable_since: float | None = None
        while not self._closing.is_set():
            if self._session is None:
                try:
                    self._register()
                    backoff, next_beat = 0.5, 0.0
                except (grpc.RpcError, ValueError) as exc:
                    if self._closing.is_set():
                        return
                    self._registration_failed(exc)  # type: ignore[arg-type]
                    self._closing.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
            news = self._poll_jobs()
            if news or self._changed.is_set() or time.monotonic() >= next_beat:
                self._changed.clear()
                next_beat = time.monotonic() + self._interval
                try:
                    response = self._registry.Heartbeat(  # type: ignore[union-attr]
                        pb.HeartbeatRequest(
                            instance_id=self.config.instance_id,
                            session=self._session or "",
                            tasks=self.statuses(),
                        ),
                        timeout=self.config.rpc_timeout_s,
                        wait_for_ready=True,
                    )
                    if unreachable_since is not None:
                        log.info("the daemon answers again")
                    unreachable_since = None
                    self._forget(response.acknowledged)
                    self._interval = response.heartbeat_interval_s or self._interval
                except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed
                    if self._closing.is_set():
                        return
                    code = exc.code()  # type: ignore[union-attr]
                    if code == grpc.StatusCode.NOT_FOUND:
                        log.info("the daemon does not know this worker (any more): registering")
                        self._session = None
                        continue
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        self._declared_lost(exc.details() or "declared lost")  # type: ignore[attr-defined]
                        continue
                    if unreachable_since is None:
                        unreachable_since = time.monotonic()
                        log.warning(
                            "heartbeat failed (%s); containers keep running, retrying", code.name
                        )
            wait = min(self.config.poll_interval_s, max(next_beat - time.monotonic(), 0.0))
            self._changed.wait(wait)

    def _registration_failed(self, exc: grpc.RpcError) -> None:
        code = exc.code()  # type: ignore[attr-defined]
        details = exc.details()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            self._declared_lost(details or "declared lost")
        else:
            log.warning("cannot register with %s: %s %s", self.config.daemon, code.name, details)

    def _declared_lost(self, reason: str) -> None:
        """The daemon gave this worker up: its tasks run elsewhere now; kill ours."""
        with self._lock:
            first = self.lost_reason is None
            self.lost_reason = reason
            self._session = None
            live = [a for a in self._attempts.values() if not a.terminal]
        if first:
            log.error("the daemon declared this worker lost (%s); killing its containers", reason)
        for attempt in live:
            self._abandon(attempt, f"the daemon declared this worker lost: {reason}")
        self._closing.wait(5.0)

    def _forget(self, refs: Any) -> None:
        with self._lock:
            for ref in refs:
                attempt = self._attempts.get((ref.task_id, ref.attempt))
                if attempt is not None and attempt.terminal:
                    del self._attempts[attempt.key]

    def statuses(self) -> list[pb.TaskStatus]:
        with self._lock:
            return [a.status() for a in self._attempts.values()]

    def _changed_now(self) -> None:
        self._changed.set()

    def _poll_jobs(self) -> bool:
        """Ask each running job how far it got (the report socket); True when one has just
        done its first iteration (worth telling the daemon at once: it is running now)."""
        with self._lock:
            running = [
                a
                for a in self._attempts.values()
                if a.state in ("running", "checkpointing") and a.container is not None
            ]
        news = False
        for attempt in running:
            try:
                answer = reporter.ask(
                    attempt.socket_path, {"op": "status"}, timeout=self.config.poll_timeout_s
                )
            except (OSError, ValueError):
                continue  # no reporter (yet): nothing to say
            initialized = "init" in attempt.phases
            self._absorb_answer(attempt, answer)
            news = news or (not initialized and "init" in attempt.phases)
        return news

    def _absorb_answer(self, attempt: _Attempt, answer: Mapping[str, Any]) -> None:
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

    # -- starting -------------------------------------------------------------------------

    def start_task(self, launch: TaskLaunch) -> pb.TaskStatus:
        """Accept an attempt (idempotent) and start it in the background."""
        if launch.instance_id and launch.instance_id != self.config.instance_id:
            raise _Rejected(
                f"this worker runs instance {self.config.instance_id}, not {launch.instance_id}"
            )
        with self._lock:
            existing = self._attempts.get((launch.task_id, launch.attempt))
            if existing is not None:
                return existing.status()
            others = [a for a in self._attempts.values() if a.launch.task_id == launch.task_id]
            newer = [a.launch.attempt for a in others if a.launch.attempt > launch.attempt]
            if newer:
                raise _Rejected(
                    f"attempt {max(newer)} of {launch.task_id} is newer than {launch.attempt}"
                )
            attempt = _Attempt(
                launch,
                self._attempt_dir(launch),
                self.config.throughput_window_s,
                checkpoint=launch.checkpoint,
            )
            misfit = self._misfit(launch)
            self._attempts[attempt.key] = attempt
            if misfit:
                attempt.state, attempt.reason = "failed", misfit
                attempt.exited.set()
            status = attempt.status()
        for older in others:
            self._request_stop(older)  # superseded: one attempt of a task runs at a time
        if not misfit:
            threading.Thread(
                target=self._run, args=(attempt,), name=f"attempt-{launch.task_id}", daemon=True
            ).start()
        self._changed_now()
        return status

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

    def _attempt_dir(self, launch: TaskLaunch) -> Path:
        return self.config.work_dir / "attempts" / f"{_slug(launch.task_id)}.{launch.attempt}"

    def _run(self, attempt: _Attempt) -> None:
        """One attempt, start to end: image, restore, run, wait, finish."""
        launch = attempt.launch
        phase = "fetch"
        try:
            storage = self._storage
            if storage is None:
                raise AgentError("not registered with the daemon yet")
            attempt.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            attempt.report_dir.mkdir(parents=True, exist_ok=True)
            # The job may run as any user: its own two directories are open to it (they sit
            # in the agent's 0700 work directory; only the container sees them).
            os.chmod(attempt.checkpoint_dir, 0o777)
            os.chmod(attempt.report_dir, 0o777)
            _write_json(attempt.directory / "launch.json", _launch_document(launch))
            image = self._image_for(attempt, storage)
            phase = "restore"
            if not self._stop_before_start(attempt):
                self._restore(attempt, storage)
            if self._stop_before_start(attempt):
                if attempt.abandoned:
                    self._end(attempt, "failed", attempt.abandoned, launch.checkpoint)
                else:
                    self._end(attempt, "stopped", "stopped before it started", launch.checkpoint)
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
            self._changed_now()
            if stop_now:
                self._begin_stop(attempt)
            self._watch(attempt)
        except BuildFailed as exc:
            self._save_log(attempt, self.config, exc.log.encode())  # the build's output
            self._end(attempt, "failed", f"build failed: {exc}", launch.checkpoint)
            self._cleanup(attempt)
        except (StorageError, OSError, RuntimeFailure, AgentError, tarfile.TarError) as exc:
            self._end(attempt, "failed", f"{phase} failed: {exc}", launch.checkpoint)
            self._cleanup(attempt)
        except Exception as exc:  # a bug of ours must still end the attempt, with its reason
            log.exception("attempt %s/%d", launch.task_id, launch.attempt)
            self._end(
                attempt, "failed", f"worker error: {type(exc).__name__}: {exc}", launch.checkpoint
            )
            self._cleanup(attempt)

    def _stop_before_start(self, attempt: _Attempt) -> bool:
        with self._lock:
            return attempt.stop_requested_at is not None or attempt.abandoned is not None

    def _image_for(self, attempt: _Attempt, storage: Storage) -> str:
        run = attempt.launch.run
        if not run.build_context:
            began = time.monotonic()
            assert run.image is not None
            self.runtime.pull(run.image)
            attempt.phases["fetch"] = time.monotonic() - began
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
            archive = self.config.work_dir / "contexts" / f"{digest}.{uuid.uuid4().hex}.tar.gz"
            storage.get_file(run.build_context, archive)
            try:
                if file_digest(archive) != digest:
                    raise StorageError(
                        f"{run.build_context}: the content does not match its sha256 address"
                    )
                attempt.phases["fetch"] = time.monotonic() - began
                began = time.monotonic()
                try:
                    self.runtime.build(archive, tag)
                finally:
                    attempt.phases["build"] = time.monotonic() - began
            finally:
                archive.unlink(missing_ok=True)
        return tag

    def _restore(self, attempt: _Attempt, storage: Storage) -> None:
        ref = attempt.launch.checkpoint
        if ref:
            began = time.monotonic()
            archive = attempt.directory / "restore.tar.gz"
            storage.get_file(ref, archive)
            _extract(archive, attempt.checkpoint_dir)
            archive.unlink()
            attempt.phases["fetch"] = attempt.phases.get("fetch", 0.0) + time.monotonic() - began
        attempt.restored = _manifest(attempt.checkpoint_dir)
        _write_json(attempt.directory / "restored.json", attempt.restored)

    def _container_spec(self, attempt: _Attempt, image: str) -> ContainerSpec:
        launch, config = attempt.launch, self.config
        limits: ResourceLimits = launch.limits
        shm = limits.shm_size_gb if limits.shm_size_gb is not None else launch.run.shm_size_gb
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

    def stop_task(self, task_id: str, attempt_number: int) -> pb.TaskStatus | None:
        """Ask an attempt to checkpoint and stop; None when this worker never saw it."""
        with self._lock:
            attempt = self._attempts.get((task_id, attempt_number))
        if attempt is None:
            return None
        self._request_stop(attempt)
        with self._lock:
            return attempt.status()

    def _request_stop(self, attempt: _Attempt) -> None:
        with self._lock:
            if attempt.terminal or attempt.stop_requested_at is not None:
                return
            attempt.stop_requested_at = time.monotonic()
            attempt.state = "checkpointing"
            attempt.throughput = None
            begin = attempt.container is not None
        self._changed_now()
        if begin:
            self._begin_stop(attempt)

    def _begin_stop(self, attempt: _Attempt) -> None:
        thread = threading.Thread(
            target=self._stop_container, args=(attempt,), name="stop", daemon=True
        )
        attempt.stopper = thread
        thread.start()

    def _stop_container(self, attempt: _Attempt) -> None:
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

    def _abandon(self, attempt: _Attempt, reason: str) -> None:
        with self._lock:
            if attempt.terminal or attempt.abandoned:
                return
            attempt.abandoned = reason
            container = attempt.container
        if container is not None:
            self.runtime.kill(container)

    # -- the end of an attempt ------------------------------------------------------------

    def _watch(self, attempt: _Attempt) -> None:
        assert attempt.container is not None
        exit_ = self.runtime.wait(attempt.container)
        if self._closing.is_set():
            return  # this agent is gone: the next one adopts the container and finishes it
        attempt.exited.set()
        self._finish(attempt, exit_)

    def _finish(self, attempt: _Attempt, exit_: ContainerExit) -> None:
        """Decide how the attempt ended, keep its checkpoint and its log, report it."""
        launch, config = attempt.launch, self.config
        self.registered.wait()  # an adopted container may end before the storage is known
        with self._lock:
            stop_at = attempt.stop_requested_at
        if stop_at is not None:
            attempt.phases["checkpoint"] = time.monotonic() - stop_at
        if attempt.stopper is not None:
            # The job may exit before the stopping thread has heard its answer: wait for
            # it (it returns at once now that the container has exited) to know how it went.
            attempt.stopper.join(timeout=config.checkpoint_wait_s + config.stop_grace_s + 30)
        self._read_final_count(attempt)
        checkpoint = launch.checkpoint
        if attempt.abandoned:
            state, reason = "failed", attempt.abandoned
        elif stop_at is not None and not (
            exit_.code == 0 and not attempt.asked and not attempt.sigterm_sent
        ):
            state, reason = "stopped", self._how_it_stopped(attempt, exit_)
        elif exit_.oom_killed:
            state, reason = "failed", f"out of memory (limit {launch.limits.memory_gb:g} GiB)"
        elif exit_.code == 0:  # (also when a stop came too late to reach it: it finished)
            state, reason = "completed", ""
        elif exit_.error:
            state, reason = "failed", f"exit code {exit_.code}: {exit_.error}"
        else:
            state, reason = "failed", f"exit code {exit_.code}" + _signal_note(exit_.code)
        # Whatever the job saved is kept, on request or not: nothing checkpointed is lost.
        if (
            state != "completed"
            and not attempt.abandoned
            and _manifest(attempt.checkpoint_dir) != attempt.restored
        ):
            began = time.monotonic()
            try:
                checkpoint = self._upload_checkpoint(attempt)
                attempt.phases["upload"] = time.monotonic() - began
            except (StorageError, OSError, tarfile.TarError) as exc:
                note = f" ({reason})" if reason else ""
                state, reason = "failed", f"checkpoint upload failed: {exc}{note}"
        self._save_log(attempt, config)
        self._end(attempt, state, reason, checkpoint, exit_.code)
        self._cleanup(attempt)

    def _read_final_count(self, attempt: _Attempt) -> None:
        """The count the job's reporter left when it exited (polls miss the last seconds)."""
        try:
            final = json.loads((attempt.report_dir / reporter.FINAL_FILE).read_text())
        except (OSError, ValueError):
            return
        iterations = final.get("iterations") if isinstance(final, dict) else None
        if isinstance(iterations, (int, float)) and iterations >= 0:
            with self._lock:
                attempt.iterations = max(attempt.iterations, float(iterations))

    def _how_it_stopped(self, attempt: _Attempt, exit_: ContainerExit) -> str:
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

    def _upload_checkpoint(self, attempt: _Attempt) -> str:
        storage = self._storage
        assert storage is not None
        launch = attempt.launch
        archive = attempt.directory / "checkpoint.tar.gz"
        pack_directory(attempt.checkpoint_dir, archive)
        key = checkpoint_key(launch.job_id, launch.task_id, launch.attempt)
        return storage.put_file(key, archive)

    def _save_log(self, attempt: _Attempt, config: AgentConfig, data: bytes | None = None) -> None:
        """Keep the container's log (or `data`) in the storage, and its last lines."""
        container, storage, launch = attempt.container, self._storage, attempt.launch
        if storage is None or (container is None and data is None):
            return
        if data is None:
            assert container is not None
            try:
                data = self.runtime.logs(container)
            except RuntimeFailure as exc:
                log.warning("log of %s/%d: %s", launch.task_id, launch.attempt, exc)
                return
        lines = data.decode("utf-8", "replace").splitlines()
        attempt.log_tail = tuple(line[:500] for line in lines[-config.log_tail_lines :])
        try:
            storage.put_bytes(log_key(launch.job_id, launch.task_id, launch.attempt), data)
        except StorageError as exc:
            log.warning("log of %s/%d not saved: %s", launch.task_id, launch.attempt, exc)

    def _end(
        self,
        attempt: _Attempt,
        state: str,
        reason: str,
        checkpoint: str | None,
        exit_code: int | None = None,
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
        attempt.exited.set()
        log.info(
            "attempt %d of %s %s%s",
            attempt.launch.attempt,
            attempt.launch.task_id,
            state,
            f": {reason}" if reason else "",
        )
        self._changed_now()

    def _cleanup(self, attempt: _Attempt) -> None:
        shutil.rmtree(attempt.directory, ignore_errors=True)

    # -- adoption after a restart ---------------------------------------------------------

    def _adopt(self) -> None:
        """Take over the containers a previous agent process of this instance started."""
        found = self.runtime.containers({LABEL_INSTANCE: self.config.instance_id})
        for info in found:
            labels = info.labels
            try:
                number = int(labels.get(LABEL_ATTEMPT, ""))
                task_id = labels[LABEL_TASK]
            except (KeyError, ValueError):
                continue
            directory = self._attempt_dir_for(task_id, number)
            try:
                launch = _launch_from_document(json.loads((directory / "launch.json").read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("container %s has no saved launch: removing it", info.container_id)
                self.runtime.remove(info.container_id)
                continue
            attempt = _Attempt(
                launch,
                directory,
                self.config.throughput_window_s,
                state="running",
                checkpoint=launch.checkpoint,
                container=info.container_id,
            )
            restored = directory / "restored.json"
            if restored.exists():
                attempt.restored = tuple(tuple(x) for x in json.loads(restored.read_text()))
            with self._lock:
                self._attempts[attempt.key] = attempt
            log.info("adopted attempt %d of %s (%s)", number, task_id, info.container_id[:12])
            threading.Thread(target=self._watch, args=(attempt,), daemon=True).start()

    def _attempt_dir_for(self, task_id: str, number: int) -> Path:
        return self.config.work_dir / "attempts" / f"{_slug(task_id)}.{number}"


class _WorkerService(pb_grpc.WorkerServicer):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def StartTask(self, request: pb.StartTaskRequest, context: grpc.ServicerContext) -> Any:
        try:
            launch = launch_from_pb(request)
            return pb.StartTaskResponse(status=self.agent.start_task(launch))
        except BadMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except _Rejected as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def StopTask(self, request: pb.StopTaskRequest, context: grpc.ServicerContext) -> Any:
        status = self.agent.stop_task(request.task_id, request.attempt)
        if status is None:
            return pb.StopTaskResponse(known=False)
        return pb.StopTaskResponse(known=True, status=status)

    def ListTasks(self, request: pb.ListTasksRequest, context: grpc.ServicerContext) -> Any:
        return pb.ListTasksResponse(tasks=self.agent.statuses())


# -- helpers ---------------------------------------------------------------------------------


def _slug(task_id: str) -> str:
    """A name for files and containers: readable, and unique by a short hash."""
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:8]
    return f"{_SLUG.sub('_', task_id)[:60]}-{digest}"


def _route_to(target: str) -> str:
    """This machine's address on the route to `target` (no packet is sent)."""
    host = target.rpartition(":")[0].strip("[]") or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _manifest(directory: Path) -> tuple:
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


def _extract(archive: Path, target: Path) -> None:
    """Unpack a checkpoint: regular files and directories only, nothing outside `target`."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if (
                member.name.startswith("/")
                or ".." in parts
                or not (member.isfile() or member.isdir())
            ):
                raise tarfile.TarError(f"checkpoint member {member.name!r} is not allowed")
            members.append(member)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python before 3.11.4
            tar.extractall(target, members=members)
    for root, dirs, files in os.walk(target):
        for name in dirs + files:
            os.chmod(Path(root) / name, 0o777 if name in dirs else 0o666)


def _signal_note(code: int) -> str:
    names = {137: "SIGKILL", 143: "SIGTERM", 139: "SIGSEGV", 134: "SIGABRT"}
    return f" (killed by {names[code]})" if code in names else ""


def _write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document))


def _launch_document(launch: TaskLaunch) -> dict[str, Any]:
    run, limits = launch.run, launch.limits
    return {
        "task_id": launch.task_id,
        "job_id": launch.job_id,
        "attempt": launch.attempt,
        "instance_id": launch.instance_id,
        "workload": launch.workload,
        "checkpoint": launch.checkpoint,
        "run": {
            "build_context": run.build_context,
            "image": run.image,
            "command": list(run.command),
            "env": [list(pair) for pair in run.env],
            "shm_size_gb": run.shm_size_gb,
            "network": run.network,
        },
        "limits": {
            "cpus": limits.cpus,
            "memory_gb": limits.memory_gb,
            "gpus": list(limits.gpus),
            "shm_size_gb": limits.shm_size_gb,
        },
    }


def _launch_from_document(document: Mapping[str, Any]) -> TaskLaunch:
    run, limits = document["run"], document["limits"]
    return TaskLaunch(
        task_id=document["task_id"],
        job_id=document["job_id"],
        attempt=int(document["attempt"]),
        instance_id=document["instance_id"],
        workload=document["workload"],
        run=TaskRun(
            build_context=run["build_context"],
            image=run["image"],
            command=tuple(run["command"]),
            env=tuple((k, v) for k, v in run["env"]),
            shm_size_gb=run["shm_size_gb"],
            network=bool(run["network"]),
        ),
        limits=ResourceLimits(
            cpus=float(limits["cpus"]),
            memory_gb=float(limits["memory_gb"]),
            gpus=tuple(limits["gpus"]),
            shm_size_gb=limits["shm_size_gb"],
        ),
        checkpoint=document["checkpoint"],
    )


__all__ = ["DAEMON_METHODS", "Agent", "AgentConfig", "AgentError", "agent_version"]
