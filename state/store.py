"""`SqlStore`: the `Store` interface in SQLite or PostgreSQL.

Like `state.memory.InMemoryStore`, it reads the records a transition needs,
passes them through the pure rules of `autoscaler.transitions`, and writes what
they return; what SQL adds is that state survives the process and that several
processes (the daemon's round, a submission API, the CLI) can use it at once:

- **One transition, one transaction.** Every method that changes state runs in
  one write transaction, so a process killed at any point leaves either all of
  a transition or none of it.
- **Finished is final, under concurrency too.** A transition that touches a job
  or its tasks first locks the job's row (`SELECT … FOR UPDATE` on PostgreSQL;
  on SQLite `BEGIN IMMEDIATE` holds the database's write lock for the whole
  transaction) and only then reads its status and its tasks. A cancellation
  committed while a round was planning is therefore seen by the round's writes,
  which leave the job alone; a cancellation still in flight makes them wait for
  it. Instance transitions lock the instance's row the same way, so two
  processes cannot both move it from the same status.
- **A job's end is news**: the transaction that ends a job (completed, failed,
  cancelled) also writes its event to the notification outbox (`state.outbox`).
- **Snapshots are consistent**: `snapshot()` reads every table in one read
  transaction (REPEATABLE READ on PostgreSQL; on SQLite in WAL mode a read
  transaction sees the database as of its first read), without blocking writers.
- **Snapshots read in proportion to change**: the database versions every row of
  jobs, tasks and instances on every write (triggers, migration 0013), and a
  snapshot merges only the rows written since the store's previous one into it —
  equal to reading them all, whichever process wrote them. A new store (a restart)
  reads everything once.

Opening a database whose schema is missing or not at the head revision raises
`SchemaOutdated`, whose message says to run `autoscaler db upgrade --url …`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from operator import attrgetter, itemgetter
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    String,
    Table,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from autoscaler import spot, transitions
from autoscaler.jobs import JobSpec, spec_document, spec_from_document
from autoscaler.store import (
    FINAL_INSTANCE_STATUSES,
    FINAL_JOB_STATUSES,
    ActionRecord,
    DuplicateJob,
    InstanceChange,
    InstanceRecord,
    InterruptionKind,
    InterruptionRecord,
    JobRecord,
    JobStatus,
    PriceChange,
    RefreshedPrices,
    RoundIntents,
    RoundRecord,
    StateCounts,
    StateSnapshot,
    Store,
    StoreError,
    TaskRecord,
    TaskUpdate,
    UnknownEntity,
    instance_counts,
)
from autoscaler.store import Placement as PlacementRecord
from autoscaler.store import UptimeInterval as UptimeRecord
from autoscaler.throughput import DEFAULT_THROUGHPUT, Colocated, ThroughputEntry, ThroughputTable
from autoscaler.view import MeasuredDelay, MeasuredDelays, PhaseSample
from state.database import create_state_engine, read_transaction, write_transaction
from state.migrate import check_schema
from state.outbox import insert_events, job_event
from state.schema import (
    Instance,
    InstanceTransition,
    Interruption,
    Job,
    PhaseDelay,
    Placement,
    Round,
    RoundAction,
    SpotPrice,
    Task,
    Throughput,
    UptimeInterval,
    colocated_from_key,
    colocated_key,
    dump_json,
)

__all__ = ["SqlStore", "create_state_engine", "spec_document", "spec_from_document"]

JOBS = cast(Table, Job.__table__)
TASKS = cast(Table, Task.__table__)
INSTANCES = cast(Table, Instance.__table__)
HISTORY = cast(Table, InstanceTransition.__table__)
THROUGHPUT = cast(Table, Throughput.__table__)
ROUNDS = cast(Table, Round.__table__)
ACTIONS = cast(Table, RoundAction.__table__)
LEDGER = cast(Table, UptimeInterval.__table__)
PLACEMENTS = cast(Table, Placement.__table__)
DELAYS = cast(Table, PhaseDelay.__table__)
INTERRUPTIONS = cast(Table, Interruption.__table__)
SPOT_PRICES = cast(Table, SpotPrice.__table__)

#: A job record's fields after its spec, each a column of its row.
JOB_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))[1:]
#: The columns transitions change, named as the fields of their records.
JOB_COLUMNS = ("status", "started_at", "finished_at", "reason", "solo_throughput")
TASK_FIELDS = tuple(f.name for f in fields(TaskRecord))
TASK_COLUMNS = tuple(name for name in TASK_FIELDS if name not in ("task_id", "job_id"))
GPUS = TASK_FIELDS.index("gpus")  # stored as a JSON list, held as a tuple
TASK_ID, JOB_ID = TASK_FIELDS.index("task_id"), TASK_FIELDS.index("job_id")
INSTANCE_COLUMNS = (
    "status",
    "cloud_id",
    "zone",
    "private_address",
    "ready_at",
    "lost_at",
    "reason",
    "reclaimed_at",
    "hourly_price",  # the price the cloud named when it landed (`transition_instance`)
)
#: The instance record's fields stored in its row (its history is in its own table).
INSTANCE_FIELDS = tuple(f.name for f in fields(InstanceRecord) if f.name != "history")
HISTORY_FIELD = [f.name for f in fields(InstanceRecord)].index("history")
LEDGER_COLUMNS = ("instance_id", "instance_type", "hourly_price", "start", "end")
#: A round action's row: its round, its position, then the action record's fields.
ACTION_COLUMNS = ("round_id", "position", *(f.name for f in fields(ActionRecord)))
#: An instance's row as `_request_many` inserts it.
REQUESTED_COLUMNS = tuple(
    dict.fromkeys(
        ("instance_id", "instance_type", "hourly_price", "requested_at", "on_demand_price")
    )
    | dict.fromkeys(INSTANCE_COLUMNS)
)
#: table -> (its key, the columns transitions change).
WRITTEN = {
    "jobs": ("job_id", JOB_COLUMNS),
    "tasks": ("task_id", TASK_COLUMNS),
    "instances": ("instance_id", INSTANCE_COLUMNS),
}

#: Ids per `IN (…)` list: well under SQLite's and PostgreSQL's bound-parameter limits.
CHUNK = 5000
#: Ids or rows up to which `_among` and the bulk writes (`_unnest`) send array parameters on
#: PostgreSQL: the planner sees their length (a function's rows it estimates at 100), and
#: dumping a few costs nothing. More go as JSON arrays (`_json_array`).
FEW = 100


def _locked_instances(conn: Connection, ids: Sequence[str]) -> dict[str, InstanceRecord]:
    """These instances' records without their histories, their rows locked in id order
    (so lockers never deadlock) for the transaction to change them."""
    current: dict[str, InstanceRecord] = {}
    for chunk in _chunks(ids):
        for values in conn.execute(
            select(*(INSTANCES.c[n] for n in INSTANCE_FIELDS))
            .where(_among(conn, INSTANCES.c.instance_id, chunk))
            .order_by(INSTANCES.c.instance_id)
            .with_for_update()
        ).all():
            current[values[0]] = _instance_of(list(values), ())
    return current


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


class SqlStore(Store):
    """`Store` in a SQL database: SQLite (a file) or PostgreSQL (psycopg 3).

    `database` is a URL (the store then owns its engine and `close()` disposes
    it) or an Engine made by `create_state_engine`. Raises `BadDatabaseUrl`,
    `DatabaseUnreachable`, or `SchemaOutdated` when the schema is not at the
    head revision. Thread-safe: every call uses its own pooled connection (an
    in-memory SQLite database has a single one: use it from one thread, as a replay does).
    """

    def __init__(self, database: str | URL | Engine) -> None:
        if isinstance(database, Engine):
            self._engine, self._owns_engine = database, False
        else:
            self._engine, self._owns_engine = create_state_engine(database), True
        try:
            check_schema(self._engine)
        except BaseException:
            self.close()
            raise
        self._specs: dict[int, JobSpec] = {}  # parsed specs of the active jobs, by row id
        # The active jobs, tasks and live instances of the latest snapshot, which the
        # next one merges what was written since into (None: the next reads them all).
        self._active: _Active | None = None

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release the connections of an engine this store made (not one it was given)."""
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlStore({self._engine.url.render_as_string(hide_password=True)!r})"

    # -- jobs -------------------------------------------------------------
    def submit_job(self, job: JobSpec, *, owner: str, at: float, team: str = "") -> JobRecord:
        record, tasks = transitions.submitted_job(job, owner, at, team)
        document = spec_document(job)
        try:
            with write_transaction(self._engine) as conn:
                taken = conn.execute(select(JOBS.c.id).where(JOBS.c.job_id == job.job_id))
                if taken.first() is not None:
                    raise DuplicateJob(job.job_id)
                inserted = conn.execute(
                    insert(JOBS).values(
                        job_id=job.job_id,
                        name=job.name,
                        owner=owner,
                        team=team,
                        submitted_at=at,
                        spec=document,
                        **_columns(record, JOB_COLUMNS),
                    )
                )
                if tasks:
                    conn.execute(
                        insert(TASKS),
                        [
                            {
                                "task_id": task.task_id,
                                "job_id": job.job_id,
                                "position": position,
                                "workload": job.tasks[position].workload,
                                **_columns(task, TASK_COLUMNS),
                            }
                            for position, task in enumerate(tasks)
                        ],
                    )
        except IntegrityError as exc:
            # Two submissions of one job id raced (PostgreSQL: the second waits on the
            # unique index and fails), or a task id is already another job's.
            if self.job(job.job_id) is not None:
                raise DuplicateJob(job.job_id) from None
            raise StoreError(f"job {job.job_id!r} conflicts with stored data: {exc.orig}") from None
        # Committed: the next snapshot finds its spec parsed, as it would parse the stored
        # text (the daemon's API submits through the round's store, so a first round
        # after thousands of submissions parses none of them).
        key = inserted.inserted_primary_key
        if key is not None:
            self._specs[int(key[0])] = spec_from_document(json.loads(dump_json(document)))
        return record

    def cancel_job(self, job_id: str, at: float) -> bool:
        return self._finish(job_id, at, "cancelled", "cancelled by the user")

    def job_started(self, job_id: str, at: float) -> bool:
        with write_transaction(self._engine) as conn:
            job = self._locked_job(conn, job_id)
            started = None if job is None else transitions.start_job(job, at)
            if started is None:
                return False
            _write(conn, JOBS, [started])
            return True

    def job_finished(
        self, job_id: str, at: float, status: JobStatus = "completed", reason: str = ""
    ) -> bool:
        return self._finish(job_id, at, status, reason)

    def learn_solo_throughput(self, job_id: str, throughput: float) -> bool:
        with write_transaction(self._engine) as conn:
            job = self._locked_job(conn, job_id)
            if job is None:
                raise UnknownEntity(f"no job {job_id!r}")
            learned = transitions.learn_solo_throughput(job, throughput)
            if learned is None:
                return False
            _write(conn, JOBS, [learned])
            return True

    def _finish(self, job_id: str, at: float, status: JobStatus, reason: str) -> bool:
        with write_transaction(self._engine) as conn:
            job = self._locked_job(conn, job_id)
            if job is None:
                raise UnknownEntity(f"no job {job_id!r}")
            tasks = tuple(self._tasks(conn, JOBS.c.job_id == job_id))
            end = transitions.finish_job(job, tasks, status, reason, at)
            if end is None:
                return False
            _write(conn, JOBS, [end.job])
            _write(conn, TASKS, end.tasks)
            self._close_placements(conn, end.leaves, at)
            # The notification of its end, in the same transaction (`state.outbox`).
            insert_events(conn, [job_event(end.job)])
            return True

    def _locked_job(self, conn: Connection, job_id: str) -> JobRecord | None:
        """The job's record, its row locked until the transaction ends (None: no such job)."""
        row = conn.execute(select(JOBS).where(JOBS.c.job_id == job_id).with_for_update()).first()
        if row is None:
            return None
        spec = self._specs.get(row.id) or spec_from_document(row.spec)
        return _job(row, spec)

    @staticmethod
    def _lock_jobs(conn: Connection, job_ids: Iterable[str]) -> dict[str, str]:
        """Lock these jobs' rows (in id order, so lockers never deadlock) and return their
        statuses. Their tasks may then be read and written."""
        statuses: dict[str, str] = {}
        for chunk in _chunks(sorted(set(job_ids))):
            rows = conn.execute(
                select(JOBS.c.job_id, JOBS.c.status)
                .where(_among(conn, JOBS.c.job_id, chunk))
                .order_by(JOBS.c.job_id)
                .with_for_update()
            ).all()  # at once: a first round locks thousands, and row by row was most of it
            statuses.update({job_id: status for job_id, status in rows})
        return statuses

    # -- tasks ------------------------------------------------------------
    def _assign(self, conn: Connection, targets: Mapping[str, str | None], at: float) -> None:
        """Adopt a plan's targets. Most are as they were (a round rewrites few): those
        are found without locking, and only the jobs of the others are locked. A
        retarget changes a task's target and `updated_at` only
        (`transitions.retargets`), so only those columns are read and written: a
        first round over thousands of tasks moves them all."""
        moved: dict[str, str] = {}  # task -> its job
        for chunk in _chunks(list(targets)):
            for row in conn.execute(
                select(TASKS.c.task_id, TASKS.c.job_id, TASKS.c.target_instance_id, JOBS.c.status)
                .join(JOBS, JOBS.c.job_id == TASKS.c.job_id)
                .where(_among(conn, TASKS.c.task_id, chunk))
            ).all():
                task_id, job_id, current, status = row
                if transitions.retargets(status, current, targets[task_id]):
                    moved[task_id] = job_id
        if not moved:
            return
        rows: list[tuple[str, str | None, float]] = []
        if conn.dialect.name == "sqlite":
            # The write transaction holds the database's write lock from its start (`BEGIN
            # IMMEDIATE`): what was just read is as it is under the lock, and a first round
            # that moves every task reads them once, not three times.
            rows = [(task_id, targets[task_id], at) for task_id in sorted(moved)]
            _update_values(conn, TASKS, ("task_id",), ("target_instance_id", "updated_at"), rows)
            return
        statuses = self._lock_jobs(conn, moved.values())
        for chunk in _chunks(sorted(moved)):  # as they are under the locks
            for task_id, current in conn.execute(
                select(TASKS.c.task_id, TASKS.c.target_instance_id).where(
                    _among(conn, TASKS.c.task_id, chunk)
                )
            ).all():
                target = targets[task_id]
                if transitions.retargets(statuses[moved[task_id]], current, target):
                    rows.append((task_id, target, at))
        _update_values(conn, TASKS, ("task_id",), ("target_instance_id", "updated_at"), rows)

    def update_tasks(self, updates: Iterable[TaskUpdate], at: float) -> set[str]:
        changes = list(updates)
        if not changes:
            return set()
        with write_transaction(self._engine) as conn:
            job_of: dict[str, str] = {}
            for chunk in _chunks(sorted({c.task_id for c in changes})):
                job_of.update(
                    conn.execute(
                        select(TASKS.c.task_id, TASKS.c.job_id).where(
                            _among(conn, TASKS.c.task_id, chunk)
                        )
                    ).all()
                )
            unknown = [c.task_id for c in changes if c.task_id not in job_of]
            if unknown:
                raise UnknownEntity(f"no task {unknown[0]!r}")
            statuses = self._lock_jobs(conn, job_of.values())
            tasks = {t.task_id: t for t in self._read_tasks(conn, sorted(job_of))}
            done: set[str] = set()
            written: dict[str, TaskRecord] = {}
            placements = _PlacementWrites()
            samples: list[PhaseSample] = []
            for change in changes:
                task = tasks[change.task_id]
                step = transitions.update_task(statuses[task.job_id], task, change, at)
                if step is None:
                    continue
                tasks[task.task_id] = written[task.task_id] = step.task
                placements.add(step, at)
                samples.extend(step.measured)
                done.add(task.task_id)
            _write(conn, TASKS, list(written.values()))
            self._close_placements(conn, placements.closed, at)
            _insert_rows(conn, PLACEMENTS, placements.opened)
            if samples:
                self._observe_delays(conn, samples)
            return done

    @staticmethod
    def _read_tasks(conn: Connection, task_ids: Sequence[str]) -> list[TaskRecord]:
        return [
            _task(row)
            for chunk in _chunks(task_ids)
            for row in conn.execute(select(TASKS).where(_among(conn, TASKS.c.task_id, chunk)))
        ]

    @staticmethod
    def _close_placements(conn: Connection, task_ids: Sequence[str], at: float) -> None:
        for chunk in _chunks(sorted(task_ids)):
            conn.execute(
                update(PLACEMENTS)
                .where(_among(conn, PLACEMENTS.c.task_id, chunk), PLACEMENTS.c.end.is_(None))
                .values(end=at)
            )

    def _observe_delays(self, conn: Connection, samples: Sequence[PhaseSample]) -> None:
        """Fold measured phases into their (type, phase) running means."""
        keys = {(instance_type, phase) for instance_type, phase, _ in samples}
        types = sorted({instance_type for instance_type, _ in keys})
        known = MeasuredDelays(
            {
                (r.instance_type, r.phase): MeasuredDelay(r.mean_s, r.observations)
                for r in conn.execute(
                    select(DELAYS)
                    .where(DELAYS.c.instance_type.in_(types))
                    .order_by(DELAYS.c.instance_type, DELAYS.c.phase)
                    .with_for_update()
                )
            }
        )
        means = known.observed(samples).means
        statement = self._insert(DELAYS)
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=["instance_type", "phase"],
                set_={
                    "mean_s": statement.excluded.mean_s,
                    "observations": statement.excluded.observations,
                },
            ),
            [
                {
                    "instance_type": instance_type,
                    "phase": phase,
                    "mean_s": means[(instance_type, phase)].mean_s,
                    "observations": means[(instance_type, phase)].observations,
                }
                for instance_type, phase in sorted(keys)
            ],
        )

    # -- instances --------------------------------------------------------
    def _request_many(
        self,
        conn: Connection,
        requests: Sequence[tuple[str, str, float]],
        at: float,
        on_demand_prices: Mapping[str, float] | None = None,
    ) -> None:
        """Record instances before asking the cloud; a token already recorded stands as it is."""
        wanted = {instance_id: (itype, price) for instance_id, itype, price in requests}
        if not wanted:
            return
        taken: set[str] = set()
        for chunk in _chunks(sorted(wanted)):
            taken.update(
                conn.execute(
                    select(INSTANCES.c.instance_id).where(
                        _among(conn, INSTANCES.c.instance_id, chunk)
                    )
                )
                .scalars()
                .all()
            )
        new = [
            transitions.request_instance(i, itype, price, at, (on_demand_prices or {}).get(i))
            for i, (itype, price) in wanted.items()
            if i not in taken
        ]
        if not new:
            return
        get = attrgetter(*REQUESTED_COLUMNS)
        _insert_values(conn, INSTANCES, REQUESTED_COLUMNS, [get(i) for i in new])
        _insert_values(
            conn,
            HISTORY,
            ("instance_id", "seq", "status", "at"),
            [
                (i.instance_id, seq, status, when)
                for i in new
                for seq, (status, when) in enumerate(i.history)
            ],
        )

    def _transition_many(
        self, conn: Connection, changes: Sequence[InstanceChange], at: float
    ) -> set[str]:
        """Instance transitions in one transaction, a few statements for any number:
        rows locked in id order, each change passed through the status machine's rule,
        then the instances, their histories and the ledger written in bulk. Returns the
        instances that changed (one already in its status is left alone)."""
        if not changes:
            return set()
        ids = sorted({c.instance_id for c in changes})
        # Each record without its history: the rule appends to it, and only the new
        # entries are written.
        current = _locked_instances(conn, ids)
        seqs: dict[str, int] = {}
        for chunk in _chunks(ids):
            seqs.update(
                conn.execute(
                    select(HISTORY.c.instance_id, func.count())
                    .where(_among(conn, HISTORY.c.instance_id, chunk))
                    .group_by(HISTORY.c.instance_id)
                ).all()
            )
        written: dict[str, InstanceRecord] = {}
        history: list[tuple[str, int, str, float, str]] = []
        opened: list[tuple[Any, ...]] = []
        closed: list[tuple[str, float]] = []
        ledger = attrgetter(*LEDGER_COLUMNS)
        for c in changes:
            inst = current.get(c.instance_id)
            if inst is None:
                raise UnknownEntity(f"no instance {c.instance_id!r}")
            step = transitions.transition_instance(inst, c, at)
            if step is None:
                continue
            current[c.instance_id] = written[c.instance_id] = step.instance
            seq = seqs.get(c.instance_id, 0)
            seqs[c.instance_id] = seq + 1
            status, when = step.instance.history[-1]
            history.append((c.instance_id, seq, status, when, step.instance.reason))
            if step.opens is not None:
                opened.append(ledger(step.opens))
            if step.closes:
                closed.append((c.instance_id, at))
        if written:
            _write(conn, INSTANCES, list(written.values()))
            _insert_values(conn, HISTORY, ("instance_id", "seq", "status", "at", "reason"), history)
        _insert_values(conn, LEDGER, LEDGER_COLUMNS, opened)
        _update_values(conn, LEDGER, ("instance_id",), ("end",), closed, where_null="end")
        return set(written)

    def transition_instances(self, changes: Iterable[InstanceChange], at: float) -> set[str]:
        with write_transaction(self._engine) as conn:
            return self._transition_many(conn, list(changes), at)

    def instance_worker(
        self, instance_id: str, at: float, *, ready: bool, reason: str = ""
    ) -> bool:
        with write_transaction(self._engine) as conn:
            row = conn.execute(
                select(INSTANCES).where(INSTANCES.c.instance_id == instance_id).with_for_update()
            ).first()
            if row is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            seen = transitions.instance_worker(_instance(row, ()), at, ready=ready, reason=reason)
            if seen is None:
                return False
            _write(conn, INSTANCES, [seen])
            return True

    def instance_notice(
        self, instance_id: str, kind: InterruptionKind, at: float, reason: str = ""
    ) -> bool:
        with write_transaction(self._engine) as conn:
            row = conn.execute(
                select(INSTANCES).where(INSTANCES.c.instance_id == instance_id).with_for_update()
            ).first()
            if row is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            known = conn.execute(
                select(INTERRUPTIONS.c.id).where(
                    INTERRUPTIONS.c.instance_id == instance_id, INTERRUPTIONS.c.kind == kind
                )
            ).first()
            if known is not None:
                return False
            if kind == "reclaim":
                seen = transitions.reclaim_instance(_instance(row, ()), at, reason)
                if seen is not None:
                    _write(conn, INSTANCES, [seen])
            conn.execute(
                insert(INTERRUPTIONS).values(
                    offering=row.instance_type,
                    instance_id=instance_id,
                    at=at,
                    kind=kind,
                    reason=reason,
                )
            )
            return True

    def reprice_instances(self, changes: Iterable[PriceChange]) -> set[str]:
        ordered = sorted(changes, key=lambda c: (c.instance_id, c.at))
        if not ordered:
            return set()
        ids = sorted({c.instance_id for c in ordered})
        with write_transaction(self._engine) as conn:
            current = _locked_instances(conn, ids)
            stretches: dict[str, tuple[int, UptimeRecord]] = {}
            for chunk in _chunks(ids):
                for row in conn.execute(
                    select(LEDGER).where(
                        _among(conn, LEDGER.c.instance_id, chunk), LEDGER.c.end.is_(None)
                    )
                ):
                    stretches[row.instance_id] = (row.id, _interval(row))
            changed: dict[str, InstanceRecord] = {}
            for change in ordered:
                held = stretches.get(change.instance_id)
                inst = current.get(change.instance_id)
                step = spot.repriced(held[1], change) if held is not None else None
                if held is None or inst is None or step is None:
                    continue
                row_id = held[0]
                if step.closes_at is None:
                    conn.execute(
                        update(LEDGER)
                        .where(LEDGER.c.id == row_id)
                        .values(hourly_price=step.opens.hourly_price)
                    )
                else:
                    conn.execute(
                        update(LEDGER).where(LEDGER.c.id == row_id).values(end=step.closes_at)
                    )
                    row_id = conn.execute(
                        insert(LEDGER)
                        .values(**_columns(step.opens, LEDGER_COLUMNS))
                        .returning(LEDGER.c.id)
                    ).scalar_one()
                stretches[change.instance_id] = (row_id, step.opens)
                current[inst.instance_id] = changed[inst.instance_id] = replace(
                    inst, hourly_price=step.opens.hourly_price
                )
            _write(conn, INSTANCES, list(changed.values()))
            return set(changed)

    def record_spot_prices(self, prices: RefreshedPrices) -> bool:
        with write_transaction(self._engine) as conn:
            kept = conn.execute(
                select(func.max(SPOT_PRICES.c.retrieved_at)).where(
                    SPOT_PRICES.c.region == prices.region
                )
            ).scalar_one()
            if kept is not None and kept >= prices.retrieved_at:
                return False
            conn.execute(delete(SPOT_PRICES).where(SPOT_PRICES.c.region == prices.region))
            _insert_rows(
                conn,
                SPOT_PRICES,
                [
                    {
                        "region": prices.region,
                        "instance_type": itype,
                        "zone": zone,
                        "price": price,
                        "retrieved_at": prices.retrieved_at,
                        "source": prices.source,
                    }
                    for itype, by_zone in sorted(prices.prices.items())
                    for zone, price in sorted(by_zone.items())
                ],
            )
            return True

    def spot_prices(self, region: str) -> RefreshedPrices | None:
        with read_transaction(self._engine) as conn:
            rows = conn.execute(select(SPOT_PRICES).where(SPOT_PRICES.c.region == region)).all()
        if not rows:
            return None
        prices: dict[str, dict[str, float]] = {}
        for row in rows:
            prices.setdefault(row.instance_type, {})[row.zone] = row.price
        return RefreshedPrices(region, prices, rows[0].retrieved_at, rows[0].source)

    def interruption_counts(self, since: float) -> dict[str, int]:
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                select(INTERRUPTIONS.c.offering, func.count())
                .where(INTERRUPTIONS.c.kind == "reclaim", INTERRUPTIONS.c.at >= since)
                .group_by(INTERRUPTIONS.c.offering)
            )
            return {offering: int(count) for offering, count in rows}

    def interruptions(self, since: float | None = None) -> list[InterruptionRecord]:
        with read_transaction(self._engine) as conn:
            query = select(INTERRUPTIONS).order_by(INTERRUPTIONS.c.at, INTERRUPTIONS.c.id)
            if since is not None:
                query = query.where(INTERRUPTIONS.c.at >= since)
            return [
                InterruptionRecord(r.offering, r.instance_id, r.at, r.kind, r.reason)
                for r in conn.execute(query)
            ]

    # -- learning ---------------------------------------------------------
    def record_throughput(
        self,
        entries: Iterable[tuple[str, Colocated, ThroughputEntry]],
        forget: Iterable[tuple[str, Colocated]] = (),
    ) -> None:
        # One row per key, the last entry winning (as in the in-memory store): a
        # PostgreSQL upsert may not touch the same row twice in one statement.
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for workload, colocated, entry in entries:
            key = colocated_key(colocated)
            rows[(workload, key)] = {
                "workload": workload,
                "colocated": key,
                "throughput": entry.throughput,
                "observations": entry.observations,
                "updated_at": entry.updated_at_s,
            }
        gone = [
            {"w": workload, "c": colocated_key(colocated)}
            for workload, colocated in forget
            if (workload, colocated_key(colocated)) not in rows
        ]
        if not rows and not gone:
            return
        with write_transaction(self._engine) as conn:
            if gone:
                conn.execute(
                    delete(THROUGHPUT).where(
                        THROUGHPUT.c.workload == bindparam("w"),
                        THROUGHPUT.c.colocated == bindparam("c"),
                    ),
                    gone,
                )
            if rows:
                conn.execute(self._upsert_throughput(), list(rows.values()))

    def _upsert_throughput(self) -> Any:
        statement = self._insert(THROUGHPUT)
        statement = statement.on_conflict_do_update(
            index_elements=["workload", "colocated"],
            set_={
                "throughput": statement.excluded.throughput,
                "observations": statement.excluded.observations,
                "updated_at": statement.excluded.updated_at,
            },
        )
        return statement

    # -- rounds -----------------------------------------------------------
    def record_round(self, record: RoundRecord, intents: RoundIntents | None = None) -> int:
        with write_transaction(self._engine) as conn:
            result = conn.execute(
                insert(ROUNDS).values(
                    at=record.at,
                    planner=record.planner,
                    chosen=record.chosen,
                    had_event=record.had_event,
                    reason=record.reason,
                    numbers=dict(record.numbers),
                    job_events=record.job_events,
                )
            )
            key = result.inserted_primary_key
            assert key is not None  # an INSERT of one row
            round_id = int(key[0])
            if record.actions:
                _insert_values(
                    conn,
                    ACTIONS,
                    ACTION_COLUMNS,
                    [
                        (
                            round_id,
                            i,
                            a.kind,
                            a.target,
                            a.reason,
                            a.outcome,
                            a.message,
                            dict(a.detail),
                        )
                        for i, a in enumerate(record.actions)
                    ],
                )
            if intents is not None:
                at = record.at
                self._request_many(conn, intents.requests, at, intents.on_demand_prices)
                if intents.targets:
                    self._assign(conn, intents.targets, at)
                self._transition_many(conn, intents.instance_changes(), at)
            return round_id

    def record_action_outcomes(
        self, round_id: int, outcomes: Iterable[tuple[int, str, str]]
    ) -> None:
        outcomes = list(outcomes)
        if not outcomes:
            return
        positions = sorted({i for i, _, _ in outcomes})
        rows = [(round_id, i, o, m) for i, o, m in outcomes]
        with write_transaction(self._engine) as conn:
            known = set(
                conn.execute(
                    select(ACTIONS.c.position).where(
                        ACTIONS.c.round_id == round_id, _among(conn, ACTIONS.c.position, positions)
                    )
                )
                .scalars()
                .all()
            )
            missing = [p for p in positions if p not in known]
            if missing:
                raise UnknownEntity(f"no action {missing[0]} in round {round_id}")
            _update_values(conn, ACTIONS, ("round_id", "position"), ("outcome", "message"), rows)

    # -- reads ------------------------------------------------------------
    def snapshot(
        self, default_throughput: float = DEFAULT_THROUGHPUT, *, with_throughput: bool = True
    ) -> StateSnapshot:
        """Everything a round reads, in one read transaction. The active jobs, their
        tasks and the live instances are the previous snapshot's with the rows written
        since merged in (`_Active.merged`: the rows whose version, set by the database
        on every write, is at or above the previous snapshot's mark), so a round reads
        in proportion to what changed; a store's first snapshot (after a restart too)
        reads them all."""
        with read_transaction(self._engine) as conn:
            marks = _marks(conn)  # first, so it is of this transaction's snapshot
            previous = self._active
            if previous is None:
                active = self._read_active(conn, marks)
            else:
                active = previous.merged(conn, self, marks)
            self._active = active  # a snapshot older than the last is a sound base too
            jobs = active.job_records()
            tasks = active.task_records(jobs)
            instances = active.instance_records()
            entries = (
                {
                    (r.workload, colocated_from_key(r.colocated)): ThroughputEntry(
                        r.throughput, r.observations, r.updated_at
                    )
                    for r in conn.execute(select(THROUGHPUT))
                }
                if with_throughput
                else {}
            )
            # The reconfiguration history is derived from the rounds themselves.
            first_round_at = conn.execute(
                select(ROUNDS.c.at).order_by(ROUNDS.c.round_id).limit(1)
            ).scalar_one_or_none()
            event_rounds = conn.execute(
                select(func.count()).select_from(ROUNDS).where(ROUNDS.c.had_event)
            ).scalar_one()
            full_rounds = conn.execute(
                select(func.count())
                .select_from(ROUNDS)
                .where(ROUNDS.c.had_event, ROUNDS.c.chosen == "full")
            ).scalar_one()
            last_round_job_events = conn.execute(
                select(ROUNDS.c.job_events).order_by(ROUNDS.c.round_id.desc()).limit(1)
            ).scalar_one_or_none()
            requested = conn.execute(select(func.count()).select_from(INSTANCES)).scalar_one()
            delays = MeasuredDelays(
                {
                    (r.instance_type, r.phase): MeasuredDelay(r.mean_s, r.observations)
                    for r in conn.execute(select(DELAYS))
                }
            )
            submitted, finished = conn.execute(
                select(func.count(), func.count(JOBS.c.finished_at)).select_from(JOBS)
            ).one()
        return StateSnapshot(
            tuple(jobs),
            tasks,
            tuple(instances),
            ThroughputTable(entries, default_throughput),
            first_round_at,
            int(event_rounds),
            int(full_rounds),
            int(requested),
            int(submitted) + int(finished),
            last_round_job_events,
            delays,
        )

    def state_counts(self) -> StateCounts:
        """Counted by the database: two aggregates and the live instances' three columns,
        instead of a snapshot's every active job, task and instance history."""
        active = JOBS.c.status.not_in(FINAL_JOB_STATUSES)
        with read_transaction(self._engine) as conn:
            jobs = conn.execute(
                select(JOBS.c.status, func.count()).where(active).group_by(JOBS.c.status)
            ).all()
            tasks = conn.execute(
                select(TASKS.c.status, func.count())
                .join(JOBS, JOBS.c.job_id == TASKS.c.job_id)
                .where(active)
                .group_by(TASKS.c.status)
            ).all()
            instances = conn.execute(
                select(INSTANCES.c.instance_type, INSTANCES.c.status, INSTANCES.c.hourly_price)
                .where(INSTANCES.c.status.not_in(FINAL_INSTANCE_STATUSES))
                .order_by(INSTANCES.c.id)
            ).all()
        return StateCounts(
            {status: int(n) for status, n in jobs},
            {status: int(n) for status, n in tasks},
            *instance_counts((t, s, p) for t, s, p in instances),
        )

    def job(self, job_id: str) -> JobRecord | None:
        with read_transaction(self._engine) as conn:
            found = self._jobs(conn, JOBS.c.job_id == job_id)
        return found[0] if found else None

    def jobs(self, statuses: Iterable[str] | None = None) -> list[JobRecord]:
        with read_transaction(self._engine) as conn:
            if statuses is None:
                return self._jobs(conn, None)
            return self._jobs(conn, JOBS.c.status.in_(list(statuses)))

    def tasks_of(self, job_id: str) -> list[TaskRecord]:
        with read_transaction(self._engine) as conn:
            return self._tasks(conn, JOBS.c.job_id == job_id)

    def tasks_of_jobs(self, job_ids: Iterable[str]) -> dict[str, list[TaskRecord]]:
        ids = list(dict.fromkeys(job_ids))
        found: dict[str, list[TaskRecord]] = {job_id: [] for job_id in ids}
        with read_transaction(self._engine) as conn:
            # In chunks: SQLite's default bound on a statement's parameters is 999 in
            # older builds.
            for at in range(0, len(ids), 500):
                for task in self._tasks(conn, JOBS.c.job_id.in_(ids[at : at + 500])):
                    found[task.job_id].append(task)
        return found

    def instance(self, instance_id: str) -> InstanceRecord | None:
        with read_transaction(self._engine) as conn:
            found = self._instances(conn, INSTANCES.c.instance_id == instance_id)
        return found[0] if found else None

    def instances(self, include_finished: bool = False) -> list[InstanceRecord]:
        with read_transaction(self._engine) as conn:
            where = None if include_finished else INSTANCES.c.status.not_in(FINAL_INSTANCE_STATUSES)
            return self._instances(conn, where)

    def rounds(self, limit: int | None = None) -> list[RoundRecord]:
        with read_transaction(self._engine) as conn:
            query = select(ROUNDS).order_by(ROUNDS.c.round_id.desc())
            if limit is not None:
                if limit <= 0:
                    return []
                query = query.limit(limit)
            rounds = list(reversed(conn.execute(query).all()))
            if not rounds:
                return []
            actions: dict[int, list[ActionRecord]] = {r.round_id: [] for r in rounds}
            for a in conn.execute(
                select(ACTIONS)
                .where(ACTIONS.c.round_id >= rounds[0].round_id)
                .order_by(ACTIONS.c.round_id, ACTIONS.c.position)
            ):
                actions[a.round_id].append(
                    ActionRecord(a.kind, a.target, a.reason, a.outcome, a.message, a.detail)
                )
        return [
            RoundRecord(
                r.at,
                r.planner,
                r.chosen,
                r.had_event,
                r.reason,
                r.numbers,
                tuple(actions[r.round_id]),
                r.round_id,
                r.job_events,
            )
            for r in rounds
        ]

    def uptime(self, since: float | None = None) -> list[UptimeRecord]:
        with read_transaction(self._engine) as conn:
            query = select(LEDGER).order_by(LEDGER.c.id)
            if since is not None:
                query = query.where(or_(LEDGER.c.end.is_(None), LEDGER.c.end >= since))
            return [_interval(r) for r in conn.execute(query)]

    def placements(self, since: float | None = None) -> list[PlacementRecord]:
        with read_transaction(self._engine) as conn:
            query = select(PLACEMENTS).order_by(PLACEMENTS.c.id)
            if since is not None:
                query = query.where(or_(PLACEMENTS.c.end.is_(None), PLACEMENTS.c.end >= since))
            return [
                PlacementRecord(r.task_id, r.job_id, r.instance_id, r.attempt, r.start, r.end)
                for r in conn.execute(query)
            ]

    def cost_between(self, t0: float, t1: float) -> float:
        """Dollars billed within [t0, t1]: the ledger's intervals that overlap it, each
        at the price recorded with its instance's request."""
        with read_transaction(self._engine) as conn:
            overlapping = conn.execute(
                select(LEDGER)
                .where(LEDGER.c.start < t1, or_(LEDGER.c.end.is_(None), LEDGER.c.end > t0))
                .order_by(LEDGER.c.id)
            )
            return sum((_interval(r).cost(t0, t1) for r in overlapping), 0.0)

    # -- helpers ----------------------------------------------------------
    def _insert(self, table: Table) -> Any:
        """INSERT with the dialect's ON CONFLICT clause (both dialects spell it alike)."""
        dialect = sqlite if self._engine.dialect.name == "sqlite" else postgresql
        return dialect.insert(table)

    def _job_rows(
        self,
        conn: Connection,
        where: ColumnElement[bool],
        known: Mapping[str, JobRecord] | None = None,
    ) -> tuple[list[tuple[int, JobRecord]], list[str]]:
        """(row id, record) of the active jobs matching `where`, in submission order, and
        the ids of the ended ones. A spec never changes once submitted: it is taken from
        `known` records, else from the specs parsed at submission (`_specs`), and only
        the rest are read and parsed."""
        known = known or {}
        # (row id, job id, then the record's fields after its spec, in order): a first
        # snapshot reads thousands of jobs, and lookups by name were most of it.
        query = select(JOBS.c.id, JOBS.c.job_id, *(JOBS.c[n] for n in JOB_RECORD_FIELDS))
        rows = [tuple(r) for r in conn.execute(query.where(where).order_by(JOBS.c.id)).all()]
        ended = [r[1] for r in rows if r[2] in FINAL_JOB_STATUSES]
        if ended:
            rows = [r for r in rows if r[2] not in FINAL_JOB_STATUSES]
        specs = {r[0]: known[r[1]].spec for r in rows if r[1] in known}
        cache = self._specs
        missing = [r[0] for r in rows if r[0] not in specs and r[0] not in cache]
        for chunk in _chunks(missing):
            for r in conn.execute(
                select(JOBS.c.id, JOBS.c.spec).where(_among(conn, JOBS.c.id, chunk))
            ):
                cache[r.id] = spec_from_document(r.spec)
        return [
            (row_id, JobRecord(specs.get(row_id) or cache[row_id], *values))
            for row_id, _, *values in rows
        ], ended

    def _read_active(self, conn: Connection, marks: dict[str, int]) -> _Active:
        """The active jobs, their tasks and the live instances, all read."""
        jobs, _ = self._job_rows(conn, JOBS.c.status.not_in(FINAL_JOB_STATUSES))
        tasks = self._tasks(conn, JOBS.c.status.not_in(FINAL_JOB_STATUSES))
        instances = self._instance_rows(conn, INSTANCES.c.status.not_in(FINAL_INSTANCE_STATUSES))
        self._keep_specs(jobs)
        return _Active(
            marks,
            {j.job_id: (row_id, j) for row_id, j in jobs},
            {t.task_id: t for t in tasks},
            {i.instance_id: (row_id, i) for row_id, i in instances},
        )

    def _keep_specs(self, jobs: Iterable[tuple[int, JobRecord]]) -> None:
        """Keep the parsed specs of these jobs only (the active ones): the cache holds what
        is active, however long the daemon runs."""
        self._specs = {row_id: j.spec for row_id, j in jobs}

    @staticmethod
    def _jobs(conn: Connection, where: ColumnElement[bool] | None) -> list[JobRecord]:
        query = select(JOBS).order_by(JOBS.c.id)
        if where is not None:
            query = query.where(where)
        return [_job(r, spec_from_document(r.spec)) for r in conn.execute(query)]

    @staticmethod
    def _tasks(conn: Connection, job_where: ColumnElement[bool]) -> list[TaskRecord]:
        """Tasks of the jobs matching `job_where`, in job order then spec order."""
        query = (
            select(*(TASKS.c[name] for name in TASK_FIELDS))
            .join(JOBS, JOBS.c.job_id == TASKS.c.job_id)
            .where(job_where)
            .order_by(JOBS.c.id, TASKS.c.position)
        )
        # The columns in the record's field order, fetched at once: a snapshot reads
        # every active task, and per-row fetches and lookups by name were most of it.
        out = []
        for row in conn.execute(query).all():
            values = list(row)
            values[GPUS] = tuple(values[GPUS])
            out.append(TaskRecord(*values))
        return out

    @classmethod
    def _instances(
        cls, conn: Connection, where: ColumnElement[bool] | None
    ) -> list[InstanceRecord]:
        """Instances matching `where`, in request order, each with its status history."""
        return [inst for _, inst in cls._instance_rows(conn, where)]

    @staticmethod
    def _instance_rows(
        conn: Connection, where: ColumnElement[bool] | None
    ) -> list[tuple[int, InstanceRecord]]:
        """(row id, record) of the instances matching `where`, in request order, each with
        its status history."""
        query = select(INSTANCES.c.id, *(INSTANCES.c[n] for n in INSTANCE_FIELDS)).order_by(
            INSTANCES.c.id
        )
        history = (
            select(HISTORY.c.instance_id, HISTORY.c.status, HISTORY.c.at)
            .join(INSTANCES, INSTANCES.c.instance_id == HISTORY.c.instance_id)
            .order_by(HISTORY.c.instance_id, HISTORY.c.seq)
        )
        if where is not None:
            query, history = query.where(where), history.where(where)
        histories: dict[str, list[tuple[str, float]]] = {}
        for instance_id, status, at in conn.execute(history).all():
            histories.setdefault(instance_id, []).append((status, at))
        # The columns in the record's field order, the history spliced in: a first round's
        # launches are thousands of instances, and lookups by name were most of it.
        return [
            (row_id, _instance_of(values, histories.get(values[0], ())))
            for row_id, *values in conn.execute(query).all()
        ]


