"""`SqlAccounts`: the API's users, its audit log and teams' limits, in the state database.

Rows only: what a token is and how it is checked (scrypt, the overlap of a
rotation, roles) is the application's (`app.users`). Kept apart from the
`Store` the control loop drives — a round never reads a user — but in the same
database, so the daemon's API, `autoscaler user` and `autoscaler audit` share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Engine, Row, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from autoscaler.store import StoreError
from state.database import read_transaction, write_transaction
from state.schema import AuditEntry, TeamSetting, User

USERS = cast(Table, User.__table__)
AUDIT = cast(Table, AuditEntry.__table__)
TEAMS = cast(Table, TeamSetting.__table__)

#: The limits `team set` may override, as the config's `[teams.NAME]` keys name them.
TEAM_KEYS = ("weight", "max_hourly_spend", "max_share", "daily_budget", "priority", "max_priority")


class DuplicateUser(StoreError):
    """A user of that name (or id) exists already."""


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user as stored: hashes, never a token."""

    user_id: str
    name: str
    role: str
    token_hash: str
    created_at: float
    team: str | None = None
    previous_hash: str | None = None
    previous_until: float | None = None
    rotated_at: float | None = None
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class TeamRecord:
    """A team's limits set through the API: `limits` holds only the keys set (each
    overrides the config's), by `TEAM_KEYS` name."""

    name: str
    limits: Mapping[str, float | int]
    updated_at: float
    updated_by: str = ""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One API call: who, which method, on what, when, how it ended."""

    at: float
    user_name: str
    role: str
    method: str
    outcome: str
    target: str = ""
    detail: str = ""
    peer: str = ""


class SqlAccounts:
    """Users and the audit log in the state database of `engine` (at the head schema)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- users --------------------------------------------------------------------------------

    def add_user(self, user: UserRecord) -> None:
        try:
            with write_transaction(self.engine) as conn:
                taken = conn.execute(
                    select(USERS.c.user_id).where(
                        (USERS.c.name == user.name) | (USERS.c.user_id == user.user_id)
                    )
                ).first()
                if taken is not None:
                    raise DuplicateUser(f"a user named {user.name!r} exists already")
                conn.execute(insert(USERS).values(**_user_row(user)))
        except IntegrityError:
            raise DuplicateUser(f"a user named {user.name!r} exists already") from None

    def user(self, user_id: str) -> UserRecord | None:
        with read_transaction(self.engine) as conn:
            row = conn.execute(select(USERS).where(USERS.c.user_id == user_id)).first()
        return None if row is None else _user(row)

    def user_named(self, name: str) -> UserRecord | None:
        with read_transaction(self.engine) as conn:
            row = conn.execute(select(USERS).where(USERS.c.name == name)).first()
        return None if row is None else _user(row)

    def users(self) -> list[UserRecord]:
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(USERS).order_by(USERS.c.created_at, USERS.c.name)).all()
        return [_user(r) for r in rows]

    def rotate(self, user_id: str, token_hash: str, previous_until: float, at: float) -> bool:
        """Give a live user a new token hash; the current one stays valid until
        `previous_until`. False when the user is unknown or revoked."""
        with write_transaction(self.engine) as conn:
            row = conn.execute(
                select(USERS).where(USERS.c.user_id == user_id).with_for_update()
            ).first()
            if row is None or row.revoked_at is not None:
                return False
            conn.execute(
                update(USERS)
                .where(USERS.c.user_id == user_id)
                .values(
                    token_hash=token_hash,
                    previous_hash=row.token_hash,
                    previous_until=previous_until,
                    rotated_at=at,
                )
            )
        return True

    def revoke(self, user_id: str, at: float) -> bool:
        """Revoke every token of a user, at once (the overlap of a rotation too). False
        when unknown or revoked already."""
        with write_transaction(self.engine) as conn:
            done = conn.execute(
                update(USERS)
                .where(USERS.c.user_id == user_id, USERS.c.revoked_at.is_(None))
                .values(revoked_at=at, previous_hash=None, previous_until=None)
            )
        return bool(done.rowcount)

    # -- teams ----------------------------------------------------------------------------------

    def set_team(
        self, name: str, limits: Mapping[str, float | int], at: float, by: str = ""
    ) -> TeamRecord:
        """Set some of a team's limits (`TEAM_KEYS`), keeping those not given; returns
        what the team's row holds after."""
        unknown = set(limits) - set(TEAM_KEYS)
        if unknown:
            raise ValueError(f"not a team limit: {', '.join(sorted(unknown))}")
        with write_transaction(self.engine) as conn:
            row = conn.execute(select(TEAMS).where(TEAMS.c.name == name).with_for_update()).first()
            values = {**limits, "updated_at": at, "updated_by": by}
            if row is None:
                conn.execute(insert(TEAMS).values(name=name, **values))
            else:
                conn.execute(update(TEAMS).where(TEAMS.c.name == name).values(**values))
            after = conn.execute(select(TEAMS).where(TEAMS.c.name == name)).one()
        return _team(after)

    def teams(self) -> list[TeamRecord]:
        """Every team set through the API, by name."""
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(TEAMS).order_by(TEAMS.c.name)).all()
        return [_team(r) for r in rows]

    # -- the audit log ------------------------------------------------------------------------

    def record(self, entry: AuditRecord) -> None:
        with write_transaction(self.engine) as conn:
            conn.execute(insert(AUDIT).values(**_audit_row(entry)))

    def prune_audit(self, before: float) -> int:
        """Delete the audit entries recorded before `before` (`[audit] keep_days`); how many."""
        with write_transaction(self.engine) as conn:
            done = conn.execute(delete(AUDIT).where(AUDIT.c.at < before))
        return int(done.rowcount or 0)

    def audit(
        self, *, user: str | None = None, since: float | None = None, limit: int = 0
    ) -> list[AuditRecord]:
        """Audit entries, oldest first; the latest `limit` of them when it is not 0."""
        query = select(AUDIT)
        if user is not None:
            query = query.where(AUDIT.c.user_name == user)
        if since is not None:
            query = query.where(AUDIT.c.at >= since)
        query = query.order_by(AUDIT.c.id.desc())
        if limit:
            query = query.limit(limit)
        with read_transaction(self.engine) as conn:
            rows = conn.execute(query).all()
        return [_audit(r) for r in reversed(rows)]


_USER_FIELDS = tuple(UserRecord.__dataclass_fields__)
_AUDIT_FIELDS = tuple(AuditRecord.__dataclass_fields__)


def _user_row(user: UserRecord) -> dict[str, Any]:
    return {f: getattr(user, f) for f in _USER_FIELDS}


def _user(row: Row[Any]) -> UserRecord:
    return UserRecord(**{f: getattr(row, f) for f in _USER_FIELDS})


def _team(row: Row[Any]) -> TeamRecord:
    limits = {k: getattr(row, k) for k in TEAM_KEYS if getattr(row, k) is not None}
    return TeamRecord(row.name, limits, row.updated_at, row.updated_by)


def _audit_row(entry: AuditRecord) -> dict[str, Any]:
    return {f: getattr(entry, f) for f in _AUDIT_FIELDS}


def _audit(row: Row[Any]) -> AuditRecord:
    return AuditRecord(**{f: getattr(row, f) for f in _AUDIT_FIELDS})


__all__: Sequence[str] = (
    "TEAM_KEYS",
    "AuditRecord",
    "DuplicateUser",
    "SqlAccounts",
    "TeamRecord",
    "UserRecord",
)
