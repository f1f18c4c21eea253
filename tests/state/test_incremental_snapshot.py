"""A snapshot merges the rows written since the previous one into it: always equal to
reading everything, whoever wrote them, on SQLite and PostgreSQL.

Each check compares a long-lived store's snapshot (the daemon's, merged round after
round) with a fresh store's on the same database (whose first snapshot reads it all).
"""

from __future__ import annotations

import random
from dataclasses import replace

from alembic import command
from sqlalchemy import text

from autoscaler.store import FINAL_JOB_STATUSES, InstanceChange, StateSnapshot, TaskUpdate
from state.database import create_state_engine
from state.migrate import alembic_config, head_revision, upgrade
from state.store import SqlStore
from tests.builders import job
from tests.store_writes import adopted_round

TYPES = (("c7i.large", 0.08925), ("p3.2xlarge", 3.06), ("g5.xlarge", 1.006))


def full_snapshot(url: str) -> StateSnapshot:
    with SqlStore(url) as fresh:
        return fresh.snapshot()


def assert_same(merged: StateSnapshot, url: str) -> None:
    full = full_snapshot(url)
    # The throughput table is read whole every time (and has no equality of its own).
    assert replace(merged, throughput=full.throughput) == full
    # In the same order too: planners see jobs, tasks and instances in it.
    assert [j.job_id for j in merged.jobs] == [j.job_id for j in full.jobs]
    assert list(merged.tasks) == list(full.tasks)
    assert [i.instance_id for i in merged.instances] == [i.instance_id for i in full.instances]


class World:
    """Random writes of every kind, through two stores on one database: the daemon's and
    another process's (the API server's submissions and cancellations, the CLI)."""

    def __init__(self, daemon: SqlStore, other: SqlStore, seed: int) -> None:
        self.daemon, self.other = daemon, other
        self.rng = random.Random(seed)
        self.jobs = 0
        self.instances = 0
        self.at = 0.0

    def active(self) -> list[str]:
        return [j.job_id for j in self.daemon.jobs() if j.status not in FINAL_JOB_STATUSES]

    def live(self) -> list[str]:
        return [i.instance_id for i in self.daemon.instances()]

    def writes(self, n: int) -> None:
        for _ in range(n):
            self.at += 1.0
            self.rng.choice(
                (
                    self.submit,
                    self.submit,
                    self.cancel,
                    self.round,
                    self.tasks,
                    self.instance,
                    self.worker,
                    self.finish,
                )
            )()

    def store(self) -> SqlStore:
        return self.rng.choice((self.daemon, self.other))

    def submit(self) -> None:
        self.jobs += 1
        shapes = [(self.rng.choice((0, 1)), 2, 4)] * self.rng.randint(1, 3)
        self.store().submit_job(job(f"j{self.jobs}", *shapes), owner="ana", at=self.at)

    def cancel(self) -> None:
        active = self.active()
        if active:
            self.store().cancel_job(self.rng.choice(active), self.at)

    def round(self) -> None:
        """A round that requests instances, retargets tasks and drains one."""
        requests = []
        for _ in range(self.rng.randint(0, 3)):
            self.instances += 1
            itype, price = self.rng.choice(TYPES)
            requests.append((f"i{self.instances}", itype, price))
        live = self.live() + [r[0] for r in requests]
        tasks = [t.task_id for ts in self.daemon.tasks_of_jobs(self.active()).values() for t in ts]
        targets = {
            t: self.rng.choice([*live, None]) for t in self.rng.sample(tasks, min(len(tasks), 5))
        }
        running = [i.instance_id for i in self.daemon.instances() if i.status == "running"]
        drains = (
            [(self.rng.choice(running), "unused")] if running and self.rng.random() < 0.3 else []
        )
        adopted_round(self.daemon, self.at, requests=requests, targets=targets, drains=drains)

    def tasks(self) -> None:
        active = self.active()
        if not active:
            return
        tasks = self.daemon.tasks_of(self.rng.choice(active))
        live = self.live()
        updates = [
            TaskUpdate(
                t.task_id,
                status=self.rng.choice(("starting", "running", "pending")),
                instance_id=self.rng.choice(live) if live else None,
                progress=self.rng.random() * 100,
                checkpoint=f"s3://c/{t.task_id}/{self.at}",
            )
            for t in tasks
        ]
        self.store().update_tasks(updates, self.at)
        if self.rng.random() < 0.5:
            self.store().job_started(tasks[0].job_id, self.at)

    def instance(self) -> None:
        live = [i for i in self.daemon.instances()]
        if not live:
            return
        inst = self.rng.choice(live)
        following = {
            "requested": ("pending", "failed"),
            "pending": ("running", "terminated"),
            "running": ("draining", "terminating"),
            "draining": ("running", "terminating"),
            "terminating": ("terminated",),
        }[inst.status]
        status = self.rng.choice(following)
        cloud_id = f"c-{inst.instance_id}" if inst.status == "requested" else None
        self.daemon.transition_instances(
            [InstanceChange(inst.instance_id, status, cloud_id=cloud_id, zone="z")],  # type: ignore[arg-type]
            self.at,
        )

    def worker(self) -> None:
        live = self.live()
        if live:
            self.daemon.instance_worker(self.rng.choice(live), self.at, ready=True)

    def finish(self) -> None:
        active = self.active()
        if active:
            status = self.rng.choice(("completed", "failed"))
            self.daemon.job_finished(self.rng.choice(active), self.at, status, "done")


