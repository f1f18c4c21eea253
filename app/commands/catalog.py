"""`autoscaler catalog show` and `autoscaler catalog refresh`.

`show` never calls AWS: it prints the cached catalog, or — with no cache, no
account — the bundled one, and says which and how old. `refresh` asks AWS
(EC2 for types and zones, the Pricing API for prices) and updates the cache;
whatever part it cannot refresh it says so, keeps what it had, and exits 1.

boto3 is imported only when a command runs, so `autoscaler plan` does not pay
for it.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli_io import add_json, print_json
from app.config import load_provisioner_config
from app.table import format_table, output_width, wrap
from app.validation import same_file
from autoscaler.errors import InputError
from provisioners.config import EC2Config

if TYPE_CHECKING:
    from provisioners.catalog import EC2Catalog

#: A cache older than this is flagged as stale in `catalog show`.
STALE_AFTER_S = 7 * 86400.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `catalog` command and its `show` and `refresh` actions."""
    catalog = subparsers.add_parser(
        "catalog",
        help="show or refresh the EC2 instance catalog (types, capacities, prices, zones)",
        description="The instance types the planner may use: capacities in the planner's "
        "units (GPUs, physical cores, GiB), on-demand prices, and the zones offering them.",
    )
    actions = catalog.add_subparsers(dest="catalog_action", required=True, metavar="ACTION")

    show = actions.add_parser(
        "show",
        help="print the catalog (cached, or bundled when never refreshed); no AWS call",
        description="Print the cached catalog, or the bundled one (Eva's 21 us-east-1 types "
        "and their bundled prices) when `catalog refresh` has never run. Does not call AWS.",
    )
    _config_argument(show)
    add_json(show)
    show.set_defaults(func=cmd_catalog_show)

    refresh = actions.add_parser(
        "refresh",
        help="fetch types, zones and prices from AWS and update the cache",
        description="Describe the allowed instance types and their zones (EC2), fetch "
        "on-demand prices (Pricing API), cache the result, and print it. When AWS cannot be "
        "reached, keeps and prints what was cached and exits with status 1.",
    )
    _config_argument(refresh)
    add_json(refresh)
    refresh.add_argument(
        "--endpoint-url",
        type=endpoint_url,
        default=None,
        metavar="URL",
        help="send AWS requests to URL (moto_server, a VPC endpoint); AWS_ENDPOINT_URL works too",
    )
    refresh.add_argument(
        "--no-prices",
        action="store_true",
        help="keep the current price table; only refresh types and zones",
    )
    refresh.set_defaults(func=cmd_catalog_refresh)


def _config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="TOML",
        help="daemon configuration file ([ec2] and [guardrails] tables; defaults: us-east-1, "
        "families c7i, p3, r7i, cache in ~/.cache/ec2-batch-autoscaler)",
    )


