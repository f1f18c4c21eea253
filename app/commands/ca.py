"""`autoscaler ca rotate --workers`: a new worker CA, the old one accepted for an overlap.

Run where the cluster's secrets are (the daemon's host): it writes files, and the
running daemon picks them up at its next worker call (`app.worker_ca`). No running
worker is dropped: each renews at half its certificate's lifetime, at heartbeat, and
gets the new CA's certificate before the old CA stops being accepted.
"""

from __future__ import annotations

import argparse
import time

from app.cli_io import add_json, print_json
from app.commands.cluster import _config
from app.config import load_cluster_config
from app.validation import number_arg
from app.worker_ca import DEFAULT_OVERLAP_S, rotate
from autoscaler.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser(
        "ca",
        help="the cluster's certificate authorities: rotate the worker CA",
        description="Rotate the worker CA: workers renew onto the new one at heartbeat "
        "while both are accepted, then the old one is dropped. The server CA, which "
        "clients pin, is not rotated here.",
    )
    actions = ca.add_subparsers(dest="action", required=True, metavar="ACTION")
    rotation = actions.add_parser("rotate", help="make a new CA; the old one stays for --overlap")
    rotation.add_argument(
        "--workers", action="store_true", required=True, help="the worker CA (the one rotated)"
    )
    rotation.add_argument(
        "--overlap",
        type=number_arg(60.0, 30 * 86400.0),
        default=DEFAULT_OVERLAP_S,
        metavar="SECONDS",
        help=f"how long the old CA is still accepted (default {DEFAULT_OVERLAP_S:.0f}: two "
        "certificate lifetimes)",
    )
    rotation.add_argument(
        "--force",
        action="store_true",
        help="rotate even while a previous rotation's overlap runs (drops its old CA)",
    )
    add_json(rotation)
    _config(rotation)
    rotation.set_defaults(func=cmd_ca_rotate)


def cmd_ca_rotate(args: argparse.Namespace) -> int:
    config = load_cluster_config(args.config)
    now = time.time()
    try:
        trust = rotate(
            config.secrets, now, args.overlap, name=config.cluster.name, force=args.force
        )
    except OSError as exc:
        raise InputError(
            f"cannot rotate the worker CA: {exc}", source=str(config.secrets.dir)
        ) from None
    document = {
        "rotated_at": now,
        "previous_accepted_until": trust.previous_until,
        "worker_ca": str(config.secrets.worker_ca_cert),
    }
    if args.json:
        print_json(document)
    else:
        print(
            f"new worker CA in {config.secrets.worker_ca_cert}; the old one is accepted for "
            f"{args.overlap:.0f} s more, while workers renew onto the new one at heartbeat"
        )
    return 0
