"""The submission API: the daemon's gRPC service for users, and the client the CLI uses.

Every call is authenticated (TLS with the cluster's CA, a user's token as a
bearer token: `app.users`), allowed or refused by the user's role
(`UserAuth`), and written to the audit log with its outcome. A job belongs to
the user who submitted it; cancelling or draining others' jobs takes an admin.
A job is checked against the catalog before it is queued, and
a rejected one leaves the queue as it was. Build contexts are uploaded once
(content-addressed) and only then is the job committed; a context whose job
never came is collected after `ORPHAN_CONTEXT_AGE_S`.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import re
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import msgspec
from sqlalchemy import Engine

from app.config import TeamTable
from app.reports import cluster_status, cost_report, job_detail, job_list, quote
from app.teams import check_team, team_list
from app.users import (
    ROTATION_OVERLAP_S,
    Authenticator,
    Caller,
    add_user,
    check_user_name,
    rotate_user,
)
from app.v1 import api_pb2, api_pb2_grpc
from autoscaler.catalog import Catalog
from autoscaler.decide import ControlOptions, Planner
from autoscaler.errors import InputError
from autoscaler.fairshare import MAX_PRIORITY
from autoscaler.jobs import (
    JobSpec,
    spec_document,
    spec_from_document,
    validate_against_catalog,
    without_missing_families,
)
from autoscaler.limits import MAX_JOB_COST
from autoscaler.store import FINAL_JOB_STATUSES, DuplicateJob, Store, TaskUpdate, UnknownEntity
from executor.packing import inflated_size
from executor.storage import (
    CHECKPOINT,
    CONTEXTS_PREFIX,
    StorageError,
    context_key,
    context_key_of,
    is_digest,
    is_log_key,
    job_prefix,
)
from state.accounts import TEAM_KEYS, AuditRecord, DuplicateUser, SqlAccounts

log = logging.getLogger("autoscaler.api")

SERVICE = "/autoscaler.api.v1.Submission/"

#: The methods each role may call. `submit` may cancel and drain only its own jobs,
#: which the method itself checks (the owner is known only once the job is read).
READ_METHODS = frozenset(
    {"GetJob", "ListJobs", "GetLogs", "ClusterStatus", "CostReport", "GetCatalog", "QuoteJob"}
)
SUBMIT_METHODS = READ_METHODS | {
    "MissingContexts",
    "UploadContext",
    "SubmitJob",
    "CancelJob",
    "DrainInstance",
}
ADMIN_METHODS = SUBMIT_METHODS | {
    "AddUser",
    "ListUsers",
    "RotateUser",
    "RevokeUser",
    "Audit",
    "SetTeam",
    "ListTeams",
}
ROLE_METHODS = {"read": READ_METHODS, "submit": SUBMIT_METHODS, "admin": ADMIN_METHODS}

#: What a task's env value shows as unless its owner or an admin asks for it.
HIDDEN = "(hidden)"

#: How long an uploaded context may wait for the job that uses it before it is collected.
ORPHAN_CONTEXT_AGE_S = 24 * 3600.0

#: Jobs finished longer ago than their checkpoints' retention plus this are not swept
#: again (the bucket's lifecycle rule expires what a daemon stopped that long missed).
CHECKPOINT_SWEEP_WINDOW_S = 7 * 86400.0

#: Deadline of every call the client makes (uploads get one per MiB on top).
CALL_TIMEOUT_S = 30.0

_CHUNK = 1024 * 1024


class Storage(Protocol):
    """What the API needs of the cluster's storage (`executor.storage`)."""

    def put_file(self, key: str, path: Path) -> str: ...

    def get_file(self, ref_or_key: str, path: Path) -> None: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def ref(self, key: str) -> str: ...

    def modified_at(self, key: str) -> float | None: ...


