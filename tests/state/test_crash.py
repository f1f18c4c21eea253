"""Crash safety: a writer killed with SIGKILL at any point leaves a database that is
consistent, in which the interrupted transition happened entirely or not at all, and
from which the next start continues.

The writer (`crash_writer.py`) stops at a chosen point and the test kills it there:
inside the transaction (after one of its statements, or just before COMMIT), or
after COMMIT. The expected outcome is what the in-memory reference store holds after
the same history, with or without the transition.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from state.store import SqlStore
from tests.state.checks import assert_consistent, reference, state_of
from tests.state.crash_writer import TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    # (transition, where the writer is killed, whether the transition must have happened)
    ("terminate", "after:UPDATE instances", False),  # before its history and ledger rows
    ("cancel", "after:UPDATE jobs", False),  # before its tasks
    ("submit", "after:INSERT INTO tasks", False),  # before the tasks' demands
    ("terminate", "before-commit", False),
    ("cancel", "after-commit", True),
]


def kill_writer_at(url: str, transition: str, point: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.state.crash_writer", url, transition, point, str(ready)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if writer.poll() is not None:
                pytest.fail(f"writer exited {writer.returncode} early: {writer.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail("writer never reached its stopping point")
            time.sleep(0.01)
        if not point.startswith("after-commit"):
            assert transaction_in_flight(url), "the writer should be inside its transaction"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        writer.stderr.close()
    assert writer.returncode == -signal.SIGKILL


def transaction_in_flight(url: str) -> bool:
    """True while another process holds an open write transaction on the database."""
    if url.startswith("sqlite"):
        probe = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        finally:
            probe.close()
        return False
    with SqlStore(url) as store, store.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'idle in transaction'"
                )
            ).scalar()
        )


@pytest.mark.parametrize(("transition", "point", "happened"), CASES)
def test_a_killed_writer_leaves_all_or_nothing(
    db_url: str, tmp_path: Path, transition: str, point: str, happened: bool
) -> None:
    with SqlStore(db_url) as store:
        expected = reference(store)  # the same history in the reference store
    kill_writer_at(db_url, transition, point, tmp_path)
    if happened:
        TRANSITIONS[transition](expected)
    with SqlStore(db_url) as reopened:  # the next start
        assert_consistent(reopened)
        assert state_of(reopened) == state_of(expected)
        if not happened:  # ... continues: the transition can now be made, entirely
            TRANSITIONS[transition](reopened)
            TRANSITIONS[transition](expected)
            assert_consistent(reopened)
            assert state_of(reopened) == state_of(expected)
