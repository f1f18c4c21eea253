"""`autoscaler db upgrade` and `autoscaler db status`: create, upgrade, inspect the state database.

The daemon refuses a database whose schema is not at this code's revision
(`SchemaOutdated`, naming the command to run); `db upgrade` is that command.
SQLAlchemy and Alembic are imported only when a `db` command runs, so
`autoscaler plan` does not pay for them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from app.cli_io import add_json, print_json
from app.state_config import database_url_for, default_state_path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `db` command and its `upgrade` and `status` actions."""
    db = subparsers.add_parser(
        "db",
        help="create, upgrade or inspect the state database (SQLite or PostgreSQL)",
        description="The daemon's state (jobs, tasks, instances, the throughput table, "
        "rounds, the cost ledger) lives in a SQL database whose schema is versioned.",
    )
    actions = db.add_subparsers(dest="db_action", required=True, metavar="ACTION")

    upgrade = actions.add_parser(
        "upgrade",
        help="create the schema, or upgrade it to this version's revision",
        description="Create the database's schema, or upgrade it to the revision this "
        "autoscaler needs, in one transaction. Running it again changes nothing.",
    )
    _database_arguments(upgrade)
    upgrade.set_defaults(func=cmd_db_upgrade)

    status = actions.add_parser(
        "status",
        help="show the database's schema revision and whether it needs an upgrade",
        description="Show which schema revision the database is at and the one this "
        "autoscaler needs. Exit status 0 when up to date, 1 when it needs `db upgrade`.",
    )
    _database_arguments(status)
    status.set_defaults(func=cmd_db_status)


def _database_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=None,
        metavar="URL",
        help="database URL: sqlite:////path/state.db or postgresql+psycopg://USER@HOST:PORT/DB "
        "(default: [state] in the configuration file, else "
        f"sqlite:///{default_state_path()})",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="TOML",
        help="daemon configuration file whose [state] table names the database (default: "
        "$AUTOSCALER_CONFIG, else ./autoscaler.toml if it exists, as the daemon reads them)",
    )
    add_json(parser)


def _config(given: Path | None) -> Path | None:
    """The configuration file whose `[state]` names the database: `--config`, else
    $AUTOSCALER_CONFIG, else ./autoscaler.toml when there is one — the file the daemon
    reads, so `db upgrade` in a cluster's directory upgrades that cluster's database, not
    the per-user default (None: no file, the default)."""
    from app.config import CONFIG_ENV, config_path

    if given is not None or os.environ.get(CONFIG_ENV):
        return config_path(given)
    found = config_path(None)
    return found if found.exists() else None


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from state.database import create_state_engine
    from state.migrate import upgrade

    engine = create_state_engine(database_url_for(args.url, _config(args.config)))
    try:
        shown = engine.url.render_as_string(hide_password=True)
        before, after = upgrade(engine)
    finally:
        engine.dispose()
    if args.json:
        print_json({"url": shown, "before": before, "after": after})
    elif before == after:
        print(f"{shown}: schema already at revision {after}; nothing to do")
    elif before is None:
        print(f"{shown}: schema created at revision {after}")
    else:
        print(f"{shown}: schema upgraded from revision {before} to {after}")
    return 0


def cmd_db_status(args: argparse.Namespace) -> int:
    from state.database import create_state_engine
    from state.migrate import missing_columns, schema_status

    engine = create_state_engine(database_url_for(args.url, _config(args.config)))
    try:
        status = schema_status(engine)
        missing = missing_columns(engine) if status.up_to_date else []
    finally:
        engine.dispose()
    healthy = status.up_to_date and not missing
    if args.json:
        print_json(
            {
                "url": status.url,
                "current": status.current,
                "head": status.head,
                "known": status.known,
                "up_to_date": status.up_to_date,
                "missing": missing,
            }
        )
    elif missing:
        print(
            f"{status.url}: schema revision {status.current}, but {', '.join(missing)} "
            "missing: the database was changed outside the autoscaler"
        )
    else:
        print(status.describe())
    return 0 if healthy else 1