class SubmissionService(api_pb2_grpc.SubmissionServicer):
    """The daemon's side of the API; it reads and writes only through the Store."""

    def __init__(
        self,
        store: Store,
        storage: Storage,
        catalog: Callable[[], Catalog],
        *,
        now: Callable[[], float] = time.time,
        planner: Callable[[], Planner] | None = None,
        options: ControlOptions | None = None,
        max_context_bytes: int = 256 * 1024 * 1024,
        accounts: SqlAccounts | None = None,
        teams: Mapping[str, TeamTable] | None = None,
    ) -> None:
        if accounts is None and isinstance(getattr(store, "engine", None), Engine):
            accounts = SqlAccounts(store.engine)  # type: ignore[attr-defined]
        self._accounts = accounts
        self.store = store
        self.storage = storage
        self.catalog = catalog
        self.now = now
        self.planner = planner
        self.options = options
        self.max_context_bytes = max_context_bytes
        self.teams = dict(teams or {})  # the config's [teams.NAME] (`app.teams`)

    # -- contexts -----------------------------------------------------------------------------

    def MissingContexts(self, request, context):
        bad = [d for d in request.digests if not is_digest(d)]
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a sha256 digest: {bad[0]!r}")
        missing = [d for d in request.digests if not self.storage.exists(context_key(d))]
        refs = {d: self.storage.ref(context_key(d)) for d in request.digests}
        return api_pb2.MissingContextsResponse(missing=missing, refs=refs)

    def UploadContext(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or not is_digest(first.digest):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first chunk must name a digest")
        if first.size > self.max_context_bytes:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"build context of {first.size / 2**20:.1f} MiB is over the limit of "
                f"{self.max_context_bytes / 2**20:.0f} MiB ([limits] max_context_mb); "
                "shrink it with a .dockerignore",
            )
        digest, received = hashlib.sha256(), 0
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
            for chunk in _chain(first, request_iterator):
                received += len(chunk.data)
                if received > first.size or received > self.max_context_bytes:
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "more bytes than the declared size"
                    )
                digest.update(chunk.data)
                tmp.write(chunk.data)
            tmp.flush()
            if received != first.size or digest.hexdigest() != first.digest:
                context.abort(
                    grpc.StatusCode.DATA_LOSS,
                    "the upload does not match its declared size and digest; send it again",
                )
            current().target = first.digest
            try:
                inflated = inflated_size(tmp.name, self.max_context_bytes)
            except (OSError, EOFError, zlib.error):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a .tar.gz build context")
            if inflated > self.max_context_bytes:
                # The limit is on what the context is, not on how well it compresses.
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"build context inflates to more than the limit of "
                    f"{self.max_context_bytes / 2**20:.0f} MiB ([limits] max_context_mb); "
                    "shrink it with a .dockerignore",
                )
            ref = self.storage.put_file(context_key(first.digest), Path(tmp.name))
        return api_pb2.UploadContextResponse(ref=ref)

    # -- jobs ---------------------------------------------------------------------------------

    def SubmitJob(self, request, context):
        try:
            job = parse_submitted(request.spec_json)
            catalog = self.catalog()
            job, _ = without_missing_families(job, catalog)  # the client said so already
            validate_against_catalog((job,), catalog, source=f"job {job.job_id!r}")
            for task in job.tasks:
                ref = task.run.build_context
                if ref and not self.storage.exists(_context_key_of(ref, task.task_id)):
                    raise InputError(
                        "is not in the cluster's storage: upload it first",
                        where=f"task {task.task_id!r}",
                        field="build_context",
                        value=ref,
                        has_value=True,
                    )
            current().target = job.job_id
            caller = current().caller
            self.store.submit_job(job, owner=caller.name, at=self.now(), team=caller.team or "")
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except DuplicateJob as exc:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        return api_pb2.SubmitJobResponse(job_id=job.job_id)

    def GetJob(self, request, context):
        detail = job_detail(self.store, request.job_id, self.catalog(), self.now())
        if detail is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        caller = current().caller
        if request.show_secrets and not (caller.is_admin or caller.name == detail["owner"]):
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"only the job's owner ({detail['owner']}) or an admin may see its env values",
            )
        record = self.store.job(request.job_id)
        env = {t.task_id: t.run.env for t in record.spec.tasks} if record else {}
        for task in detail["task_list"]:
            task["env"] = {
                name: (value if request.show_secrets else HIDDEN)
                for name, value in env.get(task["task"], ())
            }
        return _document(detail)

    def ListJobs(self, request, context):
        return _document(job_list(self.store, request.statuses or None, request.limit))

    def CancelJob(self, request, context):
        record = self.store.job(request.job_id)
        if record is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        _own(context, record.owner, f"job {request.job_id!r}")
        try:
            cancelled = self.store.cancel_job(request.job_id, self.now())
        except UnknownEntity:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        record = self.store.job(request.job_id)
        return api_pb2.CancelJobResponse(
            cancelled=cancelled, status=record.status if record else ""
        )

    def DrainInstance(self, request, context):
        inst = self.store.instance(request.instance_id)
        if inst is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no instance {request.instance_id!r}")
        if request.job_id:
            return self._drain_job(request.job_id, inst, context)
        if not current().caller.is_admin:
            # A submitter may drain an instance only when every task on it is theirs.
            owners = self._owners_on(request.instance_id)
            others = sorted(owners - {current().caller.name})
            if others or not owners:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"instance {request.instance_id!r} runs "
                    + (f"jobs of {', '.join(others)}" if others else "no job of yours")
                    + ": only an admin may drain it",
                )
        on_it = [
            t.task_id
            for j in self.store.jobs(("queued", "running"))
            for t in self.store.tasks_of(j.job_id)
            if t.instance_id == inst.instance_id
        ]
        draining = False
        if inst.status in ("pending", "running"):
            draining = self.store.transition_instance(
                inst.instance_id,
                "draining",
                self.now(),
                reason="drained by the operator: its tasks move at the next round",
            )
        record = self.store.instance(request.instance_id)
        return api_pb2.DrainInstanceResponse(
            draining=draining, status=record.status, tasks=on_it if draining else []
        )

    def _drain_job(self, job_id: str, inst: Any, context: Any) -> Any:
        """Move only this job's tasks off the instance (`drain --job`): the next round
        places them elsewhere (`autoscaler.decide.drained_off`); the rest stays."""
        job = self.store.job(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r}")
        assert job is not None  # abort raised
        _own(context, job.owner, f"job {job_id!r}")  # moving it is changing it
        moving = [
            TaskUpdate(
                t.task_id,
                drain_from=inst.instance_id,
                reason=f"drained by the operator: moves off {inst.instance_id} at the next round",
            )
            for t in self.store.tasks_of(job_id)
            if t.instance_id == inst.instance_id and t.status in ("starting", "running")
        ]
        moved = self.store.update_tasks(moving, self.now()) if moving else set()
        return api_pb2.DrainInstanceResponse(
            draining=bool(moved), status=inst.status, tasks=sorted(moved)
        )

    def GetLogs(self, request, context):
        if self.store.job(request.job_id) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id!r}")
        prefix = job_prefix(request.job_id, request.task)
        logs: dict[str, str] = {}
        for key in sorted(self.storage.list(prefix)):
            if not is_log_key(key):
                continue
            with tempfile.NamedTemporaryFile() as tmp:
                self.storage.get_file(key, Path(tmp.name))
                text = Path(tmp.name).read_text(encoding="utf-8", errors="replace")
            if request.tail:
                text = "\n".join(text.splitlines()[-request.tail :])
            logs[key.removeprefix(job_prefix(request.job_id))] = text
        return _document({"job": request.job_id, "logs": logs})

    # -- the cluster ---------------------------------------------------------------------------

    def ClusterStatus(self, request, context):
        return _document(cluster_status(self.store, self.now()))

    def CostReport(self, request, context):
        hypothetical: list[JobSpec] = []
        if request.dry_run_json:
            try:
                hypothetical = [spec_from_document(d) for d in json.loads(request.dry_run_json)]
            except (ValueError, KeyError, TypeError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"dry-run jobs: {exc}")
        try:
            report = cost_report(
                self.store,
                self.catalog(),
                self.now(),
                since=request.since,
                planner=self.planner() if self.planner else None,
                options=self.options,
                hypothetical=hypothetical,
            )
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return _document(report)

    def GetCatalog(self, request, context):
        return _document(catalog_document(self.catalog()))

    def QuoteJob(self, request, context):
        if self.planner is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this service has no planner")
        try:
            job = parse_submitted(request.spec_json)
            catalog = self.catalog()
            job, _ = without_missing_families(job, catalog)
            validate_against_catalog((job,), catalog, source=f"job {job.job_id!r}")
            current().target = job.job_id
            options = self.options or ControlOptions()
            document = quote(
                self.store.snapshot(options.default_throughput),
                catalog,
                self.planner(),
                options,
                self.now(),
                job,
                duration_s=request.duration_s or None,
                iterations=request.iterations or None,
                throughput=request.throughput or None,
            )
        except (InputError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return _document(document)

    # -- users and the audit log (admin only: `UserAuth`) ----------------------------------------

    @property
    def accounts(self) -> SqlAccounts:
        if self._accounts is None:
            raise RuntimeError("this service has no state database for users")
        return self._accounts

    def AddUser(self, request, context):
        current().target = request.name
        try:
            user, token = add_user(
                self.accounts, request.name, request.role, request.team or None, self.now()
            )
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except DuplicateUser as exc:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        return _document({**_user_document(user), "token": token})

    def ListUsers(self, request, context):
        return _document({"users": [_user_document(u) for u in self.accounts.users()]})

    def RotateUser(self, request, context):
        user = self._user(request, context)
        overlap = request.overlap_s if request.overlap_s > 0 else ROTATION_OVERLAP_S
        try:
            token = rotate_user(self.accounts, user, self.now(), overlap)
        except InputError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if token is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{user.name!r} is revoked")
        rotated = self.accounts.user(user.user_id)
        return _document(
            {**_user_document(rotated or user), "token": token, "previous_valid_s": overlap}
        )

    def RevokeUser(self, request, context):
        user = self._user(request, context)
        revoked = self.accounts.revoke(user.user_id, self.now())
        after = self.accounts.user(user.user_id) or user
        return _document({**_user_document(after), "revoked": revoked})

    def Audit(self, request, context):
        entries = self.accounts.audit(
            user=request.user or None, since=request.since or None, limit=request.limit
        )
        return _document({"entries": [_audit_document(e) for e in entries]})

    # -- teams (admin only) ------------------------------------------------------------------------

    def SetTeam(self, request, context):
        current().target = request.name
        given = {key: getattr(request, key) for key in TEAM_KEYS if request.HasField(key)}
        if not given:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "give at least one limit: "
                + ", ".join(f"--{k.replace('_', '-')}" for k in TEAM_KEYS),
            )
        current().detail = json.dumps(given, sort_keys=True)
        records = self.accounts.teams()
        before = next((r for r in records if r.name == request.name), None)
        try:
            check_team(
                request.name,
                {
                    **msgspec.structs.asdict(self.teams.get(request.name, TeamTable())),
                    **(before.limits if before else {}),
                    **given,
                },
            )
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.accounts.set_team(request.name, given, self.now(), current().caller.name)
        listed = team_list(self.teams, self.accounts.teams())["teams"]
        return _document(next(t for t in listed if t["team"] == request.name))

    def ListTeams(self, request, context):
        return _document(team_list(self.teams, self.accounts.teams()))

    def _user(self, request: Any, context: Any) -> Any:
        current().target = request.name
        try:
            check_user_name(request.name)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        user = self.accounts.user_named(request.name)
        if user is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no user {request.name!r}")
        return user

    def _owners_on(self, instance_id: str) -> set[str]:
        """The owners of the unfinished jobs with a task on (or bound for) the instance."""
        owners = set()
        for job in self.store.jobs():
            if job.status in ("completed", "cancelled", "failed"):
                continue
            for task in self.store.tasks_of(job.job_id):
                if instance_id in (task.instance_id, task.target_instance_id):
                    owners.add(job.owner)
        return owners

    # -- housekeeping --------------------------------------------------------------------------

    def collect_orphan_contexts(self, *, older_than_s: float = ORPHAN_CONTEXT_AGE_S) -> list[str]:
        """Delete uploaded contexts no job refers to and older than `older_than_s`:
        what a submission that failed after its upload left behind."""
        used = {
            context_key_of(t.run.build_context)
            for j in self.store.jobs()
            for t in j.spec.tasks
            if t.run.build_context
        }
        deleted = []
        for key in self.storage.list(CONTEXTS_PREFIX):
            if key in used:
                continue
            age = _age_s(self.storage, key, self.now())
            if age is not None and age >= older_than_s:
                self.storage.delete(key)
                deleted.append(key)
        return deleted

    def collect_finished_checkpoints(
        self, *, retention_s: float, window_s: float = CHECKPOINT_SWEEP_WINDOW_S
    ) -> list[str]:
        """Delete the checkpoints of jobs that finished (completed, failed or cancelled)
        at least `retention_s` ago: nothing resumes from them, and they are most of what a
        cluster stores. Logs are kept (`autoscaler logs`), until the lifecycle rule expires
        them. Only jobs finished less than `window_s` past their retention are listed, so
        an hourly sweep costs a few LIST calls whatever the cluster's history."""
        now = self.now()
        deleted = []
        for job in self.store.jobs(sorted(FINAL_JOB_STATUSES)):
            if job.finished_at is None or not (
                retention_s <= now - job.finished_at < retention_s + window_s
            ):
                continue
            for key in self.storage.list(job_prefix(job.job_id)):
                if key.rpartition("/")[2].startswith(CHECKPOINT):
                    self.storage.delete(key)
                    deleted.append(key)
        return deleted


