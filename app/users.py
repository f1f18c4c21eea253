"""Users of the API: tokens, roles, and how a call's token is checked.

A token is `<user_id>.<secret>`; the state database keeps only its scrypt hash
(RFC 7914; `hashlib.scrypt`), so a copy of the database gives no one a token.
The id in front finds the user's row in one lookup, so a call costs at most one
scrypt, not one per user. A token verified once is remembered by its SHA-256
for the life of the process (`Authenticator`), and the row is read again on
every call: a revocation or a rotation takes effect on the next call.

Roles: `read` sees everything and changes nothing; `submit` adds submitting
jobs and cancelling or draining its own; `admin` may do anything, others' jobs,
users and the audit log included.

Rotation keeps the previous token valid for an overlap (`ROTATION_OVERLAP_S`
unless given), so a client that has not picked up its new token yet is not
cut off; a revocation ends every token of the user at once.

A cluster made before users existed has one shared `api.token` (no id in
front): the daemon takes it as the admin user `admin` (id `legacy`) the first
time it starts, until `autoscaler user revoke admin`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autoscaler.errors import InputError
from state.accounts import DuplicateUser, SqlAccounts, UserRecord

ROLES = ("admin", "submit", "read")

#: How long a rotated-out token keeps working beside its successor (one hour).
ROTATION_OVERLAP_S = 3600.0

#: The id of the user a pre-users cluster's shared `api.token` becomes.
LEGACY_ID = "legacy"

#: The name of the first admin (`init`) and of a legacy token's user.
FIRST_ADMIN = "admin"

#: scrypt's cost (n = 2^14, r = 8, p = 1: 16 MiB, tens of milliseconds — the
#: interactive-login parameters of RFC 7914 §2), paid once per token per process.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def new_user_token(user_id: str) -> str:
    """A fresh token for `user_id`: its id, a dot, and 256 random bits."""
    return f"{user_id}.{secrets.token_urlsafe(32)}"


def new_user_id() -> str:
    return "u" + secrets.token_hex(6)


def user_id_of(token: str) -> str:
    """The user id a token names (a token without one is the legacy shared token)."""
    user_id, dot, _ = token.partition(".")
    return user_id if dot else LEGACY_ID


def hash_token(token: str, *, salt: bytes | None = None) -> str:
    """`scrypt$n$r$p$salt$digest` of a token (base64 parts)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(token.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    parts = (base64.b64encode(salt).decode(), base64.b64encode(digest).decode())
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${parts[0]}${parts[1]}"


def token_matches(token: str, stored: str) -> bool:
    """Does `token` hash to `stored`? (constant-time comparison of the digests)"""
    try:
        scheme, n, r, p, salt_b64, digest_b64 = stored.split("$")
        if scheme != "scrypt":
            return False
        salt, digest = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
        fresh = hashlib.scrypt(
            token.encode(), salt=salt, n=int(n), r=int(r), p=int(p), dklen=len(digest)
        )
    except ValueError:
        return False
    return hmac.compare_digest(fresh, digest)


def check_user_name(name: str) -> str:
    if not _NAME.match(name):
        raise InputError(
            "must be 1-63 letters, digits, '.', '_' or '-'",
            field="NAME",
            value=name,
            has_value=True,
        )
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InputError(f"must be one of {', '.join(ROLES)}", field="--role", value=role)
    return role


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a call: their name, role and team."""

    user_id: str
    name: str
    role: str
    team: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


#: Failed token checks a user id may cost before it is limited (a burst), then one per
#: `FAILURE_EVERY_S`: each costs a scrypt (tens of milliseconds, 16 MiB), so guessing at a
#: known user id is bounded CPU and memory a second, not what the caller sends.
FAILURE_BURST = 10
FAILURE_EVERY_S = 1.0


class Authenticator:
    """The user a token belongs to, if it is valid now.

    Each call reads the user's row (so revocations and rotations apply at once);
    scrypt runs only the first time a given token meets a given stored hash.

    Failed checks are rate-limited per user id (a token bucket: `FAILURE_BURST`, then
    one per `FAILURE_EVERY_S`): once a user id's bucket is empty, a token not verified
    before is refused without running scrypt until the bucket refills. A token already
    verified (a logged-in client) is checked from the cache and never limited, so an
    attack on a user id does not cut its running clients off. Unknown ids cost no
    scrypt at all; the buckets are bounded by the users that exist.
    """

    CACHE = 4096

    def __init__(
        self,
        accounts: SqlAccounts,
        now: Callable[[], float] = time.time,
        *,
        failure_burst: int = FAILURE_BURST,
        failure_every_s: float = FAILURE_EVERY_S,
    ) -> None:
        self.accounts = accounts
        self.now = now
        self.failure_burst = failure_burst
        self.failure_every_s = failure_every_s
        self._verified: OrderedDict[tuple[bytes, str], None] = OrderedDict()
        self._failures: dict[str, tuple[float, float]] = {}  # user id -> (tokens, at)
        self._lock = threading.Lock()

    def authenticate(self, token: str) -> Caller | None:
        user = self.accounts.user(user_id_of(token))
        if user is None or user.revoked_at is not None:
            return None
        valid = [user.token_hash]
        if user.previous_hash and (user.previous_until or 0.0) > self.now():
            valid.append(user.previous_hash)
        fingerprint = hashlib.sha256(token.encode()).digest()
        if any(self._cached(fingerprint, stored) for stored in valid):
            return Caller(user.user_id, user.name, user.role, user.team)
        if not self._may_try(user.user_id):
            return None  # too many failures for this id lately: no scrypt spent on it
        if not any(self._matches(fingerprint, token, stored) for stored in valid):
            self._failed(user.user_id)
            return None
        return Caller(user.user_id, user.name, user.role, user.team)

    def _bucket(self, user_id: str, now: float) -> float:
        tokens, at = self._failures.get(user_id, (float(self.failure_burst), now))
        return min(float(self.failure_burst), tokens + (now - at) / self.failure_every_s)

    def _may_try(self, user_id: str) -> bool:
        with self._lock:
            return self._bucket(user_id, self.now()) >= 1.0

    def _failed(self, user_id: str) -> None:
        now = self.now()
        with self._lock:
            self._failures[user_id] = (max(0.0, self._bucket(user_id, now) - 1.0), now)

    def _cached(self, fingerprint: bytes, stored: str) -> bool:
        key = (fingerprint, stored)
        with self._lock:
            if key in self._verified:
                self._verified.move_to_end(key)
                return True
        return False

    def _matches(self, fingerprint: bytes, token: str, stored: str) -> bool:
        key = (fingerprint, stored)
        if not token_matches(token, stored):
            return False
        with self._lock:
            self._verified[key] = None
            while len(self._verified) > self.CACHE:
                self._verified.popitem(last=False)
        return True


def add_user(
    accounts: SqlAccounts, name: str, role: str, team: str | None, at: float
) -> tuple[UserRecord, str]:
    """A new user and their token (shown once; only its hash is kept)."""
    user_id = new_user_id()
    token = new_user_token(user_id)
    record = UserRecord(
        user_id=user_id,
        name=check_user_name(name),
        role=check_role(role),
        team=team or None,
        token_hash=hash_token(token),
        created_at=at,
    )
    accounts.add_user(record)
    return record, token


def rotate_user(
    accounts: SqlAccounts, user: UserRecord, at: float, overlap_s: float = ROTATION_OVERLAP_S
) -> str | None:
    """A new token for `user`; the current one keeps working `overlap_s` more. None when
    the user is revoked."""
    token = new_user_token(user.user_id) if user.user_id != LEGACY_ID else None
    if token is None:
        raise InputError(
            "the legacy shared token cannot be rotated: add an admin with `autoscaler user "
            "add NAME --role admin`, then `autoscaler user revoke admin`",
            field="NAME",
            value=user.name,
            has_value=True,
        )
    if not accounts.rotate(user.user_id, hash_token(token), at + overlap_s, at):
        return None
    return token


def ensure_first_admin(accounts: SqlAccounts, token_file: Path, at: float) -> UserRecord | None:
    """Make the token in `token_file` (`secrets/api.token`) the admin `admin`, unless its
    user is known already (revoked stays revoked). A token from `init` names its user id;
    a pre-users cluster's shared token becomes the user of id `legacy`. Returns the user
    added, if one was."""
    try:
        token = token_file.read_text().strip()
    except OSError:
        return None
    if not token:
        return None
    user_id = user_id_of(token)
    if accounts.user(user_id) is not None or accounts.user_named(FIRST_ADMIN) is not None:
        return None
    record = UserRecord(
        user_id=user_id,
        name=FIRST_ADMIN,
        role="admin",
        token_hash=hash_token(token),
        created_at=at,
    )
    try:
        accounts.add_user(record)
    except DuplicateUser:  # another process (init, a daemon) added it meanwhile
        return None
    return record
