"""The `autoscaler` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from app.cli_io import silence_solver_banner
from app.commands.catalog import register as register_catalog_commands
from app.commands.cluster import register as register_cluster_commands
from app.commands.db import register as register_db_commands
from app.commands.deploy import register as register_deploy_commands
from app.commands.plan import register as register_plan_command
from app.commands.replay import register as register_simulator_commands
from autoscaler.errors import InputError
from executor.cli import register as register_worker_command


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (exit 2) like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"autoscaler: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="autoscaler",
        description="Cost-optimizing cluster autoscaler for batch jobs on EC2.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )

    register_plan_command(sub)
    register_catalog_commands(sub)
    register_simulator_commands(sub)
    register_db_commands(sub)
    register_cluster_commands(sub)
    register_deploy_commands(sub)
    register_worker_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    silence_solver_banner()
    from app.api import DaemonUnavailable

    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"autoscaler: error: {exc}", file=sys.stderr)
        return 2
    except DaemonUnavailable as exc:
        print(f"autoscaler: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autoscaler: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`autoscaler … | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
