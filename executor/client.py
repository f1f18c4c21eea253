"""The daemon side: `GrpcExecutor`, the Executor contract over gRPC to the worker agents.

Workers dial out; nothing dials a worker. A worker first **enrolls**: it proves
which instance it is (the cloud's `IdentityVerifier`: EC2's signed identity
document, the local cloud's one-time secret), for a launch the daemon's state
knows, and gets a short-lived client certificate naming that instance. Every
later call (`Registry`: heartbeat, command stream, renewal, upload grants) is
mutual TLS, and the daemon takes the caller's instance from the verified
certificate (`security.instance_of`), never from the request.

What a worker may say is bounded by the state (`Ledger`): a heartbeat is
absorbed only for attempts the daemon placed on that instance (the current
attempt of a task whose state names this instance); a checkpoint only under
that attempt's own storage prefix (`storage.is_checkpoint_of`). Anything else
is dropped and logged, and a live attempt not placed there is told to stop at
once. When a heartbeat names a newer checkpoint of an attempt, its older
versions are pruned (`storage.prune_checkpoints`: the newest two are kept).

Storage is granted, never owned: a start carries presigned GETs of its
build context and checkpoint, and `GrantUpload` presigns one PUT under the
attempt's prefix — refused once the daemon has given the attempt up. That is
the fencing of an abandoned attempt: it can neither upload nor report, and its
container is killed as soon as its host answers again.

`report()` reads memory and never waits on the network: the last heartbeat of
every worker, overlaid with the commands not yet confirmed (an accepted start
is at least `starting`, a requested stop at least `checkpointing`). Commands
go out on each worker's `Commands` stream the moment they are queued, and are
sent again on every new stream until a heartbeat confirms them. A worker
silent for longer than `heartbeat_timeout_s` (by the injected clock) is lost:
listed in `lost_instances` with the reason, its tasks reported `failed` (an
infrastructure failure: never the job's) with their last complete checkpoint,
its calls refused until the round released it — with FAILED_PRECONDITION and
the trailing metadata `autoscaler-instance-ended` saying `lost` or `released`,
so the agent of a normal scale-in logs it as one.

Wiring, in the daemon (`app.wiring`, `app.daemon`):

    executor = GrpcExecutor(worker_ca=ca, storage=storage, cluster=name,
                            registry_address=workers_address, ledger=StateLedger(store),
                            verifier=cloud_verifier, heartbeat_timeout_s=60)
    add_worker_services(server, executor)
    server.add_secure_port(api, server_credentials(cert, key))           # users, Enroll
    server.add_secure_port(workers, server_credentials(cert, key, client_ca=ca.cert_pem))
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import grpc

from autoscaler.execution import (
    TERMINAL_TASK_STATES,
    ExecutorReport,
    InstanceNotice,
    TaskLaunch,
    TaskReport,
    TaskState,
)
from executor.enrollment import EnrollmentRefused, IdentityVerifier
from executor.messages import (
    ENDED_KEY,
    INSTANCE_ID,
    LOST,
    RELEASED,
    launch_to_pb,
    report_from_pb,
)
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.security import Authority, PeerRefused, WorkerTrust, instance_uri
from executor.storage import (
    Storage,
    StorageError,
    checkpoint_key,
    context_key_of,
    is_checkpoint_of,
    log_key,
    prune_checkpoints,
)

log = logging.getLogger(__name__)

#: Methods that authenticate their callers themselves (by enrollment proof, or by client
#: certificate), open past the daemon's `TokenAuth`.
WORKER_METHODS = ("/autoscaler.worker.v2.Enrollment/", "/autoscaler.worker.v2.Registry/")

#: How long a worker's client certificate is valid; it renews at half of it.
CERTIFICATE_LIFETIME_S = 3600.0
#: How long a presigned URL is valid: enough to start a transfer, not to keep one.
GRANT_EXPIRY_S = 600.0
#: Enrollment attempts per peer address: a burst, then one every `ENROLL_EVERY_S`.
ENROLL_BURST = 5
ENROLL_EVERY_S = 12.0

_TERMINAL_PB = frozenset({pb.TASK_STATE_STOPPED, pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED})
_ON_INSTANCE = frozenset({"starting", "running", "checkpointing"})
_LIVE_INSTANCE = frozenset({"requested", "pending", "running", "draining"})
#: Released instances remembered, so their workers cannot come back.
_RELEASED_KEPT = 10_000


# -- what the state says -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    """Where the state has a task's current attempt (`instance_id` None: on none)."""

    job_id: str
    attempt: int
    instance_id: str | None
    checkpoint: str | None  # where that attempt resumes from


