"""The `Store` bindings: `store.SqlStore` (SQLAlchemy; SQLite or PostgreSQL, with its
schema in `schema` and Alembic migrations) and `memory.InMemoryStore` (replays, tests).

Importing this package loads no SQLAlchemy: `memory` is light, `store` is not.
"""
