"""Jobs, tasks and instances: a row version set by the database on every write.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

A round's snapshot then reads only the rows written since the previous one and merges
them into it (`state.store.SqlStore.snapshot`), whoever wrote them: the daemon, its
API's submissions and cancellations, or another process. Triggers set the version, so
no writer can forget to.

- PostgreSQL: the writing transaction's id (`pg_current_xact_id()`, 64 bits, never
  wrapping). Transactions commit out of order, so a reader does not read "above the
  newest version it saw" but from its previous snapshot's xmin, the oldest transaction
  still running then: every row written by a transaction that snapshot could not see
  has a version at or above it.
- SQLite: one more than the table's largest version. Writers hold the database's
  write lock for their whole transaction (`BEGIN IMMEDIATE`), so a row written after
  a reader's snapshot always gets a version above the largest that reader saw.

Rows written before this revision keep version 0: a store's first snapshot reads
everything anyway.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TABLES = ("jobs", "tasks", "instances")
FUNCTION = "autoscaler_row_version"


def upgrade() -> None:
    for table in TABLES:
        # Plain ADD COLUMN (as 0008, 0011, 0012): a batch copy would trip SQLite's foreign keys.
        op.add_column(
            table, sa.Column("version", sa.BigInteger(), nullable=False, server_default="0")
        )
        op.create_index(f"ix_{table}_version", table, ["version"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN NEW.version := pg_current_xact_id()::text::bigint; RETURN NEW; END $$"
        )
        for table in TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_version BEFORE INSERT OR UPDATE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
            )
        return
    for table in TABLES:
        bump = (
            f"UPDATE {table} SET version = (SELECT coalesce(max(version), 0) + 1 FROM {table}) "
            "WHERE rowid = NEW.rowid;"
        )
        op.execute(
            f"CREATE TRIGGER {table}_version_insert AFTER INSERT ON {table} BEGIN {bump} END"
        )
        # Not on its own write of the version (were recursive triggers ever turned on).
        op.execute(
            f"CREATE TRIGGER {table}_version_update AFTER UPDATE ON {table} "
            f"WHEN NEW.version = OLD.version BEGIN {bump} END"
        )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table in TABLES:
        if postgresql:
            op.execute(f"DROP TRIGGER {table}_version ON {table}")
        else:
            op.execute(f"DROP TRIGGER {table}_version_insert")
            op.execute(f"DROP TRIGGER {table}_version_update")
        op.drop_index(f"ix_{table}_version", table)
        op.execute(f'ALTER TABLE {table} DROP COLUMN "version"')
    if postgresql:
        op.execute(f"DROP FUNCTION {FUNCTION}()")
