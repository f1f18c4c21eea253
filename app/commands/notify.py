"""`autoscaler notify test` and `autoscaler notify deliveries`: try the `[[notify]]` webhooks,
and see what the daemon delivered (`app.notify`).

`test` posts a `test` event to each webhook now, signed as the daemon signs, and says
how each answered: the way to check a URL, a secret and a CA file before a job ends.
`deliveries` reads the state's outbox: each delivery, its attempts and how it ended.
Neither prints a webhook's URL (a secret) or an HMAC key.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from app.cli_io import add_json, print_json
from app.commands.cluster import _config
from app.config import load_cluster_config
from app.table import format_table
from autoscaler.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `notify` command and its `test` and `deliveries` actions."""
    notify = sub.add_parser(
        "notify",
        help="webhook notifications: post a test event, list deliveries",
        description="The [[notify]] webhooks of the cluster's configuration: jobs that end, "
        "budgets at 80%% and 100%%, offerings held, a new leader (README: Dashboards and "
        "notifications).",
    )
    actions = notify.add_subparsers(dest="notify_action", required=True, metavar="ACTION")
    test = actions.add_parser(
        "test",
        help="post a test event to each webhook now and say how it answered",
        description="Post a `test` event, signed as the daemon signs, to each [[notify]] "
        "webhook (or the one --name gives). Exit status 1 when one did not accept it.",
    )
    test.add_argument("--name", default=None, help="only the webhook of this name")
    _config(test)
    add_json(test)
    test.set_defaults(func=cmd_notify_test)
    deliveries = actions.add_parser(
        "deliveries",
        help="the latest deliveries from the state: webhook, event, status, attempts, error",
    )
    deliveries.add_argument("--limit", type=int, default=50, help="how many (default 50)")
    _config(deliveries)
    add_json(deliveries)
    deliveries.set_defaults(func=cmd_notify_deliveries)


def cmd_notify_test(args: argparse.Namespace) -> int:
    from app.notify import DeliveryError, post, sample_event, signed, webhooks

    config = load_cluster_config(args.config)
    try:
        hooks = webhooks(config)
    except (OSError, ValueError) as exc:
        raise InputError(" ".join(str(exc).split()), source=str(config.path)) from None
    if args.name is not None:
        hooks = [h for h in hooks if h.name == args.name]
    if not hooks:
        wanted = f" named {args.name!r}" if args.name else ""
        raise InputError(f"has no [[notify]] webhook{wanted}", source=str(config.path))
    results = []
    for hook in hooks:
        now = time.time()
        body, headers = signed(hook, sample_event(now), config.cluster.name, now)
        try:
            post(hook, body, headers)
        except DeliveryError as exc:
            results.append({"webhook": hook.name, "delivered": False, "error": str(exc)})
        else:
            results.append({"webhook": hook.name, "delivered": True, "error": ""})
    if args.json:
        print_json({"results": results})
    else:
        for r in results:
            said = "delivered" if r["delivered"] else f"not delivered: {r['error']}"
            print(f"{r['webhook']}: {said}")
    return 0 if all(r["delivered"] for r in results) else 1


def cmd_notify_deliveries(args: argparse.Namespace) -> int:
    from app.wiring import open_state
    from state.outbox import SqlOutbox

    config = load_cluster_config(args.config)
    store = open_state(config)
    try:
        found = SqlOutbox(store.engine).deliveries()[-max(args.limit, 0) :]
    finally:
        store.close()
    documents = [
        {
            "webhook": d.sink,
            "event": d.event.kind,
            "key": d.event.key,
            "status": d.status,
            "attempts": d.attempts,
            "next_at": d.next_at,
            "error": d.last_error,
        }
        for d in found
    ]
    if args.json:
        print_json({"deliveries": documents})
        return 0
    if not documents:
        print("no deliveries")
        return 0
    rows = [
        (
            d.sink,
            d.event.key,
            d.status,
            str(d.attempts),
            _when(d.next_at) if d.status == "pending" else "-",
            d.last_error or "-",
        )
        for d in found
    ]
    headers = ["webhook", "event", "status", "attempts", "next try", "last error"]
    print(format_table(headers, rows, [False, False, False, True, False, False]))
    return 0


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
