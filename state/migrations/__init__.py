"""Alembic migrations of the state schema, run by `autoscaler db upgrade` (`state.migrate`)."""
