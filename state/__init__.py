"""The `Store` bindings: `store.SqlStore` (SQLAlchemy; SQLite or PostgreSQL, with its
schema in `schema` and Alembic migrations) and `memory.InMemoryStore` (replays, tests).
Both pass every change through the rules of `autoscaler.transitions` and store what
they return.

Importing this package loads no SQLAlchemy: `memory` is light, `store` is not.
"""
