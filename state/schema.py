"""The state schema: SQLAlchemy 2.0 declarative models of what the control loop persists.

One table per fact, in the problem's words:

- `jobs`: a submitted job — its spec (a JSON document, so it round-trips exactly),
  owner, status and submitted/started/finished times.
- `tasks`: a task's status (since when, and why), the instance it runs on, the
  instance the latest plan assigned it to, its progress and checkpoint location,
  its attempts and failures. Its demands live in the job's spec document, once.
- `instances`: an instance we asked for — launch token (our id), cloud id, type,
  zone, private address, the hourly price at its request, its status and why, when its worker
  registered or was lost; `instance_transitions` the history of its statuses with
  their times and reasons.
- `placements`: which task occupied which instance when (opened and closed by task
  updates): cost reports split an instance's bill among its tasks from it.
- `throughput`: the co-location throughput table (workload, co-located multiset,
  observed throughput, number of observations, last update).
- `rounds` and `round_actions`: each scheduling round's decision, the numbers behind
  it, and each action with its reason and outcome.
- `uptime_intervals`: the cost ledger — billed stretches of instance uptime at the
  price of the time, so reports stay right when catalog prices change.
- `spot_prices`: the spot prices the cluster last refreshed from its provider, per
  region, type and zone, dated: a restarted daemon plans and quotes with them.
- `phase_delays`: how long each phase of a task's attempt (fetch, build, start,
  init, checkpoint, upload) took on each instance type, as a bounded running mean:
  the migration criterion's delays where measured (Eva §4.5).
- `users`: who may call the API — name, team, role, and the scrypt hash of the
  current token (and of the previous one while a rotation's overlap lasts); never
  a token itself.
- `audit`: every API call — who, which method, on what, when, and its outcome
  (never a token, a job's env values or any other request body).
- `notify_events`, `notify_deliveries`, `notify_marks`: the notification outbox —
  each event written in the transaction of the change it reports (a job's end) or
  with the mark it moves (a budget level, the offerings held, the leader), then one
  delivery per subscribed webhook with its attempts, next try and outcome.

Times are seconds as floats (epoch in production, virtual in replay), stored as
double precision so they round-trip exactly. Statuses are strings checked against
the status sets of `autoscaler.store`.

Changing a model means writing a migration in `state/migrations/versions/`
(the test `test_migrated_schema_matches_the_models` fails until they agree).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

#: Constraint names are fixed by convention so that migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JOB_STATUSES = ("queued", "running", "completed", "cancelled", "failed")
TASK_STATUSES = (
    "pending",
    "starting",
    "running",
    "checkpointing",
    "completed",
    "cancelled",
    "failed",
)
INSTANCE_STATUSES = (
    "requested",
    "pending",
    "running",
    "draining",
    "terminating",
    "terminated",
    "failed",
)
ACTION_KINDS = ("launch", "terminate", "start", "migrate", "stop", "adopt", "report")
ACTION_OUTCOMES = ("planned", "done", "refused", "failed", "skipped")
USER_ROLES = ("admin", "submit", "read")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


def one_of(column: str, values: tuple[str, ...]) -> str:
    """A CHECK expression: `column` holds one of `values`."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and sets that planners put into round numbers."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


#: One encoder for every document: `json.dumps` with options builds a new one per call,
#: and a round stores one document per action (thousands in a first round).
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_plain, allow_nan=True)


def dump_json(value: Any) -> str:
    """JSON text whose floats read back bit for bit, infinities and NaN included."""
    return _ENCODER.encode(value)


