"""Persistent state: SQLAlchemy schema, Alembic migrations and the SQL `Store` binding."""
