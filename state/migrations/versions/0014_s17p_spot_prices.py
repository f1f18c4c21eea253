"""Spot prices of the cluster's last refresh, kept in the state, dated.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27

`spot_prices`: per region, type and zone, the spot price the cluster last refreshed
from its provider (`DescribeSpotPriceHistory`), with when (`retrieved_at`) and where
from. A daemon restarted on any machine reads them at start, so its quotes and its
first plan use them rather than the bundled snapshot. No existing row changes: the
price segments of a running spot instance are rows of `uptime_intervals` already.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spot_prices",
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("price", sa.Double(), nullable=False),
        sa.Column("retrieved_at", sa.Double(), nullable=False),
        sa.Column("source", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("region", "instance_type", "zone", name=op.f("pk_spot_prices")),
    )


def downgrade() -> None:
    op.drop_table("spot_prices")