@dataclass(frozen=True, slots=True)
class Launch:
    """An instance the state asked for: its cloud id and private address once recorded,
    and whether it may still run tasks (not being terminated, its worker not lost)."""

    instance_id: str
    cloud_id: str | None = None
    private_address: str | None = None
    live: bool = True
    reason: str = ""  # why it is not live
    lost: bool = False  # not live because its worker was lost (else: released, terminated)


class Ledger(Protocol):
    """The daemon's state, as the executor reads it to know what a worker may do."""

    def placed(self, task_ids: Collection[str]) -> Mapping[str, Placed]:
        """The current attempt of each of these tasks the state knows."""
        ...

    def launch(self, instance_id: str) -> Launch | None:
        """The launch `instance_id` stands for (None: not one of this cluster's)."""
        ...


class MemoryLedger:
    """What the executor itself asked for, as a `Ledger`: for an executor without a state
    (tests, benchmarks). The daemon reads its database instead (`app.wiring`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._placed: dict[str, Placed] = {}
        self._launches: dict[str, Launch] = {}

    def add_launch(self, launch: Launch) -> None:
        with self._lock:
            self._launches[launch.instance_id] = launch

    def give_up(self, instance_id: str, reason: str, *, lost: bool = True) -> None:
        with self._lock:
            launch = self._launches.get(instance_id)
            if launch is not None:
                self._launches[instance_id] = replace(launch, live=False, reason=reason, lost=lost)
            for task_id, placed in list(self._placed.items()):
                if placed.instance_id == instance_id:
                    self._placed[task_id] = replace(placed, instance_id=None)

    def place(self, launch: TaskLaunch) -> None:
        with self._lock:
            known = self._placed.get(launch.task_id)
            if known is None or known.attempt <= launch.attempt:
                self._placed[launch.task_id] = Placed(
                    launch.job_id, launch.attempt, launch.instance_id, launch.checkpoint
                )

    def ended(self, task_id: str, attempt: int, checkpoint: str | None) -> None:
        """The attempt's end is recorded (`acknowledge`): it is on no instance any more."""
        with self._lock:
            known = self._placed.get(task_id)
            if known is not None and known.attempt == attempt:
                self._placed[task_id] = replace(
                    known, instance_id=None, checkpoint=checkpoint or known.checkpoint
                )

    def placed(self, task_ids: Collection[str]) -> Mapping[str, Placed]:
        with self._lock:
            return {t: self._placed[t] for t in task_ids if t in self._placed}

    def launch(self, instance_id: str) -> Launch | None:
        with self._lock:
            return self._launches.get(instance_id)


