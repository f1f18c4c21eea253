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
from typing import Any

from app.files import read_config_file
from autoscaler.errors import InputError

KNOWN_KEYS = frozenset({"url", "path"})


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


def default_state_config() -> StateConfig:
    return StateConfig(sqlite_url(default_state_path()))


def parse_state_config(
    data: Mapping[str, Any], source: str = "config", base_dir: Path | None = None
) -> StateConfig:
    """Validate the `[state]` table of a parsed TOML document."""
    raw = data.get("state", {})
    if not isinstance(raw, Mapping):
        raise InputError("must be a table", source=source, field="state", value=raw, has_value=True)
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise InputError(
            f"unknown field (known: {', '.join(sorted(KNOWN_KEYS))})",
            source=source,
            where="[state]",
            field=unknown[0],
        )
    for key in ("url", "path"):
        value = raw.get(key)
        if key in raw and (not isinstance(value, str) or not value.strip()):
            raise InputError(
                "must be a non-empty string",
                source=source,
                where="[state]",
                field=key,
                value=value,
                has_value=True,
            )
    if "url" in raw and "path" in raw:
        raise InputError(
            "give either 'url' or 'path' (a SQLite file), not both",
            source=source,
            where="[state]",
        )
    if "url" in raw:
        return StateConfig(raw["url"], source)
    if "path" in raw:
        path = Path(raw["path"]).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return StateConfig(sqlite_url(path), source)
    return StateConfig(default_state_config().url, source)


def load_state_config(path: str | Path | None) -> StateConfig:
    """Read the `[state]` table of the configuration file; the default when `path` is None."""
    if path is None:
        return default_state_config()
    p = Path(path)
    data = read_config_file(p)
    return parse_state_config(data, source=str(p), base_dir=p.parent)


def database_url_for(url: str | None, config_path: str | Path | None) -> str:
    """The database to use: `--url` if given, else the config file's `[state]`, else the default."""
    if url is not None:
        return url
    return load_state_config(config_path).url
