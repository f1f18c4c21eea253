"""The round as a reconciler: attempts, timeouts and reasons; demands stored once.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

- tasks: `attempt` (the executor's idempotency key), `failures`, `status_since`
  (timeouts), `reason`, last raw `throughput`, `gpus` (device indices);
- jobs: `reason` (why it failed), `solo_throughput` (learned when the spec has none);
- instances: `ready_at` / `lost_at` (its worker), `reason`; transitions: `reason`;
- rounds: `job_events` (had-event detection that survives a restart);
- round actions may be `report` (an orphan reported, not terminated);
- `task_demands` is dropped: the spec document holds the demands, and was the
  only copy ever read;
- spec documents move to the three-part job spec (planning, what runs, trace facts).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_KINDS_BEFORE = "'launch', 'terminate', 'start', 'migrate', 'stop', 'adopt'"
_KINDS_AFTER = _KINDS_BEFORE + ", 'report'"


#: Columns added, per table. Plain ADD/DROP COLUMN (native on PostgreSQL and on SQLite
#: 3.35+): a batch "copy and recreate" of a table other tables refer to would trip
#: SQLite's foreign keys once it holds data.
_ADDED: dict[str, list[sa.Column]] = {
    "tasks": [
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("status_since", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("throughput", sa.Double(), nullable=True),
        sa.Column("gpus", sa.Text(), server_default="[]", nullable=False),
    ],
    "jobs": [
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("solo_throughput", sa.Double(), nullable=True),
    ],
    "instances": [
        sa.Column("ready_at", sa.Double(), nullable=True),
        sa.Column("lost_at", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
    ],
    "instance_transitions": [sa.Column("reason", sa.Text(), server_default="", nullable=False)],
    "rounds": [sa.Column("job_events", sa.Integer(), server_default="0", nullable=False)],
}


def upgrade() -> None:
    for table, columns in _ADDED.items():
        for column in columns:
            op.add_column(table, column)
    # Nothing refers to round_actions: its CHECK constraint can be changed by recreating it.
    with op.batch_alter_table("round_actions") as batch:
        batch.drop_constraint(op.f("ck_round_actions_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_round_actions_kind"), f"kind IN ({_KINDS_AFTER})")
    op.drop_table("task_demands")
    op.execute("UPDATE tasks SET status_since = updated_at")
    _rewrite_specs(_to_three_parts)


def downgrade() -> None:
    _rewrite_specs(_to_flat)
    op.create_table(
        "task_demands",
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(), nullable=False),
        sa.Column("gpu", sa.Double(), nullable=False),
        sa.Column("cpu", sa.Double(), nullable=False),
        sa.Column("ram_gb", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.task_id"], name=op.f("fk_task_demands_task_id_tasks")
        ),
        sa.PrimaryKeyConstraint("task_id", "position", name=op.f("pk_task_demands")),
    )
    conn = op.get_bind()
    demands = sa.table(
        "task_demands",
        *(sa.column(name) for name in ("task_id", "position", "family", "gpu", "cpu", "ram_gb")),
    )
    rows = [
        {
            "task_id": task["task_id"],
            "position": i,
            "family": family,
            "gpu": vector[0],
            "cpu": vector[1],
            "ram_gb": vector[2],
        }
        for document in _specs(conn).values()
        for task in document.get("tasks", [])
        for i, (family, vector) in enumerate(task["demands"])
    ]
    if rows:
        conn.execute(sa.insert(demands), rows)
    with op.batch_alter_table("round_actions") as batch:
        batch.drop_constraint(op.f("ck_round_actions_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_round_actions_kind"), f"kind IN ({_KINDS_BEFORE})")
    for table, columns in _ADDED.items():
        for column in reversed(columns):
            op.execute(f'ALTER TABLE {table} DROP COLUMN "{column.name}"')


_JOBS = sa.table("jobs", sa.column("id", sa.Integer()), sa.column("spec", sa.Text()))


def _specs(conn: sa.Connection) -> dict[int, dict]:
    return {row.id: json.loads(row.spec) for row in conn.execute(sa.select(_JOBS)).all()}


def _rewrite_specs(convert) -> None:
    conn = op.get_bind()
    for job_id, document in _specs(conn).items():
        converted = convert(document)
        if converted is not None:
            conn.execute(
                sa.update(_JOBS).where(_JOBS.c.id == job_id).values(spec=json.dumps(converted))
            )


def _to_three_parts(document: dict) -> dict | None:
    if "trace" in document:
        return None
    document["trace"] = {
        "arrival_time_s": document.pop("arrival_time_s", 0.0),
        "duration_s": document.pop("duration_s", None),
        "total_iters": document.pop("total_iters", None),
    }
    for task in document.get("tasks", []):
        task["run"] = {"image": task.pop("image_id", None)}
    return document


def _to_flat(document: dict) -> dict | None:
    if "trace" not in document:
        return None
    document.update(document.pop("trace") or {})
    for task in document.get("tasks", []):
        task["image_id"] = (task.pop("run", None) or {}).get("image")
    return document
