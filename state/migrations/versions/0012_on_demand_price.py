"""Instances: the on-demand price of their EC2 type at the request.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26

What a spot instance saved against on-demand is its hours at the on-demand price of
its type when it was bought, less what it was bought at: a later catalog price would
rewrite past savings. Instances requested before this column have none (NULL); the
cost report falls back to the catalog's current price for them and says so.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0008, 0011): a batch copy of instances would trip SQLite's
    # foreign keys.
    op.add_column("instances", sa.Column("on_demand_price", sa.Double(), nullable=True))


def downgrade() -> None:
    op.execute('ALTER TABLE instances DROP COLUMN "on_demand_price"')
