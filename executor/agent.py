"""The worker agent: one per instance, runs the tasks the daemon places there.

What it does (Eva §5, and what the Eva artifact's worker left undone), one
part a module:

- **Registers** with the daemon (instance id, capacity, agent version, the
  address it serves on, a certificate signing request: its key never leaves
  the instance) and **heart-beats**; every heartbeat carries the state of
  every attempt it holds. When the daemon restarts it registers again and
  its containers keep running; a daemon that declared it lost gets its
  containers killed (their tasks already run elsewhere). This module: the
  `Agent`, which also composes the parts below.
- **Runs attempts** (`attempts`): start, watch, stop (checkpoint request,
  SIGTERM, SIGKILL), the final state, and adoption of the containers a
  previous agent process of the instance left running.
- **Moves artifacts** (`artifacts`): the image from a content-addressed build
  context, the checkpoint restored and uploaded, the log kept.
- **Serves** the daemon's calls (`servicer`): StartTask, StopTask, ListTasks,
  behind TLS and the daemon's token.

Each attempt's phases (fetch, build, start, init, checkpoint, upload) are
measured and reported with its status.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.resources import Resources
from executor.artifacts import Artifacts
from executor.attempts import AttemptRunner
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.runtime import ContainerRuntime
from executor.security import (
    Authority,
    TokenAuth,
    secure_channel,
    server_options,
    signing_request,
)
from executor.servicer import WorkerService
from executor.storage import Storage, open_storage

log = logging.getLogger(__name__)

#: What the daemon may call on a worker (the worker's `TokenAuth`).
DAEMON_METHODS = ("/autoscaler.worker.v1.Worker/",)

#: Channel arguments for the link to the daemon: reconnect quickly after it restarts.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
)

#: The distributions the agent may be installed from: the light worker's, or the whole one.
DISTRIBUTIONS = ("ec2-batch-autoscaler-worker", "ec2-batch-autoscaler")


def agent_version() -> str:
    """`<distribution>/<version>` of the installed agent (what it registers with)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in DISTRIBUTIONS:
        try:
            return f"{name}/{version(name)}"
        except PackageNotFoundError:
            continue
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


class Agent:
    """The worker agent of one instance. `serve()` starts it; `close()` stops the agent
    (its containers keep running, as they would across a restart)."""

    def __init__(self, config: AgentConfig, runtime: ContainerRuntime) -> None:
        # Docker takes a relative bind-mount source for a volume name: paths are absolute.
        self.config = config = replace(config, work_dir=config.work_dir.absolute())
        self.runtime = runtime
        self.version = agent_version()
        self._lock = threading.RLock()
        self._changed = threading.Event()
        self._closing = threading.Event()
        self.artifacts = Artifacts(runtime, config.work_dir, config.log_tail_lines)
        self.attempts = AttemptRunner(
            config, runtime, self.artifacts, changed=self._changed.set, closing=self._closing
        )
        self._session: str | None = None
        self._daemon_token: str | None = None
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
        pb_grpc.add_WorkerServicer_to_server(WorkerService(self.attempts), server)
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
        self.attempts.adopt()
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

    @property
    def storage(self) -> Storage | None:
        """The cluster's storage, once the daemon has named it (at registration)."""
        return self.artifacts.storage

    def statuses(self) -> list[pb.TaskStatus]:
        """The state of every attempt this worker holds (what a heartbeat carries)."""
        return self.attempts.statuses()

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
        storage = self.artifacts.storage
        if storage is None or storage.url != response.storage_url.rstrip("/"):
            storage = open_storage(response.storage_url, **self.config.storage_options)
        with self._lock:
            self._pending_certificate = grpc.ssl_server_certificate_configuration(
                [(self._key, response.certificate_pem)]
            )
            self._daemon_token = response.daemon_token
            self._session = response.session
            self._interval = response.heartbeat_interval_s or self._interval
            self.lost_reason = None
        self.artifacts.use(storage)
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
            news = self.attempts.poll()
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
                        self._declared_lost(exc.details() or "declared lost")  # type: ignore[union-attr]
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
        if first:
            log.error("the daemon declared this worker lost (%s); killing its containers", reason)
        self.attempts.abandon_all(f"the daemon declared this worker lost: {reason}")
        self._closing.wait(5.0)

    def _forget(self, refs: Iterable[Any]) -> None:
        self.attempts.forget(refs)


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


__all__ = ["DAEMON_METHODS", "Agent", "AgentConfig", "AgentError", "agent_version"]
