"""The notification outbox: events, their deliveries to webhooks, and the marks of levels.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

A job's end is written to `notify_events` in the transaction that ends it, so a
daemon killed before sending still sends after its restart (at least once, the
event's key telling receivers it is the same). The notifier fans each event out
to one `notify_deliveries` row per subscribed webhook, retried with back-off and
recorded delivered or failed. `notify_marks` keeps the levels whose crossings are
events (a budget's share, the offerings held, the leader).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("dispatched", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notify_events")),
        sa.UniqueConstraint("key", name=op.f("uq_notify_events_key")),
    )
    op.create_index(op.f("ix_notify_events_dispatched"), "notify_events", ["dispatched"])
    op.create_table(
        "notify_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("sink", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.Text(), server_default="", nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')",
            name=op.f("ck_notify_deliveries_status"),
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["notify_events.id"],
            name=op.f("fk_notify_deliveries_event_id_notify_events"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notify_deliveries")),
        sa.UniqueConstraint("event_id", "sink", name=op.f("uq_notify_deliveries_event_id_sink")),
    )
    op.create_index(
        op.f("ix_notify_deliveries_status_next_at"), "notify_deliveries", ["status", "next_at"]
    )
    op.create_table(
        "notify_marks",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_notify_marks")),
    )


def downgrade() -> None:
    op.drop_table("notify_marks")
    op.drop_index(op.f("ix_notify_deliveries_status_next_at"), table_name="notify_deliveries")
    op.drop_table("notify_deliveries")
    op.drop_index(op.f("ix_notify_events_dispatched"), table_name="notify_events")
    op.drop_table("notify_events")
