"""Initial state schema: jobs, tasks, instances and their history, throughput, rounds, ledger.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

A migration is a historical record: it spells out the tables as they were at
this revision instead of importing the models (which will move on).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

INSTANCE_STATUSES = (
    "'requested', 'pending', 'running', 'draining', 'terminating', 'terminated', 'failed'"
)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("spec", sa.Text(), nullable=False),  # JSON document of the JobSpec
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'completed', 'cancelled', 'failed')",
            name=op.f("ck_jobs_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("job_id", name=op.f("uq_jobs_job_id")),
    )
    op.create_index(op.f("ix_jobs_status"), "jobs", ["status"])

    op.create_table(
        "tasks",
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=True),
        sa.Column("target_instance_id", sa.String(), nullable=True),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'starting', 'running', 'checkpointing', 'completed', "
            "'cancelled', 'failed')",
            name=op.f("ck_tasks_status"),
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"], name=op.f("fk_tasks_job_id_jobs")),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
    )
    op.create_index(op.f("ix_tasks_job_id_position"), "tasks", ["job_id", "position"], unique=True)
    op.create_index(op.f("ix_tasks_workload"), "tasks", ["workload"])
    op.create_index(op.f("ix_tasks_instance_id"), "tasks", ["instance_id"])

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

    op.create_table(
        "instances",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("hourly_price", sa.Double(), nullable=False),
        sa.Column("requested_at", sa.Double(), nullable=False),
        sa.Column("cloud_id", sa.String(), nullable=True),
        sa.Column("zone", sa.String(), nullable=True),
        sa.CheckConstraint(f"status IN ({INSTANCE_STATUSES})", name=op.f("ck_instances_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
        sa.UniqueConstraint("instance_id", name=op.f("uq_instances_instance_id")),
    )
    op.create_index(op.f("ix_instances_status"), "instances", ["status"])

    op.create_table(
        "instance_transitions",
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.CheckConstraint(
            f"status IN ({INSTANCE_STATUSES})", name=op.f("ck_instance_transitions_status")
        ),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.instance_id"],
            name=op.f("fk_instance_transitions_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("instance_id", "seq", name=op.f("pk_instance_transitions")),
    )

    op.create_table(
        "throughput",
        sa.Column("workload", sa.String(), nullable=False),
        sa.Column("colocated", sa.Text(), nullable=False),
        sa.Column("throughput", sa.Double(), nullable=False),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("workload", "colocated", name=op.f("pk_throughput")),
    )

    op.create_table(
        "rounds",
        sa.Column("round_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("planner", sa.String(), nullable=False),
        sa.Column("chosen", sa.String(), nullable=False),
        sa.Column("had_event", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("numbers", sa.Text(), nullable=False),  # JSON document
        sa.PrimaryKeyConstraint("round_id", name=op.f("pk_rounds")),
    )

    op.create_table(
        "round_actions",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),  # JSON document
        sa.CheckConstraint(
            "kind IN ('launch', 'terminate', 'start', 'migrate', 'stop', 'adopt')",
            name=op.f("ck_round_actions_kind"),
        ),
        sa.CheckConstraint(
            "outcome IN ('planned', 'done', 'refused', 'failed', 'skipped')",
            name=op.f("ck_round_actions_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["rounds.round_id"], name=op.f("fk_round_actions_round_id_rounds")
        ),
        sa.PrimaryKeyConstraint("round_id", "position", name=op.f("pk_round_actions")),
    )

    op.create_table(
        "uptime_intervals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("hourly_price", sa.Double(), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("end", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.instance_id"],
            name=op.f("fk_uptime_intervals_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_uptime_intervals")),
    )
    op.create_index(op.f("ix_uptime_intervals_start"), "uptime_intervals", ["start"])
    # At most one open interval per instance.
    op.create_index(
        "uq_uptime_intervals_open",
        "uptime_intervals",
        ["instance_id"],
        unique=True,
        sqlite_where=sa.text('"end" IS NULL'),
        postgresql_where=sa.text('"end" IS NULL'),
    )


def downgrade() -> None:
    for table in (
        "uptime_intervals",
        "round_actions",
        "rounds",
        "throughput",
        "instance_transitions",
        "instances",
        "task_demands",
        "tasks",
        "jobs",
    ):
        op.drop_table(table)