class JsonText(TypeDecorator[Any]):
    """A JSON document stored as text.

    Not PostgreSQL's json/jsonb: those reject Infinity and NaN, which a round's
    numbers may legitimately hold (an unbounded estimate), and the document must
    read back exactly as written on both databases.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else dump_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        # Most documents a snapshot reads are a task's empty GPU list: a fresh list
        # without the parser (a round over 10,000 tasks reads thousands of them).
        if value == "[]":
            return []
        return None if value is None else json.loads(value)


def colocated_key(colocated: tuple[str, ...] | list[str]) -> str:
    """The co-located multiset as a key: a JSON array of the sorted workload keys
    (unambiguous whatever characters a workload name holds)."""
    return json.dumps(sorted(colocated), separators=(",", ":"))


def colocated_from_key(key: str) -> tuple[str, ...]:
    return tuple(json.loads(key))


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """A submitted job. `id` keeps submission order (the order planners see jobs in)."""

    __tablename__ = "jobs"
    __table_args__ = (CheckConstraint(one_of("status", JOB_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String, unique=True)
    name: Mapped[str] = mapped_column(String)
    owner: Mapped[str] = mapped_column(String)
    #: The owner's team at submission ("": none): whose fair share the job spends.
    team: Mapped[str] = mapped_column(String, server_default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    submitted_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    #: The JobSpec as submitted (tasks included), never changed afterwards.
    spec: Mapped[Any] = mapped_column(JsonText)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    #: Iterations per second alone, learned when the spec gave none.
    solo_throughput: Mapped[float | None] = mapped_column(Double)
    #: Set by the database on every write (0013's triggers): a snapshot reads only the
    #: rows written since the previous one.
    version: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class Task(Base):
    """A task's state. `instance_id` and `target_instance_id` are launch tokens; they
    are deliberately not foreign keys: a plan may target an instance before the round
    records its request, and a task keeps naming the instance it ran on."""

    __tablename__ = "tasks"
    __table_args__ = (
        CheckConstraint(one_of("status", TASK_STATUSES), name="status"),
        Index(None, "job_id", "position", unique=True),
    )

    task_id: Mapped[str] = mapped_column(String, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"))
    position: Mapped[int] = mapped_column(Integer)  # order within the job's spec
    workload: Mapped[str] = mapped_column(String, index=True)
    status: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[str | None] = mapped_column(String, index=True)
    target_instance_id: Mapped[str | None] = mapped_column(String)
    progress: Mapped[float] = mapped_column(Double)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[float | None] = mapped_column(Double)
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")
    failures: Mapped[int] = mapped_column(Integer, server_default="0")
    status_since: Mapped[float | None] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    throughput: Mapped[float | None] = mapped_column(Double)  # raw iterations per second
    gpus: Mapped[Any] = mapped_column(JsonText, server_default="[]")  # device indices
    moves: Mapped[int] = mapped_column(Integer, server_default="0")  # the plan moved it
    retries: Mapped[int] = mapped_column(Integer, server_default="0")  # failed, started again
    failure: Mapped[str | None] = mapped_column(String(16))  # class of the latest failure
    retry_at: Mapped[float | None] = mapped_column(Double)  # transient back-off until
    drain_from: Mapped[str | None] = mapped_column(String)  # the operator moves it off
    #: Set by the database on every write (0013's triggers): a snapshot reads only the
    #: rows written since the previous one.
    version: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class Instance(Base):
    """An instance the cluster asked for; `instance_id` is our launch token."""

    __tablename__ = "instances"
    __table_args__ = (CheckConstraint(one_of("status", INSTANCE_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(String, unique=True)
    instance_type: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16), index=True)
    hourly_price: Mapped[float] = mapped_column(Double)  # at the time of the request
    requested_at: Mapped[float] = mapped_column(Double)
    cloud_id: Mapped[str | None] = mapped_column(String)
    zone: Mapped[str | None] = mapped_column(String)
    # The cloud's private address of it, once known: enrollment matches it (0005).
    private_address: Mapped[str | None] = mapped_column(String)
    ready_at: Mapped[float | None] = mapped_column(Double)  # its worker registered
    lost_at: Mapped[float | None] = mapped_column(Double)  # its worker fell silent
    reason: Mapped[str] = mapped_column(Text, server_default="")  # of its current status
    # Its provider announced it reclaims it (a spot interruption notice, 0009).
    reclaimed_at: Mapped[float | None] = mapped_column(Double)
    # Its EC2 type's on-demand price at the request: spot savings are measured against it.
    on_demand_price: Mapped[float | None] = mapped_column(Double)
    #: Set by the database on every write (0013's triggers): a snapshot reads only the
    #: rows written since the previous one.
    version: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class InstanceTransition(Base):
    """One entry of an instance's status history, with its reason; `seq` 0 is its request."""

    __tablename__ = "instance_transitions"
    __table_args__ = (CheckConstraint(one_of("status", INSTANCE_STATUSES), name="status"),)

    instance_id: Mapped[str] = mapped_column(ForeignKey("instances.instance_id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text, server_default="")


class Throughput(Base):
    """One entry of the co-location throughput table (Eva §4.3)."""

    __tablename__ = "throughput"

    workload: Mapped[str] = mapped_column(String, primary_key=True)
    colocated: Mapped[str] = mapped_column(Text, primary_key=True)  # see colocated_key
    throughput: Mapped[float] = mapped_column(Double)
    observations: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float | None] = mapped_column(Double)


class Round(Base):
    """A scheduling round: which plan won, why, and the numbers behind it."""

    __tablename__ = "rounds"

    round_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double)
    planner: Mapped[str] = mapped_column(String)
    chosen: Mapped[str] = mapped_column(String)
    had_event: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    numbers: Mapped[Any] = mapped_column(JsonText)
    #: The store's count of job arrivals and completions the round's snapshot saw:
    #: the next round had an event exactly when the count moved (restart-safe).
    job_events: Mapped[int] = mapped_column(Integer, server_default="0")


