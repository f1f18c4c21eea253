"""The web dashboard over Starlette's test client: login, sessions, roles, CSRF, the
audit log, and the same documents the command line prints (through the gRPC API)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.testclient import TestClient

from app.commands.cluster import connect
from app.dashboard.server import COOKIE, Dashboard
from app.dashboard.sessions import Sessions
from app.users import Authenticator, add_user
from autoscaler.cloud import Guardrails
from autoscaler.store import TaskUpdate
from executor.security import read_token
from tests.app.conftest import Api
from tests.builders import job
from tests.store_writes import request


@dataclass
class Web:
    api: Api
    dashboard: Dashboard
    admin: str  # tokens
    reader: str
    submitter: str

    def client(self) -> TestClient:
        # https: the session cookie is Secure, and a client sends it back over HTTPS only.
        return TestClient(self.dashboard.app, base_url="https://testserver")

    def logged_in(self, token: str) -> TestClient:
        client = self.client()
        answer = client.post("/login", data={"token": token}, follow_redirects=False)
        assert answer.status_code == 303, answer.text
        return client

    def audit(self, method: str) -> list:
        return [e for e in self.api.service.accounts.audit() if e.method == method]


@pytest.fixture
def web(api: Api) -> Iterator[Web]:
    accounts = api.service.accounts
    _, reader = add_user(accounts, "rita", "read", None, api.clock[0])
    _, submitter = add_user(accounts, "sam", "submit", "ml", api.clock[0])
    dashboard = Dashboard(
        api.service,
        Authenticator(accounts, now=lambda: api.clock[0]),
        guardrails=Guardrails(max_instances=4, max_hourly_spend=2.0),
        cluster="test",
        now=lambda: api.clock[0],
        sessions=Sessions(lambda: api.clock[0]),
    )
    yield Web(api, dashboard, read_token(api.config.secrets.api_token), reader, submitter)


def _history(api: Api) -> None:
    """Two jobs of two users sharing one instance for an hour (as a daemon records it)."""
    store, t0 = api.store, api.clock[0] - 3600
    store.submit_job(job("a", (0, 2, 8)), owner="sam", at=t0, team="ml")
    store.submit_job(job("b", (0, 2, 8)), owner="admin", at=t0)
    request(store, "i-1", "c7i.2xlarge", 0.357, t0)
    store.transition_instance("i-1", "running", t0 + 10, cloud_id="c-1")
    running = [
        TaskUpdate(t, status="running", instance_id="i-1", attempt=1) for t in ("a/0", "b/0")
    ]
    store.update_tasks(running, t0 + 100)
    store.update_tasks([TaskUpdate("a/0", throughput=12.5, progress=300.0)], t0 + 200)


def test_a_wrong_token_is_refused_and_audited(web):
    client = web.client()
    answer = client.post("/login", data={"token": web.admin + "x"}, follow_redirects=False)
    assert answer.status_code == 401 and "refused" in answer.text
    assert COOKIE not in answer.cookies
    assert client.get("/now", follow_redirects=False).headers["location"] == "/login"
    assert client.get("/api/status").status_code == 401
    assert [e.outcome for e in web.audit("Login")] == ["unauthenticated"]
    assert [e.outcome for e in web.audit("ClusterStatus")] == ["unauthenticated"]


def test_login_sets_an_opaque_httponly_secure_strict_cookie(web):
    client = web.client()
    answer = client.post("/login", data={"token": web.reader}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/now"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for flag in ("HttpOnly", "Secure", "SameSite=strict", "Path=/"):
        assert flag.lower() in cookie.lower()
    value = answer.cookies[COOKIE]
    user_id = web.reader.partition(".")[0]
    assert web.reader not in value and user_id not in value  # nothing but a random id
    page = client.get("/now")
    assert page.status_code == 200 and 'data-role="read"' in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self'
    assert "'unsafe-inline'" not in page.headers["content-security-policy"]


def test_the_documents_are_the_ones_the_command_line_prints(web):
    _history(web.api)
    client = web.logged_in(web.reader)
    with connect(web.api.config) as grpc_client:
        assert client.get("/api/status").json() == grpc_client.status()
        assert client.get("/api/cost-report").json() == grpc_client.cost_report()
        listed = grpc_client.jobs()["jobs"]
        report = grpc_client.cost_report()
    jobs = client.get("/api/jobs").json()
    for row, cli_row in zip(jobs["jobs"], listed, strict=True):
        assert {k: row[k] for k in cli_row} == cli_row
        assert row["cost"] == report["spend_by_job"][row["job"]]
    assert jobs["spend_by_user"] == report["spend_by_user"]
    assert jobs["spend_by_team"] == report["spend_by_team"]


def test_now_shows_tasks_with_their_throughput_and_guardrail_headroom(web):
    _history(web.api)
    now = web.logged_in(web.reader).get("/api/now").json()
    [instance] = now["instances"]
    assert instance["market"] == "on-demand" and instance["ec2_type"] == "c7i.2xlarge"
    measured = {t["task"]: t["throughput"] for t in instance["task_detail"]}
    assert measured == {"a/0": 12.5, "b/0": None}
    headroom = {g["guardrail"]: g for g in now["headroom"]}
    assert headroom["max_instances"]["used"] == 1 and headroom["max_instances"]["left"] == 3
    assert headroom["max_hourly_spend"]["left"] == pytest.approx(2.0 - 0.357)
    assert now["instances_by_type"] == [{"type": "c7i.2xlarge", "market": "on-demand", "count": 1}]


def test_a_reader_may_not_cancel_and_the_job_stays(web):
    _history(web.api)
    client = web.logged_in(web.reader)
    page = client.get("/jobs")
    csrf = page.text.split('data-csrf="')[1].split('"')[0]
    answer = client.post("/api/jobs/a/cancel", headers={"X-CSRF-Token": csrf})
    assert answer.status_code == 403 and "may not call CancelJob" in answer.json()["error"]
    assert web.api.store.job("a").status == "queued"
    [entry] = web.audit("CancelJob")
    assert (entry.user_name, entry.outcome, entry.target) == ("rita", "permission_denied", "a")


def test_an_action_needs_the_sessions_csrf_token(web):
    _history(web.api)
    client = web.logged_in(web.admin)
    assert client.post("/api/jobs/a/cancel").status_code == 403
    assert client.post("/api/jobs/a/cancel", headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert web.api.store.job("a").status == "queued"
    csrf = client.get("/jobs").text.split('data-csrf="')[1].split('"')[0]
    answer = client.post("/api/jobs/a/cancel", headers={"X-CSRF-Token": csrf})
    assert answer.status_code == 200 and answer.json()["cancelled"] is True
    assert web.api.store.job("a").status == "cancelled"
    assert [e.outcome for e in web.audit("CancelJob")] == [
        "permission_denied",
        "permission_denied",
        "ok",
    ]


def test_a_submitter_cancels_only_their_own_jobs_as_over_grpc(web):
    _history(web.api)
    client = web.logged_in(web.submitter)
    csrf = client.get("/jobs").text.split('data-csrf="')[1].split('"')[0]
    refused = client.post("/api/jobs/b/cancel", headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 403 and "belongs to admin" in refused.json()["error"]
    assert client.post("/api/jobs/a/cancel", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert [web.api.store.job(j).status for j in ("a", "b")] == ["cancelled", "queued"]


def test_scripts_use_a_bearer_token_without_a_session(web):
    _history(web.api)
    client = web.client()
    bearer = {"Authorization": f"Bearer {web.admin}"}
    assert client.get("/api/jobs", headers=bearer).status_code == 200
    assert client.post("/api/jobs/b/cancel", headers=bearer).status_code == 200
    assert client.get("/api/jobs", headers={"Authorization": "Bearer nope.nope"}).status_code == 401
    assert client.get("/api").json()["endpoints"]  # documented


def test_a_revoked_users_session_ends_at_once(web):
    client = web.logged_in(web.reader)
    assert client.get("/api/status").status_code == 200
    accounts = web.api.service.accounts
    accounts.revoke(accounts.user_named("rita").user_id, web.api.clock[0])
    assert client.get("/api/status").status_code == 401
    assert client.get("/now", follow_redirects=False).status_code == 303


def test_sessions_end_after_their_idle_time_and_lifetime():
    clock = [1000.0]
    sessions = Sessions(lambda: clock[0], lifetime_s=100.0, idle_s=30.0)
    sid, session = sessions.open("u1")
    clock[0] += 29.0
    assert sessions.get(sid) is session  # used: idle time starts again
    clock[0] += 29.0
    assert sessions.get(sid) is session
    clock[0] += 31.0
    assert sessions.get(sid) is None  # idle too long
    sid, _ = sessions.open("u1")
    for _ in range(4):
        clock[0] += 25.0
        assert sessions.get(sid) is not None
    clock[0] += 25.0
    assert sessions.get(sid) is None  # 125 s after login: past its lifetime
    assert sessions.get("made-up") is None


def test_the_decision_log_is_filtered_and_newest_first(web):
    from autoscaler.store import ActionRecord, RoundRecord

    store = web.api.store
    t = web.api.clock[0]
    store.record_round(
        RoundRecord(
            t - 60,
            "eva",
            "full",
            True,
            "jobs arrived",
            actions=(ActionRecord("launch", "i-1", "pack a, b", "done"),),
        )
    )
    store.record_round(
        RoundRecord(
            t,
            "eva",
            "partial",
            False,
            "migration not worth it",
            actions=(
                ActionRecord("launch", "i-2", "over max_hourly_spend", "refused"),
                ActionRecord("start", "a/0", "on i-1", "done"),
            ),
        )
    )
    client = web.logged_in(web.reader)
    everything = client.get("/api/decisions").json()["rounds"]
    assert [r["chosen"] for r in everything] == ["partial", "full"]
    refused = client.get("/api/decisions", params={"outcome": "refused"}).json()["rounds"]
    assert [[a["target"] for a in r["actions"]] for r in refused] == [["i-2"]]
    launches = client.get("/api/decisions", params={"kind": "launch"}).json()["rounds"]
    assert [[a["target"] for a in r["actions"]] for r in launches] == [["i-2"], ["i-1"]]
    text = client.get("/api/decisions", params={"q": "worth"}).json()["rounds"]
    assert [r["reason"] for r in text] == ["migration not worth it"]
    assert web.audit("Decisions")[0].detail == "dashboard"


def test_spend_series_follow_the_ledger(web):
    _history(web.api)
    spend = web.logged_in(web.reader).get("/api/spend").json()
    series, report = spend["series"], spend["report"]
    first_billed = min(i.start for i in web.api.store.uptime())  # not the epoch
    assert series["t"][0] == pytest.approx(first_billed, abs=1e-3)
    assert series["t"][-1] == pytest.approx(report["until"], abs=1e-3)
    assert max(series["hourly"]) == pytest.approx(0.357)
    assert series["spent"][-1] == pytest.approx(report["spend"], abs=1e-5)


def test_every_page_renders_for_a_logged_in_user(web):
    _history(web.api)
    client = web.logged_in(web.reader)
    for path in ("/now", "/jobs", "/jobs/a", "/spend", "/decisions"):
        page = client.get(path)
        assert page.status_code == 200 and "/static/dashboard.js" in page.text, path
    assert client.get("/static/uPlot.iife.min.js").status_code == 200
    assert "MIT" in client.get("/static/uPlot.LICENSE").text
    job = client.get("/api/jobs/a").json()
    assert [e["event"] for e in job["timeline"]][:2] == ["submitted", "placed"]
    assert client.get("/api/jobs/nope").status_code == 404


def _statements_per_request(directory, jobs: int) -> dict[str, int]:
    """SQL statements each polled endpoint runs on a cluster with `jobs` jobs (filled as a
    daemon writes them: most completed, some running on a dozen instances, rounds)."""
    from sqlalchemy import event

    from benchmarks.dashboard import build_dashboard, demo_cluster

    now = time.time()
    config, store = demo_cluster(directory, jobs, now)
    try:
        client = TestClient(build_dashboard(config, store, lambda: now).app, base_url="https://t")
        bearer = {"Authorization": f"Bearer {read_token(config.secrets.api_token)}"}
        counted = [0]

        def count(*_args) -> None:
            counted[0] += 1

        event.listen(store.engine, "before_cursor_execute", count)
        result = {}
        for path in ("/api/now", "/api/jobs", "/api/spend", "/api/decisions", "/api/status"):
            counted[0] = 0
            answer = client.get(path, headers=bearer)
            assert answer.status_code == 200, (path, answer.text)
            result[path] = counted[0]
        event.remove(store.engine, "before_cursor_execute", count)
        return result
    finally:
        store.close()


def test_each_endpoint_reads_the_state_in_as_many_statements_whatever_the_jobs(tmp_path):
    """A page's server time grows with the rows it reads, never by a query per job: each
    endpoint runs as many statements with 200 jobs as with 20 (`python -m benchmarks
    dashboard` times them with 1,000 beside the command line's own builders)."""
    few = _statements_per_request(tmp_path / "few", 20)
    many = _statements_per_request(tmp_path / "many", 200)
    assert many == few


def test_the_what_if_line_is_replayed_in_the_background_and_reused():
    import threading

    from app.dashboard.server import WHAT_IF_WINDOW_S, WhatIfCache

    calls: list[tuple[float, float]] = []
    finished = threading.Semaphore(0)

    def replay(since: float, until: float) -> dict:
        calls.append((since, until))
        finished.release()
        return {"would_have_cost": {"no-packing": 1.5 * len(calls)}, "message": ""}

    clock = [1_000_000.0]
    cache = WhatIfCache(replay, lambda: clock[0], ttl_s=600.0)

    def ready() -> dict:
        assert finished.acquire(timeout=30)
        while (answer := cache.get())["state"] != "ready" or answer["would_have_cost"] != {
            "no-packing": 1.5 * len(calls)
        }:
            threading.Event().wait(0.01)  # the thread stores what it computed
        return answer

    assert cache.get()["state"] == "computing"  # a page poll never waits for a replay
    assert ready()["would_have_cost"] == {"no-packing": 1.5}
    assert calls == [(1_000_000.0 - WHAT_IF_WINDOW_S, 1_000_000.0)]  # the last week
    clock[0] += 599.0
    assert cache.get()["state"] == "ready" and len(calls) == 1  # reused
    clock[0] += 1.0
    assert cache.get()["would_have_cost"] == {"no-packing": 1.5}  # the old one meanwhile
    assert ready()["would_have_cost"] == {"no-packing": 3.0} and len(calls) == 2
    assert WhatIfCache(None, lambda: 0.0).get()["state"] == "off"


def test_a_jobs_timeline_lists_its_moves_in_order():
    from app.dashboard.views import job_timeline

    detail = {
        "job": "j",
        "status": "completed",
        "reason": "",
        "submitted_at": 10.0,
        "started_at": 20.0,
        "finished_at": 90.0,
        "task_list": [
            {
                "task": "j/0",
                "checkpoint": None,
                "failure": None,
                "placements": [
                    {"instance": "i-1", "attempt": 1, "start": 20.0, "end": 50.0},
                    {"instance": "i-2", "attempt": 2, "start": 55.0, "end": 90.0},
                ],
            }
        ],
    }
    events = [(e["at"], e["event"]) for e in job_timeline(detail)]
    assert events == [
        (10.0, "submitted"),
        (20.0, "started"),
        (20.0, "placed"),
        (50.0, "left"),
        (55.0, "moved"),
        (90.0, "left"),
        (90.0, "completed"),
    ]


def test_drain_is_the_apis_drain_with_its_ownership_rule(web):
    _history(web.api)  # i-1 runs sam's a/0 and admin's b/0
    sam = web.logged_in(web.submitter)
    csrf = sam.get("/now").text.split('data-csrf="')[1].split('"')[0]
    refused = sam.post("/api/instances/i-1/drain", headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 403 and "only an admin may drain it" in refused.json()["error"]
    assert web.api.store.instance("i-1").status == "running"
    admin = web.logged_in(web.admin)
    csrf = admin.get("/now").text.split('data-csrf="')[1].split('"')[0]
    drained = admin.post("/api/instances/i-1/drain", headers={"X-CSRF-Token": csrf}).json()
    assert drained["draining"] is True and sorted(drained["tasks"]) == ["a/0", "b/0"]
    assert web.api.store.instance("i-1").status == "draining"
    outcomes = [(e.user_name, e.outcome) for e in web.audit("DrainInstance")]
    assert outcomes == [("sam", "permission_denied"), ("admin", "ok")]