#: The tables whose rows carry a version the database sets on every write (0013).
VERSIONED = ("jobs", "tasks", "instances")


def _marks(conn: Connection) -> dict[str, int]:
    """Per versioned table, the version from which rows may have been written after this
    read transaction's snapshot: the next snapshot re-reads the rows at or above it.

    PostgreSQL: the snapshot's xmin, the oldest transaction still running when it was
    taken (a row's version is its writer's transaction id; transactions commit out of
    order, so a writer below the newest seen may still commit, but never one below
    xmin). SQLite: one above the table's largest version (writers are serialized, and
    each row written later gets a larger one)."""
    if conn.dialect.name == "postgresql":
        xmin = conn.exec_driver_sql(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
        ).scalar_one()
        return dict.fromkeys(VERSIONED, int(xmin))
    return {
        name: int(
            conn.exec_driver_sql(f"SELECT coalesce(max(version), 0) FROM {name}").scalar_one()
        )
        + 1
        for name in VERSIONED
    }


class _Active:
    """The active jobs (row id, record), their tasks and the live instances (row id,
    record) as of one snapshot, and its marks (`_marks`)."""

    __slots__ = ("instances", "jobs", "marks", "tasks")

    def __init__(
        self,
        marks: dict[str, int],
        jobs: dict[str, tuple[int, JobRecord]],
        tasks: dict[str, TaskRecord],
        instances: dict[str, tuple[int, InstanceRecord]],
    ) -> None:
        self.marks, self.jobs, self.tasks, self.instances = marks, jobs, tasks, instances

    def merged(self, conn: Connection, store: SqlStore, marks: dict[str, int]) -> _Active:
        """This state with the rows written since it merged in, as of `conn`'s snapshot
        (whose marks are `marks`): equal to reading them all (tested on both databases).
        A row is never deleted, a job or instance that ends never comes back, and a job's
        tasks are written in the transaction that submits it."""
        jobs, tasks, instances = dict(self.jobs), dict(self.tasks), dict(self.instances)
        known = {job_id: record for job_id, (_, record) in jobs.items()}
        changed, ended = store._job_rows(conn, JOBS.c.version >= self.marks["jobs"], known)
        for job_id in ended:
            gone = jobs.pop(job_id, None)
            if gone is not None:
                for spec in gone[1].spec.tasks:
                    tasks.pop(spec.task_id, None)
        for row_id, job in changed:
            jobs[job.job_id] = (row_id, job)
        query = select(*(TASKS.c[name] for name in TASK_FIELDS)).where(
            TASKS.c.version >= self.marks["tasks"]
        )
        for row in conn.execute(query).all():
            values = list(row)  # in the record's field order: by position, not by name
            if values[JOB_ID] in jobs:
                values[GPUS] = tuple(values[GPUS])
                tasks[values[TASK_ID]] = TaskRecord(*values)
        for row_id, inst in store._instance_rows(
            conn, INSTANCES.c.version >= self.marks["instances"]
        ):
            if inst.status in FINAL_INSTANCE_STATUSES:
                instances.pop(inst.instance_id, None)
            else:
                instances[inst.instance_id] = (row_id, inst)
        store._keep_specs(jobs.values())
        return _Active(marks, jobs, tasks, instances)

    def job_records(self) -> list[JobRecord]:
        """The active jobs in submission order."""
        return [job for _, job in sorted(self.jobs.values(), key=_first)]

    def task_records(self, jobs: Sequence[JobRecord]) -> dict[str, TaskRecord]:
        """Their tasks in job order, then spec order (as a full read orders them)."""
        tasks = self.tasks
        return {spec.task_id: tasks[spec.task_id] for job in jobs for spec in job.spec.tasks}

    def instance_records(self) -> list[InstanceRecord]:
        """The live instances in request order."""
        return [inst for _, inst in sorted(self.instances.values(), key=_first)]


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def _job(row: Row[Any], spec: JobSpec) -> JobRecord:
    """A job's record from its row (its columns named as the record's fields)."""
    mapping = row._mapping
    return JobRecord(spec, *(mapping[n] for n in JOB_RECORD_FIELDS))


