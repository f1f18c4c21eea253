"""The dashboard's web server: pages, JSON endpoints, login, and how each call is checked.

Starlette (an ASGI toolkit: routing, requests, responses, nothing more) under
uvicorn, in a thread of the daemon, over HTTPS with the daemon's own server
certificate. Every JSON endpoint is one of the submission API's methods (or a
read-only one of the dashboard's, `DASHBOARD_READ`), allowed by the same role
table (`app.api.ROLE_METHODS`), run by the same `SubmissionService` method
(ownership checks included), and written to the same audit log with its
outcome. A browser authenticates with its session cookie (`sessions`) and
echoes its CSRF token on every action; a script sends its token as
`Authorization: Bearer …` (no cookie, so no CSRF token either).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import grpc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from app.api import _CALL, ROLE_METHODS, Call, SubmissionService
from app.dashboard.pages import ENDPOINTS, PAGES, login_page, page
from app.dashboard.sessions import Session, Sessions, csrf_matches
from app.dashboard.views import (
    decisions_document,
    job_timeline,
    jobs_document,
    now_document,
    spend_series,
)
from app.reports import job_list, spend_of_jobs
from app.users import Authenticator, Caller
from app.v1 import api_pb2
from autoscaler.cloud import Guardrails
from state.accounts import AuditRecord, SqlAccounts

log = logging.getLogger("autoscaler.dashboard")

#: The session cookie: `__Host-` makes the browser insist on Secure, Path=/ and no Domain.
COOKIE = "__Host-autoscaler-session"

#: Read-only methods only the dashboard has; every role may call them.
DASHBOARD_READ = frozenset({"Decisions"})

#: How long the what-if replay of the last week is reused before it is run again.
WHAT_IF_TTL_S = 600.0

#: The window of the Spend page's what-if line: "this week".
WHAT_IF_WINDOW_S = 7 * 86400.0

STATIC = Path(__file__).parent / "static"

_HTTP_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
}

_SECURITY_HEADERS = {
    # No inline script or style, no third-party origin: the page works offline and an
    # injected string cannot run.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Refused(Exception):
    """A call refused or failed the way the gRPC method would have: its code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _WebContext:
    """What a `SubmissionService` method needs of its gRPC context, for a web call: an
    `abort` that raises (as gRPC's does), and the peer for the audit log."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self._code: grpc.StatusCode | None = None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise Refused(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def peer(self) -> str:
        return self._peer


@dataclass
class WhatIfCache:
    """The last week replayed under the other schedulers (`app.what_if`), computed in a
    background thread at most every `ttl_s`: a replay takes seconds, a page poll must not."""

    compute: Callable[[float, float], dict[str, Any]] | None
    now: Callable[[], float]
    ttl_s: float = WHAT_IF_TTL_S
    _document: dict[str, Any] | None = None
    _at: float = float("-inf")
    _running: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> dict[str, Any]:
        if self.compute is None:
            return {"state": "off", "message": "the what-if replay is not available here"}
        at = self.now()
        with self._lock:
            stale = at - self._at >= self.ttl_s
            if stale and not self._running:
                self._running = True
                threading.Thread(target=self._refresh, args=(at,), daemon=True).start()
            if self._document is None:
                return {"state": "computing", "message": "replaying the last week…"}
            return {"state": "ready", **self._document}

    def _refresh(self, at: float) -> None:
        assert self.compute is not None
        try:
            document = self.compute(at - WHAT_IF_WINDOW_S, at)
        except Exception as exc:
            log.exception("what-if replay failed")
            document = {"would_have_cost": {}, "message": f"the replay failed: {exc}"}
        with self._lock:
            self._document, self._at, self._running = document, at, False


class Dashboard:
    """The dashboard of one cluster: an ASGI app (`app`) on the daemon's service."""

    def __init__(
        self,
        service: SubmissionService,
        authenticator: Authenticator,
        *,
        guardrails: Guardrails,
        cluster: str,
        what_if: Callable[[float, float], dict[str, Any]] | None = None,
        now: Callable[[], float] = time.time,
        sessions: Sessions | None = None,
        poll_ms: int = 3000,
    ) -> None:
        self.service = service
        self.store = service.store
        self.authenticator = authenticator
        self.accounts: SqlAccounts = service.accounts
        self.guardrails = guardrails
        self.cluster = cluster
        self.now = now
        self.sessions = sessions or Sessions(now)
        self.what_if = WhatIfCache(what_if, now)
        self.poll_ms = poll_ms
        routes = [
            Route("/", self.home),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            *(Route(path, self.page(name)) for name, path in PAGES.items()),
            Route("/jobs/{job_id}", self.page("job")),
            Route("/api", self.api_index),
            Route("/api/status", self.api("ClusterStatus", self._status)),
            Route("/api/now", self.api("ClusterStatus", self._now)),
            Route("/api/jobs", self.api("ListJobs", self._jobs)),
            Route("/api/jobs/{job_id}/logs", self.api("GetLogs", self._logs)),
            Route(
                "/api/jobs/{job_id}/cancel",
                self.api("CancelJob", self._cancel, action=True),
                methods=["POST"],
            ),
            Route("/api/jobs/{job_id}", self.api("GetJob", self._job)),
            Route(
                "/api/instances/{instance_id}/drain",
                self.api("DrainInstance", self._drain, action=True),
                methods=["POST"],
            ),
            Route("/api/cost-report", self.api("CostReport", self._cost_report)),
            Route("/api/spend", self.api("CostReport", self._spend)),
            Route("/api/what-if", self.api("CostReport", self._what_if)),
            Route("/api/decisions", self.api("Decisions", self._decisions)),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
        self.app = Starlette(routes=routes)
        self.app.add_middleware(_Headers)

    # -- who is calling ---------------------------------------------------------------------

    def _session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def _caller_of(self, request: Request) -> tuple[Caller | None, Session | None]:
        """The caller of a request: its bearer token's user, else its session's (read
        again from the state: a revoked user's session ends at once)."""
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            return self.authenticator.authenticate(header[len("Bearer ") :].strip()), None
        session = self._session(request)
        if session is None:
            return None, None
        user = self.accounts.user(session.user_id)
        if user is None or user.revoked_at is not None:
            self.sessions.close(request.cookies.get(COOKIE))
            return None, None
        return Caller(user.user_id, user.name, user.role, user.team), session

    def _audit(self, caller: Caller, method: str, outcome: str, target: str, peer: str) -> None:
        entry = AuditRecord(
            at=self.now(),
            user_name=caller.name,
            role=caller.role,
            method=method,
            outcome=outcome,
            target=target[:256],
            detail="dashboard",
            peer=peer,
        )
        try:
            self.accounts.record(entry)
        except Exception:  # the call has happened; its entry must not turn it into an error
            log.exception("no audit entry for %s by %s", method, caller.name)

    # -- the JSON endpoints ---------------------------------------------------------------

    def api(
        self,
        method: str,
        handler: Callable[[Request, dict[str, Any], _WebContext], Any],
        *,
        action: bool = False,
    ) -> Callable[[Request], Any]:
        """An endpoint that runs as the API's `method`: authenticated, allowed by role,
        CSRF-checked when it changes something, audited with its outcome."""

        async def endpoint(request: Request) -> Response:
            body = await request.body() if request.method == "POST" else b""
            return await run_in_threadpool(self._serve_api, request, method, handler, action, body)

        return endpoint

    def _serve_api(
        self,
        request: Request,
        method: str,
        handler: Callable[[Request, dict[str, Any], _WebContext], Any],
        action: bool,
        body: bytes,
    ) -> Response:
        peer = _peer(request)
        params = {**request.path_params, **_form(body)}
        target = str(params.get("job_id") or params.get("instance_id") or "")
        caller, session = self._caller_of(request)
        if caller is None:
            self._audit(Caller("", "-", "-"), method, "unauthenticated", target, peer)
            return _error(401, "a valid token is required: log in, or send Authorization: Bearer")
        allowed = method in ROLE_METHODS.get(caller.role, ()) or method in DASHBOARD_READ
        if not allowed:
            self._audit(caller, method, "permission_denied", target, peer)
            return _error(403, f"{caller.name} ({caller.role}) may not call {method}")
        if action and session is not None:
            given = request.headers.get("x-csrf-token") or params.get("csrf")
            if not csrf_matches(session, given):
                self._audit(caller, method, "permission_denied", target, peer)
                return _error(403, "missing or wrong CSRF token: reload the page")
        context = _WebContext(peer)
        call = Call(caller, method, target=target)
        token = _CALL.set(call)
        outcome = "ok"
        try:
            return JSONResponse(handler(request, params, context))
        except Refused as exc:
            outcome = exc.code.name.lower()
            return _error(_HTTP_OF.get(exc.code, 500), exc.message)
        except Exception:
            outcome = "error"
            log.exception("dashboard call %s failed", method)
            return _error(500, f"{method} failed; see the daemon's log")
        finally:
            _CALL.reset(token)
            self._audit(caller, method, outcome, call.target or target, peer)

    def _document(self, answer: api_pb2.Document) -> dict[str, Any]:
        return json.loads(answer.json)

    def _status(self, request: Request, params: dict, context: _WebContext) -> Any:
        return self._document(self.service.ClusterStatus(api_pb2.ClusterStatusRequest(), context))

    def _now(self, request: Request, params: dict, context: _WebContext) -> Any:
        status = self._status(request, params, context)
        return now_document(status, self.store, self.service.catalog(), self.guardrails, self.now())

    def _jobs(self, request: Request, params: dict, context: _WebContext) -> Any:
        statuses = request.query_params.getlist("status")
        limit = _int(request.query_params.get("limit"), 0)
        # `ListJobs`'s document and `cost-report`'s split of the spend, from one read of the
        # jobs (a page of 1,000 jobs reads them once, not three times).
        records = self.store.jobs()
        listed = job_list(self.store, statuses, limit, records=records)
        by_id = {r.job_id: r for r in records}
        per_job, idle = spend_of_jobs(self.store, self.service.catalog(), by_id, 0.0, self.now())
        return jobs_document(listed, per_job, idle, by_id)

    def _job(self, request: Request, params: dict, context: _WebContext) -> Any:
        detail = self._document(
            self.service.GetJob(api_pb2.GetJobRequest(job_id=params["job_id"]), context)
        )
        return {**detail, "timeline": job_timeline(detail)}

    def _logs(self, request: Request, params: dict, context: _WebContext) -> Any:
        tail = _int(request.query_params.get("tail"), 50)
        request_ = api_pb2.GetLogsRequest(job_id=params["job_id"], tail=tail)
        return self._document(self.service.GetLogs(request_, context))

    def _cancel(self, request: Request, params: dict, context: _WebContext) -> Any:
        answer = self.service.CancelJob(api_pb2.CancelJobRequest(job_id=params["job_id"]), context)
        return {"job": params["job_id"], "cancelled": answer.cancelled, "status": answer.status}

    def _drain(self, request: Request, params: dict, context: _WebContext) -> Any:
        request_ = api_pb2.DrainInstanceRequest(
            instance_id=params["instance_id"], job_id=params.get("job", "")
        )
        answer = self.service.DrainInstance(request_, context)
        return {
            "instance": params["instance_id"],
            "draining": answer.draining,
            "status": answer.status,
            "tasks": list(answer.tasks),
        }

    def _cost_report(self, request: Request, params: dict, context: _WebContext) -> Any:
        since = _float(request.query_params.get("since"), 0.0)
        answer = self.service.CostReport(api_pb2.CostReportRequest(since=since), context)
        return self._document(answer)

    def _spend(self, request: Request, params: dict, context: _WebContext) -> Any:
        report = self._cost_report(request, params, context)
        series = spend_series(self.store, self.store.rounds(), report["since"], report["until"])
        return {"report": report, "series": series}

    def _what_if(self, request: Request, params: dict, context: _WebContext) -> Any:
        return self.what_if.get()

    def _decisions(self, request: Request, params: dict, context: _WebContext) -> Any:
        q = request.query_params
        rounds = self.store.rounds(limit=max(1, min(_int(q.get("limit"), 200), 5000)))
        return decisions_document(
            rounds,
            kind=q.get("kind", ""),
            outcome=q.get("outcome", ""),
            text=q.get("q", ""),
            chosen=q.get("chosen", ""),
        )

    async def api_index(self, request: Request) -> Response:
        return JSONResponse(
            {
                "endpoints": [
                    {"method": m, "path": p, "api_method": a, "returns": r}
                    for m, p, a, r in ENDPOINTS
                ],
                "auth": "a session cookie from /login (actions then need the X-CSRF-Token "
                "header), or Authorization: Bearer <a user's token>",
            }
        )

    # -- pages and login ------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/now", status_code=303)

    def page(self, name: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            caller, session = await run_in_threadpool(self._caller_of, request)
            if caller is None or session is None:
                return RedirectResponse("/login", status_code=303)
            return HTMLResponse(
                page(
                    name,
                    cluster=self.cluster,
                    user=caller.name,
                    role=caller.role,
                    csrf=session.csrf,
                    poll_ms=self.poll_ms,
                    subject=str(request.path_params.get("job_id", "")),
                )
            )

        return endpoint

    async def login_form(self, request: Request) -> Response:
        return HTMLResponse(login_page(self.cluster))

    async def login(self, request: Request) -> Response:
        token = _form(await request.body()).get("token", "").strip()
        return await run_in_threadpool(self._login, request, token)

    def _login(self, request: Request, token: str) -> Response:
        peer = _peer(request)
        caller = self.authenticator.authenticate(token) if token else None
        if caller is None:
            self._audit(Caller("", "-", "-"), "Login", "unauthenticated", "", peer)
            return HTMLResponse(
                login_page(self.cluster, error="That token was refused."), status_code=401
            )
        session_id, _ = self.sessions.open(caller.user_id)
        self._audit(caller, "Login", "ok", caller.name, peer)
        response = RedirectResponse("/now", status_code=303)
        response.set_cookie(
            COOKIE,
            session_id,
            max_age=int(self.sessions.lifetime_s),
            path="/",
            secure=True,
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        session = self._session(request)
        given = request.headers.get("x-csrf-token") or _form(await request.body()).get("csrf")
        if session is not None and csrf_matches(session, given):
            self.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response


class _Headers:
    """Adds `_SECURITY_HEADERS` to every response (pure ASGI middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _peer(request: Request) -> str:
    """The caller's address as gRPC writes it in the audit log (`ipv4:HOST:PORT`)."""
    client = request.client
    if client is None:
        return ""
    family = "ipv6" if ":" in client.host else "ipv4"
    return f"{family}:{client.host}:{client.port}"


def _form(body: bytes) -> dict[str, str]:
    """An `application/x-www-form-urlencoded` body (the login form, an action's fields)."""
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in parsed.items()}


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def _float(value: str | None, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:
        return default


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class DashboardServer:
    """uvicorn serving a `Dashboard` over HTTPS in a thread of the daemon."""

    def __init__(self, dashboard: Dashboard, listen: str, cert_file: Path, key_file: Path) -> None:
        import uvicorn

        from app.config import parse_address

        host, port = parse_address(listen)
        self.listen = listen
        self.server = uvicorn.Server(
            uvicorn.Config(
                dashboard.app,
                host=host,
                port=port,
                ssl_certfile=str(cert_file),
                ssl_keyfile=str(key_file),
                log_config=None,
                access_log=False,
                lifespan="off",
                # Polls every few seconds: keep-alive keeps one TLS session per browser.
                timeout_keep_alive=30,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        """Serve; returns once listening, or raises when the address cannot be bound."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the dashboard cannot listen on {self.listen} ([dashboard] listen)")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10.0)
