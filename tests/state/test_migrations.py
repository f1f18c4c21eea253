"""Schema revisions: an empty database is created at head, an outdated or foreign one is
refused with the command that fixes it, and an upgrade is all or nothing."""

from __future__ import annotations

import json
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


def test_a_database_at_head_missing_a_table_or_column_is_refused_in_one_line(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    engine = create_state_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE uptime_intervals"))
        with pytest.raises(SchemaOutdated, match="table 'uptime_intervals' is missing"):
            SqlStore(engine)
        assert main(["db", "status", "--url", db_url]) == 1
        assert "table 'uptime_intervals' missing" in capsys.readouterr().out
        with engine.begin() as conn:
            Base.metadata.tables["uptime_intervals"].create(conn)
            conn.execute(text("ALTER TABLE rounds DROP COLUMN reason"))
        with pytest.raises(SchemaOutdated, match=r"column 'rounds.reason' is missing") as refused:
            SqlStore(engine)
        assert "\n" not in str(refused.value)
    finally:
        engine.dispose()


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
    """The shipped migrations plus a revision 0099 on top (what the next release would add)."""
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0099_next.py").write_text(
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        "revision = '0099'\n"
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
        assert f"needs 0099: run `autoscaler db upgrade --url {db_url}`" in str(refused.value)
        assert upgrade(engine, scripts) == (head_revision(), "0099")
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
        with pytest.raises(StateError, match="upgrade to 0099 failed, nothing was changed"):
            upgrade(engine, scripts)
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert "priority" not in columns
    finally:
        engine.dispose()
    assert revision_of(db_url) == head_revision()


def test_0002_moves_stored_specs_to_three_parts_and_keeps_their_data(empty_db_url: str) -> None:
    """A job stored by revision 0001 (flat spec, demands also in task_demands) reads back
    as the same job after the upgrade, and a downgrade restores the old layout."""
    if empty_db_url.startswith("sqlite:///"):
        Path(empty_db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_state_engine(empty_db_url)
    flat = {
        "job_id": "j1",
        "name": "resnet18[0]",
        "arrival_time_s": 960.0,
        "duration_s": 12430.0,
        "total_iters": 26103.0,
        "full_throughput": 2.1,
        "init_delay_s": 80.0,
        "max_tasks_per_instance": None,
        "tasks": [
            {
                "task_id": "j1/0",
                "job_id": "j1",
                "name": "node0",
                "workload": "resnet18_node0",
                "kill_s": 1.0,
                "upload_s": 1.0,
                "fetch_s": 1.0,
                "build_image_s": 10.0,
                "image_id": "7",
                "demands": [["any", [1.0, 12.0, 16.0]]],
            }
        ],
    }
    try:
        command.upgrade(alembic_config(engine), "0001")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO jobs (job_id, name, owner, status, submitted_at, spec) "
                    "VALUES ('j1', 'resnet18[0]', 'ana', 'queued', 960.0, :spec)"
                ),
                {"spec": json.dumps(flat)},
            )
            conn.execute(
                text(
                    "INSERT INTO tasks (task_id, job_id, position, workload, status, progress, "
                    "updated_at) VALUES ('j1/0', 'j1', 0, 'resnet18_node0', 'pending', 0, 960.0)"
                )
            )
            conn.execute(
                text("INSERT INTO task_demands VALUES ('j1/0', 0, 'any', 1.0, 12.0, 16.0)")
            )
        assert upgrade(engine) == ("0001", head_revision())
        with SqlStore(engine) as store:
            spec = store.job("j1").spec
            [task] = store.tasks_of("j1")
        assert spec.trace.arrival_time_s == 960.0 and spec.trace.total_iters == 26103.0
        assert spec.full_throughput == 2.1 and spec.tasks[0].run.image == "7"
        assert spec.tasks[0].demands[0][1] == (1.0, 12.0, 16.0)
        assert (task.status, task.attempt, task.failures, task.status_since) == (
            "pending",
            0,
            0,
            960.0,
        )
        command.downgrade(alembic_config(engine), "0001")
        with engine.connect() as conn:
            back = json.loads(conn.execute(text("SELECT spec FROM jobs")).scalar_one())
            demands = conn.execute(text("SELECT family, gpu, cpu, ram_gb FROM task_demands")).all()
        assert back["arrival_time_s"] == 960.0 and back["tasks"][0]["image_id"] == "7"
        assert [tuple(d) for d in demands] == [("any", 1.0, 12.0, 16.0)]
    finally:
        engine.dispose()
