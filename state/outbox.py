"""`SqlOutbox`: the notification outbox in the state database (the transactional outbox).

An event is written in the same transaction as the change it reports — a job's end
by `SqlStore` (`job_event`, `insert_events`), a level crossing with the mark it
moves (`SqlOutbox.emit`) — so a daemon killed before sending sends after its
restart, and an event that was not committed is never sent. Each event has a key
naming the fact it reports: written twice, it is one event (and receivers get
the key to drop a second delivery: delivery is at least once).

The notifier (`app.notify`) fans each event out to one delivery per subscribed
webhook (`dispatch`), sends what is due (`due`) and records each attempt
(`attempted`). Rows only: what a webhook is, how a body is signed and how long to
back off are the application's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Engine, Row, Table, and_, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from autoscaler.store import JobRecord
from state.database import read_transaction, write_transaction
from state.schema import NotifyDelivery, NotifyEvent, NotifyMark

EVENTS = cast(Table, NotifyEvent.__table__)
DELIVERIES = cast(Table, NotifyDelivery.__table__)
MARKS = cast(Table, NotifyMark.__table__)

#: Every kind of event, as `[[notify]] events` names them.
JOB_KINDS = ("job.completed", "job.failed", "job.cancelled")
EVENT_KINDS = (
    *JOB_KINDS,
    "budget.80",  # spend reached 80% of max_hourly_spend or of max_daily_spend
    "budget.100",  # ... or all of it
    "offering.held",  # an offering held back after boots that never registered a worker
    "leader.changed",  # a daemon took the cluster's leader lock
    "test",  # `autoscaler notify test`
)


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A fact to notify about: its key (unique), kind, time and what receivers see."""

    key: str
    kind: str
    at: float
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event to one webhook (`sink`, its name) and how far its sending got."""

    delivery_id: int
    sink: str
    status: str  # pending, delivered, failed
    attempts: int
    next_at: float | None
    last_error: str
    event: OutboxEvent


def job_event(job: JobRecord) -> OutboxEvent:
    """The event of a job that ended (completed, failed or cancelled): who, what, when
    and why — never its env values or anything else of its spec but its name."""
    return OutboxEvent(
        f"job.{job.status}:{job.job_id}",
        f"job.{job.status}",
        job.finished_at or 0.0,
        {
            "job_id": job.job_id,
            "name": job.spec.name,
            "owner": job.owner,
            "team": job.team,
            "status": job.status,
            "reason": job.reason,
            "tasks": len(job.spec.tasks),
            "submitted_at": job.submitted_at,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
        },
    )


def insert_events(conn: Connection, events: Iterable[OutboxEvent]) -> list[str]:
    """Add `events` within the caller's transaction, skipping keys already there;
    returns the keys added."""
    added = []
    for event in events:
        row = {"key": event.key, "kind": event.kind, "at": event.at, "payload": event.payload}
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        statement = (
            dialect.insert(EVENTS).values(**row).on_conflict_do_nothing().returning(EVENTS.c.id)
        )
        # RETURNING, not rowcount: psycopg counts a row the conflict skipped.
        if conn.execute(statement).first() is not None:
            added.append(event.key)
    return added


class SqlOutbox:
    """The outbox of the state database of `engine` (at the head schema)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- writing events -----------------------------------------------------------------------

    def emit(
        self, events: Sequence[OutboxEvent], at: float, marks: Mapping[str, Any] | None = None
    ) -> list[str]:
        """Add `events` (keys already there are skipped) and set `marks`, in one
        transaction; returns the keys added."""
        with write_transaction(self.engine) as conn:
            added = insert_events(conn, events)
            for name, value in (marks or {}).items():
                conn.execute(delete(MARKS).where(MARKS.c.name == name))
                conn.execute(insert(MARKS).values(name=name, value=value, at=at))
            return added

    def marks(self) -> dict[str, Any]:
        with read_transaction(self.engine) as conn:
            return {row.name: row.value for row in conn.execute(select(MARKS))}

    # -- delivering them ----------------------------------------------------------------------

    def dispatch(self, sinks: Mapping[str, frozenset[str]], at: float, max_age_s: float) -> int:
        """Make one pending delivery per event not yet dispatched and each sink (name ->
        the kinds it subscribes to) subscribing to its kind, in one transaction; an
        event older than `max_age_s` is dispatched to none (news, not history: a
        webhook added today does not get last month's jobs). Returns deliveries made."""
        with read_transaction(self.engine) as conn:  # most passes find nothing: no write
            waiting = conn.execute(
                select(EVENTS.c.id).where(EVENTS.c.dispatched.is_(False)).limit(1)
            ).first()
        if waiting is None:
            return 0
        made = 0
        with write_transaction(self.engine) as conn:
            rows = conn.execute(
                select(EVENTS.c.id, EVENTS.c.kind, EVENTS.c.at)
                .where(EVENTS.c.dispatched.is_(False))
                .order_by(EVENTS.c.id)
            ).all()
            for row in rows:
                if row.at >= at - max_age_s:
                    wanted = [name for name, kinds in sorted(sinks.items()) if row.kind in kinds]
                    for sink in wanted:
                        conn.execute(
                            insert(DELIVERIES).values(
                                event_id=row.id,
                                sink=sink,
                                status="pending",
                                attempts=0,
                                next_at=at,
                                last_error="",
                                updated_at=at,
                            )
                        )
                    made += len(wanted)
            if rows:
                conn.execute(
                    update(EVENTS)
                    .where(EVENTS.c.id.in_([r.id for r in rows]))
                    .values(dispatched=True)
                )
        return made

    def due(self, at: float, limit: int = 100) -> list[Delivery]:
        """Pending deliveries whose next attempt is due at `at`, oldest first."""
        return self._deliveries(
            and_(DELIVERIES.c.status == "pending", DELIVERIES.c.next_at <= at), limit
        )

    def next_due(self) -> float | None:
        """When the earliest pending delivery is due (None: nothing pending)."""
        with read_transaction(self.engine) as conn:
            return cast(
                "float | None",
                conn.execute(
                    select(DELIVERIES.c.next_at)
                    .where(DELIVERIES.c.status == "pending")
                    .order_by(DELIVERIES.c.next_at)
                    .limit(1)
                ).scalar(),
            )

    def attempted(
        self, delivery_id: int, at: float, status: str, *, next_at: float | None, error: str = ""
    ) -> None:
        """Record one attempt: `delivered`, `failed` for good, or `pending` until `next_at`."""
        with write_transaction(self.engine) as conn:
            conn.execute(
                update(DELIVERIES)
                .where(DELIVERIES.c.id == delivery_id)
                .values(
                    status=status,
                    attempts=DELIVERIES.c.attempts + 1,
                    next_at=next_at,
                    last_error=error,
                    updated_at=at,
                )
            )

    def prune(self, before: float) -> int:
        """Forget what ended before `before`: deliveries delivered or failed, and events
        with no delivery left (sent, or news too old to send). Returns events removed."""
        with write_transaction(self.engine) as conn:
            conn.execute(
                delete(DELIVERIES).where(
                    DELIVERIES.c.status != "pending", DELIVERIES.c.updated_at < before
                )
            )
            left = select(DELIVERIES.c.id).where(DELIVERIES.c.event_id == EVENTS.c.id)
            gone = conn.execute(delete(EVENTS).where(EVENTS.c.at < before, ~left.exists())).rowcount
            return int(gone or 0)

    def deliveries(self, sink: str | None = None) -> list[Delivery]:
        """Every delivery (of one sink), oldest first."""
        return self._deliveries(None if sink is None else DELIVERIES.c.sink == sink, None)

    def events(self) -> list[OutboxEvent]:
        """Every event in the outbox, oldest first."""
        with read_transaction(self.engine) as conn:
            return [_event(r) for r in conn.execute(select(EVENTS).order_by(EVENTS.c.id))]

    def _deliveries(self, where: Any, limit: int | None) -> list[Delivery]:
        query = (
            select(DELIVERIES, EVENTS.c.key, EVENTS.c.kind, EVENTS.c.at, EVENTS.c.payload)
            .join(EVENTS, EVENTS.c.id == DELIVERIES.c.event_id)
            .order_by(DELIVERIES.c.id)
        )
        if where is not None:
            query = query.where(where)
        if limit is not None:
            query = query.limit(limit)
        with read_transaction(self.engine) as conn:
            return [_delivery(r) for r in conn.execute(query)]


def _event(row: Row[Any]) -> OutboxEvent:
    return OutboxEvent(row.key, row.kind, row.at, row.payload)


def _delivery(row: Row[Any]) -> Delivery:
    return Delivery(
        row.id,
        row.sink,
        row.status,
        row.attempts,
        row.next_at,
        row.last_error,
        OutboxEvent(row.key, row.kind, row.at, row.payload),
    )
