"""Browser sessions of the dashboard: an opaque id in a cookie, everything else server-side.

A user logs in once with their API token (`app.users`); the dashboard keeps
no token, only the user's id, so the user's row is read again on every request
and a revocation or a role change applies at once. The cookie holds 256 random
bits and nothing else (OWASP Session Management Cheat Sheet: an opaque,
server-side session); each session has its own CSRF token, which every action
(cancel, drain, logout) must echo in a header or form field — a synchronizer
token, on top of `SameSite=Strict`.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: A session ends this long after login, or this long after its last use if sooner.
SESSION_LIFETIME_S = 12 * 3600.0
IDLE_TIMEOUT_S = 3600.0

#: The most sessions kept; the oldest go first (a flood of logins cannot grow memory).
MAX_SESSIONS = 10_000


@dataclass
class Session:
    """One logged-in browser: whose it is, its CSRF token, and when it ends."""

    user_id: str
    csrf: str
    created_at: float
    used_at: float


class Sessions:
    """Sessions by their opaque id, with an injected clock (tests move it)."""

    def __init__(
        self,
        now: Callable[[], float] = time.time,
        *,
        lifetime_s: float = SESSION_LIFETIME_S,
        idle_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.now = now
        self.lifetime_s = lifetime_s
        self.idle_s = idle_s
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, user_id: str) -> tuple[str, Session]:
        """A new session for `user_id`: (its cookie value, the session)."""
        at = self.now()
        session_id = secrets.token_urlsafe(32)
        session = Session(user_id, secrets.token_urlsafe(32), at, at)
        with self._lock:
            if len(self._by_id) >= MAX_SESSIONS:
                oldest = min(self._by_id, key=lambda k: self._by_id[k].used_at)
                del self._by_id[oldest]
            self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie value (None: unknown, expired or idle too long)."""
        if not session_id:
            return None
        at = self.now()
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            if at - session.created_at > self.lifetime_s or at - session.used_at > self.idle_s:
                del self._by_id[session_id]
                return None
            session.used_at = at
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._by_id.pop(session_id or "", None)

    def __len__(self) -> int:
        return len(self._by_id)


def csrf_matches(session: Session, given: str | None) -> bool:
    """Does the request carry this session's CSRF token? (constant-time)"""
    return bool(given) and hmac.compare_digest(session.csrf.encode(), (given or "").encode())
