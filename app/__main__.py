"""`python -m app` runs the `autoscaler` command line.

Ctrl-C before the command line is even imported ends it the way it ends a
command: one line, exit status 130 (`app.cli.main` takes over from there).
"""

import os
import signal
import sys


def _interrupted(*_: object) -> None:
    os.write(2, b"autoscaler: interrupted\n")
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted)

from app.cli import main  # noqa: E402  (after the handler: Ctrl-C during the import)

signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(main())
