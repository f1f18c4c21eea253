"""Database URLs, engines and transactions for the state layer, and its errors.

Two databases are supported:

- **SQLite** (the default; a file). Every connection runs in WAL mode (readers
  never block the writer), with foreign keys enforced, `synchronous=FULL` and a
  busy timeout. pysqlite's own transaction handling is switched off and the
  engine emits `BEGIN IMMEDIATE` for write transactions and a plain (deferred)
  `BEGIN` for reads — the workaround SQLAlchemy documents for pysqlite. A write
  transaction thus takes the write lock before it reads anything, so what it
  reads cannot change under it (with a deferred BEGIN a reader that later writes
  would fail with "database is locked" once another writer committed).
- **PostgreSQL** through psycopg 3 (`postgresql+psycopg://…`; `postgresql://` is
  taken to mean the same). Writes lock the rows they decide on (`SELECT … FOR
  UPDATE`); snapshots read in one REPEATABLE READ, read-only transaction. Lock
  waits give up after `LOCK_TIMEOUT_S` instead of hanging a daemon forever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from autoscaler.errors import InputError
from autoscaler.store import StoreError

#: How long a write waits for another writer's lock before it fails.
BUSY_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = 30.0
#: How long to wait for a PostgreSQL server to accept a connection.
CONNECT_TIMEOUT_S = 10

#: Execution option read by the SQLite `begin` hook: "IMMEDIATE" or "DEFERRED".
_SQLITE_BEGIN = "state_sqlite_begin"

URL_EXAMPLES = (
    "sqlite:////absolute/path/state.db, sqlite:///relative/state.db or "
    "postgresql+psycopg://USER@HOST:PORT/DBNAME"
)


class StateError(StoreError, InputError):
    """The state database cannot be used as configured.

    An `InputError` too, so that a command line prints it as one line (exit
    status 2) with what to do, and a `StoreError` for code that handles store
    failures.
    """


class BadDatabaseUrl(StateError):
    """The database URL is malformed or names a database we do not support."""


class DatabaseUnreachable(StateError):
    """The database server refused or did not answer, or the file cannot be opened."""


class SchemaOutdated(StateError):
    """The database has no state schema or an older (or newer) revision than this code."""


def database_url(text: str | URL) -> URL:
    """Parse and check a database URL; `postgresql://` means psycopg 3."""
    if isinstance(text, URL):
        url = text
    else:
        try:
            url = make_url(text)
        except ArgumentError:
            raise BadDatabaseUrl(
                f"not a database URL: use {URL_EXAMPLES}", source=repr(text)
            ) from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.drivername not in ("sqlite", "sqlite+pysqlite"):
            raise BadDatabaseUrl(
                f"unsupported SQLite driver {url.drivername!r}: use sqlite:///PATH",
                source=shown(url),
            )
        return url
    if backend == "postgresql":
        if url.drivername == "postgresql":
            return url.set(drivername="postgresql+psycopg")
        if url.drivername != "postgresql+psycopg":
            raise BadDatabaseUrl(
                f"unsupported PostgreSQL driver {url.drivername!r}: "
                "use postgresql+psycopg://USER@HOST:PORT/DBNAME (psycopg 3)",
                source=shown(url),
            )
        return url
    raise BadDatabaseUrl(f"unsupported database {backend!r}: use {URL_EXAMPLES}", source=shown(url))


def shown(url: str | URL) -> str:
    """The URL as it may be printed: any password replaced by ***."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def is_sqlite_file(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")


def create_state_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for the state database, with the pragmas and transaction modes above.

    An in-memory SQLite URL (`sqlite://`) gets a single shared connection, so the
    schema created by `upgrade` is the one the store then uses.
    """
    url = database_url(url)
    if url.get_backend_name() == "sqlite":
        if is_sqlite_file(url):
            engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S}, **kwargs)
        else:
            engine = create_engine(
                url,
                connect_args={"check_same_thread": False},
                poolclass=StaticPool,
                **kwargs,
            )
        _configure_sqlite(engine)
        return engine
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    if "options" not in url.query:
        connect_args["options"] = f"-c lock_timeout={int(LOCK_TIMEOUT_S * 1000)}"
    try:
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:  # pragma: no cover - psycopg is a dependency
        raise BadDatabaseUrl(f"cannot load the driver: {exc}", source=shown(url)) from None


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from pysqlite: the `begin` hook below
        # emits BEGIN itself (pysqlite would not BEGIN before a SELECT).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(_SQLITE_BEGIN, "IMMEDIATE")
        connection.exec_driver_sql(f"BEGIN {mode}")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One write transaction: committed when the block ends, rolled back if it raises."""
    with engine.connect() as connection, connection.begin():
        yield connection


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """One read-only transaction in which every query sees the same committed state."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            # In WAL mode a read transaction sees the database as of its first read.
            connection = connection.execution_options(**{_SQLITE_BEGIN: "DEFERRED"})
        else:
            connection = connection.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        with connection.begin():
            yield connection
