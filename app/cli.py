"""The `autoscaler` command line.

Nothing is imported before `main` runs but `sys`: Ctrl-C at any moment, while
the commands' modules (numpy, HiGHS, boto3, gRPC) are still being imported
too, ends the command with one line and exit status 130, never a traceback.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

#: Commands whose files are the cluster's (0600 files, 0700 directories).
PRIVATE_COMMANDS = frozenset({"init", "daemon", "worker", "down"})
PRIVATE_UMASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (2: bad input, 130: interrupted)."""
    try:
        return _main(argv)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        if argv is None:  # the process is ending: a second Ctrl-C changes nothing now
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(OSError, ValueError):
            print("autoscaler: interrupted", file=sys.stderr, flush=True)
        if argv is None:
            # Out now, past the interpreter's exit: a Ctrl-C that landed inside an
            # extension's initialisation marks the process to re-kill itself with SIGINT
            # at exit, which would end it by a signal instead of with 130.
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
            import os

            os._exit(130)
        return 130


def _interrupted(exc: BaseException) -> bool:
    """True for Ctrl-C, also when an extension module's import turned it into an
    ImportError ("initialization failed")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def build_parser() -> Any:
    import argparse
    from typing import NoReturn

    from app.commands.ca import register as register_ca_commands
    from app.commands.catalog import register as register_catalog_commands
    from app.commands.cluster import register as register_cluster_commands
    from app.commands.db import register as register_db_commands
    from app.commands.deploy import register as register_deploy_commands
    from app.commands.notify import register as register_notify_commands
    from app.commands.plan import register as register_plan_command
    from app.commands.replay import register as register_simulator_commands
    from app.commands.users import register as register_user_commands
    from executor.cli import register as register_worker_command

    class Parser(argparse.ArgumentParser):
        """argparse, with a bad flag reported in one line (exit 2) like every other bad input."""

        def error(self, message: str) -> NoReturn:
            message = " ".join(message.split())  # a value with a newline stays one line
            self.exit(2, f"autoscaler: error: {message} (see `{self.prog} --help`)\n")

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
    register_user_commands(sub)
    register_ca_commands(sub)
    register_deploy_commands(sub)
    register_notify_commands(sub)
    register_worker_command(sub)
    return parser


def _main(argv: Sequence[str] | None) -> int:
    import os
    import signal

    from autoscaler.errors import InputError

    # Ctrl-C waits while the commands' modules are imported (numpy, HiGHS, gRPC): inside
    # an extension's initialisation it would become an ImportError. It is delivered
    # the moment they are in, as a KeyboardInterrupt, a second or so later at most.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        parser = build_parser()
        from app.api import DaemonUnavailable
        from app.cli_io import silence_solver_banner

        silence_solver_banner()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    args = parser.parse_args(argv)
    # What init, the daemon and a worker write (state, checkpoints, logs, work directories)
    # only their owner reads: job data and env values are not for other local users.
    umask = os.umask(PRIVATE_UMASK) if args.command in PRIVATE_COMMANDS else None
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"autoscaler: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except DaemonUnavailable as exc:
        print(f"autoscaler: error: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`autoscaler … | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        if umask is not None:
            os.umask(umask)


def _one_line(message: str) -> str:
    """A message as one line: any line break a value or a library put in it becomes a space."""
    return " ".join(message.splitlines())


if __name__ == "__main__":
    sys.exit(main())