def add_submission(server: grpc.Server, service: SubmissionService) -> None:
    api_pb2_grpc.add_SubmissionServicer_to_server(service, server)


# -- who calls, and the audit log ---------------------------------------------------------------


@dataclass
class Call:
    """The call being served: who made it, and what it is about (for the audit log)."""

    caller: Caller
    method: str
    target: str = ""
    detail: str = ""


_CALL: contextvars.ContextVar[Call] = contextvars.ContextVar("autoscaler_api_call")


def current() -> Call:
    """The call this thread serves (set by `UserAuth` around every user call)."""
    return _CALL.get()


def _own(context: Any, owner: str, what: str) -> None:
    """Refuse unless the caller owns `what` or is an admin."""
    caller = current().caller
    if not caller.is_admin and caller.name != owner:
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{what} belongs to {owner}: only its owner or an admin may change it",
        )


@dataclass
class UserAuth(grpc.ServerInterceptor):
    """Authenticates every call of the submission API by its bearer token, allows it by
    the user's role (`ROLE_METHODS`), and writes it to the audit log with its outcome —
    refused calls too. Methods under `open` (the workers' services, which check
    certificates themselves) and health checks pass untouched.

    The audit entry names the user, the method, its target (a job, an instance, a user)
    and the status the call ended with; never a token nor a request's body.
    """

    authenticator: Authenticator
    accounts: SqlAccounts
    now: Callable[[], float] = time.time
    open: tuple[str, ...] = ()
    _open: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self._open = ("/grpc.health.v1.Health/", *self.open)

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(self._open):
            return handler
        name = method.removeprefix(SERVICE)
        token = _bearer(handler_call_details.invocation_metadata or ())
        caller = self.authenticator.authenticate(token) if token else None
        if caller is None:
            anonymous = Caller("", "-", "-")
            return self._wrap(
                handler, anonymous, name, (grpc.StatusCode.UNAUTHENTICATED, _NO_TOKEN)
            )
        if name not in ROLE_METHODS.get(caller.role, ()):
            refusal = f"{caller.name} ({caller.role}) may not call {name}"
            return self._wrap(handler, caller, name, (grpc.StatusCode.PERMISSION_DENIED, refusal))
        return self._wrap(handler, caller, name, None)

    def _wrap(
        self,
        handler: grpc.RpcMethodHandler,
        caller: Caller,
        method: str,
        refusal: tuple[grpc.StatusCode, str] | None,
    ) -> grpc.RpcMethodHandler:
        if handler.response_streaming:
            raise TypeError(f"{method}: response streams are not audited")
        behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary
        if behavior is None:  # a unary or client-streaming method always has its behaviour
            raise TypeError(f"{method}: no behaviour to audit")

        def audited(request: Any, context: grpc.ServicerContext) -> Any:
            call = Call(caller, method, target=_target(request))
            token = _CALL.set(call)
            outcome = "ok"
            try:
                if refusal is not None:
                    context.abort(*refusal)
                return behavior(request, context)
            except BaseException:
                code = context.code() if hasattr(context, "code") else None
                outcome = code.name.lower() if isinstance(code, grpc.StatusCode) else "error"
                if refusal is None and code is None:
                    call.detail = "failed"
                raise
            finally:
                _CALL.reset(token)
                self._record(call, outcome, context.peer())

        make = (
            grpc.stream_unary_rpc_method_handler
            if handler.request_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(
            audited,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _record(self, call: Call, outcome: str, peer: str) -> None:
        entry = AuditRecord(
            at=self.now(),
            user_name=call.caller.name,
            role=call.caller.role,
            method=call.method,
            outcome=outcome,
            target=call.target[:256],
            detail=call.detail,
            peer=peer or "",
        )
        try:
            self.accounts.record(entry)
        except Exception:  # the call has happened; its entry must not turn it into an error
            log.exception("no audit entry for %s by %s", call.method, call.caller.name)


_NO_TOKEN = "a valid token is required (see `autoscaler user add`)"


def _bearer(metadata: Iterable[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def _target(request: Any) -> str:
    """What a call is about, from its request's naming fields (never a body)."""
    for name in ("job_id", "instance_id", "name", "user"):
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


def _user_document(user: Any) -> dict[str, Any]:
    return {
        "user": user.name,
        "id": user.user_id,
        "role": user.role,
        "team": user.team,
        "created_at": user.created_at,
        "rotated_at": user.rotated_at,
        "previous_valid_until": user.previous_until,
        "revoked_at": user.revoked_at,
    }


def _audit_document(entry: AuditRecord) -> dict[str, Any]:
    return {
        "at": entry.at,
        "user": entry.user_name,
        "role": entry.role,
        "method": entry.method,
        "target": entry.target,
        "outcome": entry.outcome,
        "detail": entry.detail,
        "peer": entry.peer,
    }


def parse_submitted(spec_json: str) -> JobSpec:
    """A submitted spec document as a JobSpec, checked for what a client may get wrong."""
    try:
        document = json.loads(spec_json)
        job = spec_from_document(document)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"not a job spec document: {exc}") from None
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", job.job_id):
        raise InputError(
            "must be 1-63 letters, digits, '.', '_' or '-'",
            field="id",
            value=job.job_id,
            has_value=True,
        )
    if not job.tasks:
        raise InputError("needs at least one task", where=f"job {job.job_id!r}", field="tasks")
    if job.priority is not None and (
        type(job.priority) is not int or abs(job.priority) > MAX_PRIORITY
    ):
        raise InputError(
            f"must be a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY}",
            where=f"job {job.job_id!r}",
            field="priority",
            value=job.priority,
            has_value=True,
        )
    if job.max_cost is not None and (
        type(job.max_cost) not in (int, float) or not 0 < job.max_cost <= MAX_JOB_COST
    ):
        raise InputError(
            f"must be a number of US dollars above 0 and at most {MAX_JOB_COST:g}",
            where=f"job {job.job_id!r}",
            field="max_cost",
            value=job.max_cost,
            has_value=True,
        )
    seen: set[str] = set()
    for task in job.tasks:
        key = task.task_id.removeprefix(f"{job.job_id}/")
        if task.job_id != job.job_id or key == task.task_id or not key or "/" in key or key in seen:
            raise InputError(
                f"must be '{job.job_id}/<key>', a key of its own without '/'",
                where=f"job {job.job_id!r}",
                field="task_id",
                value=task.task_id,
                has_value=True,
            )
        seen.add(key)
    return job


def catalog_document(catalog: Catalog) -> dict[str, Any]:
    """A catalog in Eva's `ec2_config.json` format (what `catalog_from_eva` reads), for
    clients checking job files: its on-demand types only — the format has no markets,
    and a spot offering is one of those types on another market, which no job file names."""
    return {
        "region": catalog.region,
        "instance_types": {
            t.name: {"family": t.family, "capacity": list(t.capacity), "cost": t.hourly_cost}
            for t in catalog
            if not t.is_spot
        },
    }


def _context_key_of(ref: str, task_id: str) -> str:
    """The storage key of a task's build context; InputError when the ref names none."""
    try:
        return context_key_of(ref)
    except StorageError:
        raise InputError(
            "is not a build context (contexts/<sha256>.tar.gz): upload it with `autoscaler submit`",
            where=f"task {task_id!r}",
            field="build_context",
            value=ref,
            has_value=True,
        ) from None


def _age_s(storage: Storage, key: str, now: float) -> float | None:
    at = storage.modified_at(key)
    return None if at is None else now - at


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _document(value: Mapping[str, Any]) -> api_pb2.Document:
    return api_pb2.Document(json=json.dumps(value, sort_keys=False))


# -- the client -----------------------------------------------------------------------------------


#: What gRPC's core says when the handshake, not the connection, failed.
_TLS_FAILURES = ("CERTIFICATE_VERIFY_FAILED", "Ssl handshake failed", "Peer name", "SSL_ERROR")


def _tls_reason(details: str) -> str:
    """The part of gRPC's message that says why the certificate was refused."""
    for marker in ("CERTIFICATE_VERIFY_FAILED", "Peer name"):
        at = details.find(marker)
        if at >= 0:
            return details[at:].split(": OK")[0].strip()
    return details.strip()


class DaemonUnavailable(Exception):
    """The daemon could not be reached (not running, wrong address, network)."""


class ApiRefused(InputError):
    """The daemon refused the request; the message says why (one line)."""


@dataclass
class ApiClient:
    """The submission API as the command line uses it (one channel, deadlines on every call)."""

    channel: grpc.Channel
    address: str
    ca_file: str = ""  # the CA the daemon's certificate is verified against, named in errors

    @property
    def stub(self) -> api_pb2_grpc.SubmissionStub:
        return api_pb2_grpc.SubmissionStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: Callable[..., Any], request: Any, timeout: float = CALL_TIMEOUT_S
    ) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> Exception:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        if code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in _TLS_FAILURES):
            # Something answered, but not a daemon this cluster's CA vouches for: the fix is
            # the CA file or the daemon's certificate, not the daemon's address.
            return DaemonUnavailable(
                f"TLS handshake with the daemon at {self.address} failed "
                f"({_tls_reason(details)}): its certificate must be signed by "
                f"{self.ca_file or 'the cluster CA'} and name the daemon; is that file this "
                "cluster's server CA, and was the daemon's certificate reissued by "
                "`autoscaler init` for it?"
            )
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return DaemonUnavailable(
                f"cannot reach the daemon at {self.address}: {details} "
                "(is `autoscaler daemon` running, and is [api] advertise right?)"
            )
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ApiRefused(f"the daemon refused the token: {details}")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return ApiRefused(f"not allowed: {details}")
        return ApiRefused(details or str(code))

    def upload_contexts(self, packed: Mapping[str, bytes | Path]) -> dict[str, str]:
        """Upload the contexts the daemon does not have yet (digest -> the packed archive,
        a file streamed in chunks, or bytes); returns digest -> stored ref for all."""
        wanted = sorted(packed)
        answer = self._call(
            self.stub.MissingContexts, api_pb2.MissingContextsRequest(digests=wanted)
        )
        refs = dict(answer.refs)
        for digest in answer.missing:
            data = packed[digest]
            size = data.stat().st_size if isinstance(data, Path) else len(data)
            timeout = CALL_TIMEOUT_S + size / _CHUNK
            chunks = _file_chunks(digest, data) if isinstance(data, Path) else _chunks(digest, data)
            refs[digest] = self._call(self.stub.UploadContext, chunks, timeout).ref
        return refs

    def submit(self, job: JobSpec) -> str:
        """Queue a job; it belongs to the user whose token the channel carries."""
        request = api_pb2.SubmitJobRequest(spec_json=json.dumps(spec_document(job)))
        return self._call(self.stub.SubmitJob, request).job_id

    def job(self, job_id: str, *, show_secrets: bool = False) -> dict[str, Any]:
        request = api_pb2.GetJobRequest(job_id=job_id, show_secrets=show_secrets)
        return json.loads(self._call(self.stub.GetJob, request).json)

    def jobs(self, statuses: Sequence[str] = (), limit: int = 0) -> dict[str, Any]:
        request = api_pb2.ListJobsRequest(statuses=list(statuses), limit=limit)
        return json.loads(self._call(self.stub.ListJobs, request).json)

    def cancel(self, job_id: str) -> tuple[bool, str]:
        answer = self._call(self.stub.CancelJob, api_pb2.CancelJobRequest(job_id=job_id))
        return answer.cancelled, answer.status

    def drain(self, instance_id: str, job_id: str = "") -> tuple[bool, str, list[str]]:
        """Drain an instance (every task on it moves), or with `job_id` move only that
        job's tasks off it: (draining, its status, the tasks that move)."""
        answer = self._call(
            self.stub.DrainInstance,
            api_pb2.DrainInstanceRequest(instance_id=instance_id, job_id=job_id),
        )
        return answer.draining, answer.status, list(answer.tasks)

    def logs(self, job_id: str, task: str = "", tail: int = 0) -> dict[str, Any]:
        request = api_pb2.GetLogsRequest(job_id=job_id, task=task, tail=tail)
        return json.loads(self._call(self.stub.GetLogs, request).json)

    def status(self) -> dict[str, Any]:
        return json.loads(self._call(self.stub.ClusterStatus, api_pb2.ClusterStatusRequest()).json)

    def cost_report(self, since: float = 0.0, dry_run: Iterable[JobSpec] = ()) -> dict[str, Any]:
        jobs = [spec_document(j) for j in dry_run]
        request = api_pb2.CostReportRequest(
            since=since, dry_run_json=json.dumps(jobs) if jobs else ""
        )
        return json.loads(self._call(self.stub.CostReport, request).json)

    def catalog(self) -> dict[str, Any]:
        return json.loads(self._call(self.stub.GetCatalog, api_pb2.GetCatalogRequest()).json)

    def add_user(self, name: str, role: str, team: str = "") -> dict[str, Any]:
        request = api_pb2.UserRequest(name=name, role=role, team=team)
        return json.loads(self._call(self.stub.AddUser, request).json)

    def users(self) -> dict[str, Any]:
        return json.loads(self._call(self.stub.ListUsers, api_pb2.ListUsersRequest()).json)

    def rotate_user(self, name: str, overlap_s: float = 0.0) -> dict[str, Any]:
        request = api_pb2.UserRequest(name=name, overlap_s=overlap_s)
        return json.loads(self._call(self.stub.RotateUser, request).json)

    def revoke_user(self, name: str) -> dict[str, Any]:
        request = api_pb2.UserRequest(name=name)
        return json.loads(self._call(self.stub.RevokeUser, request).json)

    def audit(self, user: str = "", since: float = 0.0, limit: int = 0) -> dict[str, Any]:
        request = api_pb2.AuditRequest(user=user, since=since, limit=limit)
        return json.loads(self._call(self.stub.Audit, request).json)

    def set_team(self, name: str, **limits: float | int) -> dict[str, Any]:
        """Set some of a team's limits (`state.accounts.TEAM_KEYS`); the rest stay."""
        request = api_pb2.TeamRequest(name=name)
        for key, value in limits.items():
            setattr(request, key, value)  # sets the field's presence too (proto3 optional)
        return json.loads(self._call(self.stub.SetTeam, request).json)

    def teams(self) -> dict[str, Any]:
        return json.loads(self._call(self.stub.ListTeams, api_pb2.ListTeamsRequest()).json)

    def quote(
        self,
        job: JobSpec,
        *,
        duration_s: float = 0.0,
        iterations: float = 0.0,
        throughput: float = 0.0,
    ) -> dict[str, Any]:
        """What `job` would cost at the current packing, nothing submitted (`reports.quote`)."""
        request = api_pb2.QuoteJobRequest(
            spec_json=json.dumps(spec_document(job)),
            duration_s=duration_s,
            iterations=iterations,
            throughput=throughput,
        )
        return json.loads(self._call(self.stub.QuoteJob, request).json)


def _chunks(digest: str, data: bytes) -> Iterator[api_pb2.ContextChunk]:
    yield api_pb2.ContextChunk(digest=digest, size=len(data), data=data[:_CHUNK])
    for start in range(_CHUNK, len(data), _CHUNK):
        yield api_pb2.ContextChunk(data=data[start : start + _CHUNK])


def _file_chunks(digest: str, path: Path) -> Iterator[api_pb2.ContextChunk]:
    """A packed context read from its file a chunk at a time (never whole in memory)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        yield api_pb2.ContextChunk(digest=digest, size=size, data=handle.read(_CHUNK))
        for block in iter(lambda: handle.read(_CHUNK), b""):
            yield api_pb2.ContextChunk(data=block)
