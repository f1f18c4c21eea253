"""Teams' limits set through the API (`autoscaler team set`), over the config's defaults.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

Each column set overrides the same key of the config's `[teams.NAME]`; NULL leaves the
config's value. The daemon reads them before each round, so a change takes effect at the
next round without a restart.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "team_settings",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("weight", sa.Double(), nullable=True),
        sa.Column("max_hourly_spend", sa.Double(), nullable=True),
        sa.Column("max_share", sa.Double(), nullable=True),
        sa.Column("daily_budget", sa.Double(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("max_priority", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("updated_by", sa.String(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_team_settings")),
    )


def downgrade() -> None:
    op.drop_table("team_settings")
