"""Users with roles and hashed tokens, and the audit log of API calls.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Each user of the API has a role (admin, submit, read), a team, and a token
stored only as its scrypt hash; the previous hash survives a rotation for an
overlap. Every API call is recorded: who, what, when, and its outcome.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("user_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(), nullable=False),
        sa.Column("previous_hash", sa.String(), nullable=True),
        sa.Column("previous_until", sa.Double(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("rotated_at", sa.Double(), nullable=True),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.CheckConstraint("role IN ('admin', 'submit', 'read')", name=op.f("ck_users_role")),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("user_name", sa.String(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("method", sa.String(), nullable=False),
        sa.Column("target", sa.String(), server_default="", nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.Column("peer", sa.String(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
    )
    op.create_index(op.f("ix_audit_at"), "audit", ["at"])
    op.create_index(op.f("ix_audit_user_name"), "audit", ["user_name"])


def downgrade() -> None:
    op.drop_index(op.f("ix_audit_user_name"), table_name="audit")
    op.drop_index(op.f("ix_audit_at"), table_name="audit")
    op.drop_table("audit")
    op.drop_table("users")