class RoundAction(Base):
    """An action a round decided, its reason and its outcome."""

    __tablename__ = "round_actions"
    __table_args__ = (
        CheckConstraint(one_of("kind", ACTION_KINDS), name="kind"),
        CheckConstraint(one_of("outcome", ACTION_OUTCOMES), name="outcome"),
    )

    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.round_id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    detail: Mapped[Any] = mapped_column(JsonText)


class UptimeInterval(Base):
    """The cost ledger: a billed stretch of one instance's uptime at its request's price.

    At most one interval per instance is open (`end` NULL) at a time.
    """

    __tablename__ = "uptime_intervals"
    __table_args__ = (
        Index(
            "uq_uptime_intervals_open",
            "instance_id",
            unique=True,
            sqlite_where=text('"end" IS NULL'),
            postgresql_where=text('"end" IS NULL'),
        ),
        Index(None, "start"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(ForeignKey("instances.instance_id"))
    instance_type: Mapped[str] = mapped_column(String)
    hourly_price: Mapped[float] = mapped_column(Double)
    start: Mapped[float] = mapped_column(Double)
    end: Mapped[float | None] = mapped_column(Double)


class Placement(Base):
    """A stretch of time a task occupied an instance; `end` NULL while it still does."""

    __tablename__ = "placements"
    __table_args__ = (
        Index(
            "uq_placements_open",
            "task_id",
            unique=True,
            sqlite_where=text('"end" IS NULL'),
            postgresql_where=text('"end" IS NULL'),
        ),
        Index(None, "instance_id"),
        Index(None, "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"))
    instance_id: Mapped[str] = mapped_column(String)
    attempt: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Double)
    end: Mapped[float | None] = mapped_column(Double)


class Interruption(Base):
    """One notice a provider gave about an instance — reclaimed, or a rebalance
    recommendation — with the offering it was bought as: the cluster's own interruption
    history, from which an observed rate per offering is drawn (0009)."""

    __tablename__ = "interruptions"
    __table_args__ = (
        CheckConstraint(one_of("kind", ("reclaim", "rebalance")), name="kind"),
        Index(None, "offering", "at"),
        Index(None, "instance_id", "kind", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    offering: Mapped[str] = mapped_column(String)
    instance_id: Mapped[str] = mapped_column(ForeignKey("instances.instance_id"))
    at: Mapped[float] = mapped_column(Double)
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, server_default="")


class SpotPrice(Base):
    """One (type, zone)'s spot price of the cluster's last refresh in a region, dated
    (`retrieved_at`, the same on every row of the refresh) and with its source (0014)."""

    __tablename__ = "spot_prices"

    region: Mapped[str] = mapped_column(String, primary_key=True)
    instance_type: Mapped[str] = mapped_column(String, primary_key=True)
    zone: Mapped[str] = mapped_column(String, primary_key=True)
    price: Mapped[float] = mapped_column(Double)
    retrieved_at: Mapped[float] = mapped_column(Double)
    source: Mapped[str] = mapped_column(Text, server_default="")


class PhaseDelay(Base):
    """The measured mean duration of one attempt phase on one instance type (Eva §4.5)."""

    __tablename__ = "phase_delays"

    instance_type: Mapped[str] = mapped_column(String, primary_key=True)
    phase: Mapped[str] = mapped_column(String(16), primary_key=True)
    mean_s: Mapped[float] = mapped_column(Double)
    observations: Mapped[int] = mapped_column(Integer)  # at most MAX_DELAY_OBSERVATIONS


class User(Base):
    """A user of the API: a role, a team, and the hash of their token (never the token).

    A token is `<user_id>.<secret>`: the id finds the row without trying every
    user's hash. After a rotation the previous hash stays valid until
    `previous_until`, so a client mid-way through a change of token is not cut off.
    """

    __tablename__ = "users"
    __table_args__ = (CheckConstraint(one_of("role", USER_ROLES), name="role"),)

    user_id: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    team: Mapped[str | None] = mapped_column(String)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String)  # scrypt parameters, salt and digest
    previous_hash: Mapped[str | None] = mapped_column(String)
    previous_until: Mapped[float | None] = mapped_column(Double)
    created_at: Mapped[float] = mapped_column(Double)
    rotated_at: Mapped[float | None] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


class AuditEntry(Base):
    """One API call: who made it, which method, on what, when, and how it ended."""

    __tablename__ = "audit"
    __table_args__ = (Index(None, "at"), Index(None, "user_name"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double)
    user_name: Mapped[str] = mapped_column(String)  # "-" when no valid token was shown
    role: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String)
    target: Mapped[str] = mapped_column(String, server_default="")
    outcome: Mapped[str] = mapped_column(String(32))  # "ok" or the gRPC status refused with
    detail: Mapped[str] = mapped_column(Text, server_default="")
    peer: Mapped[str] = mapped_column(String, server_default="")


class TeamSetting(Base):
    """A team's limits as `autoscaler team set` left them: each column set overrides the
    same key of the config's `[teams.NAME]`; NULL leaves the config's value
    (`app.teams`). Read by the daemon before each round."""

    __tablename__ = "team_settings"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    weight: Mapped[float | None] = mapped_column(Double)
    max_hourly_spend: Mapped[float | None] = mapped_column(Double)
    max_share: Mapped[float | None] = mapped_column(Double)
    daily_budget: Mapped[float | None] = mapped_column(Double)
    priority: Mapped[int | None] = mapped_column(Integer)
    max_priority: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Double)
    updated_by: Mapped[str] = mapped_column(String, server_default="")


