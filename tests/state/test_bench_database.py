"""`python -m benchmarks daemon --url URL` wipes the database it is given for each part:
only an empty one or its own, never a state database named by mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.errors import InputError
from benchmarks.daemon_scale import OWNED_MARKER, fresh_store, main
from state.store import SqlStore
from tests.builders import job


def test_a_state_database_given_by_mistake_is_refused_and_kept(db_url: str, tmp_path: Path):
    with SqlStore(db_url) as store:
        store.submit_job(job("precious", (0, 2, 4)), owner="ana", at=0.0)
    with pytest.raises(InputError, match="did not create"):
        fresh_store(db_url, tmp_path)
    with SqlStore(db_url) as store:
        assert [j.spec.job_id for j in store.jobs()] == ["precious"]


def test_the_command_says_so_in_one_line_with_exit_2(db_url: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--round-only", "--jobs", "10", "--url", db_url])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "name an empty database" in err


def test_an_empty_database_becomes_its_own_and_is_wiped_for_each_part(
    empty_db_url: str, tmp_path: Path
) -> None:
    if empty_db_url.startswith("sqlite:///"):
        Path(empty_db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True)
    store, _ = fresh_store(empty_db_url, tmp_path)
    with store:
        store.submit_job(job("a", (0, 2, 4)), owner="ana", at=0.0)
    store, _ = fresh_store(empty_db_url, tmp_path)  # its own now: wiped again
    with store:
        assert store.jobs() == []
        from sqlalchemy import inspect

        assert OWNED_MARKER in inspect(store.engine).get_table_names()
