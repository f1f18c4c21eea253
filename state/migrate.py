"""Schema revisions: create or upgrade a state database, and refuse to use an outdated one.

Alembic runs programmatically from a `Config` built here, with the migration
scripts shipped inside the package (`state/migrations/`), so `autoscaler db
upgrade` works from an installed package without an `alembic.ini`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import DBAPIError

from state.database import (
    DatabaseUnreachable,
    SchemaOutdated,
    StateError,
    is_sqlite_file,
    shown,
)

#: Where the migration scripts live (package data).
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(engine: Engine, script_location: Path = MIGRATIONS) -> Config:
    """An Alembic configuration that migrates `engine`'s database."""
    config = Config()
    config.set_main_option("script_location", str(script_location))
    # configparser interpolation: a %-encoded URL (a passfile query, a non-ASCII path) is
    # stored with its '%' doubled, or setting it raises.
    url = engine.url.render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["engine"] = engine
    return config


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Which revision a database is at, and which one this code needs."""

    url: str  # password hidden
    current: str | None  # None: no state schema at all
    head: str
    known: bool  # False: a revision this code does not know (made by a newer version)

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    def describe(self) -> str:
        """One line saying where the schema stands and what to do about it."""
        upgrade = f"run `autoscaler db upgrade --url {self.url}`"
        if self.current is None:
            return f"{self.url}: no autoscaler schema: {upgrade} to create it"
        if not self.known:
            return (
                f"{self.url}: schema revision {self.current} is newer than this autoscaler "
                f"knows (its latest is {self.head}): upgrade the autoscaler"
            )
        if self.current != self.head:
            return (
                f"{self.url}: schema revision {self.current} is outdated, this autoscaler "
                f"needs {self.head}: {upgrade}"
            )
        return f"{self.url}: schema revision {self.current} (up to date)"


def head_revision(script_location: Path = MIGRATIONS) -> str:
    script = ScriptDirectory(str(script_location))
    head = script.get_current_head()
    assert head is not None, f"no migrations in {script_location}"
    return head


def schema_status(engine: Engine, script_location: Path = MIGRATIONS) -> SchemaStatus:
    """Read the database's revision (without creating anything)."""
    url = shown(engine.url)
    if is_sqlite_file(engine.url) and not Path(str(engine.url.database)).exists():
        return SchemaStatus(url, None, head_revision(script_location), True)
    script = ScriptDirectory(str(script_location))
    try:
        with engine.connect() as connection:
            heads = MigrationContext.configure(connection).get_current_heads()
    except DBAPIError as exc:
        raise _unreachable(engine, exc) from None
    current = heads[0] if heads else None
    known = True
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            known = False
    return SchemaStatus(url, current, head_revision(script_location), known)


def check_schema(engine: Engine, script_location: Path = MIGRATIONS) -> None:
    """Raise SchemaOutdated (saying what to run) unless the database is at the head
    revision with every table and column this code reads (a table dropped by hand
    would otherwise surface as a traceback deep inside a round)."""
    status = schema_status(engine, script_location)
    if not status.up_to_date:
        raise SchemaOutdated(status.describe())
    missing = missing_columns(engine)
    if missing:
        raise SchemaOutdated(
            f"{status.url}: schema revision {status.current} but {missing[0]} is missing: "
            "the database was changed outside the autoscaler; restore it from a backup "
            "or point [state] url at a new database"
        )


def missing_columns(engine: Engine) -> list[str]:
    """Tables ('table x') and columns ('column x.y') of the state schema the database lacks."""
    from state.schema import Base  # the ORM's tables: only needed once the revision matches

    try:
        inspector = inspect(engine)
        present = {
            table: {column["name"] for column in columns}
            for (_, table), columns in inspector.get_multi_columns().items()
        }
    except DBAPIError as exc:
        raise _unreachable(engine, exc) from None
    missing: list[str] = []
    for table in Base.metadata.sorted_tables:
        if table.name not in present:
            missing.append(f"table {table.name!r}")
            continue
        missing += [
            f"column '{table.name}.{column.name}'"
            for column in table.columns
            if column.name not in present[table.name]
        ]
    return missing


def upgrade(engine: Engine, script_location: Path = MIGRATIONS) -> tuple[str | None, str]:
    """Create or upgrade the schema to the head revision, in one transaction.

    Returns the revisions before and after. A SQLite file and its directory are
    created when missing.
    """
    before = schema_status(engine, script_location)
    if not before.known:
        raise SchemaOutdated(before.describe())
    if before.up_to_date:
        return before.current, before.head
    if is_sqlite_file(engine.url):
        directory = Path(str(engine.url.database)).parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnreachable(
                f"cannot create directory {directory}: {exc.strerror or exc}",
                source=before.url,
            ) from None
    try:
        command.upgrade(alembic_config(engine, script_location), "head")
    except DBAPIError as exc:
        # The database answered just above; whatever failed (a statement, or the
        # connection), the upgrade's single transaction was rolled back.
        raise StateError(
            f"upgrade to {before.head} failed, nothing was changed: {_reason(exc)}",
            source=before.url,
        ) from None
    after = schema_status(engine, script_location)
    return before.current, str(after.current)


def _reason(exc: DBAPIError) -> str:
    """The driver's own message, first line only."""
    text = str(exc.orig if exc.orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc.orig or exc).__name__


def _unreachable(engine: Engine, exc: DBAPIError) -> DatabaseUnreachable:
    reason = _reason(exc)
    hint = (
        "check the path and its permissions"
        if engine.dialect.name == "sqlite"
        else "check the URL, that the server runs and accepts connections, and the credentials"
    )
    return DatabaseUnreachable(
        f"cannot use the database: {reason}; {hint}", source=shown(engine.url)
    )
