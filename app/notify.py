"""Webhook notifications: jobs that end, budgets near their limit, offerings held, a new leader.

Each `[[notify]]` table of the configuration is a webhook (`Webhook`). Events come
from the notification outbox in the state (`state.outbox`): a job's end is written
there by the transaction that ends it; the daemon adds the crossings it sees after
each round (`Notices`: spend reaching 80% or 100% of `max_hourly_spend` or of
`max_daily_spend`, an offering held after boots that never registered a worker)
and its taking of the leader lock. A background thread (`Notifier`) fans events
out to the webhooks that subscribe to them and posts each one — never in a round,
so a slow or dead receiver delays no decision — retrying with exponential back-off
up to a bound, each attempt recorded (delivered, pending until its next try, or
failed). Restart-safe and at least once: what was committed is sent after a
restart, and the `Idempotency-Key` header lets receivers drop a repeat.

What a receiver gets (documented in README.md, "Notifications"):

- a POST of `application/json`: `{"text": "<one line>", "event": KIND, "id": KEY,
  "cluster": NAME, "at": ISO-8601, "data": {...}}` — `text` is what Slack and
  Teams incoming webhooks show; the rest is for programs. Never a secret, a job's
  env values, or the webhook's URL.
- headers `X-Autoscaler-Event: KIND`, `Idempotency-Key: KEY` (the same for every
  attempt and webhook), `X-Autoscaler-Timestamp: SECONDS` (Unix time of the
  attempt) and, with a `secret_file`, `X-Autoscaler-Signature: sha256=HEX`, the
  HMAC-SHA256 under the secret of `SECONDS + "." + BODY` (the raw bytes): a
  receiver recomputes it, compares in constant time, and refuses old timestamps
  (replays), as Stripe's and GitHub's webhook signatures are checked.

HTTPS only, verified against the system's CAs and an optional `ca_file`; redirects
are not followed (a redirected POST would lose its body, or leak it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.config import ClusterConfig, NotifyTable
from app.reports import hourly_cost_now
from autoscaler.cloud import Guardrails
from autoscaler.store import RoundRecord, Store
from state.outbox import Delivery, OutboxEvent, SqlOutbox

log = logging.getLogger("autoscaler.notify")

SIGNATURE_HEADER = "X-Autoscaler-Signature"
TIMESTAMP_HEADER = "X-Autoscaler-Timestamp"
EVENT_HEADER = "X-Autoscaler-Event"
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: An event older than this when the notifier first sees it is not sent (a webhook
#: added today does not get last month's jobs).
MAX_EVENT_AGE_S = 86400.0

#: Shares of a budget whose crossing is an event (`budget.80`, `budget.100`).
BUDGET_LEVELS = (80, 100)

#: HTTP statuses worth another try; any other 4xx is the request's fault and fails at once.
RETRIED_CLIENT_ERRORS = frozenset({408, 425, 429})


class Clock(Protocol):
    def now(self) -> float: ...


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """`sha256=HEX`: HMAC-SHA256 under `secret` of `timestamp + "." + body`."""
    mac = hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off, bounded: `first_s`, doubling, at most `max_s`, for at most
    `max_attempts` attempts in all."""

    first_s: float = 10.0
    max_s: float = 3600.0
    max_attempts: int = 8

    def delay(self, attempts: int) -> float | None:
        """Seconds to wait after the `attempts`-th failed attempt (None: give up)."""
        if attempts >= self.max_attempts:
            return None
        return min(self.first_s * 2.0 ** (attempts - 1), self.max_s)


@dataclass(frozen=True)
class Webhook:
    """A `[[notify]]` table, ready to post: its secret read, its TLS context built."""

    name: str
    url: str = field(repr=False)  # a webhook URL is a secret: never logged
    events: frozenset[str]
    secret: bytes | None = field(default=None, repr=False)
    context: ssl.SSLContext | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    backoff: Backoff = Backoff()


