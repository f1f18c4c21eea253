"""Phase delays: how long each phase of a task's attempt took, per instance type.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Workers time each attempt's phases (fetch, build, start, init, checkpoint,
upload); task updates fold them into one bounded running mean per (instance
type, phase), which the migration criterion prices moves with (Eva §4.5).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "phase_delays",
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("mean_s", sa.Double(), nullable=False),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("instance_type", "phase", name=op.f("pk_phase_delays")),
    )


def downgrade() -> None:
    op.drop_table("phase_delays")
