"""Teams' limits: the config's `[teams.NAME]` defaults, overridden by `autoscaler team set`.

**Precedence.** For each team and each limit (`state.accounts.TEAM_KEYS`): the value set
by `team set` (stored in the state database) if there is one, else the config's
`[teams.NAME]` value, else the default of `autoscaler.fairshare.TeamLimits`. A team
named only by `team set` is a team like one named in the config. The daemon merges the
two before each round (`team_policy`), so a change takes effect at the next round
without a restart; editing the config still needs one.

Values set through the API are checked against the same schema as the config's
(`app.config.TeamTable`), so the bounds and the messages are the config's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from app.config import TeamTable
from autoscaler.errors import InputError
from autoscaler.fairshare import TeamPolicy
from provisioners.documents import convert
from state.accounts import TEAM_KEYS, TeamRecord

#: A team's name: what `user add --team` takes.
_NAME_LIMIT = 63


def check_team(name: str, limits: Mapping[str, Any]) -> TeamTable:
    """`limits` for team `name` as the config's schema reads them; InputError naming the
    field and its value when one is out of bounds or not a limit."""
    if not name or len(name) > _NAME_LIMIT or not all(c.isalnum() or c in "._-" for c in name):
        raise InputError("must be 1-63 letters, digits, '.', '_' or '-'", field="team", value=name)
    return convert(dict(limits), TeamTable, source=f"team {name}")


def merged(
    config_teams: Mapping[str, TeamTable], records: Sequence[TeamRecord]
) -> dict[str, TeamTable]:
    """Each team's limits after the precedence above."""
    teams: dict[str, dict[str, Any]] = {
        name: msgspec.structs.asdict(table) for name, table in config_teams.items()
    }
    for record in records:
        teams.setdefault(record.name, {}).update(record.limits)
    return {name: check_team(name, values) for name, values in sorted(teams.items())}


def team_policy(
    config_teams: Mapping[str, TeamTable], records: Sequence[TeamRecord]
) -> TeamPolicy | None:
    """The `TeamPolicy` a round decides by (None: no team anywhere, no admission)."""
    teams = merged(config_teams, records)
    if not teams:
        return None
    return TeamPolicy({name: table.limits() for name, table in teams.items()})


def team_list(
    config_teams: Mapping[str, TeamTable], records: Sequence[TeamRecord]
) -> dict[str, Any]:
    """Every team's limits in effect, and which of them `team set` set (the rest are the
    config's or the defaults)."""
    by_name = {r.name: r for r in records}
    rows = []
    for name, table in merged(config_teams, records).items():
        record = by_name.get(name)
        rows.append(
            {
                "team": name,
                **{key: getattr(table, key) for key in TEAM_KEYS},
                "set": sorted(record.limits) if record else [],
                "in_config": name in config_teams,
                "updated_at": record.updated_at if record else None,
                "updated_by": record.updated_by if record else "",
            }
        )
    return {"teams": rows, "precedence": "team set, then the config's [teams.NAME], then defaults"}
