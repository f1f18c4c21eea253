"""Instances: the cloud's private address of each, for worker enrollment.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

A worker enrolls by showing the signed identity document of its instance; the
daemon matches the document's instance id and private address to what the
cloud reported for that launch (RunInstances, DescribeInstances), kept here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("private_address", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("private_address")
