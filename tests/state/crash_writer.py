"""A writer process for the crash test: runs one state transition and stops at a chosen
point, inside the transaction or after it, until the test kills it with SIGKILL.

    python -m tests.state.crash_writer URL TRANSITION POINT READY_FILE

POINT is `after:<SQL prefix>` (the transaction has executed the first statement
starting with that prefix and not committed), `before-commit`, or
`after-commit`. When the writer gets there it writes READY_FILE and sleeps.
The pause is injected with SQLAlchemy events from outside the store, so the
store runs exactly its production code.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

from autoscaler.store import Store
from state.store import SqlStore
from tests.builders import job

#: The transitions the crash test interrupts; each changes several rows or tables.
TRANSITIONS: dict[str, Callable[[Store], Any]] = {
    # instances, instance_transitions, and the ledger's open interval
    "terminate": lambda store: store.transition_instance("i-1", "terminated", 500.0),
    # the job and its tasks
    "cancel": lambda store: store.cancel_job("j1", 500.0),
    # the job, its tasks and their demands
    "submit": lambda store: store.submit_job(
        job("j2", (1, 4, 8), (0, 2, 4), (0, 1, 2)), owner="bo", at=500.0
    ),
}


def stop_here(ready: Path) -> None:
    ready.write_text("ready")
    time.sleep(600)  # the test kills us long before
    raise SystemExit("not killed")


def main(url: str, transition: str, point: str, ready_file: str) -> None:
    ready = Path(ready_file)
    store = SqlStore(url)
    if point.startswith("after:"):
        prefix = point.removeprefix("after:").upper()

        @event.listens_for(store.engine, "after_cursor_execute")
        def after_statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if " ".join(statement.split()).upper().startswith(prefix):
                stop_here(ready)

    elif point == "before-commit":

        @event.listens_for(store.engine, "commit")
        def before_commit(_conn: Any) -> None:
            stop_here(ready)

    TRANSITIONS[transition](store)
    if point == "after-commit":
        stop_here(ready)
    raise SystemExit(f"never reached {point!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