def webhook(table: NotifyTable, base_dir: Path) -> Webhook:
    """The webhook of one `[[notify]]` table; paths are relative to `base_dir`. OSError
    (a `SecretError`) when the secret is unreadable or readable by others, ssl.SSLError
    when the CA file is not PEM."""
    from executor.security import read_secret

    secret = None
    if table.secret_file:
        secret = read_secret(_path(table.secret_file, base_dir)).strip()
        if not secret:
            raise OSError(f"{table.secret_file}: the secret file is empty")
    context = ssl.create_default_context()
    if table.ca_file:
        context.load_verify_locations(cafile=str(_path(table.ca_file, base_dir)))
    return Webhook(
        table.sink,
        table.url,
        frozenset(table.events),
        secret,
        context,
        table.timeout_s,
        Backoff(table.backoff_s, table.max_backoff_s, table.max_attempts),
    )


def webhooks(config: ClusterConfig) -> list[Webhook]:
    """Every webhook of the configuration."""
    return [webhook(t, config.path.parent) for t in config.notify]


def _path(value: str, base_dir: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir / path


# -- what is sent ------------------------------------------------------------------------------


def summary(event: OutboxEvent, cluster: str) -> str:
    """The event in one line, for people (Slack and Teams show it)."""
    data = event.payload
    where = f"[{cluster}]"
    if event.kind.startswith("job."):
        what = f"{where} job {data.get('name')} ({data.get('job_id')}) of {data.get('owner')}"
        if event.kind == "job.completed":
            return f"{what} completed"
        if event.kind == "job.cancelled":
            return f"{what} was cancelled"
        return f"{what} failed: {data.get('reason') or 'no reason given'}"
    if event.kind.startswith("budget."):
        unit = "/h" if data.get("budget") == "max_hourly_spend" else ""
        return (
            f"{where} spend reached {data.get('level')}% of {data.get('budget')}: "
            f"${data.get('spend', 0.0):.2f}{unit} of ${data.get('limit', 0.0):.2f}{unit}"
        )
    if event.kind == "offering.held":
        return f"{where} {data.get('offering')} {data.get('reason')}"
    if event.kind == "leader.changed":
        was = data.get("previous") or "no one"
        return f"{where} {data.get('leader')} now leads the cluster (before: {was})"
    return f"{where} {data.get('message') or event.kind}"


def message(event: OutboxEvent, cluster: str) -> bytes:
    """The JSON body of an event: Slack's and Teams' `text`, and the structured fields."""
    document = {
        "text": summary(event, cluster),
        "event": event.kind,
        "id": event.key,
        "cluster": cluster,
        "at": datetime.fromtimestamp(event.at, UTC).isoformat(timespec="seconds"),
        "data": dict(event.payload),
    }
    return json.dumps(document, separators=(",", ":"), default=str).encode()


def signed(
    hook: Webhook, event: OutboxEvent, cluster: str, now: float
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt to post `event` to `hook` at `now`."""
    body = message(event, cluster)
    timestamp = str(int(now))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "autoscaler-notify/1",
        EVENT_HEADER: event.kind,
        IDEMPOTENCY_HEADER: event.key,
        TIMESTAMP_HEADER: timestamp,
    }
    if hook.secret is not None:
        headers[SIGNATURE_HEADER] = sign(hook.secret, timestamp, body)
    return body, headers


class DeliveryError(Exception):
    """A post that did not succeed; `permanent` when another try cannot help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx surfaces as an HTTPError


def post(hook: Webhook, body: bytes, headers: Mapping[str, str]) -> None:
    """POST `body` to the webhook over verified HTTPS; DeliveryError unless it answers 2xx.
    The error says what happened without the URL (it may hold the webhook's token)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=hook.context), _NoRedirect()
    )
    request = urllib.request.Request(hook.url, data=body, headers=dict(headers), method="POST")
    try:
        with opener.open(request, timeout=hook.timeout_s) as response:
            response.read(65536)
    except urllib.error.HTTPError as exc:
        code = exc.code
        permanent = 400 <= code < 500 and code not in RETRIED_CLIENT_ERRORS
        raise DeliveryError(f"HTTP {code} {exc.reason}", permanent=permanent) from None
    except urllib.error.URLError as exc:
        raise DeliveryError(_scrub(f"{type(exc.reason).__name__}: {exc.reason}", hook)) from None
    except (TimeoutError, OSError) as exc:
        raise DeliveryError(_scrub(f"{type(exc).__name__}: {exc}", hook)) from None


def _scrub(text: str, hook: Webhook) -> str:
    return text.replace(hook.url, f"<{hook.name}>")


# -- the background worker ---------------------------------------------------------------------


Post = Callable[[Webhook, bytes, Mapping[str, str]], None]


class Notifier:
    """Sends the outbox's events to the webhooks, from its own thread (`start`).

    `run_once` is one pass: fan new events out to the webhooks subscribing to them,
    then post every delivery that is due, recording each attempt. Its clock is
    injected (tests move it to check the back-off)."""

    def __init__(
        self,
        outbox: SqlOutbox,
        hooks: Sequence[Webhook],
        cluster: str,
        clock: Clock,
        *,
        send: Post = post,
        on_attempt: Callable[[str], None] | None = None,
        max_age_s: float = MAX_EVENT_AGE_S,
    ) -> None:
        self.outbox = outbox
        self.hooks = {h.name: h for h in hooks}
        self.cluster = cluster
        self.clock = clock
        self.send = send
        self.on_attempt = on_attempt or (lambda outcome: None)
        self.max_age_s = max_age_s

    def run_once(self, stop: threading.Event | None = None) -> int:
        """Dispatch new events and post what is due, until `stop` is set; returns the
        attempts made."""
        now = self.clock.now()
        self.outbox.dispatch(
            {name: hook.events for name, hook in self.hooks.items()}, now, self.max_age_s
        )
        made = 0
        for delivery in self.outbox.due(now):
            if stop is not None and stop.is_set():
                break
            self._attempt(delivery)
            made += 1
        return made

    def _attempt(self, delivery: Delivery) -> None:
        event = delivery.event
        hook = self.hooks.get(delivery.sink)
        now = self.clock.now()
        if hook is None:
            self._record(delivery, now, "failed", None, "no [[notify]] of this name any more")
            return
        body, headers = signed(hook, event, self.cluster, now)
        try:
            self.send(hook, body, headers)
        except DeliveryError as exc:
            done = self.clock.now()
            attempts = delivery.attempts + 1
            delay = None if exc.permanent else hook.backoff.delay(attempts)
            if delay is None:
                self._record(delivery, done, "failed", None, str(exc))
            else:
                self._record(delivery, done, "pending", done + delay, str(exc))
            return
        self._record(delivery, self.clock.now(), "delivered", None, "")

    def _record(
        self, delivery: Delivery, at: float, status: str, next_at: float | None, error: str
    ) -> None:
        self.outbox.attempted(delivery.delivery_id, at, status, next_at=next_at, error=error)
        outcome = "retry" if status == "pending" else status
        self.on_attempt(outcome)
        fields = {
            "event": "notify",
            "outcome": outcome,
            "webhook": delivery.sink,  # its name: the URL is a secret
            "kind": delivery.event.kind,
            "key": delivery.event.key,
            "attempt": delivery.attempts + 1,
        }
        if error:
            fields["error"] = error
        if next_at is not None:
            fields["retry_at"] = next_at
        level = logging.WARNING if status == "failed" else logging.INFO
        log.log(level, json.dumps(fields, default=str))

    def start(self, stop: threading.Event, poll_s: float = 1.0) -> threading.Thread:
        """Run passes every `poll_s` in a daemon thread until `stop` is set."""

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.run_once(stop)
                except Exception:
                    log.exception("notification pass failed; the next one retries")
                stop.wait(poll_s)

        thread = threading.Thread(target=loop, name="notify", daemon=True)
        thread.start()
        return thread


# -- events the daemon sees --------------------------------------------------------------------


def budget_level(spend: float, limit: float) -> int:
    """The highest of `BUDGET_LEVELS` that `spend` reached of `limit` (0: none)."""
    reached = [level for level in BUDGET_LEVELS if spend >= limit * level / 100.0 - 1e-9]
    return max(reached, default=0)


def crossings(
    marks: Mapping[str, Any],
    *,
    spends: Mapping[str, tuple[float, float]],
    held: Mapping[str, str],
    at: float,
    tag: str,
) -> tuple[list[OutboxEvent], dict[str, Any]]:
    """The events of levels crossed since `marks` (what was seen last), and the new marks.

    `spends`: budget name -> (spend, limit); a level reached that was not reached
    before is an event (each level crossed, so `budget.80` subscribers hear of a jump
    to 100%), and falling back re-arms it. `held`: offering -> why; one newly held
    is an event. `tag` makes the keys of this observation unique (the round's id).
    """
    events: list[OutboxEvent] = []
    new: dict[str, Any] = {}
    for budget, (spend, limit) in sorted(spends.items()):
        name = f"budget:{budget}"
        level = budget_level(spend, limit)
        before = int(marks.get(name) or 0)
        for crossed in (lv for lv in BUDGET_LEVELS if before < lv <= level):
            events.append(
                OutboxEvent(
                    f"budget.{crossed}:{budget}:{tag}",
                    f"budget.{crossed}",
                    at,
                    {"budget": budget, "level": crossed, "spend": spend, "limit": limit},
                )
            )
        if level != before:
            new[name] = level
    before_held = set(marks.get("held") or ())
    for offering in sorted(set(held) - before_held):
        events.append(
            OutboxEvent(
                f"offering.held:{offering}:{tag}",
                "offering.held",
                at,
                {"offering": offering, "reason": held[offering]},
            )
        )
    if set(held) != before_held:
        new["held"] = sorted(held)
    return events, new


class Notices:
    """The events the daemon itself raises: budget and held-offering crossings after
    each round, and its taking of the leader lock; each written with the mark it
    moves, in one transaction, so a crossing is one event across restarts."""

    def __init__(self, outbox: SqlOutbox, guardrails: Guardrails) -> None:
        self.outbox = outbox
        self.guardrails = guardrails

    def after_round(self, record: RoundRecord, store: Store, now: float) -> list[str]:
        """Events of this round's crossings; returns the keys written."""
        rails = self.guardrails
        spends: dict[str, tuple[float, float]] = {}
        if rails.max_hourly_spend:
            spends["max_hourly_spend"] = (hourly_cost_now(store), rails.max_hourly_spend)
        if rails.max_daily_spend:
            spends["max_daily_spend"] = (
                store.cost_between(now - 86400.0, now),
                rails.max_daily_spend,
            )
        held = dict(record.numbers.get("held", {}))
        tag = f"round-{record.round_id}" if record.round_id is not None else f"at-{now:.3f}"
        events, marks = crossings(self.outbox.marks(), spends=spends, held=held, at=now, tag=tag)
        if not events and not marks:
            return []
        return self.outbox.emit(events, now, marks)

    def leader(self, holder: str, now: float) -> list[str]:
        """This daemon took the leader lock: an event naming it and the one before."""
        previous = self.outbox.marks().get("leader")
        event = OutboxEvent(
            f"leader.changed:{holder}:{now:.3f}",
            "leader.changed",
            now,
            {"leader": holder, "previous": previous},
        )
        return self.outbox.emit([event], now, {"leader": holder})


def sample_event(now: float) -> OutboxEvent:
    """What `autoscaler notify test` posts (its key unique: receivers keep it)."""
    import uuid

    return OutboxEvent(
        f"test:{uuid.uuid4()}",
        "test",
        now,
        {"message": "a test notification from `autoscaler notify test`"},
    )
