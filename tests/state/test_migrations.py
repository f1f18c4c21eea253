"""Schema revisions: an empty database is created at head, an outdated or foreign one is
refused with the command that fixes it, and an upgrade is all or nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from state.database import SchemaOutdated, StateError, create_state_engine
from state.migrate import MIGRATIONS, alembic_config, check_schema, head_revision, upgrade
from state.schema import Base
from state.store import JOBS, SqlStore
from tests.builders import job

TABLES = {
    "jobs",
    "tasks",
    "task_demands",
    "instances",
    "instance_transitions",
    "throughput",
    "rounds",
    "round_actions",
    "uptime_intervals",
}


def revision_of(url: str) -> str | None:
    engine = create_state_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def test_upgrade_creates_the_schema_the_models_describe(empty_db_url: str) -> None:
    engine = create_state_engine(empty_db_url)
    try:
        assert upgrade(engine) == (None, head_revision())
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= TABLES
            # The hand-written migration and the models agree (types, indexes, keys).
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
        assert upgrade(engine) == (head_revision(), head_revision())  # a second run: no-op
    finally:
        engine.dispose()
    with SqlStore(empty_db_url) as store:
        store.submit_job(job("j1", (1, 4, 8)), owner="ana", at=0.0)
        assert store.job("j1").status == "queued"


def test_a_database_without_the_schema_is_refused_with_the_command_to_run(
    empty_db_url: str, backend: str
) -> None:
    with pytest.raises(SchemaOutdated) as refused:
        SqlStore(empty_db_url)
    message = str(refused.value)
    assert f"run `autoscaler db upgrade --url {empty_db_url}`" in message
    assert "\n" not in message
    if backend == "sqlite":  # refusing did not leave an empty file behind
        assert not Path(empty_db_url.removeprefix("sqlite:///")).exists()


def test_a_downgraded_database_is_refused(db_url: str) -> None:
    engine = create_state_engine(db_url)
    try:
        command.downgrade(alembic_config(engine), "base")
        with engine.connect() as conn:
            assert not TABLES & set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    with pytest.raises(SchemaOutdated, match="autoscaler db upgrade --url"):
        SqlStore(db_url)


def test_a_schema_newer_than_the_code_is_refused_and_left_alone(db_url: str) -> None:
    engine = create_state_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(SchemaOutdated, match="newer than this autoscaler knows"):
            SqlStore(engine)
        with pytest.raises(SchemaOutdated, match="upgrade the autoscaler"):
            upgrade(engine)
    finally:
        engine.dispose()
    assert revision_of(db_url) == "9999"


def next_revision(tmp_path: Path, body: str) -> Path:
    """The shipped migrations plus a revision 0002 on top (what the next release would add)."""
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0002_next.py").write_text(
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        "revision = '0002'\n"
        f"down_revision = {head_revision()!r}\n"
        "branch_labels = None\n"
        "depends_on = None\n\n"
        "def upgrade():\n"
        f"{body}\n\n"
        "def downgrade():\n"
        "    pass\n"
    )
    return scripts


def test_an_older_revision_is_refused_and_upgraded_with_its_data(
    db_url: str, tmp_path: Path
) -> None:
    scripts = next_revision(
        tmp_path, "    op.add_column('jobs', sa.Column('priority', sa.Integer(), nullable=True))"
    )
    with SqlStore(db_url) as store:
        store.submit_job(job("j1", (1, 4, 8)), owner="ana", at=3.0)
    engine = create_state_engine(db_url)
    try:
        with pytest.raises(SchemaOutdated) as refused:
            check_schema(engine, scripts)
        assert f"revision {head_revision()} is outdated" in str(refused.value)
        assert f"needs 0002: run `autoscaler db upgrade --url {db_url}`" in str(refused.value)
        assert upgrade(engine, scripts) == (head_revision(), "0002")
        check_schema(engine, scripts)
        with engine.connect() as conn:
            row = conn.execute(select(JOBS.c.job_id, text("priority"))).one()
        assert tuple(row) == ("j1", None)
    finally:
        engine.dispose()


def test_a_failing_upgrade_changes_nothing(db_url: str, tmp_path: Path) -> None:
    scripts = next_revision(
        tmp_path,
        "    op.add_column('jobs', sa.Column('priority', sa.Integer(), nullable=True))\n"
        "    op.execute('SELECT * FROM no_such_table')",
    )
    engine = create_state_engine(db_url)
    try:
        with pytest.raises(StateError, match="upgrade to 0002 failed, nothing was changed"):
            upgrade(engine, scripts)
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert "priority" not in columns
    finally:
        engine.dispose()
    assert revision_of(db_url) == head_revision()
