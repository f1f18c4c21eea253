"""Webhook notifications against a local HTTPS receiver: the body a receiver gets and its
HMAC, retries with back-off on an injected clock, certificates checked, a slow receiver
beside a round that does not wait for it, and the events the daemon's own rounds and
steps raise (a job completing, failing, cancelled; a budget crossed)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest

from app.config import NotifyTable
from app.notify import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Backoff,
    Notifier,
    crossings,
    webhook,
)
from autoscaler.errors import InputError
from executor.security import Authority, SecretError, write_secret
from state.outbox import SqlOutbox
from tests.app.simulated_daemon import SimulatedDaemon
from tests.simulator.test_hand_computed import job
from tests.state.test_outbox import secret_job

SECRET = b"the-hmac-key-of-the-receiver"
TOKEN = "T000-secret-token"  # a Slack webhook URL's last part: a secret


class Receiver:
    """A webhook receiver on 127.0.0.1 over HTTPS (its own CA): records every POST and
    answers the next of `statuses` (204 once they run out); `gate`, when set up, holds
    each answer until the test opens it."""

    def __init__(self, root: Path) -> None:
        ca = Authority.create("receiver")
        cert, key = ca.issue(["127.0.0.1"])
        root.mkdir(parents=True, exist_ok=True)
        (root / "cert.pem").write_bytes(cert)
        write_secret(root / "key.pem", key)
        self.ca_file = root / "ca.pem"
        self.ca_file.write_bytes(ca.cert_pem)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.gate: threading.Event | None = None
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                receiver.arrived.set()
                if receiver.gate is not None:
                    receiver.gate.wait(30)
                status = receiver.statuses.pop(0) if receiver.statuses else 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(root / "cert.pem", root / "key.pem")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/services/{TOKEN}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    r = Receiver(tmp_path / "receiver")
    yield r
    r.close()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "hook.secret"
    write_secret(path, SECRET + b"\n")
    return path


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def table(receiver: Receiver, **fields) -> NotifyTable:
    return NotifyTable(url=receiver.url, ca_file=str(receiver.ca_file), **fields)


def verified(headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does: recompute the HMAC of timestamp + "." + body, compare."""
    mac = hmac.new(SECRET, headers[TIMESTAMP_HEADER].encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(headers[SIGNATURE_HEADER], f"sha256={mac.hexdigest()}")


@pytest.fixture
def store(tmp_path: Path, sqlite_template: Path):
    import shutil

    from state.store import SqlStore

    shutil.copyfile(sqlite_template, tmp_path / "state.db")
    with SqlStore(f"sqlite:///{tmp_path / 'state.db'}") as s:
        yield s


@pytest.fixture
def notify_log(caplog, monkeypatch):
    """The notifier's log lines (the logger re-enabled: a library's logging.config call
    in an earlier test, import-linter's, disables loggers that existed then)."""
    monkeypatch.setattr(logging.getLogger("autoscaler.notify"), "disabled", False)
    caplog.set_level(logging.INFO, logger="autoscaler.notify")
    return caplog


# -- delivery ----------------------------------------------------------------------------------


def test_a_job_ended_before_any_notifier_ran_reaches_the_receiver_signed(
    store, receiver, secret_file, tmp_path, notify_log
):
    # The job ends while no notifier runs (a daemon killed before sending): the event
    # is in the state, and the next notifier sends it.
    store.submit_job(secret_job("a"), owner="alice", at=1.0)
    store.job_finished("a", 50.0, "failed", "exit code 3")
    hook = webhook(table(receiver, name="chat", secret_file=str(secret_file)), tmp_path)
    clock = Clock(60.0)
    assert Notifier(SqlOutbox(store.engine), [hook], "prod", clock).run_once() == 1

    [(headers, body)] = receiver.requests
    assert verified(headers, body)
    assert not verified({**headers, TIMESTAMP_HEADER: "61"}, body)  # the time is signed too
    assert headers[TIMESTAMP_HEADER] == "60"
    assert headers[IDEMPOTENCY_HEADER] == "job.failed:a"
    assert headers["Content-Type"] == "application/json"
    document = json.loads(body)
    # Slack's and Teams' incoming webhooks show `text`; programs read the rest.
    assert document["text"] == "[prod] job wa (a) of alice failed: exit code 3"
    assert document["event"] == "job.failed" and document["cluster"] == "prod"
    assert document["data"]["job_id"] == "a" and document["data"]["reason"] == "exit code 3"
    [delivery] = SqlOutbox(store.engine).deliveries()
    assert (delivery.sink, delivery.status, delivery.attempts) == ("chat", "delivered", 1)
    # Neither the job's env values, the HMAC key, nor the webhook's URL are said anywhere.
    for secret in ("hunter2", SECRET.decode(), TOKEN):
        assert secret not in body.decode() and secret not in notify_log.text
    assert '"webhook": "chat"' in notify_log.text


def test_a_failing_receiver_is_retried_with_backoff_then_failed(
    store, receiver, tmp_path, notify_log
):
    store.submit_job(job("a", 0, 10), owner="alice", at=0.0)
    store.job_finished("a", 100.0)
    receiver.statuses = [503] * 10
    hook = webhook(
        table(receiver, name="ops", backoff_s=10.0, max_backoff_s=25.0, max_attempts=4), tmp_path
    )
    assert hook.backoff == Backoff(10.0, 25.0, 4)
    clock = Clock(100.0)
    outbox = SqlOutbox(store.engine)
    notifier = Notifier(outbox, [hook], "prod", clock)
    tries = []
    # Due at 100; after each failure the next is 10, then 20, then 25 (the cap) s later.
    for t in (100.0, 109.9, 110.0, 129.9, 130.0, 154.9, 155.0, 1e6):
        clock.t = t
        if notifier.run_once():
            tries.append(t)
    assert tries == [100.0, 110.0, 130.0, 155.0]
    assert len(receiver.requests) == 4
    assert {h[IDEMPOTENCY_HEADER] for h, _ in receiver.requests} == {"job.completed:a"}
    [delivery] = outbox.deliveries()
    assert (delivery.status, delivery.attempts, delivery.next_at) == ("failed", 4, None)
    assert delivery.last_error == "HTTP 503 Service Unavailable"
    assert '"outcome": "failed"' in notify_log.text and TOKEN not in notify_log.text


def test_a_refusal_no_retry_can_mend_fails_at_once(store, receiver, tmp_path):
    store.submit_job(job("a", 0, 10), owner="alice", at=0.0)
    store.cancel_job("a", 5.0)
    receiver.statuses = [404]
    outbox = SqlOutbox(store.engine)
    Notifier(outbox, [webhook(table(receiver), tmp_path)], "prod", Clock(6.0)).run_once()
    [delivery] = outbox.deliveries()
    assert (delivery.status, delivery.attempts) == ("failed", 1)


def test_a_receiver_whose_certificate_is_not_trusted_gets_nothing(store, receiver, tmp_path):
    store.submit_job(job("a", 0, 10), owner="alice", at=0.0)
    store.job_finished("a", 5.0)
    untrusted = webhook(NotifyTable(url=receiver.url, name="x"), tmp_path)  # no ca_file
    outbox = SqlOutbox(store.engine)
    Notifier(outbox, [untrusted], "prod", Clock(6.0)).run_once()
    assert receiver.requests == []
    [delivery] = outbox.deliveries()
    assert delivery.status == "pending" and "CERTIFICATE_VERIFY_FAILED" in delivery.last_error


def test_only_subscribed_events_are_sent(store, receiver, tmp_path):
    for name in ("a", "b"):
        store.submit_job(job(name, 0, 10), owner="alice", at=0.0)
    store.job_finished("a", 5.0)
    store.cancel_job("b", 5.0)
    hook = webhook(table(receiver, events=("job.cancelled",)), tmp_path)
    Notifier(SqlOutbox(store.engine), [hook], "prod", Clock(6.0)).run_once()
    assert [h[IDEMPOTENCY_HEADER] for h, _ in receiver.requests] == ["job.cancelled:b"]


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"url": "http://example.com/hook"}, "url"),
        ({"url": "https://example.com/hook", "events": ["job.exploded"]}, "events"),
        ({"url": "https://example.com/hook", "max_attempts": 0}, "max_attempts"),
    ],
)
def test_a_bad_notify_table_is_refused_naming_its_field(entry, problem):
    with pytest.raises(msgspec.ValidationError, match=problem):
        msgspec.convert(entry, NotifyTable)


