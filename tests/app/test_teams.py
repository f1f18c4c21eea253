"""Teams' limits set through the API (`autoscaler team set/list`, `app.teams`), over the
real API (gRPC with TLS, the state in SQLite): admin only, audited, each key set
overriding the config's `[teams.NAME]`, and in effect at the daemon's next round."""

from __future__ import annotations

import json

import grpc
import pytest

from app.api import ApiRefused
from app.config import load_cluster_config
from app.daemon import Daemon
from app.teams import team_policy
from app.wiring import build_bindings
from autoscaler.fairshare import TeamLimits
from tests.app.test_users import admin, client, refused, users

TEAMS = """
[teams.ml]
weight = 2.0
daily_budget = 10.0
priority = 1
"""


@pytest.fixture
def with_teams(cluster_dir):
    """The cluster's config with a `[teams.ml]` table (before the API starts)."""
    path = cluster_dir / "autoscaler.toml"
    path.write_text(path.read_text() + TEAMS)
    return cluster_dir


def test_team_set_overrides_the_configs_keys_one_by_one(with_teams, api):
    with admin(api) as root:
        ml = root.set_team("ml", daily_budget=5.0)
        cv = root.set_team("cv", weight=3.0, max_share=0.5)
        listed = {t["team"]: t for t in root.teams()["teams"]}
    # ml: the daily budget set, the rest the config's; cv: only named by `team set`
    assert (ml["weight"], ml["daily_budget"], ml["priority"]) == (2.0, 5.0, 1)
    assert ml["set"] == ["daily_budget"] and ml["in_config"]
    assert (cv["weight"], cv["max_share"], cv["daily_budget"]) == (3.0, 0.5, None)
    assert listed["ml"]["updated_by"] == "admin"
    policy = team_policy(api.config.teams, api.service.accounts.teams())
    assert policy is not None
    assert policy.limits("ml") == TeamLimits(2.0, None, None, 1, None, 5.0)
    assert policy.limits("cv") == TeamLimits(3.0, None, 0.5, 0, None, None)


def test_a_later_set_keeps_what_it_does_not_name(api):
    with admin(api) as root:
        root.set_team("ml", weight=2.0, daily_budget=8.0)
        after = root.set_team("ml", daily_budget=4.0)
    assert (after["weight"], after["daily_budget"]) == (2.0, 4.0)


def test_team_set_is_admin_only_and_audited(api):
    tokens = users(api, ("alice", "submit"), ("reed", "read"))
    with client(api, tokens["alice"]) as alice, client(api, tokens["reed"]) as reed:
        refused(lambda: alice.set_team("ml", weight=9.0), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: reed.teams(), grpc.StatusCode.PERMISSION_DENIED)
    with admin(api) as root:
        root.set_team("ml", max_hourly_spend=12.5)
        assert root.teams()["teams"][0]["weight"] == 1.0  # not alice's 9
        entries = root.audit()["entries"]
    calls = [(e["user"], e["method"], e["target"], e["outcome"]) for e in entries]
    assert ("alice", "SetTeam", "ml", "permission_denied") in calls
    assert ("reed", "ListTeams", "", "permission_denied") in calls
    assert ("admin", "SetTeam", "ml", "ok") in calls


def test_a_limit_out_of_bounds_is_refused_with_its_field_and_nothing_is_stored(api):
    with admin(api) as root:
        with pytest.raises(ApiRefused) as caught:
            root.set_team("ml", max_share=0.0)
        assert "max_share" in str(caught.value)
        with pytest.raises(ApiRefused) as caught:
            root.set_team("ml")
        assert "at least one limit" in str(caught.value)
        assert root.teams()["teams"] == []


def test_the_daemon_decides_by_what_team_set_stored_at_its_next_round(with_teams, api):
    config = load_cluster_config(with_teams / "autoscaler.toml")
    daemon = Daemon(config, build_bindings(config))
    try:
        before = daemon.loop.options.teams
        assert before is not None and before.limits("ml").daily_budget == 10.0
        with admin(api) as root:
            root.set_team("ml", daily_budget=2.5)
        assert daemon.loop.options.teams is before  # nothing changes mid-round
        daemon.round()
        after = daemon.loop.options.teams
        assert after is not None and after.limits("ml").daily_budget == 2.5
        assert after.limits("ml").weight == 2.0
        assert daemon.api.options is daemon.loop.options  # quotes see the same limits
    finally:
        daemon.bindings.store.close()


def test_team_commands_through_the_cli(api, capsys):
    from app.cli import main

    config = ["--config", str(api.config.path)]
    assert main(["team", "list", *config]) == 0
    assert "no teams" in capsys.readouterr().out
    assert main(["team", "set", "ml", "--weight", "2", "--daily-budget", "150", *config]) == 0
    out = capsys.readouterr().out
    assert "$150.00*" in out and "2*" in out and "next round" in out
    assert main(["team", "set", "ml", *config]) == 2
    assert "at least one limit" in capsys.readouterr().err
    assert main(["team", "list", "--json", *config]) == 0
    [ml] = json.loads(capsys.readouterr().out)["teams"]
    assert (ml["team"], ml["weight"], ml["daily_budget"]) == ("ml", 2.0, 150.0)
    assert ml["set"] == ["daily_budget", "weight"]


def test_the_daemon_prunes_audit_entries_older_than_keep_days(cluster_dir, api):
    path = cluster_dir / "autoscaler.toml"
    path.write_text(path.read_text() + "\n[audit]\nkeep_days = 1.0\n")
    config = load_cluster_config(path)
    now = api.clock[0]
    api.clock[0] = now - 2 * 86400.0  # two days ago
    with admin(api) as root:
        root.teams()
    api.clock[0] = now - 3600.0  # an hour ago
    with admin(api) as root:
        root.set_team("ml", weight=2.0)
    daemon = Daemon(config, build_bindings(config))
    try:
        assert daemon.prune_audit() == 1
        assert daemon.prune_audit() == 0
    finally:
        daemon.bindings.store.close()
    api.clock[0] = now
    with admin(api) as root:
        methods = [e["method"] for e in root.audit()["entries"]]
    assert methods == ["SetTeam"]  # the call two days old is gone
