"""Alembic environment for the state schema.

`state.migrate` builds the Alembic `Config` in code and passes the engine in
`config.attributes["engine"]`, so migrations run from an installed package with
no `alembic.ini`. All pending revisions run in one transaction (SQLite's DDL is
transactional too), so an upgrade interrupted at any point leaves the schema as
it was.
"""

from __future__ import annotations

from alembic import context

from state.database import create_state_engine
from state.schema import Base

config = context.config


def run_migrations() -> None:
    if context.is_offline_mode():
        raise SystemExit(
            "offline (--sql) migrations are not supported; run them against a database"
        )
    engine = config.attributes.get("engine")
    if engine is None:  # the alembic command line, for writing new revisions
        url = config.get_main_option("sqlalchemy.url")
        if url is None:
            raise SystemExit("set sqlalchemy.url to the database to migrate")
        engine = create_state_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            transactional_ddl=True,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations()
