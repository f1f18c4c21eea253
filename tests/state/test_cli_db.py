"""`autoscaler db upgrade` / `db status` as a user runs them, and the `[state]` table."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.state_config import (
    StateConfig,
    database_url_for,
    default_state_path,
    load_state_config,
    parse_state_config,
)
from autoscaler.errors import InputError
from state.migrate import head_revision
from state.store import SqlStore
from tests.builders import job

ROOT = Path(__file__).resolve().parents[2]


def autoscaler(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed `autoscaler` command (`python -m autoscaler` where no script exists)."""
    script = Path(sys.executable).with_name("autoscaler")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "app"]
    return subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_db_upgrade_creates_then_leaves_the_schema_alone(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = autoscaler("db", "upgrade", "--url", empty_db_url)
    assert created.returncode == 0, created.stderr
    assert f"schema created at revision {head_revision()}" in created.stdout
    with SqlStore(empty_db_url) as store:
        store.submit_job(job("j1", (1, 4, 8)), owner="ana", at=1.0)
    again = autoscaler("db", "upgrade", "--url", empty_db_url)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    with SqlStore(empty_db_url) as store:
        assert store.job("j1").owner == "ana"  # the second run kept the data
    assert main(["db", "status", "--url", empty_db_url]) == 0
    assert f"revision {head_revision()} (up to date)" in capsys.readouterr().out


def test_db_status_says_what_to_run_on_a_database_without_schema(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "status", "--url", empty_db_url]) == 1
    out = capsys.readouterr().out
    assert f"no autoscaler schema: run `autoscaler db upgrade --url {empty_db_url}`" in out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("state.db", "not a database URL: use sqlite:////absolute/path/state.db"),
        ("mysql://u@db/autoscaler", "unsupported database 'mysql'"),
        ("postgresql+psycopg2://u@db/a", "unsupported PostgreSQL driver 'postgresql+psycopg2'"),
        (
            # The port is picked when the test runs: a collection-time one would differ
            # between pytest-xdist's workers, which must collect the same tests.
            "postgresql://u:secret@127.0.0.1:{free_port}/a",
            "cannot use the database: connection failed",
        ),
    ],
)
def test_bad_database_urls_get_one_line_and_status_2(
    url: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url.replace("{free_port}", str(free_port()))
    assert main(["db", "upgrade", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoscaler: error: ") and expected in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "secret" not in err  # passwords are never printed


def test_a_file_that_is_not_a_database_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just some text that fills a page. " * 40)
    assert main(["db", "upgrade", "--url", f"sqlite:///{path}"]) == 2
    err = capsys.readouterr().err
    assert f"sqlite:///{path}: cannot use the database: file is not a database" in err
    assert err.count("\n") == 1


def test_db_upgrade_reads_the_state_table_of_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "autoscaler.toml"
    config.write_text('[ec2]\nregion = "us-east-1"\n\n[state]\npath = "var/state.db"\n')
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    assert (tmp_path / "var" / "state.db").exists()
    assert "schema created" in capsys.readouterr().out
    with SqlStore(f"sqlite:///{tmp_path / 'var' / 'state.db'}") as store:
        assert store.jobs() == []


def test_db_upgrade_in_a_cluster_directory_upgrades_that_cluster_s_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Run where `autoscaler init` wrote the cluster's file, as the daemon's refusal
    # suggests, `db upgrade` upgrades the database the daemon will open, not the
    # per-user default; $AUTOSCALER_CONFIG, which the daemon also reads, comes first.
    monkeypatch.delenv("AUTOSCALER_CONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "autoscaler.toml").write_text('[state]\npath = "var/state.db"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["db", "upgrade"]) == 0
    assert f"sqlite:///{tmp_path / 'var' / 'state.db'}: schema created" in capsys.readouterr().out
    assert not default_state_path().exists()
    other = tmp_path / "elsewhere" / "c.toml"
    other.parent.mkdir()
    other.write_text('[state]\npath = "other.db"\n')
    monkeypatch.setenv("AUTOSCALER_CONFIG", str(other))
    assert main(["db", "upgrade"]) == 0
    assert (other.parent / "other.db").exists() and not default_state_path().exists()
    (tmp_path / "autoscaler.toml").unlink()  # no file at all: the per-user default
    monkeypatch.delenv("AUTOSCALER_CONFIG")
    assert main(["db", "upgrade"]) == 0
    assert default_state_path().exists()


def test_state_table_url_path_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg://autoscaler@db:5432/autoscaler"
    assert parse_state_config({"state": {"url": url}}) == StateConfig(url, "config")
    assert parse_state_config({"state": {"path": "s.db"}}, base_dir=tmp_path).url == (
        f"sqlite:///{tmp_path / 's.db'}"
    )
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_path() == tmp_path / "xdg" / "ec2-batch-autoscaler" / "state.db"
    assert parse_state_config({}).url == f"sqlite:///{default_state_path()}"
    assert load_state_config(None).url == f"sqlite:///{default_state_path()}"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_path() == (
        Path.home() / ".local" / "state" / "ec2-batch-autoscaler" / "state.db"
    )
    config = tmp_path / "c.toml"
    config.write_text(f'[state]\nurl = "{url}"\n')
    assert database_url_for(None, config) == url
    assert database_url_for("sqlite:///other.db", config) == "sqlite:///other.db"  # --url wins


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"url": "sqlite:///a.db", "path": "b.db"}, "give either 'url' or 'path'"),
        ({"ulr": "sqlite:///a.db"}, "field 'ulr': unknown field (known: path, url)"),
        ({"url": ""}, "field 'url' = '': must be a non-empty string"),
        ({"path": 3}, "field 'path' = 3: must be a string, not a whole number"),
    ],
)
def test_state_table_mistakes_are_named(table: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=r"^c\.toml: \[state\]") as error:
        parse_state_config({"state": table}, source="c.toml")
    assert message in str(error.value)


def test_a_state_key_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(InputError, match="field 'state' = 'x': must be a table"):
        parse_state_config({"state": "x"}, source="c.toml")