class Refused(Exception):
    """A worker's call refused, with the gRPC status to answer; `ended` (RELEASED or LOST)
    when it is refused because the daemon gave the instance up."""

    def __init__(self, code: grpc.StatusCode, message: str, ended: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.ended = ended


# -- the executor -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    instance_id: str
    capacity: pb.Capacity
    agent_version: str
    registered_at: float
    last_seen: float
    tasks: dict[tuple[str, int], pb.TaskStatus] = field(default_factory=dict)
    lost: str | None = None
    gone: bool = False  # released or replaced: its command streams end
    # Commands not yet confirmed by a heartbeat, in order: (sequence number, command, the
    # launch of a start, whose grants are made as it is sent).
    outbox: list[tuple[int, pb.Command, TaskLaunch | None]] = field(default_factory=list)
    streams: int = 0  # command streams open now
    notices: tuple[InstanceNotice, ...] = ()  # what its provider announced (spot)
    # Wakes this worker's command streams only (one condition per worker, on the
    # executor's lock: a start for one worker does not wake a hundred streams).
    wakeup: threading.Condition | None = None


@dataclass
class _Request:
    """The latest thing asked of a task: start or stop one attempt."""

    attempt: int
    instance_id: str
    kind: str  # "start" or "stop"
    checkpoint: str | None = None
    refused: str | None = None  # why it cannot happen, reported as the attempt's failure
    progress: float = 0.0  # carried from the attempt before, until the job reports its own


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What the daemon knows of one worker (for status pages)."""

    instance_id: str
    agent_version: str
    capacity: tuple[float, float, float]
    registered_at: float
    last_seen: float
    lost: str | None


class GrpcExecutor:
    """`autoscaler.execution.Executor` over gRPC: workers enroll, stream and heart-beat."""

    def __init__(
        self,
        *,
        worker_ca: Authority,
        storage: Storage,
        cluster: str,
        registry_address: str,
        verifier: IdentityVerifier,
        ledger: Ledger | None = None,
        now: Callable[[], float] = time.monotonic,
        heartbeat_timeout_s: float = 45.0,
        heartbeat_interval_s: float = 5.0,
        certificate_lifetime_s: float = CERTIFICATE_LIFETIME_S,
        grant_expiry_s: float = GRANT_EXPIRY_S,
        enroll_burst: int = ENROLL_BURST,
        enroll_every_s: float = ENROLL_EVERY_S,
        trust: Callable[[], WorkerTrust] | None = None,
    ) -> None:
        if not heartbeat_timeout_s > heartbeat_interval_s > 0:
            raise ValueError(
                "the heartbeat timeout must be longer than the heartbeat interval, "
                f"got {heartbeat_timeout_s} s and {heartbeat_interval_s} s"
            )
        self.worker_ca = worker_ca
        # Which worker CAs are accepted and which signs, read at every use: a rotation
        # (`WorkerTrust`) takes effect without a restart. None: `worker_ca` alone.
        self._trust = trust or (lambda: WorkerTrust(worker_ca))
        self.storage = storage
        self.cluster = cluster
        self.registry_address = registry_address
        self.verifier = verifier
        self.memory = ledger is None
        self.ledger: Ledger = MemoryLedger() if ledger is None else ledger
        self._now = now
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.certificate_lifetime_s = certificate_lifetime_s
        self.grant_expiry_s = grant_expiry_s
        self._limiter = _RateLimiter(enroll_burst, enroll_every_s)
        self._lock = threading.RLock()
        self._workers: dict[str, _Worker] = {}
        self._requests: dict[str, _Request] = {}
        self._acked: set[tuple[str, int]] = set()
        self._progress: dict[str, float] = {}  # task -> iterations last reported by a worker
        self._released: dict[str, None] = {}  # instances given up (oldest first, bounded)
        self._sequence = 0
        self._closed = False
        # Called (outside the lock) with an instance whose worker reports a new notice from
        # its provider: the daemon runs a round at once rather than at the next period.
        self.on_notice: Callable[[str, InstanceNotice], None] | None = None

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
            if isinstance(self.ledger, MemoryLedger):
                self.ledger.place(launch)
            worker = self._workers.get(launch.instance_id)
            if worker is None:
                request.refused = f"no worker is registered for instance {launch.instance_id}"
                return
            if worker.lost is not None:
                request.refused = worker.lost
                return
            self._queue(worker, pb.Command(start=launch_to_pb(launch)), launch)

    def _with_grants(self, command: pb.Command, launch: TaskLaunch) -> pb.Command | None:
        """A start with fresh presigned GETs of its build context and checkpoint, made as it
        is sent (each resend gets its own; `start` stays a memory operation); None, and the
        request failed with the reason, when they cannot be made."""
        grants = {}
        try:
            if launch.run.build_context:
                key = context_key_of(launch.run.build_context)
                grants["build_context_url"] = self.storage.grant_get(key, self.grant_expiry_s)
            if launch.checkpoint:
                key = self.storage.key(launch.checkpoint)
                grants["checkpoint_url"] = self.storage.grant_get(key, self.grant_expiry_s)
        except StorageError as exc:
            with self._lock:
                request = self._requests.get(launch.task_id)
                if request is not None and request.attempt == launch.attempt:
                    request.refused = f"cannot grant the attempt its inputs: {exc}"
            return None
        return pb.Command(start=launch_to_pb(launch, **grants))

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
            if current is not None and current.attempt == attempt and current.kind == "stop":
                return
            if current is None or current.attempt <= attempt:
                self._requests[task_id] = _Request(attempt, worker.instance_id, "stop")
            if worker.lost is None:
                stop = pb.StopTask(task_id=task_id, attempt=attempt)
                self._queue(worker, pb.Command(stop=stop))

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
                        seen = replace(
                            seen,
                            state="failed",
                            reason=worker.lost,
                            throughput=None,
                            failure="infrastructure",
                        )
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
                {w.instance_id: w.notices for w in self._workers.values() if w.notices},
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
                failure="infrastructure",  # it never reached a worker: not the job's doing
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
                    if isinstance(self.ledger, MemoryLedger):
                        self.ledger.ended(task_id, attempt, status.checkpoint or None)
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
                worker.gone = True
                for key in worker.tasks:
                    self._acked.discard(key)
            if isinstance(self.ledger, MemoryLedger):
                self.ledger.give_up(instance_id, f"instance {instance_id} was released", lost=False)
            for task_id, request in list(self._requests.items()):
                if request.instance_id == instance_id:
                    del self._requests[task_id]
            if worker is not None:
                _wake(worker)

    # -- introspection ---------------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return [
                WorkerInfo(
                    w.instance_id,
                    w.agent_version,
                    (w.capacity.gpus, w.capacity.cpus, w.capacity.memory_gb),
                    w.registered_at,
                    w.last_seen,
                    w.lost,
                )
                for w in self._workers.values()
            ]

    def close(self) -> None:
        """End every command stream (the daemon is shutting down)."""
        with self._lock:
            self._closed = True
            for worker in self._workers.values():
                _wake(worker)

    # -- enrollment (the API port: no certificate yet) -------------------------------------------

    def enroll(self, request: pb.EnrollRequest, peer: str) -> pb.EnrollResponse:
        """A certificate for the instance the request proves it is, or Refused. Nothing is
        kept in memory either way: the worker exists for the daemon from its first
        heartbeat, which it can only make with this certificate."""
        host = _peer_host(peer)
        if not self._limiter.allowed(host, time.monotonic()):
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many refused enrollments from this address; wait and try again",
            )
        try:
            return self._enroll(request, peer)
        except Refused:
            self._limiter.spend(host, time.monotonic())  # refusals count, not enrollments
            raise

    def _enroll(self, request: pb.EnrollRequest, peer: str) -> pb.EnrollResponse:
        instance_id = request.instance_id
        if not INSTANCE_ID.fullmatch(instance_id):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"bad instance id {instance_id!r}")
        launch = self._live_launch(instance_id)
        try:
            self.verifier.verify(request, launch)
        except EnrollmentRefused as exc:
            log.warning("enrollment of %s from %s refused: %s", instance_id, peer, exc)
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"enrollment refused: {exc}") from None
        certificate = self._certificate(instance_id, request.csr_pem)
        held = {(r.task_id, r.attempt) for r in request.held}
        stop = [k for k in held if not self._own(instance_id, *k, self._placements(held))]
        log.info("worker %s enrolled from %s", instance_id, peer)
        return pb.EnrollResponse(
            certificate_pem=certificate,
            registry_address=self.registry_address,
            heartbeat_interval_s=self.heartbeat_interval_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            stop=[pb.AttemptRef(task_id=t, attempt=a) for t, a in sorted(stop)],
        )

    def _live_launch(self, instance_id: str) -> Launch:
        """The launch `instance_id` stands for, if its worker may still work; else Refused."""
        launch = self.ledger.launch(instance_id)
        if launch is None:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"no launch of cluster {self.cluster} is instance {instance_id}",
            )
        with self._lock:
            released = instance_id in self._released
            worker = self._workers.get(instance_id)
            lost = worker.lost if worker is not None else None
        if released:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"instance {instance_id} was released: it is being terminated",
                RELEASED,
            )
        if lost is not None:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{lost}; its instance is being terminated",
                LOST,
            )
        if not launch.live:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"instance {instance_id} was given up ({launch.reason})",
                LOST if launch.lost else RELEASED,
            )
        return launch

    def _certificate(self, instance_id: str, csr_pem: bytes) -> bytes:
        try:
            return self._trust().current.sign_client(
                csr_pem, instance_uri(self.cluster, instance_id), self.certificate_lifetime_s
            )
        except ValueError as exc:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"bad certificate signing request: {exc}"
            ) from None

    # -- the registry (mutual TLS: `instance_id` comes from the verified certificate) --------

    def identify(self, auth_context: Mapping[str, Iterable[bytes]]) -> str:
        """The instance a caller's client certificate names (checked again here, whatever
        the TLS layer did), or Refused."""
        pems = list(auth_context.get("x509_pem_cert", ()))
        if len(pems) != 1:
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "a worker certificate is required (enroll, then call the worker port)",
            )
        try:
            return self._trust().instance_of(pems[0], self.cluster, time.time())
        except PeerRefused as exc:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None

    def renew(self, instance_id: str, request: pb.RenewRequest) -> pb.RenewResponse:
        self._live_launch(instance_id)
        return pb.RenewResponse(certificate_pem=self._certificate(instance_id, request.csr_pem))

    def heartbeat(self, instance_id: str, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        self._live_launch(instance_id)
        keys = {(s.task_id, s.attempt) for s in request.tasks}
        placements = self._placements(keys)
        with self._lock:
            worker = self._worker(instance_id, request)
            if worker.lost is not None:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{worker.lost}; its instance is being terminated",
                    LOST,
                )
            worker.last_seen = self._now()
            worker.capacity = pb.Capacity(
                gpus=request.capacity.gpus,
                cpus=request.capacity.cpus,
                memory_gb=request.capacity.memory_gb,
            )
            worker.agent_version = request.agent_version
            notices = tuple(
                InstanceNotice(n.kind, n.action, n.time) for n in request.notices if n.kind
            )
            new_notices = [n for n in notices if n not in worker.notices]
            worker.notices = tuple(dict.fromkeys((*worker.notices, *notices)))
            before = {key: status.checkpoint for key, status in worker.tasks.items()}
            others = self._absorb(worker, request.tasks, placements)
            ended = {(s.task_id, s.attempt) for s in request.tasks if s.state in _TERMINAL_PB}
            forget = [k for k in worker.tasks if k in self._acked] + [
                k for k in others if k in ended
            ]
            newer = [
                (placements[t].job_id, t, a, status.checkpoint)
                for (t, a), status in worker.tasks.items()
                if status.checkpoint and status.checkpoint != before.get((t, a))
            ]
            response = pb.HeartbeatResponse(
                acknowledged=[pb.AttemptRef(task_id=t, attempt=a) for t, a in forget],
                stop=[
                    pb.AttemptRef(task_id=t, attempt=a) for t, a in others if (t, a) not in ended
                ],
                heartbeat_interval_s=self.heartbeat_interval_s,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
            )
        self._prune(newer)
        for notice in new_notices:
            log.warning("instance %s: %s", instance_id, notice.describe())
            if self.on_notice is not None:
                self.on_notice(instance_id, notice)
        return response

    def _prune(self, newer: Iterable[tuple[str, str, int, str]]) -> None:
        """Older versions of the attempts' checkpoints a heartbeat just named newer ones of:
        the newest two are kept (outside the lock: storage calls)."""
        for job_id, task_id, attempt, ref in newer:
            try:
                deleted = prune_checkpoints(self.storage, ref, job_id, task_id, attempt)
            except StorageError as exc:
                log.warning("pruning the checkpoints of %s attempt %d: %s", task_id, attempt, exc)
                continue
            if deleted:
                log.debug(
                    "pruned %d checkpoint(s) of %s attempt %d", len(deleted), task_id, attempt
                )

    def _worker(self, instance_id: str, request: pb.HeartbeatRequest) -> _Worker:
        worker = self._workers.get(instance_id)
        if worker is None:
            now = self._now()
            worker = _Worker(
                instance_id,
                pb.Capacity(),
                request.agent_version,
                registered_at=now,
                last_seen=now,
                wakeup=threading.Condition(self._lock),
            )
            self._workers[instance_id] = worker
            log.info(
                "worker %s is connected (%s; %g GPU, %g cores, %g GiB)",
                instance_id,
                request.agent_version,
                request.capacity.gpus,
                request.capacity.cpus,
                request.capacity.memory_gb,
            )
        return worker

    def _placements(self, keys: Collection[tuple[str, int]]) -> Mapping[str, Placed]:
        task_ids = {t for t, _ in keys}
        return self.ledger.placed(task_ids) if task_ids else {}

    def _own(
        self, instance_id: str, task_id: str, attempt: int, placements: Mapping[str, Placed]
    ) -> bool:
        placed = placements.get(task_id)
        return (
            placed is not None and placed.attempt == attempt and placed.instance_id == instance_id
        )

    def _absorb(
        self,
        worker: _Worker,
        statuses: Iterable[pb.TaskStatus],
        placements: Mapping[str, Placed],
    ) -> list[tuple[str, int]]:
        """Take a worker's attempts as its new state — those the daemon placed there; returns
        the others (each to be stopped, or forgotten when it has ended)."""
        tasks: dict[tuple[str, int], pb.TaskStatus] = {}
        others: list[tuple[str, int]] = []
        for status in statuses:
            key = (status.task_id, status.attempt)
            placed = placements.get(status.task_id)
            if not self._own(worker.instance_id, *key, placements):
                others.append(key)
                if placed is None or placed.attempt <= status.attempt:
                    # Not an older attempt of a task placed here once: never this worker's.
                    log.warning(
                        "dropped a report of %s attempt %d from %s: not placed there",
                        *key,
                        worker.instance_id,
                    )
                continue
            assert placed is not None
            foreign = status.checkpoint and not is_checkpoint_of(
                self.storage, status.checkpoint, placed.job_id, status.task_id, status.attempt
            )
            if foreign and status.checkpoint != placed.checkpoint:
                log.warning(
                    "dropped checkpoint %r of %s attempt %d from %s: not that attempt's own",
                    status.checkpoint,
                    *key,
                    worker.instance_id,
                )
                status = _copy(status)
                status.checkpoint = placed.checkpoint or ""
            tasks[key] = status
        for key in worker.tasks.keys() - tasks.keys():
            self._acked.discard(key)  # the worker has forgotten it
        worker.tasks = tasks
        for (task_id, _attempt), status in tasks.items():
            if status.iterations > 0:
                self._progress[task_id] = status.iterations
        self._confirm(worker)
        return others

    def _confirm(self, worker: _Worker) -> None:
        """Drop the commands a heartbeat shows were carried out."""
        kept = []
        for sequence, command, launch in worker.outbox:
            which = command.WhichOneof("command")
            order = command.start if which == "start" else command.stop
            status = worker.tasks.get((order.task_id, order.attempt))
            done = status is not None and (
                which == "start"
                or status.state in _TERMINAL_PB
                or status.state == pb.TASK_STATE_CHECKPOINTING
            )
            if not done:
                kept.append((sequence, command, launch))
        worker.outbox = kept

    def commands(self, instance_id: str, is_active: Callable[[], bool]) -> Iterator[pb.Command]:
        """The command stream of one worker: every unconfirmed command, then each new one as
        it is queued, until the worker goes, is given up, or disconnects."""
        self._live_launch(instance_id)
        sent = 0
        with self._lock:
            worker = self._workers.get(instance_id)
            if worker is None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "heart-beat first")
            worker.streams += 1
        try:
            while True:
                with self._lock:
                    pending = [entry for entry in worker.outbox if entry[0] > sent]
                    while (
                        not pending
                        and not self._closed
                        and not worker.gone
                        and worker.lost is None
                        and is_active()
                    ):
                        assert worker.wakeup is not None
                        worker.wakeup.wait(timeout=1.0)
                        pending = [entry for entry in worker.outbox if entry[0] > sent]
                    if self._closed or worker.gone or worker.lost is not None or not is_active():
                        return
                for sequence, command, launch in pending:
                    ready = command if launch is None else self._with_grants(command, launch)
                    if ready is None:  # failed with its reason: nothing to send, ever
                        with self._lock:
                            worker.outbox = [e for e in worker.outbox if e[0] != sequence]
                    else:
                        yield ready
                    sent = sequence
        finally:
            with self._lock:
                worker.streams -= 1

    def _queue(
        self, worker: _Worker, command: pb.Command, launch: TaskLaunch | None = None
    ) -> None:
        self._sequence += 1
        worker.outbox.append((self._sequence, command, launch))
        _wake(worker)

    def grant_upload(self, instance_id: str, request: pb.GrantUploadRequest) -> pb.Grant:
        """A presigned PUT for one object of an attempt placed on `instance_id`; refused for
        any other attempt, and for one the daemon gave up (fenced)."""
        self._live_launch(instance_id)
        placements = self._placements({(request.task_id, request.attempt)})
        if not self._own(instance_id, request.task_id, request.attempt, placements):
            log.warning(
                "refused an upload grant for %s attempt %d to %s: not placed there",
                request.task_id,
                request.attempt,
                instance_id,
            )
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"attempt {request.attempt} of {request.task_id} is not placed on "
                f"{instance_id} (any more): it is fenced",
            )
        job_id = placements[request.task_id].job_id
        try:
            if request.kind == pb.OBJECT_KIND_CHECKPOINT:
                key = checkpoint_key(job_id, request.task_id, request.attempt, request.step)
            elif request.kind == pb.OBJECT_KIND_LOG:
                key = log_key(job_id, request.task_id, request.attempt)
            else:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "unknown object kind")
            url = self.storage.grant_put(key, self.grant_expiry_s)
        except StorageError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return pb.Grant(
            url=url, ref=self.storage.ref(key), expires_at=time.time() + self.grant_expiry_s
        )

    def _declare_lost(self, worker: _Worker, reason: str) -> None:
        worker.lost = reason
        if isinstance(self.ledger, MemoryLedger):
            self.ledger.give_up(worker.instance_id, reason)
        _wake(worker)
        log.warning("worker %s: %s", worker.instance_id, reason)


def _wake(worker: _Worker) -> None:
    """Wake the worker's command streams (the executor's lock is held)."""
    if worker.wakeup is not None:
        worker.wakeup.notify_all()


def _copy(status: pb.TaskStatus) -> pb.TaskStatus:
    copy = pb.TaskStatus()
    copy.CopyFrom(status)
    return copy


def _peer_host(peer: str) -> str:
    """The address part of gRPC's peer string (`ipv4:10.0.0.5:51234`, `ipv6:[::1]:5`)."""
    body = peer.split(":", 1)[1] if ":" in peer else peer
    return body.rsplit(":", 1)[0].strip("[]")


