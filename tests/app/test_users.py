"""Users, roles and the audit log, over the real API (gRPC with TLS, the state in SQLite):
each role can do what it says and nothing more, a job belongs to whoever submitted it,
tokens are kept as hashes, rotation overlaps, revocation is immediate, and every call
— refused ones too — is in the audit log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import grpc
import pytest

from app.api import ApiClient, ApiRefused
from app.cli import main
from app.users import LEGACY_ID, ROTATION_OVERLAP_S, hash_token, token_matches
from app.wiring import first_admin
from autoscaler.jobs import spec_from_document
from executor.security import DAEMON_NAME, secure_channel
from state.accounts import SqlAccounts


def client(api, token: str) -> ApiClient:
    ca = api.config.secrets.ca_cert.read_bytes()
    channel = secure_channel(api.config.api.listen, ca, token, server_name=DAEMON_NAME)
    return ApiClient(channel, api.config.api.listen)


def admin(api) -> ApiClient:
    return client(api, api.config.secrets.api_token.read_text().strip())


def job(job_id: str, secret: str = "s3cr3t"):
    task = {
        "task_id": f"{job_id}/a",
        "job_id": job_id,
        "name": "a",
        "workload": "x_a",
        "demands": [["any", [0, 1, 2]]],
        "run": {"image": "busybox", "env": [["API_KEY", secret], ["MODE", "fast"]]},
    }
    return spec_from_document({"job_id": job_id, "name": job_id, "tasks": [task]})


def users(api, *specs: tuple[str, str]) -> dict[str, str]:
    """Add users (name, role) as the admin; their tokens by name."""
    with admin(api) as root:
        return {name: root.add_user(name, role)["token"] for name, role in specs}


def refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(ApiRefused) as caught:
        call()
    word = {
        grpc.StatusCode.PERMISSION_DENIED: "not allowed",
        grpc.StatusCode.UNAUTHENTICATED: "refused the token",
    }[code]
    assert word in str(caught.value), caught.value
    return str(caught.value)


def test_a_job_belongs_to_the_user_who_submitted_it_not_to_what_the_client_says(api):
    tokens = users(api, ("alice", "submit"))
    with client(api, tokens["alice"]) as alice:
        assert alice.submit(job("j1")) == "j1"
    assert api.store.job("j1").owner == "alice"


def test_a_job_spends_the_share_of_its_owners_team(api):
    with admin(api) as root:
        tokens = {
            "alice": root.add_user("alice", "submit", "research")["token"],
            "bob": root.add_user("bob", "submit")["token"],
        }
    with client(api, tokens["alice"]) as alice:
        alice.submit(job("j1"))
    with client(api, tokens["bob"]) as bob:
        bob.submit(job("j2"))
    assert (api.store.job("j1").team, api.store.job("j2").team) == ("research", "")


def test_a_submit_user_cannot_cancel_anothers_job_nor_read_the_audit_log(api):
    tokens = users(api, ("alice", "submit"), ("bob", "submit"))
    with client(api, tokens["alice"]) as alice, client(api, tokens["bob"]) as bob:
        alice.submit(job("j1"))
        message = refused(lambda: bob.cancel("j1"), grpc.StatusCode.PERMISSION_DENIED)
        assert "belongs to alice" in message
        refused(lambda: bob.audit(), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: bob.add_user("mallory", "admin"), grpc.StatusCode.PERMISSION_DENIED)
        assert api.store.job("j1").status == "queued"
        assert alice.cancel("j1") == (True, "cancelled")
    with admin(api) as root:
        names = [u["user"] for u in root.users()["users"]]
    assert "mallory" not in names


def test_an_admin_may_cancel_anyones_job(api):
    tokens = users(api, ("alice", "submit"))
    with client(api, tokens["alice"]) as alice:
        alice.submit(job("j1"))
    with admin(api) as root:
        assert root.cancel("j1") == (True, "cancelled")


def test_a_read_user_sees_everything_and_changes_nothing(api):
    tokens = users(api, ("alice", "submit"), ("reed", "read"))
    with client(api, tokens["alice"]) as alice:
        alice.submit(job("j1"))
    with client(api, tokens["reed"]) as reed:
        assert [j["job"] for j in reed.jobs()["jobs"]] == ["j1"]
        assert reed.job("j1")["owner"] == "alice"
        reed.status()
        refused(lambda: reed.submit(job("j2")), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: reed.cancel("j1"), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: reed.drain("i-1"), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: reed.upload_contexts({"0" * 64: b"x"}), grpc.StatusCode.PERMISSION_DENIED)
        refused(lambda: reed.revoke_user("alice"), grpc.StatusCode.PERMISSION_DENIED)
    assert [j.job_id for j in api.store.jobs()] == ["j1"]
    assert api.store.job("j1").status == "queued"


def test_env_values_are_hidden_unless_the_owner_or_an_admin_asks(api):
    tokens = users(api, ("alice", "submit"), ("bob", "submit"))
    with client(api, tokens["alice"]) as alice, client(api, tokens["bob"]) as bob:
        alice.submit(job("j1", secret="hunter2"))
        [task] = bob.job("j1")["task_list"]
        assert task["env"] == {"API_KEY": "(hidden)", "MODE": "(hidden)"}
        assert "hunter2" not in json.dumps(alice.job("j1"))
        refused(lambda: bob.job("j1", show_secrets=True), grpc.StatusCode.PERMISSION_DENIED)
        [task] = alice.job("j1", show_secrets=True)["task_list"]
        assert task["env"] == {"API_KEY": "hunter2", "MODE": "fast"}
    with admin(api) as root:
        [task] = root.job("j1", show_secrets=True)["task_list"]
        assert task["env"]["API_KEY"] == "hunter2"


def test_a_revoked_token_is_refused_at_once(api):
    tokens = users(api, ("alice", "submit"))
    with client(api, tokens["alice"]) as alice:
        alice.jobs()
        with admin(api) as root:
            assert root.revoke_user("alice")["revoked"] is True
        refused(lambda: alice.jobs(), grpc.StatusCode.UNAUTHENTICATED)


def test_a_rotated_token_works_and_the_old_one_only_for_the_overlap(api):
    tokens = users(api, ("alice", "submit"))
    with admin(api) as root:
        rotated = root.rotate_user("alice", overlap_s=600.0)
    assert rotated["previous_valid_s"] == 600.0
    new = rotated["token"]
    assert new != tokens["alice"]
    with client(api, tokens["alice"]) as old, client(api, new) as fresh:
        old.jobs()
        fresh.jobs()
        api.clock[0] += 599.0
        old.jobs()
        api.clock[0] += 2.0
        refused(lambda: old.jobs(), grpc.StatusCode.UNAUTHENTICATED)
        fresh.jobs()


def test_the_default_rotation_overlap_is_an_hour(api):
    tokens = users(api, ("alice", "submit"))
    with admin(api) as root:
        root.rotate_user("alice")
    with client(api, tokens["alice"]) as old:
        api.clock[0] += ROTATION_OVERLAP_S - 1
        old.jobs()
        api.clock[0] += 2
        refused(lambda: old.jobs(), grpc.StatusCode.UNAUTHENTICATED)


def test_a_token_of_a_known_user_with_a_wrong_secret_is_refused(api):
    tokens = users(api, ("alice", "submit"))
    user_id = tokens["alice"].split(".")[0]
    with client(api, f"{user_id}.not-the-secret") as forged:
        refused(lambda: forged.jobs(), grpc.StatusCode.UNAUTHENTICATED)


def test_tokens_are_stored_only_as_scrypt_hashes(api):
    tokens = users(api, ("alice", "submit"))
    database = api.config.state.sqlite_path
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT * FROM users").fetchall()
    dump = repr(rows)
    admin_token = api.config.secrets.api_token.read_text().strip()
    for token in (tokens["alice"], admin_token):
        assert token not in dump
        assert token.split(".", 1)[1] not in dump
    [alice] = [r for r in SqlAccounts(api.store.engine).users() if r.name == "alice"]
    assert alice.token_hash.startswith("scrypt$")
    assert token_matches(tokens["alice"], alice.token_hash)
    assert not token_matches(admin_token, alice.token_hash)


def test_every_call_is_in_the_audit_log_with_who_what_and_its_outcome(api):
    tokens = users(api, ("alice", "submit"), ("bob", "submit"))
    with client(api, tokens["alice"]) as alice, client(api, tokens["bob"]) as bob:
        alice.submit(job("j1", secret="hunter2"))
        with pytest.raises(ApiRefused):
            bob.cancel("j1")
        with pytest.raises(ApiRefused):
            bob.job("nope")
    with client(api, "u0.guess") as stranger, pytest.raises(ApiRefused):
        stranger.jobs()
    with admin(api) as root:
        entries = root.audit()["entries"]
        only_bob = root.audit(user="bob")["entries"]
    seen = [(e["user"], e["method"], e["target"], e["outcome"]) for e in entries]
    assert ("admin", "AddUser", "alice", "ok") in seen
    assert ("alice", "SubmitJob", "j1", "ok") in seen
    assert ("bob", "CancelJob", "j1", "permission_denied") in seen
    assert ("bob", "GetJob", "nope", "not_found") in seen
    assert ("-", "ListJobs", "", "unauthenticated") in seen
    assert {e["user"] for e in only_bob} == {"bob"}
    everything = json.dumps(entries)
    assert "hunter2" not in everything and tokens["alice"] not in everything
    assert tokens["alice"].split(".", 1)[1] not in everything


def test_audit_since_keeps_only_later_calls(api):
    with admin(api) as root:
        root.jobs()
        api.clock[0] += 100
        since = api.clock[0]
        root.status()
        later = root.audit(since=since)["entries"]
    assert [e["method"] for e in later] == ["ClusterStatus"]


def test_a_pre_users_clusters_shared_token_is_an_admin_until_revoked(api):
    legacy = "AbCdEf-legacy_shared_token_without_a_dot"
    accounts = SqlAccounts(api.store.engine)
    # A cluster made before users: its api.token has no user id in front, no user row yet.
    with api.store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM users")
    api.config.secrets.api_token.write_text(legacy + "\n")
    added = first_admin(api.config, api.store, api.clock[0])
    assert (added.user_id, added.name, added.role) == (LEGACY_ID, "admin", "admin")
    assert first_admin(api.config, api.store, api.clock[0]) is None  # once
    with client(api, legacy) as old:
        assert old.add_user("alice", "admin")["role"] == "admin"
    with client(api, accounts.users()[-1].user_id + ".x") as nobody, pytest.raises(ApiRefused):
        nobody.jobs()
    tokens_alice = None
    with client(api, legacy) as old:
        tokens_alice = old.rotate_user("alice")["token"]
    with client(api, tokens_alice) as alice:
        assert alice.revoke_user("admin")["revoked"] is True
    with client(api, legacy) as old:
        refused(lambda: old.jobs(), grpc.StatusCode.UNAUTHENTICATED)
    # A daemon start after the revocation does not bring it back.
    assert first_admin(api.config, api.store, api.clock[0]) is None
    with client(api, legacy) as old:
        refused(lambda: old.jobs(), grpc.StatusCode.UNAUTHENTICATED)


def test_user_and_audit_commands_through_the_cli(api, tmp_path, capsys, monkeypatch):
    config = str(api.config.path)
    token_file = tmp_path / "alice.token"
    assert main(["user", "add", "alice", "--role", "submit", "--team", "ml", "--config", config,
                 "--token-file", str(token_file)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "alice (submit, team ml)" in out and "token written to" in out
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() not in out
    assert main(["user", "list", "--json", "--config", config]) == 0
    listed = json.loads(capsys.readouterr().out)["users"]
    assert {(u["user"], u["role"], u["team"]) for u in listed} == {
        ("admin", "admin", None),
        ("alice", "submit", "ml"),
    }
    monkeypatch.setenv("AUTOSCALER_TOKEN_FILE", str(token_file))
    assert main(["audit", "--config", config]) == 2
    assert "not allowed" in capsys.readouterr().err
    monkeypatch.delenv("AUTOSCALER_TOKEN_FILE")
    assert main(["user", "revoke", "alice", "--config", config]) == 0
    assert "revoked alice" in capsys.readouterr().out
    assert main(["audit", "--user", "alice", "--json", "--config", config]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["method"], e["outcome"]) for e in entries] == [("Audit", "permission_denied")]


def test_hash_token_is_salted(tmp_path: Path):
    assert hash_token("t") != hash_token("t")
    assert token_matches("t", hash_token("t")) and not token_matches("u", hash_token("t"))


def test_a_submit_user_drains_only_an_instance_running_nothing_but_their_own_tasks(api):
    from autoscaler.store import TaskUpdate
    from tests.store_writes import request

    tokens = users(api, ("alice", "submit"), ("bob", "submit"))
    at = api.clock[0]
    for instance in ("i-a", "i-ab"):
        request(api.store, instance, "c7i.xlarge", 0.1785, at)
        api.store.transition_instance(instance, "running", at + 1, cloud_id=f"c-{instance}")
    with client(api, tokens["alice"]) as alice, client(api, tokens["bob"]) as bob:
        alice.submit(job("ja"))
        bob.submit(job("jb"))
        api.store.update_tasks(
            [
                TaskUpdate("ja/a", status="running", instance_id="i-a"),
                TaskUpdate("jb/a", status="running", instance_id="i-ab"),
            ],
            at + 2,
        )
        message = refused(lambda: alice.drain("i-ab"), grpc.StatusCode.PERMISSION_DENIED)
        assert "jobs of bob" in message
        assert api.store.instance("i-ab").status == "running"
        # Nor move bob's job off an instance (drain --job): only its owner or an admin.
        refused(lambda: alice.drain("i-ab", "jb"), grpc.StatusCode.PERMISSION_DENIED)
        assert api.store.tasks_of("jb")[0].drain_from is None
        assert alice.drain("i-a") == (True, "draining", ["ja/a"])
    with admin(api) as root:
        assert root.drain("i-ab") == (True, "draining", ["jb/a"])
