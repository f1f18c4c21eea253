"""Jobs: the owner's team at submission, whose fair share of a binding budget they spend.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

Teams share the cluster's `max_hourly_spend` by weight (`autoscaler.fairshare`); a job
counts against the team its owner belonged to when it was submitted, so moving a user
to another team later does not move the spend already admitted.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


# Plain ADD/DROP COLUMN (native on PostgreSQL and on SQLite 3.35+): a batch "copy and
# recreate" of jobs, which tasks refer to, would trip SQLite's foreign keys.


def upgrade() -> None:
    op.add_column("jobs", sa.Column("team", sa.String(), server_default="", nullable=False))


def downgrade() -> None:
    op.execute('ALTER TABLE jobs DROP COLUMN "team"')