class _RateLimiter:
    """A token bucket per peer address for refused enrollments (guesses): `burst` of them,
    then one every `every_s`; an address out of tokens is refused before its proof is even
    checked. Workers enrolling rightly spend nothing, however many share an address (the
    local cloud's). Bounded: the least recently seen addresses are forgotten first."""

    def __init__(self, burst: int, every_s: float, kept: int = 4096) -> None:
        self.burst, self.every_s, self.kept = burst, every_s, kept
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _tokens(self, peer: str, now: float) -> float:
        tokens, at = self._buckets.pop(peer, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.every_s)

    def allowed(self, peer: str, now: float) -> bool:
        with self._lock:
            if peer not in self._buckets:
                return True
            tokens = self._tokens(peer, now)
            self._buckets[peer] = (tokens, now)
            return tokens >= 1.0

    def spend(self, peer: str, now: float) -> None:
        with self._lock:
            self._buckets[peer] = (max(0.0, self._tokens(peer, now) - 1.0), now)
            while len(self._buckets) > self.kept:
                self._buckets.popitem(last=False)


# -- the gRPC services ---------------------------------------------------------------------------


class _Enrollment(pb_grpc.EnrollmentServicer):
    def __init__(self, executor: GrpcExecutor) -> None:
        self.executor = executor

    def Enroll(self, request: pb.EnrollRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.enroll(request, context.peer())
        except Refused as exc:
            context.abort(exc.code, str(exc))


def _abort(context: grpc.ServicerContext, refused: Refused) -> None:
    """Answer a refused call, saying in the trailing metadata why an instance was given up."""
    if refused.ended is not None:
        context.set_trailing_metadata(((ENDED_KEY, refused.ended),))
    context.abort(refused.code, str(refused))


class _Registry(pb_grpc.RegistryServicer):
    def __init__(self, executor: GrpcExecutor) -> None:
        self.executor = executor

    def _caller(self, context: grpc.ServicerContext) -> str:
        # gRPC maps each property to an iterable of bytes (its docstring and its behaviour);
        # types-grpcio's stub says one bytes value.
        return self.executor.identify(context.auth_context())  # type: ignore[arg-type]

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.renew(self._caller(context), request)
        except Refused as exc:
            _abort(context, exc)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.heartbeat(self._caller(context), request)
        except Refused as exc:
            _abort(context, exc)

    def Commands(self, request: pb.CommandsRequest, context: grpc.ServicerContext) -> Any:
        try:
            yield from self.executor.commands(self._caller(context), context.is_active)
        except Refused as exc:
            _abort(context, exc)

    def GrantUpload(self, request: pb.GrantUploadRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.executor.grant_upload(self._caller(context), request)
        except Refused as exc:
            _abort(context, exc)


def add_worker_services(server: grpc.Server, executor: GrpcExecutor) -> None:
    """Serve enrollment and the registry on the daemon's server. `Enroll` is answered on
    any port (it checks its proof); the registry's methods only for callers with a worker
    certificate, which only the workers' port (mutual TLS) can carry."""
    pb_grpc.add_EnrollmentServicer_to_server(_Enrollment(executor), server)
    pb_grpc.add_RegistryServicer_to_server(_Registry(executor), server)