class NotifyEvent(Base):
    """An event to notify about, in the outbox: `key` names the fact it reports, once
    (the receivers' idempotency key); `dispatched` once its deliveries are made."""

    __tablename__ = "notify_events"
    __table_args__ = (Index(None, "dispatched"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String, unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    at: Mapped[float] = mapped_column(Double)
    payload: Mapped[Any] = mapped_column(JsonText)  # never a secret nor a job's env values
    dispatched: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class NotifyDelivery(Base):
    """One event sent to one webhook: attempts, when the next is due, and how it ended.

    `sink` is the webhook's name in `[[notify]]`, never its URL (a Slack or Teams
    webhook URL is itself a secret)."""

    __tablename__ = "notify_deliveries"
    __table_args__ = (
        CheckConstraint(one_of("status", DELIVERY_STATUSES), name="status"),
        UniqueConstraint("event_id", "sink"),
        Index(None, "status", "next_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("notify_events.id"))
    sink: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_at: Mapped[float | None] = mapped_column(Double)
    last_error: Mapped[str] = mapped_column(Text, server_default="")
    updated_at: Mapped[float] = mapped_column(Double)


class NotifyMark(Base):
    """What the notifier last saw of a level it reports crossings of (a budget's share,
    the offerings held, the leader): a crossing is an event once, across restarts."""

    __tablename__ = "notify_marks"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[Any] = mapped_column(JsonText)
    at: Mapped[float] = mapped_column(Double)
