"""Placements: which task occupied which instance when, for cost attribution.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

A second ledger beside `uptime_intervals`: task updates open a placement when
a task lands on an instance and close it when it leaves, so a cost report can
split each instance's bill among the jobs that used it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("end", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_placements_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_placements")),
    )
    op.create_index(op.f("ix_placements_instance_id"), "placements", ["instance_id"])
    op.create_index(op.f("ix_placements_job_id"), "placements", ["job_id"])
    op.create_index(
        "uq_placements_open",
        "placements",
        ["task_id"],
        unique=True,
        sqlite_where=sa.text('"end" IS NULL'),
        postgresql_where=sa.text('"end" IS NULL'),
    )
    # Tasks already on an instance get an open placement from their last update.
    op.execute(
        'INSERT INTO placements (task_id, job_id, instance_id, attempt, start, "end") '
        "SELECT task_id, job_id, instance_id, attempt, COALESCE(status_since, updated_at, 0), "
        "NULL FROM tasks WHERE instance_id IS NOT NULL "
        "AND status IN ('starting', 'running', 'checkpointing')"
    )


def downgrade() -> None:
    op.drop_table("placements")
