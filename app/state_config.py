"""The state's part of the daemon's TOML configuration: the `[state]` table.

Example (one of the two keys, or neither for the default SQLite file):

    [state]
    path = "/var/lib/autoscaler/state.db"          # a SQLite file (relative: to this file)
    # url = "postgresql+psycopg://autoscaler@db.internal:5432/autoscaler"

Without either, the state lives in `$XDG_STATE_HOME/ec2-batch-autoscaler/state.db`
(`~/.local/state/ec2-batch-autoscaler/state.db` when XDG_STATE_HOME is unset).
A `--url` on the command line wins over the file. Other tables of the file
belong to other parts of the daemon and are ignored here; an unknown key inside
`[state]` is an error, so a typo never silently falls back to the default.

Parsing only: no SQLAlchemy import, so commands that never touch the database
do not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from autoscaler.errors import InputError
from provisioners.documents import FieldError, Strict, convert, dotted, text


def default_state_path() -> Path:
    """`$XDG_STATE_HOME/ec2-batch-autoscaler/state.db`, else under `~/.local/state`."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ec2-batch-autoscaler" / "state.db"


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of a SQLite file (absolute, so it does not depend on the cwd)."""
    return f"sqlite:///{path.expanduser().absolute()}"


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Where the daemon keeps its state (the `[state]` table)."""

    url: str  # a SQLAlchemy URL
    source: str | None = None  # the file it came from; None for the default

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file of this state, when it is one (what no command may overwrite)."""
        if not self.url.startswith(("sqlite:///", "sqlite+pysqlite:///")):
            return None
        path = self.url.split(":///", 1)[1].split("?", 1)[0]
        return Path(path) if path else None


def default_state_config() -> StateConfig:
    return StateConfig(sqlite_url(default_state_path()))


NonEmpty = Annotated[str, text(max_length=4096, pattern=r"\S", description="a non-empty string")]


class StateTable(Strict, frozen=True):
    """The `[state]` table: a database URL, or the path of a SQLite file; not both."""

    url: NonEmpty | None = None
    path: NonEmpty | None = None

    def check(self) -> None:
        if self.url is not None and self.path is not None:
            raise FieldError("give either 'url' or 'path' (a SQLite file), not both")
        if self.url is not None:
            problem = database_url_problem(self.url)
            if problem:
                raise FieldError(problem, "url", self.url)


def database_url_problem(url: str) -> str | None:
    """Why the state cannot be opened at `url` (None: it parses and names a database we
    support), by the very parser the daemon opens it with, so a URL that passes here
    never crashes the daemon's start."""
    from sqlalchemy.exc import ArgumentError

    from state.database import database_url

    try:
        parsed = database_url(url)
        _ = parsed.port  # a port that is no number fails here, not at the first connect
    except InputError as exc:
        return exc.problem
    except (ArgumentError, ValueError, TypeError) as exc:
        return f"is not a database URL ({exc}); use sqlite:////PATH or postgresql+psycopg://USER@HOST:PORT/DB"
    return None


def state_config_from(table: StateTable, source: str, base_dir: Path | None) -> StateConfig:
    if table.url is not None:
        return StateConfig(table.url, source)
    if table.path is not None:
        path = Path(table.path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return StateConfig(sqlite_url(path), source)
    return StateConfig(default_state_config().url, source)


def parse_state_config(
    data: Mapping[str, Any], source: str = "config", base_dir: Path | None = None
) -> StateConfig:
    """Validate the `[state]` table of a parsed TOML document."""
    raw = data.get("state", {})
    if not isinstance(raw, Mapping):
        raise InputError("must be a table", source=source, field="state", value=raw, has_value=True)
    table = convert(raw, StateTable, source=source, where_of=lambda p: ("[state]", dotted(p)))
    return state_config_from(table, source, base_dir)


def load_state_config(path: str | Path | None) -> StateConfig:
    """Read the `[state]` table of the configuration file; the default when `path` is None."""
    from app.files import CONFIG_LIMIT, read_toml

    if path is None:
        return default_state_config()
    p = Path(path)
    return parse_state_config(read_toml(p, "configuration", CONFIG_LIMIT), str(p), p.parent)


def database_url_for(url: str | None, config_path: str | Path | None) -> str:
    """The database to use: `--url` if given, else the config file's `[state]`, else the default."""
    if url is not None:
        problem = database_url_problem(url)
        if problem:
            raise InputError(problem, field="--url", value=url, has_value=True)
        return url
    return load_state_config(config_path).url
