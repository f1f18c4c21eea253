"""The daemon side: `GrpcExecutor`, the Executor contract over gRPC to the worker agents.

Workers come to the daemon: they register (the daemon signs their
certificate from a signing request and hands out a per-worker token) and
heart-beat with the state of every attempt they hold. The daemon calls a
worker back — start, stop — over one channel per worker, TLS verified
against the cluster CA with the name it put in the worker's certificate,
its bearer token on every call, a deadline on every RPC.

So `report()` reads memory and never waits on the network: it is the last
heartbeat of every worker, overlaid with the requests not yet answered (an
accepted start is at least `starting`, a requested stop at least
`checkpointing`, until the worker says more). Requests go out on a small
thread pool, retried while the worker is alive. A worker silent for longer
than `heartbeat_timeout_s` (by the injected clock) is lost: it is listed in
`lost_instances` with the reason, its tasks are reported `failed` with their
last complete checkpoint, and its heartbeats are refused until the round has
released its instance.

Wiring, in the daemon:

    executor = GrpcExecutor(authority=ca, storage_url=url, now=time.monotonic,
                            heartbeat_timeout_s=60)
    server = grpc.server(pool, interceptors=[TokenAuth(tokens, {"worker": WORKER_METHODS,
                                                                 ...})],
                         options=server_options())
    add_registry(server, executor)        # + the API servicers, health
    server.add_secure_port(listen, server_credentials(daemon_cert, daemon_key))
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from autoscaler.execution import (
    TERMINAL_TASK_STATES,
    ExecutorReport,
    TaskLaunch,
    TaskReport,
    TaskState,
)
from executor.agent import RECONNECT_OPTIONS
from executor.messages import INSTANCE_ID, launch_to_pb, report_from_pb
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.security import Authority, new_token, secure_channel

log = logging.getLogger(__name__)

#: What the "worker" role may call on the daemon (for the daemon's `TokenAuth`).
WORKER_METHODS = ("/autoscaler.worker.v1.WorkerRegistry/",)

_TERMINAL_PB = frozenset({pb.TASK_STATE_STOPPED, pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED})
_RUNNING_PB = frozenset({pb.TASK_STATE_STARTING, pb.TASK_STATE_RUNNING})
#: Released instances remembered, so their workers cannot register again.
_RELEASED_KEPT = 10_000

#: A worker's answer that will not change on retry.
_REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def worker_server_name(instance_id: str) -> str:
    """The name the daemon puts in a worker's certificate and verifies when calling it:
    bound to the instance, whatever address it serves on."""
    digest = hashlib.sha256(instance_id.encode()).hexdigest()[:24]
    return f"w{digest}.workers.autoscaler.invalid"


class Refused(Exception):
    """A registration or heartbeat refused, with the gRPC status to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class _Worker:
    instance_id: str
    session: str
    address: str
    server_name: str
    channel: grpc.Channel
    stub: pb_grpc.WorkerStub
    capacity: pb.Capacity
    agent_version: str
    registered_at: float
    last_seen: float
    tasks: dict[tuple[str, int], pb.TaskStatus] = field(default_factory=dict)
    lost: str | None = None
    outbox: deque[tuple[str, Any, tuple[str, int], _Request | None]] = field(default_factory=deque)
    sending: bool = False