def test_two_webhooks_of_one_name_are_refused(cluster_dir):
    from app.config import load_cluster_config

    path = cluster_dir / "autoscaler.toml"
    hook = '[[notify]]\nname = "chat"\nurl = "https://example.com/{}"\n'
    path.write_text(path.read_text() + hook.format("a") + hook.format("b"))
    with pytest.raises(InputError, match="names a webhook twice"):
        load_cluster_config(path)


def test_a_secret_others_can_read_is_refused(tmp_path, receiver):
    path = tmp_path / "loose.secret"
    path.write_bytes(SECRET)
    path.chmod(0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        webhook(table(receiver, secret_file=str(path)), tmp_path)


def test_the_default_name_shows_the_host_never_the_url(receiver):
    name = table(receiver).sink
    assert name.startswith("127.0.0.1-") and TOKEN not in name


# -- crossings ---------------------------------------------------------------------------------


def test_a_budget_crossing_is_one_event_per_level_until_spend_falls_back():
    limit = 10.0
    # 0 -> 9.5 $/h crosses 80%; a jump to the limit crosses 100% only once.
    events, marks = crossings(
        {}, spends={"max_hourly_spend": (8.5, limit)}, held={}, at=1, tag="r1"
    )
    assert [e.kind for e in events] == ["budget.80"] and marks == {"budget:max_hourly_spend": 80}
    events, marks2 = crossings(
        marks, spends={"max_hourly_spend": (9.0, limit)}, held={}, at=2, tag="r2"
    )
    assert events == [] and marks2 == {}
    events, marks3 = crossings(
        marks, spends={"max_hourly_spend": (10.0, limit)}, held={}, at=3, tag="r3"
    )
    assert [e.kind for e in events] == ["budget.100"]
    # Back under 80% re-arms both levels; a jump from 0 to the limit says both.
    _, low = crossings(marks3, spends={"max_hourly_spend": (1.0, limit)}, held={}, at=4, tag="r4")
    assert low == {"budget:max_hourly_spend": 0}
    events, _ = crossings(low, spends={"max_hourly_spend": (12.0, limit)}, held={}, at=5, tag="r5")
    assert [e.kind for e in events] == ["budget.80", "budget.100"]
    assert events[1].payload == {
        "budget": "max_hourly_spend",
        "level": 100,
        "spend": 12.0,
        "limit": limit,
    }


def test_an_offering_newly_held_is_an_event():
    held = {"gpu4": "held: 3 launches in a row never registered a worker"}
    events, marks = crossings({}, spends={}, held=held, at=1, tag="r1")
    assert [(e.kind, e.payload["offering"]) for e in events] == [("offering.held", "gpu4")]
    assert crossings(marks, spends={}, held=held, at=2, tag="r2") == ([], {})


# -- from the daemon ---------------------------------------------------------------------------


def notify_toml(receiver: Receiver, secret_file: Path) -> str:
    return (
        f'[[notify]]\nname = "chat"\nurl = "{receiver.url}"\n'
        f'secret_file = "{secret_file}"\nca_file = "{receiver.ca_file}"\n'
    )


def test_the_daemons_rounds_notify_a_budget_crossed_and_a_job_completed(
    tmp_path, receiver, secret_file
):
    cluster = SimulatedDaemon(
        tmp_path / "cluster",
        [job("a", 0, 300)],
        extra=notify_toml(receiver, secret_file),
        # One small instance ($3/h) is 86% of the budget: over 80%, under 100%.
        edits={"max_hourly_spend = 20.0": "max_hourly_spend = 3.5"},
    )
    try:
        daemon = cluster.daemon
        daemon.round()
        cluster.until(2000.0)
        assert cluster.store.job("a").status == "completed"
        daemon.round()  # still over 80% or not: no second budget.80 either way
        assert daemon.notifier.run_once() == 2
    finally:
        cluster.close()
    kinds = [json.loads(body)["event"] for _, body in receiver.requests]
    assert sorted(kinds) == ["budget.80", "job.completed"]
    assert all(verified(headers, body) for headers, body in receiver.requests)
    budget = next(json.loads(b) for _, b in receiver.requests if b"budget.80" in b)
    assert budget["data"]["spend"] == 3.0 and budget["data"]["limit"] == 3.5
    assert "spend reached 80% of max_hourly_spend: $3.00/h of $3.50/h" in budget["text"]
    assert (
        daemon.metrics.registry.get_sample_value(
            "autoscaler_notifications_total", {"outcome": "delivered"}
        )
        == 2.0
    )


def test_the_daemon_notifies_a_job_failed_by_its_task_and_one_cancelled(
    tmp_path, receiver, secret_file
):
    cluster = SimulatedDaemon(
        tmp_path / "cluster",
        [job("b", 0, 3000), job("c", 0, 3000)],
        extra=notify_toml(receiver, secret_file),
    )
    try:
        cluster.daemon.round()
        cluster.until(400.0)
        cluster.world.crash("b/0", "exit status 1", "deterministic")
        cluster.store.cancel_job("c", cluster.engine.now())  # as the API's Cancel does
        cluster.until(500.0)
        assert cluster.store.job("b").status == "failed"
        cluster.daemon.notifier.run_once()
    finally:
        cluster.close()
    by_kind = {json.loads(b)["event"]: json.loads(b) for _, b in receiver.requests}
    assert set(by_kind) == {"job.failed", "job.cancelled"}
    assert "exit status 1" in by_kind["job.failed"]["data"]["reason"]
    assert by_kind["job.cancelled"]["data"]["job_id"] == "c"


def test_a_slow_receiver_does_not_delay_a_round(tmp_path, receiver, secret_file):
    cluster = SimulatedDaemon(
        tmp_path / "cluster", [job("a", 0, 300)], extra=notify_toml(receiver, secret_file)
    )
    receiver.gate = threading.Event()  # the receiver answers only when the test says
    stop = threading.Event()
    daemon = cluster.daemon
    thread = daemon.notifier.start(stop, poll_s=0.05)
    try:
        cluster.store.cancel_job("a", 1.0)
        assert receiver.arrived.wait(30)  # the notifier is inside its POST, held there
        record = daemon.round()  # ... and a round runs to its end meanwhile
        assert record is not None and cluster.store.rounds()[-1].at == record.at
        [delivery] = SqlOutbox(cluster.store.engine).deliveries()
        assert delivery.status == "pending" and not receiver.gate.is_set()
        receiver.gate.set()
    finally:
        stop.set()
        thread.join(30)
        cluster.close()
    assert not thread.is_alive()
    [delivery] = SqlOutbox(cluster.store.engine).deliveries()
    assert delivery.status == "delivered"


def test_the_daily_budget_is_the_ledgers_last_24_hours(tmp_path, receiver, secret_file):
    cluster = SimulatedDaemon(
        tmp_path / "cluster",
        [job("a", 0, 20000)],
        extra=notify_toml(receiver, secret_file),
        edits={"max_hourly_spend = 20.0": "max_hourly_spend = 20.0\nmax_daily_spend = 4.0"},
    )
    try:
        cluster.daemon.round()  # launches one small instance, $3/h: 15% of the hourly budget
        cluster.until(3000.0)
        cluster.daemon.round()  # billed since ~0 s: under $2.50, under 80% of $4
        cluster.until(4000.0)
        cluster.daemon.round()  # over $3.20: 80% of the day's budget
        spent = cluster.store.cost_between(4000.0 - 86400.0, 4000.0)
        cluster.daemon.notifier.run_once()
    finally:
        cluster.close()
    [(_, body)] = receiver.requests
    document = json.loads(body)
    assert document["event"] == "budget.80" and document["data"]["budget"] == "max_daily_spend"
    assert 3.2 <= document["data"]["spend"] == spent < 4.0


def test_each_new_leader_is_an_event_naming_the_one_before(store):
    from app.notify import Notices
    from autoscaler.cloud import Guardrails

    notices = Notices(SqlOutbox(store.engine), Guardrails())
    notices.leader("host-a (pid 1)", 1.0)
    notices.leader("host-b (pid 2)", 2.0)
    events = SqlOutbox(store.engine).events()
    assert [(e.kind, e.payload["leader"], e.payload["previous"]) for e in events] == [
        ("leader.changed", "host-a (pid 1)", None),
        ("leader.changed", "host-b (pid 2)", "host-a (pid 1)"),
    ]


# -- the command line --------------------------------------------------------------------------


def test_notify_test_posts_a_signed_test_event_and_says_how_each_answered(
    cluster_dir, receiver, secret_file, capsys
):
    from app.cli import main

    path = cluster_dir / "autoscaler.toml"
    path.write_text(path.read_text() + notify_toml(receiver, secret_file))
    assert main(["notify", "test", "--config", str(path)]) == 0
    assert capsys.readouterr().out == "chat: delivered\n"
    [(headers, body)] = receiver.requests
    assert verified(headers, body) and json.loads(body)["event"] == "test"
    receiver.statuses = [500]
    assert main(["notify", "test", "--config", str(path), "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["results"] == [
        {"webhook": "chat", "delivered": False, "error": "HTTP 500 Internal Server Error"}
    ]
    assert TOKEN not in out and SECRET.decode() not in out


def test_notify_deliveries_lists_what_the_state_recorded(
    cluster_dir, receiver, secret_file, capsys
):
    from app.cli import main
    from app.config import load_cluster_config
    from app.wiring import open_state

    path = cluster_dir / "autoscaler.toml"
    path.write_text(path.read_text() + notify_toml(receiver, secret_file))
    config = load_cluster_config(path)
    receiver.statuses = [503]
    with open_state(config, create=True) as state:
        state.submit_job(job("a", 0, 10), owner="alice", at=0.0)
        state.job_finished("a", 5.0)
        hooks = [webhook(t, cluster_dir) for t in config.notify]
        Notifier(SqlOutbox(state.engine), hooks, "test", Clock(6.0)).run_once()
    assert main(["notify", "deliveries", "--config", str(path), "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["deliveries"]
    assert shown == {
        "webhook": "chat",
        "event": "job.completed",
        "key": "job.completed:a",
        "status": "pending",
        "attempts": 1,
        "next_at": 16.0,
        "error": "HTTP 503 Service Unavailable",
    }
    assert main(["notify", "deliveries", "--config", str(path)]) == 0
    assert "job.completed:a" in capsys.readouterr().out


def test_the_daemon_check_refuses_a_webhook_secret_others_can_read(cluster_dir, receiver):
    from app.config import check_daemon_config, load_cluster_config

    loose = cluster_dir / "loose.secret"
    loose.write_bytes(SECRET)
    loose.chmod(0o644)
    path = cluster_dir / "autoscaler.toml"
    path.write_text(path.read_text() + notify_toml(receiver, loose))
    with pytest.raises(InputError, match=r"\[\[notify\]\] chat.*chmod 600"):
        check_daemon_config(load_cluster_config(path))