def test_merged_snapshots_equal_full_reads_under_random_writes_from_two_stores(
    db_url: str,
) -> None:
    with SqlStore(db_url) as daemon, SqlStore(db_url) as other:
        for seed in range(3):
            world = World(daemon, other, seed)
            world.jobs = world.instances = 1000 * seed
            for _ in range(6):
                world.writes(world.rng.randint(0, 12))
                assert_same(daemon.snapshot(), db_url)
                # The step's snapshot (no throughput table) merges the same way.
                step = daemon.snapshot(with_throughput=False)
                assert (step.jobs, step.tasks, step.instances) == (
                    full_snapshot(db_url).jobs,
                    full_snapshot(db_url).tasks,
                    full_snapshot(db_url).instances,
                )
        assert daemon.snapshot().jobs  # the writes left something to compare


def test_only_the_rows_written_since_are_read_again(db_url: str) -> None:
    """Records of rows nobody wrote are the previous snapshot's own objects (not read and
    built again); a written one is new."""
    with SqlStore(db_url) as daemon, SqlStore(db_url) as api:
        for n in range(4):
            daemon.submit_job(job(f"j{n}", (1, 2, 4), (0, 2, 4)), owner="ana", at=0.0)
        adopted_round(daemon, 1.0, requests=[("i1", "c7i.large", 0.1), ("i2", "c7i.large", 0.1)])
        first = daemon.snapshot()
        api.update_tasks([TaskUpdate("j1/0", status="running", instance_id="i1")], 2.0)
        api.cancel_job("j2", 2.0)
        daemon.transition_instance("i2", "pending", 2.0, cloud_id="c-2")
        second = daemon.snapshot()
        assert_same(second, db_url)
        assert second.tasks["j0/0"] is first.tasks["j0/0"]
        assert second.tasks["j1/1"] is first.tasks["j1/1"]
        assert second.tasks["j1/0"] is not first.tasks["j1/0"]
        assert second.tasks["j1/0"].status == "running"
        assert "j2/0" not in second.tasks and "j2" not in [j.job_id for j in second.jobs]
        assert second.instances[0] is first.instances[0]  # i1: unchanged
        assert second.instances[1].status == "pending"
        # Nothing written: the same records, all of them.
        third = daemon.snapshot()
        assert all(third.tasks[t] is second.tasks[t] for t in second.tasks)
        assert replace(third, throughput=second.throughput) == second


def test_a_write_committed_after_a_snapshot_began_is_read_by_the_next(db_url: str) -> None:
    """A transaction open while a snapshot is taken (on PostgreSQL with a later one
    committed before it: transactions commit out of order) is invisible to that
    snapshot and read by the next."""
    with SqlStore(db_url) as daemon, SqlStore(db_url) as api:
        daemon.submit_job(job("j1", (1, 2, 4)), owner="ana", at=0.0)
        daemon.snapshot()
        engine = create_state_engine(db_url)
        try:
            with engine.connect() as slow:
                held = slow.begin()
                slow.execute(text("UPDATE tasks SET progress = 42.0 WHERE task_id = 'j1/0'"))
                if engine.dialect.name == "postgresql":  # SQLite: one writer at a time
                    api.submit_job(job("j2", (1, 2, 4)), owner="ana", at=1.0)
                before = daemon.snapshot()
                assert before.tasks["j1/0"].progress == 0.0
                held.commit()
            after = daemon.snapshot()
        finally:
            engine.dispose()
        assert after.tasks["j1/0"].progress == 42.0
        assert_same(after, db_url)


def test_an_upgrade_from_0012_keeps_the_data_and_snapshots_merge_after_it(db_url: str) -> None:
    """Rows written before the version column (0013) read back the same after the
    upgrade, and writes after it are merged into a snapshot taken then."""
    with SqlStore(db_url) as store:
        for n in range(3):
            store.submit_job(job(f"j{n}", (1, 2, 4)), owner="ana", at=0.0)
        adopted_round(store, 1.0, requests=[("i1", "c7i.large", 0.1)], targets={"j0/0": "i1"})
        store.transition_instance("i1", "pending", 2.0, cloud_id="c-1")
        before = store.snapshot()
    engine = create_state_engine(db_url)
    try:
        command.downgrade(alembic_config(engine), "0012")
        with engine.connect() as conn:
            columns = conn.execute(text("SELECT * FROM tasks")).keys()
        assert "version" not in columns
        assert upgrade(engine) == ("0012", head_revision())
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT DISTINCT version FROM tasks")).scalars().all()
        assert versions == [0]  # rows written before keep version 0
    finally:
        engine.dispose()
    with SqlStore(db_url) as daemon:
        assert replace(daemon.snapshot(), throughput=before.throughput) == before
        daemon.cancel_job("j1", 3.0)
        daemon.update_tasks([TaskUpdate("j0/0", status="running", instance_id="i1")], 3.0)
        daemon.transition_instance("i1", "running", 3.0)
        merged = daemon.snapshot()
        assert_same(merged, db_url)
        assert [j.job_id for j in merged.jobs] == ["j0", "j2"]
        assert merged.tasks["j0/0"].status == "running"
        assert merged.instances[0].status == "running"
