"""The user commands: `user add/list/rotate/revoke`, `team set/list` and `audit` (admin
only, via the daemon).

A new or rotated token is shown once (or written to `--token-file`, mode 0600)
and never stored: the daemon keeps its scrypt hash (`app.users`). A teammate
uses theirs with `AUTOSCALER_TOKEN_FILE=PATH autoscaler …`.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.cli_io import add_json, note, print_json
from app.commands.cluster import _client, _config
from app.table import format_table
from app.users import ROLES, ROTATION_OVERLAP_S
from app.validation import number_arg, parse_since
from autoscaler.errors import InputError
from state.accounts import TEAM_KEYS


def register(sub: argparse._SubParsersAction) -> None:
    user = sub.add_parser(
        "user",
        help="users of the cluster: add, list, rotate or revoke their tokens (admin)",
        description="Each user has a role — admin (everything), submit (submit jobs; cancel "
        "and drain their own), read (see everything, change nothing) — and a token the "
        "daemon keeps only as a hash.",
    )
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", help="add a user and show their token once")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--role", required=True, choices=ROLES)
    add.add_argument("--team", default="", help="the user's team")
    _token_file(add)
    add_json(add)
    _config(add)
    add.set_defaults(func=cmd_user_add)

    listed = actions.add_parser("list", help="the users, their roles and tokens' state")
    add_json(listed)
    _config(listed)
    listed.set_defaults(func=cmd_user_list)

    rotate = actions.add_parser(
        "rotate",
        help="give a user a new token; the old one keeps working for --overlap",
    )
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument(
        "--overlap",
        type=number_arg(0.0, 30 * 86400.0),
        default=ROTATION_OVERLAP_S,
        metavar="SECONDS",
        help=f"how long the old token still works (default {ROTATION_OVERLAP_S:.0f})",
    )
    _token_file(rotate)
    add_json(rotate)
    _config(rotate)
    rotate.set_defaults(func=cmd_user_rotate)

    revoke = actions.add_parser("revoke", help="end every token of a user, at once")
    revoke.add_argument("name", metavar="NAME")
    add_json(revoke)
    _config(revoke)
    revoke.set_defaults(func=cmd_user_revoke)

    team = sub.add_parser(
        "team",
        help="teams' limits: weight, $/h, share, daily budget, priorities (admin)",
        description="What `team set` sets overrides the config's [teams.NAME] key by key "
        "(the rest keep the config's value, else the default) and takes effect at the "
        "daemon's next round. Every call is audited.",
    )
    team_actions = team.add_subparsers(dest="action", required=True, metavar="ACTION")
    team_set = team_actions.add_parser("set", help="set some of a team's limits")
    team_set.add_argument("name", metavar="NAME")
    team_set.add_argument("--weight", type=number_arg(0.0, 1e6, low_open=True))
    team_set.add_argument(
        "--max-hourly-spend", type=number_arg(0.0, 1e7), metavar="DOLLARS_PER_HOUR"
    )
    team_set.add_argument(
        "--max-share",
        type=number_arg(0.0, 1.0, low_open=True),
        metavar="FRACTION",
        help="of [guardrails] max_hourly_spend",
    )
    team_set.add_argument(
        "--daily-budget",
        type=number_arg(0.0, 2.4e8),
        metavar="DOLLARS",
        help="per UTC day: reached, the team's jobs wait (checkpointed) until the next day",
    )
    team_set.add_argument(
        "--priority", type=number_arg(-1000, 1000, integer=True), help="of jobs that state none"
    )
    team_set.add_argument(
        "--max-priority",
        type=number_arg(-1000, 1000, integer=True),
        help="the most a job of the team may ask for",
    )
    add_json(team_set)
    _config(team_set)
    team_set.set_defaults(func=cmd_team_set)
    team_list = team_actions.add_parser("list", help="every team's limits in effect")
    add_json(team_list)
    _config(team_list)
    team_list.set_defaults(func=cmd_team_list)

    audit = sub.add_parser(
        "audit",
        help="every API call: who, what, when, and its outcome (admin)",
    )
    audit.add_argument("--user", default="", help="only this user's calls ('-': no valid token)")
    audit.add_argument(
        "--since",
        default=None,
        metavar="T",
        help="from T on: an ISO 8601 date or time, a span back from now (12h, 7d), or @EPOCH",
    )
    audit.add_argument(
        "--limit",
        type=number_arg(0, 10**9, integer=True),
        default=0,
        help="the latest N (0: all)",
    )
    add_json(audit)
    _config(audit)
    audit.set_defaults(func=cmd_audit)


def _token_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the token to PATH (mode 0600) instead of printing it",
    )


def _deliver(document: dict[str, Any], path: Path | None, args: argparse.Namespace) -> None:
    """Print the user (and the token, unless it goes to a file)."""
    from executor.security import write_secret

    token = document.pop("token")
    if path is not None:
        try:
            write_secret(path, token + "\n", overwrite=True)
        except OSError as exc:
            raise InputError(
                f"cannot write the token: {exc.strerror or exc}; it is lost — "
                f"run `autoscaler user rotate {document['user']}` for a new one",
                source=str(path),
            ) from None
        document["token_file"] = str(path)
    else:
        document["token"] = token
    if args.json:
        print_json(document)
        return
    team = f", team {document['team']}" if document["team"] else ""
    print(f"{document['user']} ({document['role']}{team})")
    if path is not None:
        print(f"token written to {path} (mode 0600)")
    else:
        print(f"token: {token}")
        note("shown once: the daemon keeps only its hash")
    print(f"use it with: AUTOSCALER_TOKEN_FILE={path or 'FILE'} autoscaler …")


def cmd_user_add(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.add_user(args.name, args.role, args.team)
    _deliver(document, args.token_file, args)
    return 0


def cmd_user_rotate(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.rotate_user(args.name, args.overlap)
    _deliver(document, args.token_file, args)
    if not args.json:
        print(f"the old token works until {_when(document['previous_valid_until'])}")
    return 0


def cmd_user_revoke(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.revoke_user(args.name)
    if args.json:
        print_json(document)
    elif document["revoked"]:
        print(f"revoked {args.name}: every token of theirs is refused from now on")
    else:
        print(f"{args.name} was revoked already ({_when(document['revoked_at'])})")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.users()
    if args.json:
        print_json(document)
        return 0
    rows = [
        (
            u["user"],
            u["role"],
            u["team"] or "-",
            _when(u["created_at"]),
            "revoked " + _when(u["revoked_at"]) if u["revoked_at"] else "active",
        )
        for u in document["users"]
    ]
    print(format_table(["user", "role", "team", "added", "token"], rows, [False] * 5))
    return 0


def cmd_team_set(args: argparse.Namespace) -> int:
    limits = {
        key: int(value) if key in ("priority", "max_priority") else value
        for key in TEAM_KEYS
        if (value := getattr(args, key)) is not None
    }
    if not limits:
        raise InputError(
            "give at least one limit: " + ", ".join(f"--{k.replace('_', '-')}" for k in TEAM_KEYS)
        )
    with _client(args) as client:
        document = client.set_team(args.name, **limits)
    if args.json:
        print_json(document)
        return 0
    print(_team_rows([document]))
    print("in effect from the daemon's next round")
    return 0


def cmd_team_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.teams()
    if args.json:
        print_json(document)
        return 0
    if not document["teams"]:
        print("no teams: add [teams.NAME] to the config, or `autoscaler team set NAME …`")
        return 0
    print(_team_rows(document["teams"]))
    print(f"precedence: {document['precedence']}; * set by `team set`")
    return 0


def _team_rows(teams: list[dict[str, Any]]) -> str:
    def cell(team: dict[str, Any], key: str, unit: str | None = None) -> str:
        value = team[key]
        text = "-" if value is None else f"{value:g}" if unit is None else f"${value:,.2f}{unit}"
        return text + ("*" if key in team["set"] else "")

    rows = [
        (
            t["team"],
            cell(t, "weight"),
            cell(t, "max_hourly_spend", "/h"),
            cell(t, "max_share"),
            cell(t, "daily_budget", ""),
            cell(t, "priority"),
            cell(t, "max_priority"),
        )
        for t in teams
    ]
    return format_table(
        ["team", "weight", "max $/h", "max share", "daily budget", "priority", "max priority"],
        rows,
        [False] + [True] * 6,
    )


def cmd_audit(args: argparse.Namespace) -> int:
    since = parse_since(args.since, time.time()) if args.since else 0.0
    with _client(args) as client:
        document = client.audit(args.user, since, args.limit)
    if args.json:
        print_json(document)
        return 0
    rows = [
        (_when(e["at"]), e["user"], e["role"], e["method"], e["target"], e["outcome"])
        for e in document["entries"]
    ]
    if not rows:
        print("no audit entries")
        return 0
    print(format_table(["when", "user", "role", "call", "target", "outcome"], rows, [False] * 6))
    return 0


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