@dataclass
class _Request:
    """The latest thing asked of a task: start or stop one attempt."""

    attempt: int
    instance_id: str
    kind: str  # "start" or "stop"
    checkpoint: str | None = None
    refused: str | None = None  # the worker's refusal, reported as the attempt's failure
    progress: float = 0.0  # carried from the attempt before, until the job reports its own


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What the daemon knows of one registered worker (for status pages)."""

    instance_id: str
    address: str
    agent_version: str
    capacity: tuple[float, float, float]
    registered_at: float
    last_seen: float
    lost: str | None


class GrpcExecutor:
    """`autoscaler.execution.Executor` over gRPC to one worker agent per instance."""

    def __init__(
        self,
        *,
        authority: Authority,
        storage_url: str,
        now: Callable[[], float] = time.monotonic,
        heartbeat_timeout_s: float = 45.0,
        heartbeat_interval_s: float = 5.0,
        rpc_timeout_s: float = 10.0,
        max_concurrent_calls: int = 16,
    ) -> None:
        if not heartbeat_timeout_s > heartbeat_interval_s > 0:
            raise ValueError(
                "the heartbeat timeout must be longer than the heartbeat interval, "
                f"got {heartbeat_timeout_s} s and {heartbeat_interval_s} s"
            )
        self.authority = authority
        self.storage_url = storage_url.rstrip("/")
        self._now = now
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self._lock = threading.RLock()
        self._workers: dict[str, _Worker] = {}
        self._requests: dict[str, _Request] = {}
        self._acked: set[tuple[str, int]] = set()
        self._superseded: set[tuple[str, int]] = set()  # old attempts already told to stop
        self._progress: dict[str, float] = {}  # task -> iterations last reported by a worker
        self._released: dict[str, None] = {}  # instances given up (oldest first, bounded)
        self._calls = futures.ThreadPoolExecutor(
            max_workers=max_concurrent_calls, thread_name_prefix="executor-rpc"
        )
        self._closed = False

    # -- the Executor contract -------------------------------------------------------------

    def start(self, launch: TaskLaunch) -> None:
        with self._lock:
            key = (launch.task_id, launch.attempt)
            current = self._requests.get(launch.task_id)
            if current is not None and current.attempt >= launch.attempt:
                return  # asked already (idempotent by attempt)
            if any(key in w.tasks for w in self._workers.values()):
                return  # a worker holds it already
            carried = self._progress.get(launch.task_id, 0.0) if launch.checkpoint else 0.0
            request = _Request(
                launch.attempt, launch.instance_id, "start", launch.checkpoint, progress=carried
            )
            self._requests[launch.task_id] = request
            worker = self._workers.get(launch.instance_id)
            if worker is None:
                request.refused = f"no worker is registered for instance {launch.instance_id}"
                return
            if worker.lost is not None:
                request.refused = worker.lost
                return
            self._send(worker, "StartTask", launch_to_pb(launch), key, request)

    def stop(self, task_id: str, attempt: int) -> None:
        with self._lock:
            key = (task_id, attempt)
            worker = next((w for w in self._workers.values() if key in w.tasks), None)
            current = self._requests.get(task_id)
            if worker is None and current is not None and current.attempt == attempt:
                worker = self._workers.get(current.instance_id)
            if worker is None:
                return  # never seen: nothing to stop
            status = worker.tasks.get(key)
            if status is not None and status.state in _TERMINAL_PB:
                return
            if current is not None and current.attempt > attempt:
                self._stop_superseded(worker, key)
                return
            if current is not None and current.attempt == attempt and current.kind == "stop":
                return
            request = _Request(attempt, worker.instance_id, "stop")
            self._requests[task_id] = request
            if worker.lost is None:
                self._send(
                    worker, "StopTask", pb.StopTaskRequest(task_id=task_id, attempt=attempt), key
                )

    def report(self) -> ExecutorReport:
        with self._lock:
            now = self._now()
            for worker in self._workers.values():
                silent = now - worker.last_seen
                if worker.lost is None and silent > self.heartbeat_timeout_s:
                    self._declare_lost(worker, f"lost worker: silent for {silent:.0f} s")
            tasks: dict[str, TaskReport] = {}
            for worker in self._workers.values():
                for key, status in worker.tasks.items():
                    if key in self._acked:
                        continue
                    seen = report_from_pb(status, worker.instance_id)
                    if worker.lost is not None and seen.state not in TERMINAL_TASK_STATES:
                        seen = replace(seen, state="failed", reason=worker.lost, throughput=None)
                    known = tasks.get(seen.task_id)
                    if known is None or known.attempt < seen.attempt:
                        tasks[seen.task_id] = seen
            for task_id, request in self._requests.items():
                if (task_id, request.attempt) in self._acked:
                    continue
                known = tasks.get(task_id)
                if known is None or known.attempt < request.attempt:
                    tasks[task_id] = self._expected(task_id, request)
                    continue
                if known.attempt == request.attempt and known.progress < request.progress:
                    # Resumed, but the job has not counted yet: its progress is not lost.
                    tasks[task_id] = known = replace(known, progress=request.progress)
                if (
                    known.attempt == request.attempt
                    and request.kind == "stop"
                    and known.state in ("starting", "running")
                ):
                    tasks[task_id] = replace(known, state="checkpointing", throughput=None)
            return ExecutorReport(
                tasks,
                frozenset(w.instance_id for w in self._workers.values() if w.lost is None),
                {w.instance_id: w.lost for w in self._workers.values() if w.lost is not None},
            )

    def _expected(self, task_id: str, request: _Request) -> TaskReport:
        """What a request not yet confirmed by its worker stands for in a report."""
        worker = self._workers.get(request.instance_id)
        reason = request.refused or (worker.lost if worker is not None else None)
        if worker is None and reason is None:
            reason = f"the worker of {request.instance_id} is gone"
        if reason is not None:
            return TaskReport(
                task_id,
                "failed",
                request.instance_id,
                request.attempt,
                request.progress,
                checkpoint=request.checkpoint,
                reason=reason,
            )
        state: TaskState = "starting" if request.kind == "start" else "checkpointing"
        return TaskReport(
            task_id,
            state,
            request.instance_id,
            request.attempt,
            request.progress,
            checkpoint=request.checkpoint,
        )

    def acknowledge(self, task_id: str, attempt: int) -> None:
        with self._lock:
            key = (task_id, attempt)
            for worker in self._workers.values():
                status = worker.tasks.get(key)
                if status is not None:
                    self._acked.add(key)  # the worker forgets it at its next heartbeat
                    if status.state == pb.TASK_STATE_COMPLETED:
                        self._progress.pop(task_id, None)
            request = self._requests.get(task_id)
            if request is not None and request.attempt <= attempt:
                del self._requests[task_id]

    def release(self, instance_id: str) -> None:
        with self._lock:
            self._released[instance_id] = None  # its worker may not come back
            while len(self._released) > _RELEASED_KEPT:
                del self._released[next(iter(self._released))]
            worker = self._workers.pop(instance_id, None)
            if worker is not None:
                for key in worker.tasks:
                    self._acked.discard(key)
                    self._superseded.discard(key)
                worker.channel.close()
            for task_id, request in list(self._requests.items()):
                if request.instance_id == instance_id:
                    del self._requests[task_id]

    # -- introspection ---------------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return [
                WorkerInfo(
                    w.instance_id,
                    w.address,
                    w.agent_version,
                    (w.capacity.gpus, w.capacity.cpus, w.capacity.memory_gb),
                    w.registered_at,
                    w.last_seen,
                    w.lost,
                )
                for w in self._workers.values()
            ]

    def close(self) -> None:
        """Stop calling workers (the daemon is shutting down)."""
        with self._lock:
            self._closed = True
            for worker in self._workers.values():
                worker.channel.close()
        self._calls.shutdown(wait=False, cancel_futures=True)

    # -- the registry (called by the daemon's gRPC server) ---------------------------------

    def register(self, request: pb.RegisterRequest) -> pb.RegisterResponse:
        instance_id = request.instance_id
        if not INSTANCE_ID.fullmatch(instance_id):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"bad instance id {instance_id!r}")
        host = _host_of(request.address)
        if host is None:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"bad address {request.address!r}: expected HOST:PORT",
            )
        capacity = request.capacity
        if min(capacity.gpus, capacity.cpus, capacity.memory_gb) < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "capacity must not be negative")
        server_name = worker_server_name(instance_id)
        try:
            certificate = self.authority.sign(request.csr_pem, [server_name, host])
        except ValueError as exc:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"bad certificate signing request: {exc}"
            ) from None
        token = new_token()
        channel = secure_channel(
            request.address,
            self.authority.cert_pem,
            token,
            server_name=server_name,
            options=RECONNECT_OPTIONS,
        )
        with self._lock:
            if instance_id in self._released:
                channel.close()
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"instance {instance_id} was released: it is being terminated",
                )
            old = self._workers.get(instance_id)
            if old is not None and old.lost is not None:
                channel.close()
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{old.lost}; its instance is being terminated",
                )
            now = self._now()
            worker = _Worker(
                instance_id,
                new_token()[:22],
                request.address,
                server_name,
                channel,
                pb_grpc.WorkerStub(channel),
                pb.Capacity(gpus=capacity.gpus, cpus=capacity.cpus, memory_gb=capacity.memory_gb),
                request.agent_version,
                now,
                now,
            )
            self._workers[instance_id] = worker
            if old is not None:
                old.channel.close()
            self._absorb(worker, request.tasks)
            self._resend_stops(worker)
            acknowledged = self._acknowledged(worker)
        log.info(
            "worker %s registered from %s (%s; %g GPU, %g cores, %g GiB)",
            instance_id,
            request.address,
            request.agent_version,
            capacity.gpus,
            capacity.cpus,
            capacity.memory_gb,
        )
        return pb.RegisterResponse(
            session=worker.session,
            certificate_pem=certificate,
            server_name=server_name,
            daemon_token=token,
            storage_url=self.storage_url,
            heartbeat_interval_s=self.heartbeat_interval_s,
            acknowledged=acknowledged,
        )

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        with self._lock:
            worker = self._workers.get(request.instance_id)
            if worker is not None and worker.lost is not None:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{worker.lost}; its instance is being terminated",
                )
            if worker is None or worker.session != request.session:
                raise Refused(grpc.StatusCode.NOT_FOUND, "unknown worker session: register again")
            worker.last_seen = self._now()
            self._absorb(worker, request.tasks)
            return pb.HeartbeatResponse(
                acknowledged=self._acknowledged(worker),
                heartbeat_interval_s=self.heartbeat_interval_s,
            )

    def _absorb(self, worker: _Worker, statuses: Iterable[pb.TaskStatus]) -> None:
        """Take a worker's full list of attempts as its new state."""
        tasks = {(s.task_id, s.attempt): s for s in statuses}
        for key in worker.tasks.keys() - tasks.keys():
            self._acked.discard(key)  # the worker has forgotten it
            self._superseded.discard(key)
        worker.tasks = tasks
        for key, status in tasks.items():
            task_id, attempt = key
            if status.iterations > 0:
                self._progress[task_id] = status.iterations
            if attempt >= self._newest_attempt(task_id):
                continue
            # An older attempt than one already asked for: nobody will record it.
            if status.state in _TERMINAL_PB:
                self._acked.add(key)
            else:
                self._stop_superseded(worker, key)

    def _newest_attempt(self, task_id: str) -> int:
        newest = 0
        request = self._requests.get(task_id)
        if request is not None:
            newest = request.attempt
        for worker in self._workers.values():
            for other_task, attempt in worker.tasks:
                if other_task == task_id and attempt > newest:
                    newest = attempt
        return newest

    def _stop_superseded(self, worker: _Worker, key: tuple[str, int]) -> None:
        status = worker.tasks.get(key)
        if key in self._superseded or worker.lost is not None:
            return
        if status is not None and status.state == pb.TASK_STATE_CHECKPOINTING:
            return
        self._superseded.add(key)
        task_id, attempt = key
        self._send(worker, "StopTask", pb.StopTaskRequest(task_id=task_id, attempt=attempt), key)

    def _resend_stops(self, worker: _Worker) -> None:
        """Stops asked of a worker that restarted before carrying them out."""
        for task_id, request in self._requests.items():
            key = (task_id, request.attempt)
            status = worker.tasks.get(key)
            if (
                request.kind == "stop"
                and request.instance_id == worker.instance_id
                and status is not None
                and status.state in _RUNNING_PB
            ):
                self._send(
                    worker,
                    "StopTask",
                    pb.StopTaskRequest(task_id=task_id, attempt=request.attempt),
                    key,
                )

    def _acknowledged(self, worker: _Worker) -> list[pb.AttemptRef]:
        return [
            pb.AttemptRef(task_id=task_id, attempt=attempt)
            for task_id, attempt in worker.tasks
            if (task_id, attempt) in self._acked
        ]

    def _declare_lost(self, worker: _Worker, reason: str) -> None:
        worker.lost = reason
        worker.channel.close()
        log.warning("worker %s: %s", worker.instance_id, reason)

    # -- calls to workers ------------------------------------------------------------------

    def _send(
        self,
        worker: _Worker,
        method: str,
        message: Any,
        key: tuple[str, int],
        request: _Request | None = None,
    ) -> None:
        """Queue a call to a worker. Calls to one worker go out in order (a stop never
        overtakes the start it stops); calls to different workers run side by side."""
        if self._closed:
            return
        worker.outbox.append((method, message, key, request))
        if not worker.sending:
            worker.sending = True
            self._calls.submit(self._drain, worker)

    def _drain(self, worker: _Worker) -> None:
        while True:
            with self._lock:
                if not worker.outbox or self._closed:
                    worker.sending = False
                    worker.outbox.clear()
                    return
                method, message, key, request = worker.outbox.popleft()
            try:
                self._call(worker, method, message, key, request)
            except Exception:  # never let one call stop the others to this worker
                log.exception("%s %s/%d to %s", method, *key, worker.instance_id)

    def _call(
        self,
        worker: _Worker,
        method: str,
        message: Any,
        key: tuple[str, int],
        request: _Request | None,
    ) -> None:
        """One call to a worker, retried while it is alive, the call still needed, and
        for no longer than the heartbeat timeout (then a start fails with the reason)."""
        delay = 0.2
        give_up = time.monotonic() + self.heartbeat_timeout_s
        while True:
            try:
                response = getattr(worker.stub, method)(
                    message, timeout=self.rpc_timeout_s, wait_for_ready=True
                )
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
                with self._lock:
                    current = self._workers.get(worker.instance_id) is worker
                    alive = current and worker.lost is None and not self._closed
                    if not alive or (key in worker.tasks and method == "StartTask"):
                        return
                    if code in _REFUSALS or time.monotonic() > give_up:
                        why = (
                            f"the worker refused the start: {details}"
                            if code in _REFUSALS
                            else f"cannot reach the worker at {worker.address}: {code.name}"
                        )
                        log.warning("%s %s/%d: %s", method, *key, why)
                        if request is not None:
                            request.refused = why
                        return
                log.info(
                    "%s %s/%d to %s: %s; retrying", method, *key, worker.instance_id, code.name
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if method == "StartTask" and response.HasField("status"):
                with self._lock:
                    if key not in worker.tasks:
                        worker.tasks[key] = response.status
            return


class _RegistryService(pb_grpc.WorkerRegistryServicer):
    def __init__(self, executor: GrpcExecutor) -> None:
        self.executor = executor

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.register(request)
        except Refused as exc:
            context.abort(exc.code, str(exc))

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.heartbeat(request)
        except Refused as exc:
            context.abort(exc.code, str(exc))


def add_registry(server: grpc.Server, executor: GrpcExecutor) -> None:
    """Serve the worker registry (registration, heartbeats) on the daemon's server.

    The server is the daemon's: TLS with its certificate, and a `TokenAuth`
    letting the "worker" role call `WORKER_METHODS`.
    """
    pb_grpc.add_WorkerRegistryServicer_to_server(_RegistryService(executor), server)


def _host_of(address: str) -> str | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]")
