"""Only one daemon acts per cluster: a leader lock in (or beside) the state database.

On PostgreSQL it is a session advisory lock (`pg_try_advisory_lock`) held by
one connection for the daemon's life: the server releases it when that
connection ends, so a daemon killed with SIGKILL frees it for the next one at
once. On SQLite it is an OS file lock on `<database>.<cluster>.leader` (filelock), which
the kernel drops with the process. A daemon that cannot take the lock waits,
says so, and tries again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from filelock import BaseFileLock


def lock_key(cluster: str) -> int:
    """A signed 64-bit advisory-lock key for the cluster (stable across versions)."""
    digest = hashlib.sha256(f"ec2-batch-autoscaler:{cluster}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class LeaderLock:
    """The right to act for one cluster; `acquire` waits for it, `release` gives it up."""

    def __init__(self, engine: Engine, cluster: str) -> None:
        self.engine = engine
        self.cluster = cluster
        self._connection: Connection | None = None
        self._file_lock: BaseFileLock | None = None

    @property
    def holder(self) -> str:
        """Where the lock lives, for messages."""
        if self.engine.dialect.name == "sqlite":
            return str(self._lock_path())
        return f"advisory lock {lock_key(self.cluster)} on {self.engine.url.render_as_string()}"

    def try_acquire(self) -> bool:
        if self.engine.dialect.name == "sqlite":
            from filelock import FileLock, Timeout

            if self._file_lock is None:
                self._file_lock = FileLock(str(self._lock_path()))
            try:
                self._file_lock.acquire(timeout=0)
            except Timeout:
                return False
            return True
        if self._connection is None:
            self._connection = self.engine.connect()
        got = self._connection.execute(
            text("SELECT pg_try_advisory_lock(:key)"), {"key": lock_key(self.cluster)}
        ).scalar_one()
        self._connection.commit()
        return bool(got)

    def acquire(
        self,
        stop: threading.Event,
        *,
        poll_s: float = 5.0,
        on_wait: Callable[[str], None] = lambda message: None,
    ) -> bool:
        """Wait until this daemon leads (True) or `stop` is set (False)."""
        said = False
        while not stop.is_set():
            if self.try_acquire():
                return True
            if not said:
                on_wait(
                    f"another daemon leads cluster {self.cluster} ({self.holder}); "
                    "waiting for it to stop"
                )
                said = True
            stop.wait(poll_s)
        return False

    def release(self) -> None:
        if self._file_lock is not None and self._file_lock.is_locked:
            self._file_lock.release()
        if self._connection is not None:
            try:
                self._connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key(self.cluster)}
                )
                self._connection.commit()
            finally:
                self._connection.close()
                self._connection = None

    def _lock_path(self) -> Path:
        database = make_url(str(self.engine.url)).database or ""
        if database in ("", ":memory:"):
            return Path(f"/tmp/autoscaler-{self.cluster}.leader")
        return Path(f"{database}.{self.cluster}.leader")
