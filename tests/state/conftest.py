"""Databases for the state tests: a SQLite file, and a PostgreSQL database per test.

PostgreSQL tests run against the server named by `AUTOSCALER_TEST_DATABASE_URL`
(`.ci/run` starts one and sets it) and are skipped only when it is unset. Each
test gets a database of its own, cloned from a template migrated once per
session (`CREATE DATABASE … TEMPLATE`), which is much faster than migrating
each one. SQLite tests get a copy of a migrated file the same way.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from state.database import create_state_engine
from state.migrate import upgrade
from state.store import SqlStore

PG_ENV = "AUTOSCALER_TEST_DATABASE_URL"
BACKENDS = ("sqlite", "postgresql")


def pg_server_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set (CI sets it; see .ci/run)")
    return url


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the server's maintenance database, to create databases."""
    engine = create_engine(
        make_url(pg_server_url()).set(drivername="postgresql+psycopg"),
        isolation_level="AUTOCOMMIT",
    )
    yield engine
    engine.dispose()


class PgDatabases:
    """Creates uniquely named databases on the test server and drops them afterwards."""

    def __init__(self, admin: Engine) -> None:
        self.admin = admin
        self.made: list[str] = []

    def create(self, template: str | None = None) -> str:
        name = f"autoscaler_test_{uuid.uuid4().hex[:12]}"
        clause = f" TEMPLATE {template}" if template else ""
        with self.admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}{clause}"))
        self.made.append(name)
        return make_url(pg_server_url()).set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.made:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.made.clear()


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine) -> Iterator[str]:
    """Name of a database migrated to head, cloned for each test."""
    databases = PgDatabases(pg_admin)
    url = databases.create()
    engine = create_state_engine(url)
    upgrade(engine)
    engine.dispose()  # a template must have no open connections
    yield make_url(url).database
    databases.drop_all()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "state.db"
    engine = create_state_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # checkpoints the WAL into the file
    return path


@pytest.fixture
def pg_databases(pg_admin: Engine) -> Iterator[PgDatabases]:
    databases = PgDatabases(pg_admin)
    yield databases
    databases.drop_all()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database at the head revision, on each backend."""
    if backend == "sqlite":
        path = tmp_path / "state.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    template = request.getfixturevalue("pg_template")
    return request.getfixturevalue("pg_databases").create(template=template)


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database with no schema, on each backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'empty' / 'state.db'}"
    return request.getfixturevalue("pg_databases").create()


@pytest.fixture
def sql_store(db_url: str) -> Iterator[SqlStore]:
    with SqlStore(db_url) as store:
        yield store
