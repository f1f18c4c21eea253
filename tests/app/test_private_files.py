"""What `init` writes, and the state database it makes, only their owner may read: job
specs (env values included) live in the state, tokens and keys in secrets/."""

from __future__ import annotations

import os
import stat

from app.cli import main
from app.config import load_cluster_config
from app.wiring import open_state
from tests.app.test_users import job


def test_init_and_the_state_database_are_readable_by_their_owner_only(tmp_path):
    before = os.umask(0o022)  # a usual umask: files would be 0644
    try:
        assert main(["init", "--dir", str(tmp_path / "c"), "--local", "--name", "p"]) == 0
        assert os.umask(0o022) == 0o022  # the command gave the process its umask back
        config = load_cluster_config(tmp_path / "c" / "autoscaler.toml")
        store = open_state(config, create=True)
        try:
            store.submit_job(job("j1", secret="hunter2"), owner="admin", at=0.0)
        finally:
            store.close()
    finally:
        os.umask(before)
    paths = [tmp_path / "c", *(tmp_path / "c").rglob("*")]
    assert config.state.sqlite_path in paths and config.path in paths
    exposed = [f"{p} {stat.S_IMODE(p.stat().st_mode):o}" for p in paths if p.stat().st_mode & 0o077]
    assert exposed == []


def test_an_existing_state_database_is_made_private_when_the_daemon_opens_it(tmp_path):
    assert main(["init", "--dir", str(tmp_path), "--local", "--name", "p"]) == 0
    config = load_cluster_config(tmp_path / "autoscaler.toml")
    database = config.state.sqlite_path
    database.chmod(0o644)  # as a cluster made before this release left it
    open_state(config, create=True).close()
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
