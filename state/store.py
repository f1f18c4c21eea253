"""`SqlStore`: the `Store` interface in SQLite or PostgreSQL.

It mirrors `state.memory.InMemoryStore` transition for transition; what SQL
adds is that state survives the process and that several processes (the
daemon's round, a submission API, the CLI) can use it at once:

- **One transition, one transaction.** Every method that changes state runs in
  one write transaction, so a process killed at any point leaves either all of
  a transition or none of it.
- **Finished is final, under concurrency too.** A transition that touches a job
  or its tasks first locks the job's row (`SELECT … FOR UPDATE` on PostgreSQL;
  on SQLite `BEGIN IMMEDIATE` holds the database's write lock for the whole
  transaction) and only then reads its status. A cancellation committed while a
  round was planning is therefore seen by the round's writes, which leave the job
  alone; a cancellation still in flight makes them wait for it. Instance
  transitions lock the instance's row the same way, so two processes cannot both
  move it from the same status.
- **Snapshots are consistent**: `snapshot()` reads every table in one read
  transaction (REPEATABLE READ on PostgreSQL; on SQLite in WAL mode a read
  transaction sees the database as of its first read), without blocking writers.

Opening a database whose schema is missing or not at the head revision raises
`SchemaOutdated`, whose message says to run `autoscaler db upgrade --url …`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from autoscaler.jobs import JobSpec, spec_document, spec_from_document
from autoscaler.store import (
    BILLED_STATUSES,
    FINAL_INSTANCE_STATUSES,
    FINAL_JOB_STATUSES,
    TRANSITIONS,
    ActionRecord,
    DuplicateJob,
    IllegalTransition,
    InstanceChange,
    InstanceRecord,
    InstanceStatus,
    JobRecord,
    JobStatus,
    RoundIntents,
    RoundRecord,
    StateSnapshot,
    StoreError,
    TaskRecord,
    TaskStatus,
    TaskUpdate,
    UnknownEntity,
)
from autoscaler.store import Placement as PlacementRecord
from autoscaler.store import UptimeInterval as UptimeRecord
from autoscaler.throughput import DEFAULT_THROUGHPUT, Colocated, ThroughputEntry, ThroughputTable
from state.database import create_state_engine, read_transaction, write_transaction
from state.migrate import check_schema
from state.schema import (
    Instance,
    InstanceTransition,
    Job,
    Placement,
    Round,
    RoundAction,
    Task,
    Throughput,
    UptimeInterval,
    colocated_from_key,
    colocated_key,
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

#: Ids per `IN (…)` list: well under SQLite's and PostgreSQL's bound-parameter limits.
CHUNK = 5000


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


class SqlStore:
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
    def submit_job(self, job: JobSpec, *, owner: str, at: float) -> JobRecord:
        try:
            with write_transaction(self._engine) as conn:
                taken = conn.execute(select(JOBS.c.id).where(JOBS.c.job_id == job.job_id))
                if taken.first() is not None:
                    raise DuplicateJob(job.job_id)
                conn.execute(
                    insert(JOBS).values(
                        job_id=job.job_id,
                        name=job.name,
                        owner=owner,
                        status="queued",
                        submitted_at=at,
                        spec=spec_document(job),
                    )
                )
                if job.tasks:
                    conn.execute(
                        insert(TASKS), [_task_row(job, i, at) for i in range(len(job.tasks))]
                    )
        except IntegrityError as exc:
            # Two submissions of one job id raced (PostgreSQL: the second waits on the
            # unique index and fails), or a task id is already another job's.
            if self.job(job.job_id) is not None:
                raise DuplicateJob(job.job_id) from None
            raise StoreError(f"job {job.job_id!r} conflicts with stored data: {exc.orig}") from None
        return JobRecord(job, "queued", owner, at)

    def cancel_job(self, job_id: str, at: float) -> bool:
        return self._finish(job_id, at, "cancelled", "cancelled", "cancelled by the user")

    def job_started(self, job_id: str, at: float) -> bool:
        with write_transaction(self._engine) as conn:
            result = conn.execute(
                update(JOBS)
                .where(
                    JOBS.c.job_id == job_id,
                    JOBS.c.status.not_in(FINAL_JOB_STATUSES),
                    JOBS.c.started_at.is_(None),
                )
                .values(status="running", started_at=at)
            )
            return result.rowcount == 1

    def job_finished(
        self, job_id: str, at: float, status: JobStatus = "completed", reason: str = ""
    ) -> bool:
        task_status = "completed" if status == "completed" else "failed"
        return self._finish(job_id, at, status, task_status, reason)

    def learn_solo_throughput(self, job_id: str, throughput: float) -> bool:
        with write_transaction(self._engine) as conn:
            known = conn.execute(
                select(JOBS.c.solo_throughput).where(JOBS.c.job_id == job_id).with_for_update()
            ).first()
            if known is None:
                raise UnknownEntity(f"no job {job_id!r}")
            if known.solo_throughput is not None:
                return False
            conn.execute(
                update(JOBS).where(JOBS.c.job_id == job_id).values(solo_throughput=throughput)
            )
            return True

    def _finish(self, job_id: str, at: float, status: str, task_status: str, reason: str) -> bool:
        with write_transaction(self._engine) as conn:
            current = conn.execute(
                select(JOBS.c.status).where(JOBS.c.job_id == job_id).with_for_update()
            ).scalar_one_or_none()
            if current is None:
                raise UnknownEntity(f"no job {job_id!r}")
            if current in FINAL_JOB_STATUSES:
                return False
            conn.execute(
                update(JOBS)
                .where(JOBS.c.job_id == job_id)
                .values(status=status, finished_at=at, reason=reason)
            )
            conn.execute(
                update(TASKS)
                .where(TASKS.c.job_id == job_id)
                .values(status=task_status, target_instance_id=None, updated_at=at, status_since=at)
            )
            conn.execute(
                update(PLACEMENTS)
                .where(PLACEMENTS.c.job_id == job_id, PLACEMENTS.c.end.is_(None))
                .values(end=at)
            )
            return True

    @staticmethod
    def _lock_active_jobs(conn: Connection, job_ids: Iterable[str]) -> set[str]:
        """Lock these jobs' rows (in id order, so lockers never deadlock) and return
        those not finished. Their tasks may then be written."""
        active: set[str] = set()
        for chunk in _chunks(sorted(set(job_ids))):
            rows = conn.execute(
                select(JOBS.c.job_id, JOBS.c.status)
                .where(JOBS.c.job_id.in_(chunk))
                .order_by(JOBS.c.job_id)
                .with_for_update()
            )
            active.update(r.job_id for r in rows if r.status not in FINAL_JOB_STATUSES)
        return active

    # -- tasks ------------------------------------------------------------
    def assign_tasks(self, targets: Mapping[str, str | None], at: float) -> set[str]:
        with write_transaction(self._engine) as conn:
            return self._assign(conn, targets, at)

    def _assign(self, conn: Connection, targets: Mapping[str, str | None], at: float) -> set[str]:
        task_ids = list(targets)
        job_of: dict[str, str] = {}
        unchanged: set[str] = set()
        for chunk in _chunks(task_ids):
            rows = conn.execute(
                select(TASKS.c.task_id, TASKS.c.job_id, TASKS.c.target_instance_id).where(
                    TASKS.c.task_id.in_(chunk)
                )
            )
            for r in rows:
                job_of[r.task_id] = r.job_id
                if r.target_instance_id == targets[r.task_id]:
                    unchanged.add(r.task_id)
        active = self._lock_active_jobs(conn, {job_of[t] for t in job_of if t not in unchanged})
        # A task whose target is already as asked needs no write (a round rewrites few).
        updated = sorted(
            tid for tid, jid in job_of.items() if jid in active and tid not in unchanged
        )
        if updated:
            conn.execute(
                update(TASKS)
                .where(TASKS.c.task_id == bindparam("b_task"))
                .values(target_instance_id=bindparam("b_target"), updated_at=bindparam("b_at")),
                [{"b_task": tid, "b_target": targets[tid], "b_at": at} for tid in updated],
            )
        done = set(updated)
        if unchanged:
            finished = {
                r.job_id
                for chunk in _chunks(sorted({job_of[t] for t in unchanged}))
                for r in conn.execute(
                    select(JOBS.c.job_id).where(
                        JOBS.c.job_id.in_(chunk), JOBS.c.status.in_(FINAL_JOB_STATUSES)
                    )
                )
            }
            done |= {t for t in unchanged if job_of[t] not in finished}
        return done

    def update_tasks(self, updates: Iterable[TaskUpdate], at: float) -> set[str]:
        changes = list(updates)
        if not changes:
            return set()
        with write_transaction(self._engine) as conn:
            current: dict[str, Row[Any]] = {}
            for chunk in _chunks([c.task_id for c in changes]):
                rows = conn.execute(
                    select(
                        TASKS.c.task_id,
                        TASKS.c.job_id,
                        TASKS.c.status,
                        TASKS.c.instance_id,
                        TASKS.c.attempt,
                    ).where(TASKS.c.task_id.in_(chunk))
                )
                current.update((r.task_id, r) for r in rows)
            unknown = [c.task_id for c in changes if c.task_id not in current]
            if unknown:
                raise UnknownEntity(f"no task {unknown[0]!r}")
            active = self._lock_active_jobs(conn, {r.job_id for r in current.values()})
            # One executemany per set of changed columns (a round changes the same few).
            batches: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            done: set[str] = set()
            moved: list[tuple[Row[Any], TaskUpdate]] = []
            for change in changes:
                row = current[change.task_id]
                if row.job_id not in active:
                    continue
                if change.instance_id != "keep" and change.instance_id != row.instance_id:
                    moved.append((row, change))
                values = _task_values(change, row.status, at)
                batches.setdefault(tuple(sorted(values)), []).append(
                    {"b_task": change.task_id, **{f"b_{k}": v for k, v in values.items()}}
                )
                done.add(change.task_id)
            for columns, rows in batches.items():
                conn.execute(
                    update(TASKS)
                    .where(TASKS.c.task_id == bindparam("b_task"))
                    .values(**{column: bindparam(f"b_{column}") for column in columns}),
                    rows,
                )
            if moved:
                self._close_placements(conn, [row.task_id for row, _ in moved], at)
                opened = [
                    {
                        "task_id": row.task_id,
                        "job_id": row.job_id,
                        "instance_id": change.instance_id,
                        "attempt": change.attempt if change.attempt is not None else row.attempt,
                        "start": at,
                        "end": None,
                    }
                    for row, change in moved
                    if change.instance_id is not None
                ]
                if opened:
                    conn.execute(insert(PLACEMENTS), opened)
            return done

    @staticmethod
    def _close_placements(conn: Connection, task_ids: Sequence[str], at: float) -> None:
        for chunk in _chunks(sorted(task_ids)):
            conn.execute(
                update(PLACEMENTS)
                .where(PLACEMENTS.c.task_id.in_(chunk), PLACEMENTS.c.end.is_(None))
                .values(end=at)
            )

    def update_task(
        self,
        task_id: str,
        at: float,
        *,
        status: TaskStatus | None = None,
        instance_id: str | Literal["keep"] | None = "keep",
        progress: float | None = None,
        checkpoint: str | None = None,
    ) -> bool:
        change = TaskUpdate(task_id, status, instance_id, progress, checkpoint)
        return bool(self.update_tasks([change], at))

    # -- instances --------------------------------------------------------
    def request_instance(
        self, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> InstanceRecord:
        with write_transaction(self._engine) as conn:
            self._request(conn, instance_id, instance_type, hourly_price, at)
            return self._instances(conn, INSTANCES.c.instance_id == instance_id)[0]

    def _request(
        self, conn: Connection, instance_id: str, instance_type: str, hourly_price: float, at: float
    ) -> None:
        self._request_many(conn, [(instance_id, instance_type, hourly_price)], at)

    def _request_many(
        self, conn: Connection, requests: Sequence[tuple[str, str, float]], at: float
    ) -> None:
        """Record instances before asking the cloud; a token already recorded stands as it is."""
        wanted = {instance_id: (itype, price) for instance_id, itype, price in requests}
        if not wanted:
            return
        taken: set[str] = set()
        for chunk in _chunks(sorted(wanted)):
            taken.update(
                conn.execute(
                    select(INSTANCES.c.instance_id).where(INSTANCES.c.instance_id.in_(chunk))
                ).scalars()
            )
        new = [i for i in wanted if i not in taken]
        if not new:
            return
        conn.execute(
            insert(INSTANCES),
            [
                {
                    "instance_id": i,
                    "instance_type": wanted[i][0],
                    "status": "requested",
                    "hourly_price": wanted[i][1],
                    "requested_at": at,
                }
                for i in new
            ],
        )
        conn.execute(
            insert(HISTORY),
            [{"instance_id": i, "seq": 0, "status": "requested", "at": at} for i in new],
        )

    def transition_instance(
        self,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        *,
        cloud_id: str | None = None,
        zone: str | None = None,
        reason: str = "",
    ) -> bool:
        with write_transaction(self._engine) as conn:
            return self._transition(conn, instance_id, status, at, cloud_id, zone, reason)

    def _transition(
        self,
        conn: Connection,
        instance_id: str,
        status: InstanceStatus,
        at: float,
        cloud_id: str | None = None,
        zone: str | None = None,
        reason: str = "",
    ) -> bool:
        change = InstanceChange(instance_id, status, cloud_id, zone, reason)
        return bool(self._transition_many(conn, [change], at))

    def _transition_many(
        self, conn: Connection, changes: Sequence[InstanceChange], at: float
    ) -> set[str]:
        """Instance transitions in one transaction, a few statements for any number:
        rows locked in id order, each change checked against the status machine, then
        the instances, their histories and the ledger written in bulk. Returns the
        instances that changed (one already in its status is left alone)."""
        if not changes:
            return set()
        rows: dict[str, Row[Any]] = {}
        ids = sorted({c.instance_id for c in changes})
        for chunk in _chunks(ids):
            for row in conn.execute(
                select(INSTANCES)
                .where(INSTANCES.c.instance_id.in_(chunk))
                .order_by(INSTANCES.c.instance_id)
                .with_for_update()
            ):
                rows[row.instance_id] = row
        seqs: dict[str, int] = {}
        for chunk in _chunks(ids):
            seqs.update(
                conn.execute(
                    select(HISTORY.c.instance_id, func.count())
                    .where(HISTORY.c.instance_id.in_(chunk))
                    .group_by(HISTORY.c.instance_id)
                ).all()
            )
        status_now = {i: r.status for i, r in rows.items()}
        updates, history, opened, closed = [], [], [], []
        changed: set[str] = set()
        for c in changes:
            row = rows.get(c.instance_id)
            if row is None:
                raise UnknownEntity(f"no instance {c.instance_id!r}")
            current = status_now[c.instance_id]
            if current == c.status:
                continue
            if c.status not in TRANSITIONS[current]:
                raise IllegalTransition(c.instance_id, current, c.status)
            status_now[c.instance_id] = c.status
            changed.add(c.instance_id)
            updates.append(
                {
                    "b_id": c.instance_id,
                    "b_status": c.status,
                    "b_cloud": c.cloud_id or row.cloud_id,
                    "b_zone": c.zone or row.zone,
                    "b_address": c.private_address or row.private_address,
                    "b_reason": c.reason,
                }
            )
            seq = seqs.get(c.instance_id, 0)
            seqs[c.instance_id] = seq + 1
            history.append(
                {
                    "instance_id": c.instance_id,
                    "seq": seq,
                    "status": c.status,
                    "at": at,
                    "reason": c.reason,
                }
            )
            billed_before = current in BILLED_STATUSES
            billed_after = c.status in BILLED_STATUSES
            if billed_after and not billed_before:
                # Billing runs from the launch request (the cloud bills from then on),
                # at the price recorded with the request.
                opened.append(
                    {
                        "instance_id": c.instance_id,
                        "instance_type": row.instance_type,
                        "hourly_price": row.hourly_price,
                        "start": row.requested_at,
                        "end": None,
                    }
                )
            elif billed_before and not billed_after:
                closed.append({"b_id": c.instance_id, "b_end": at})
        if updates:
            conn.execute(
                update(INSTANCES)
                .where(INSTANCES.c.instance_id == bindparam("b_id"))
                .values(
                    status=bindparam("b_status"),
                    cloud_id=bindparam("b_cloud"),
                    zone=bindparam("b_zone"),
                    private_address=bindparam("b_address"),
                    reason=bindparam("b_reason"),
                ),
                updates,
            )
            conn.execute(insert(HISTORY), history)
        if opened:
            conn.execute(insert(LEDGER), opened)
        if closed:
            conn.execute(
                update(LEDGER)
                .where(LEDGER.c.instance_id == bindparam("b_id"), LEDGER.c.end.is_(None))
                .values(end=bindparam("b_end")),
                closed,
            )
        return changed

    def transition_instances(self, changes: Iterable[InstanceChange], at: float) -> None:
        with write_transaction(self._engine) as conn:
            self._transition_many(conn, list(changes), at)

    def instance_worker(
        self, instance_id: str, at: float, *, ready: bool, reason: str = ""
    ) -> bool:
        column = INSTANCES.c.ready_at if ready else INSTANCES.c.lost_at
        values: dict[str, Any] = {"ready_at": at} if ready else {"lost_at": at, "reason": reason}
        with write_transaction(self._engine) as conn:
            found = conn.execute(
                select(column).where(INSTANCES.c.instance_id == instance_id).with_for_update()
            ).first()
            if found is None:
                raise UnknownEntity(f"no instance {instance_id!r}")
            if found[0] is not None:
                return False
            conn.execute(
                update(INSTANCES).where(INSTANCES.c.instance_id == instance_id).values(**values)
            )
            return True

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
            round_id = int(result.inserted_primary_key[0])
            if record.actions:
                conn.execute(
                    insert(ACTIONS),
                    [
                        {
                            "round_id": round_id,
                            "position": i,
                            "kind": a.kind,
                            "target": a.target,
                            "reason": a.reason,
                            "outcome": a.outcome,
                            "message": a.message,
                            "detail": dict(a.detail),
                        }
                        for i, a in enumerate(record.actions)
                    ],
                )
            if intents is not None:
                at = record.at
                self._request_many(conn, intents.requests, at)
                if intents.targets:
                    self._assign(conn, intents.targets, at)
                self._transition_many(
                    conn,
                    [InstanceChange(i, "draining", reason=why) for i, why in intents.drains]
                    + [InstanceChange(i, s, reason=why) for i, s, why in intents.terminations],
                    at,
                )
            return round_id

    def record_action_outcomes(
        self, round_id: int, outcomes: Iterable[tuple[int, str, str]]
    ) -> None:
        rows = [
            {"b_round": round_id, "b_position": i, "b_outcome": o, "b_message": m}
            for i, o, m in outcomes
        ]
        if not rows:
            return
        with write_transaction(self._engine) as conn:
            conn.execute(
                update(ACTIONS)
                .where(
                    ACTIONS.c.round_id == bindparam("b_round"),
                    ACTIONS.c.position == bindparam("b_position"),
                )
                .values(outcome=bindparam("b_outcome"), message=bindparam("b_message")),
                rows,
            )

    def record_action_outcome(
        self, round_id: int, index: int, outcome: str, message: str = ""
    ) -> None:
        with write_transaction(self._engine) as conn:
            result = conn.execute(
                update(ACTIONS)
                .where(ACTIONS.c.round_id == round_id, ACTIONS.c.position == index)
                .values(outcome=outcome, message=message)
            )
            if result.rowcount != 1:
                raise UnknownEntity(f"no action {index} in round {round_id}")

    # -- reads ------------------------------------------------------------
    def snapshot(
        self, default_throughput: float = DEFAULT_THROUGHPUT, *, with_throughput: bool = True
    ) -> StateSnapshot:
        with read_transaction(self._engine) as conn:
            jobs = self._active_jobs(conn)
            tasks = self._tasks(conn, JOBS.c.status.not_in(FINAL_JOB_STATUSES))
            instances = self._instances(conn, INSTANCES.c.status.not_in(FINAL_INSTANCE_STATUSES))
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
            submitted, finished = conn.execute(
                select(func.count(), func.count(JOBS.c.finished_at)).select_from(JOBS)
            ).one()
        return StateSnapshot(
            tuple(jobs),
            {t.task_id: t for t in tasks},
            tuple(instances),
            ThroughputTable(entries, default_throughput),
            first_round_at,
            int(event_rounds),
            int(full_rounds),
            int(requested),
            int(submitted) + int(finished),
            last_round_job_events,
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

    def uptime(self) -> list[UptimeRecord]:
        with read_transaction(self._engine) as conn:
            return [_interval(r) for r in conn.execute(select(LEDGER).order_by(LEDGER.c.id))]

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

    def _active_jobs(self, conn: Connection) -> list[JobRecord]:
        """Queued and running jobs. A spec never changes once submitted, so the parsed
        specs of active jobs are kept between snapshots (and only theirs: the cache
        holds what is active, however long the daemon runs)."""
        columns = [c for c in JOBS.c if c.name != "spec"]
        rows = conn.execute(
            select(*columns).where(JOBS.c.status.not_in(FINAL_JOB_STATUSES)).order_by(JOBS.c.id)
        ).all()
        cache = self._specs
        missing = [r.id for r in rows if r.id not in cache]
        for chunk in _chunks(missing):
            for r in conn.execute(select(JOBS.c.id, JOBS.c.spec).where(JOBS.c.id.in_(chunk))):
                cache[r.id] = spec_from_document(r.spec)
        self._specs = {r.id: cache[r.id] for r in rows}
        return [
            JobRecord(
                self._specs[r.id],
                r.status,
                r.owner,
                r.submitted_at,
                r.started_at,
                r.finished_at,
                r.reason,
                r.solo_throughput,
            )
            for r in rows
        ]

    @staticmethod
    def _jobs(conn: Connection, where: ColumnElement[bool] | None) -> list[JobRecord]:
        query = select(JOBS).order_by(JOBS.c.id)
        if where is not None:
            query = query.where(where)
        return [
            JobRecord(
                spec_from_document(r.spec),
                r.status,
                r.owner,
                r.submitted_at,
                r.started_at,
                r.finished_at,
                r.reason,
                r.solo_throughput,
            )
            for r in conn.execute(query)
        ]

    @staticmethod
    def _tasks(conn: Connection, job_where: ColumnElement[bool]) -> list[TaskRecord]:
        """Tasks of the jobs matching `job_where`, in job order then spec order."""
        query = (
            select(TASKS)
            .join(JOBS, JOBS.c.job_id == TASKS.c.job_id)
            .where(job_where)
            .order_by(JOBS.c.id, TASKS.c.position)
        )
        return [
            TaskRecord(
                r.task_id,
                r.job_id,
                r.status,
                r.instance_id,
                r.target_instance_id,
                r.progress,
                r.checkpoint,
                r.updated_at,
                r.attempt,
                r.failures,
                r.status_since,
                r.reason,
                r.throughput,
                tuple(r.gpus),
            )
            for r in conn.execute(query)
        ]

    @staticmethod
    def _instances(conn: Connection, where: ColumnElement[bool] | None) -> list[InstanceRecord]:
        """Instances matching `where`, in request order, each with its status history."""
        query = select(INSTANCES).order_by(INSTANCES.c.id)
        history = (
            select(HISTORY.c.instance_id, HISTORY.c.status, HISTORY.c.at)
            .join(INSTANCES, INSTANCES.c.instance_id == HISTORY.c.instance_id)
            .order_by(HISTORY.c.instance_id, HISTORY.c.seq)
        )
        if where is not None:
            query, history = query.where(where), history.where(where)
        histories: dict[str, list[tuple[str, float]]] = {}
        for h in conn.execute(history):
            histories.setdefault(h.instance_id, []).append((h.status, h.at))
        return [_instance(r, histories.get(r.instance_id, ())) for r in conn.execute(query)]


def _task_row(job: JobSpec, position: int, at: float) -> dict[str, Any]:
    task = job.tasks[position]
    return {
        "task_id": task.task_id,
        "job_id": job.job_id,
        "position": position,
        "workload": task.workload,
        "status": "pending",
        "instance_id": None,
        "target_instance_id": None,
        "progress": 0.0,
        "checkpoint": None,
        "updated_at": at,
        "attempt": 0,
        "failures": 0,
        "status_since": at,
        "reason": "",
        "throughput": None,
        "gpus": [],
    }


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
    )


def _interval(row: Row[Any]) -> UptimeRecord:
    return UptimeRecord(row.instance_id, row.instance_type, row.hourly_price, row.start, row.end)


def _task_values(change: TaskUpdate, status: str, at: float) -> dict[str, Any]:
    """The columns a TaskUpdate sets (the rule of `autoscaler.store.updated_task`)."""
    values: dict[str, Any] = {"updated_at": at}
    if change.status is not None:
        values["status"] = change.status
        if change.status != status:
            values["status_since"] = at
    if change.instance_id != "keep":
        values["instance_id"] = change.instance_id
    for name in ("progress", "checkpoint", "attempt", "failures", "reason"):
        value = getattr(change, name)
        if value is not None:
            values[name] = value
    if change.throughput != "keep":
        values["throughput"] = change.throughput
    if change.gpus is not None:
        values["gpus"] = list(change.gpus)
    return values
