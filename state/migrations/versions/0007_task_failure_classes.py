"""Tasks: moves and retries counted apart, the class of the latest failure, the back-off,
and the instance the operator drained a task (only) off.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Only the job's own failures count toward `max_attempts` (`failures`); the
infrastructure's are retried at once, counted in `retries`; the plan's moves in
`moves`. A transient failure's back-off (`retry_at`) is state, so a restarted
daemon keeps it. `drain_from`: `drain --job` moves one job's tasks off an
instance, not every task on it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("moves", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("retries", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("failure", sa.String(16), nullable=True))
        batch.add_column(sa.Column("retry_at", sa.Double(), nullable=True))
        batch.add_column(sa.Column("drain_from", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        for name in ("drain_from", "retry_at", "failure", "retries", "moves"):
            batch.drop_column(name)
