"""The `Store` bindings: `store.SqlStore` (SQLAlchemy; SQLite or PostgreSQL, with its
schema in `schema` and Alembic migrations) and `memory.InMemoryStore` (replays, tests).
Both pass every change through the rules of `autoscaler.transitions` and store what
they return. Beside the store, in the same database: `accounts` (users, the audit
log) and `outbox` (notifications, written in the transactions they report).

Importing this package loads no SQLAlchemy: `memory` is light, `store` is not.
"""
