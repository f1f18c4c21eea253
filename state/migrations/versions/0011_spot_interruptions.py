"""Spot: when an instance was reclaimed, and the cluster's interruption history per offering.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26

`instances.reclaimed_at`: its provider announced it reclaims it (a spot interruption
notice); nothing is placed on it from then on. `interruptions`: each reclaim and
rebalance recommendation with the offering the instance was bought as (its catalog
name: type, market, zone), so an observed interruption rate per offering can refine
the advisor's band. The price an instance was bought at is `instances.hourly_price`
already (the spot price at its request, for a spot offering).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0008): a batch copy of instances would trip SQLite's foreign keys.
    op.add_column("instances", sa.Column("reclaimed_at", sa.Double(), nullable=True))
    op.create_table(
        "interruptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("offering", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.CheckConstraint("kind IN ('reclaim', 'rebalance')", name=op.f("ck_interruptions_kind")),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.instance_id"],
            name=op.f("fk_interruptions_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interruptions")),
    )
    op.create_index(op.f("ix_interruptions_offering_at"), "interruptions", ["offering", "at"])
    op.create_index(
        op.f("ix_interruptions_instance_id_kind"),
        "interruptions",
        ["instance_id", "kind"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_table("interruptions")
    op.execute('ALTER TABLE instances DROP COLUMN "reclaimed_at"')