def _columns(record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A record's values of these columns (named as its fields)."""
    return {name: getattr(record, name) for name in names}


def _write(conn: Connection, table: Table, records: Sequence[Any]) -> None:
    """Store what transitions made of these records (jobs, tasks or instances), in
    bulk (`_update_values`): the columns transitions change, by the record's key."""
    if not records:
        return
    key, names = WRITTEN[table.name]
    get = attrgetter(key, *names)
    _update_values(conn, table, (key,), names, [get(r) for r in records])


def _insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert rows (each a mapping with the same columns) in bulk (`_insert_values`)."""
    if not rows:
        return
    order = tuple(rows[0])
    _insert_values(conn, table, order, [_getter(order)(row) for row in rows])


def _insert_values(
    conn: Connection, table: Table, order: Sequence[str], values: Sequence[tuple[Any, ...]]
) -> None:
    """Insert rows, each a tuple of the columns `order` names, in bulk: on PostgreSQL one
    `INSERT … SELECT FROM unnest(arrays)` (`_unnest`), so thousands of rows cost one
    round trip and one short statement instead of one each; on SQLite one
    `executemany`, which runs in process. Tuples, not mappings: a first round writes
    tens of thousands of rows, and a dict built for each was a good part of it."""
    if not values:
        return
    names = ", ".join(_quoted(conn, c) for c in order)
    if conn.dialect.name != "postgresql":
        marks = ", ".join("?" * len(order))
        conn.exec_driver_sql(
            f"INSERT INTO {table.name} ({names}) VALUES ({marks})",
            _sqlite_params(conn, table, order, values),
        )
        return
    source, params = _unnest(conn, table, order, values)
    # In the rows' order, so ids drawn from a sequence follow it (request order).
    conn.exec_driver_sql(
        f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {source} ORDER BY given_at",
        params,
    )


def _update_values(
    conn: Connection,
    table: Table,
    keys: tuple[str, ...],
    names: Sequence[str],
    values: Sequence[tuple[Any, ...]],
    where_null: str | None = None,
) -> None:
    """Set columns `names` of the rows found by their `keys`, each row a tuple of its
    keys' then its columns' values, and whose column `where_null` is NULL if given.
    On PostgreSQL one `UPDATE … FROM unnest(arrays)` (`_unnest`); on SQLite one
    `executemany`."""
    if not values:
        return
    if conn.dialect.name != "postgresql":
        sets = ", ".join(f"{_quoted(conn, n)} = ?" for n in names)
        found = [f"{_quoted(conn, k)} = ?" for k in keys]
        if where_null is not None:
            found.append(f"{_quoted(conn, where_null)} IS NULL")
        # The statement's parameters are its columns' then its keys'.
        count = len(keys)
        moved = [row[count:] + row[:count] for row in values]
        conn.exec_driver_sql(
            f"UPDATE {table.name} SET {sets} WHERE {' AND '.join(found)}",
            _sqlite_params(conn, table, (*names, *keys), moved),
        )
        return
    # One row per key, the last winning, as in a sequence of single-row updates.
    count = len(keys)
    values = list({row[:count]: row for row in values}.values())
    source, params = _unnest(conn, table, (*keys, *names), values)
    sets = ", ".join(f"{_quoted(conn, n)} = given.{_quoted(conn, n)}" for n in names)
    found = [f"{table.name}.{_quoted(conn, k)} = given.{_quoted(conn, k)}" for k in keys]
    if where_null is not None:
        found.append(f"{table.name}.{_quoted(conn, where_null)} IS NULL")
    conn.exec_driver_sql(
        f"UPDATE {table.name} SET {sets} FROM {source} WHERE {' AND '.join(found)}", params
    )


def _getter(order: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A row's values of these columns, as a tuple in this order."""
    if len(order) == 1:
        name = order[0]
        return lambda row: (row[name],)
    return cast(Callable[[Mapping[str, Any]], tuple[Any, ...]], itemgetter(*order))


def _sqlite_params(
    conn: Connection, table: Table, order: Sequence[str], values: Sequence[tuple[Any, ...]]
) -> Sequence[tuple[Any, ...]]:
    """Rows (tuples of the columns `order` names) as SQLite `executemany` parameters,
    each value through its column type's bind processing (as `conn.execute(insert(table),
    rows)` sends them, without its per-row, per-parameter work)."""
    processed = [
        (i, process)
        for i, name in enumerate(order)
        if (process := table.c[name].type.bind_processor(conn.dialect)) is not None
    ]
    if not processed:
        return values
    out = []
    for row in values:
        items = list(row)
        for i, process in processed:
            items[i] = process(items[i])
        out.append(tuple(items))
    return out


def _unnest(
    conn: Connection, table: Table, order: Sequence[str], values: Sequence[tuple[Any, ...]]
) -> tuple[str, dict[str, Any]]:
    """Rows (tuples of the columns `order` names) as a PostgreSQL table expression `given`
    (its columns, then `given_at`, each row's position), and its parameters: one per
    column, its values through the column type's bind processing (as an ORM write would
    send them).

    Up to `FEW` rows, one array per column, `unnest(array, …) WITH ORDINALITY`, whose
    length the planner sees (a write of one row finds it by its index in a large table).
    More rows, one JSON array per column (`_json_array`), zipped in order by `ROWS FROM
    (json_array_elements_text(…), …) WITH ORDINALITY` (as `unnest` zips arrays), each
    element cast to its column's type: psycopg dumps an array parameter element by
    element in Python, json's C encoder a document at once (a first round's writes of
    thousands of rows spent most of their client time in the dumping)."""
    dialect = conn.dialect
    few = len(values) <= FEW
    params: dict[str, Any] = {}
    sources, typed = [], []
    for i, name in enumerate(order):
        kind = table.c[name].type
        process = kind.bind_processor(dialect)
        column_values = [row[i] for row in values]
        if process is not None:
            column_values = [process(v) for v in column_values]
        number = _python_type(kind)
        if number in (float, int):
            # An array holds values of one type: a time given as 30 beside 30.5 is 30.0
            # (and a numpy scalar is not JSON).
            column_values = [None if v is None else number(v) for v in column_values]
        type_name = kind.compile(dialect=dialect)
        if few:
            params[f"a{i}"] = column_values
            sources.append(f"%(a{i})b::{type_name}[]")
        else:
            params[f"a{i}"] = _json_array(column_values)
            sources.append(f"json_array_elements_text(%(a{i})s::json)")
            typed.append(f"CAST(e{i} AS {type_name}) AS {_quoted(conn, name)}")
    if few:
        names = ", ".join(_quoted(conn, c) for c in order)
        return f"unnest({', '.join(sources)}) WITH ORDINALITY AS given({names}, given_at)", params
    raw = ", ".join(f"e{i}" for i in range(len(order)))
    return (
        f"(SELECT {', '.join(typed)}, given_at FROM ROWS FROM ({', '.join(sources)}) "
        f"WITH ORDINALITY AS json_rows({raw}, given_at)) AS given",
        params,
    )


#: The encoder of `_json_array` (`json.dumps` with options builds a new one per call).
_ARRAY_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _json_array(values: list[Any]) -> str:
    """Values (str, int, float, bool or None) as a JSON array whose elements PostgreSQL's
    `json_array_elements_text` gives back as the text of each, cast exactly to its
    column's type: a float as its shortest repr, which reads back bit for bit. A
    non-finite float, which JSON cannot hold, is given as a string ('inf', 'nan'),
    which float8's input reads."""
    document = _ARRAY_ENCODER.encode(values)
    if "Infinity" in document or "NaN" in document:  # rare: look closer
        document = _ARRAY_ENCODER.encode(
            [repr(v) if isinstance(v, float) and not math.isfinite(v) else v for v in values]
        )
    return document


def _python_type(kind: Any) -> type | None:
    try:
        return cast(type, kind.python_type)
    except NotImplementedError:
        return None


def _among(conn: Connection, column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN values` with one parameter however many values (an `IN` list of
    thousands is thousands of parameters to bind, expand and parse). On PostgreSQL up to
    `FEW` values are one array parameter, `column = ANY(array)`, whose length the planner
    sees (an index lookup for one id in a large table); more are one JSON array read by
    `json_array_elements_text` (`_json_array`: psycopg dumps an array parameter element by
    element in Python), each value cast to the column's type. On SQLite `column IN
    (SELECT value FROM json_each(list))`."""
    if conn.dialect.name == "postgresql":
        if len(values) <= FEW:
            return cast(
                ColumnElement[bool], column == any_(literal(list(values), ARRAY(column.type)))
            )
        document = sql_cast(literal(_json_array(list(values)), String()), postgresql.JSON())
        each = func.json_array_elements_text(document).table_valued("value")
        return cast(ColumnElement[bool], column.in_(select(sql_cast(each.c.value, column.type))))
    each = func.json_each(literal(json.dumps(list(values)), String())).table_valued("value")
    return cast(ColumnElement[bool], column.in_(select(each.c.value)))


def _quoted(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote(name)


def _task(row: Row[Any]) -> TaskRecord:
    return TaskRecord(
        row.task_id,
        row.job_id,
        row.status,
        row.instance_id,
        row.target_instance_id,
        row.progress,
        row.checkpoint,
        row.updated_at,
        row.attempt,
        row.failures,
        row.status_since,
        row.reason,
        row.throughput,
        tuple(row.gpus),
        row.moves,
        row.retries,
        row.failure,
        row.retry_at,
        row.drain_from,
    )


def _instance(row: Row[Any], history: Iterable[tuple[str, float]]) -> InstanceRecord:
    return InstanceRecord(
        row.instance_id,
        row.instance_type,
        row.status,
        row.hourly_price,
        row.requested_at,
        row.cloud_id,
        row.zone,
        tuple(history),
        row.ready_at,
        row.lost_at,
        row.reason,
        row.private_address,
        row.reclaimed_at,
        row.on_demand_price,
    )


def _instance_of(values: list[Any], history: Iterable[tuple[str, float]]) -> InstanceRecord:
    """An instance record from its row's `INSTANCE_FIELDS` values, in that order."""
    values.insert(HISTORY_FIELD, tuple(history))
    return InstanceRecord(*values)


def _interval(row: Row[Any]) -> UptimeRecord:
    return UptimeRecord(row.instance_id, row.instance_type, row.hourly_price, row.start, row.end)


class _PlacementWrites:
    """The placement ledger's writes of a batch of task steps: the placements open
    before the batch that close, and the rows to insert (closed already when a task
    entered and left within the batch)."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.opened: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}  # task -> its row opened in this batch

    def add(self, step: transitions.TaskStep, at: float) -> None:
        task_id = step.task.task_id
        if step.leaves:
            row = self._open.pop(task_id, None)
            if row is None:
                self.closed.append(task_id)
            else:
                row["end"] = at
        if step.enters is not None:
            p = step.enters
            row = {
                "task_id": p.task_id,
                "job_id": p.job_id,
                "instance_id": p.instance_id,
                "attempt": p.attempt,
                "start": p.start,
                "end": p.end,
            }
            self.opened.append(row)
            self._open[task_id] = row