def endpoint_url(text: str) -> str:
    """An argparse `type=` for `--endpoint-url`: http(s)://HOST[:PORT][/PATH]."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        port = parts.port  # a port that is no number fails here, not inside botocore
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in text)
        or (port is not None and not 0 < port < 65536)
    ):
        raise argparse.ArgumentTypeError(
            f"must be http://HOST[:PORT] or https://HOST[:PORT], got {text!r}"
        )
    return text


def cmd_catalog_show(args: argparse.Namespace) -> int:
    from provisioners.catalog import cached_or_bundled_catalog, catalog_cache_path

    config = load_provisioner_config(args.config).ec2
    catalog = cached_or_bundled_catalog(config)
    if args.json:
        print_json(catalog_document(catalog, time.time()))
        return 0
    print(render_catalog(catalog, config, time.time(), catalog_cache_path(config)))
    return 0


def catalog_document(catalog: EC2Catalog, now_s: float) -> dict[str, object]:
    """The catalog as `catalog show --json` prints it: where it came from, and each type."""
    return {
        "region": catalog.region,
        "origin": catalog.origin,
        "age_s": catalog.age_s(now_s),
        "prices": catalog.prices,
        "notes": list(catalog.notes),
        "instance_types": {
            t.name: {
                "family": t.family,
                "capacity": list(t.capacity.as_tuple()),
                "cost": t.hourly_cost,
                "vcpus": catalog.vcpus.get(t.name),
                "zones": list(catalog.zones.get(t.name, ())),
            }
            for t in sorted(catalog.catalog, key=lambda t: t.name)
        },
    }


def cmd_catalog_refresh(args: argparse.Namespace) -> int:
    from autoscaler.cloud import CloudError
    from provisioners.aws import AwsCaller, make_client
    from provisioners.catalog import (
        PRICING_API_REGION,
        cached_or_bundled_catalog,
        catalog_cache_path,
        current_price_table,
        describe_catalog,
        fetch_price_table,
        price_table_path,
        save_catalog_cache,
        save_price_table,
    )

    config = load_provisioner_config(args.config).ec2
    if args.config is not None:
        for path in (price_table_path(config), catalog_cache_path(config)):
            if same_file(path, args.config):
                raise InputError(
                    f"[ec2] cache_dir makes the cache {path} the configuration itself: "
                    "choose another cache_dir",
                    source=str(args.config),
                )
    now = time.time()
    failed = False
    if not args.no_prices:
        try:
            pricing = make_client("pricing", PRICING_API_REGION, endpoint_url=args.endpoint_url)
            today = datetime.fromtimestamp(now, UTC).date().isoformat()
            table = fetch_price_table(AwsCaller(pricing), config.region, today)
            save_price_table(table, price_table_path(config))
            _say(
                args,
                f"Prices: {len(table.prices)} on-demand prices for {config.region} fetched "
                f"from the AWS Pricing API, saved to {price_table_path(config)}",
            )
        except CloudError as exc:
            failed = True
            kept = current_price_table(config)
            _warn(
                f"prices not refreshed: {exc}. Keeping "
                + (
                    f"the current prices ({kept.describe(with_note=False)})"
                    if kept is not None
                    else "no prices at all"
                )
            )
    try:
        ec2 = AwsCaller(make_client("ec2", config.region, endpoint_url=args.endpoint_url))
        catalog = describe_catalog(ec2, config, current_price_table(config), now)
        save_catalog_cache(catalog, catalog_cache_path(config))
    except CloudError as exc:
        failed = True
        catalog = cached_or_bundled_catalog(config)
        _warn(f"catalog not refreshed: {exc}. Showing the {_origin_word(catalog)} catalog instead")
    if args.json:
        print_json(catalog_document(catalog, now))
    else:
        print(render_catalog(catalog, config, now, catalog_cache_path(config)))
    return 1 if failed else 0


def _say(args: argparse.Namespace, message: str) -> None:
    """A line about what was done: on standard output, or on standard error with --json."""
    print(message, file=sys.stderr if args.json else sys.stdout)


def _warn(message: str) -> None:
    print(f"autoscaler: warning: {message}", file=sys.stderr)


def _origin_word(catalog: EC2Catalog) -> str:
    return {"aws": "fresh", "cache": "cached", "bundled": "bundled"}[catalog.origin]


def render_catalog(catalog: EC2Catalog, config: EC2Config, now_s: float, cache: Path) -> str:
    """The catalog as a table, with where every column comes from and how old it is."""
    from provisioners.catalog import current_price_table, format_age, stale_prices_note

    types = sorted(catalog.catalog, key=lambda t: (t.family, t.hourly_cost, t.name))
    prefix = catalog.region
    rows = [
        (
            t.name,
            f"{t.capacity.gpu:g}",
            f"{t.capacity.cpu:g}",
            catalog.vcpus.get(t.name, "-"),
            f"{t.capacity.ram_gb:g}",
            f"{t.hourly_cost:g}",
            " ".join(z.removeprefix(prefix) for z in catalog.zones.get(t.name, ())) or "-",
        )
        for t in types
    ]
    out = [
        f"EC2 catalog for {catalog.region}: {len(types)} instance types"
        + (f" (cluster {config.cluster_id})" if config.cluster_id else ""),
        "",
    ]
    if rows:
        out.append(
            format_table(
                ["type", "gpus", "cores", "vcpus", "ram GiB", "$/h", f"zones ({prefix}…)"],
                rows,
                [False, True, True, True, True, True, False],
            )
        )
    else:
        out.append("(no instance types: see the notes below)")
    out += ["", "cores = physical cores (vCPUs / threads per core); $/h = on-demand, Linux."]
    if catalog.origin == "bundled":
        out.append(
            "Source: bundled offline catalog, no AWS call: capacities from the Eva artifact "
            "(EuroSys '25); zones unknown."
        )
    else:
        age = catalog.age_s(now_s)
        when = "at an unknown time" if age is None else f"{format_age(age)} ago"
        verb = "fetched" if catalog.origin == "aws" else "cached; fetched"
        stale = age is not None and age > STALE_AFTER_S
        out.append(
            f"Source: AWS ({verb} {when}), in {cache}"
            + (" — stale, run `autoscaler catalog refresh`" if stale else "")
        )
    out.append(f"Prices: {catalog.prices}")
    out += [f"Note: {note}" for note in catalog.notes]
    old_prices = stale_prices_note(current_price_table(config), config.region, now_s)
    if old_prices is not None and old_prices not in catalog.notes:
        out.append(f"Warning: {old_prices}")
    if catalog.origin == "bundled":
        out.append("Run `autoscaler catalog refresh` to fetch types, zones and prices from AWS.")
    # The table fits the terminal; so do the notes around it.
    return "\n".join(
        line if len(line) <= output_width() or "\n" in line else wrap(line) for line in out
    )
