"""The daemon against EC2 and S3 on `moto_server`: a subprocess, as users run it.

Its instances are booted by `BootedInstances` from their own user data (see `ec2.py`); its
tasks are real containers built from the examples, their contexts and checkpoints in S3.

- One scenario per state backend (SQLite, and the PostgreSQL server CI starts): jobs
  submitted through the CLI are packed, run, one is moved by draining its instance and
  resumes from its checkpoint in S3, all complete; `cost-report` sums equal the ledger;
  `autoscaler down` leaves no instance running in EC2.
- The daemon killed with SIGKILL at each named point of a round and restarted: no instance
  unknown to the state, no job lost, no launch doubled; a second daemon on the same database
  waits while the first leads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.wiring import offline_catalog
from tests.e2e.ec2 import (
    AuditedDaemon,
    BootedInstances,
    aws_env,
    check_aws_calls,
    client,
    ec2_cluster,
)
from tests.e2e.harness import (
    Daemon,
    all_running,
    cli,
    cli_json,
    copy_example,
    running_past,
    state_of,
    until,
)
from tests.executor.conftest import docker_client, moto_endpoint, python_image  # noqa: F401
from tests.state.conftest import PgDatabases, pg_admin  # noqa: F401

pytestmark = [pytest.mark.timeout(900), pytest.mark.long]

TRAIN_TOTAL = 1200  # iterations of 0.05 s: a minute alone, long enough to be moved
FINISHED = ("completed", "failed", "cancelled")


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):  # noqa: F811
    """This process talks to moto as the CLI's user would to AWS."""
    for key, value in aws_env(moto_endpoint, tmp_path).items():
        monkeypatch.setenv(key, value)
    return moto_endpoint


@pytest.fixture(params=["sqlite", "postgresql"])
def state_url(request):
    if request.param == "sqlite":
        yield None
        return
    databases = PgDatabases(request.getfixturevalue("pg_admin"))
    yield databases.create()
    databases.drop_all()


def _boot(config, aws, tmp_path, docker) -> BootedInstances:
    capacity = {t.name: ",".join(f"{v:g}" for v in t.capacity) for t in offline_catalog(config)}
    return BootedInstances(
        aws, config.cluster.name, capacity, tmp_path / "instances", docker, config.path.parent
    )


def _jobs(tmp_path: Path, train_total: int = TRAIN_TOTAL) -> list[Path]:
    jobs = tmp_path / "jobs"
    return [
        copy_example("train", jobs, {"TOTAL": str(train_total)}),
        copy_example("data-parallel", jobs, {"TOTAL": "300"}),
    ]


def test_jobs_are_packed_moved_through_s3_completed_and_billed_on_ec2(
    tmp_path,
    aws,
    state_url,
    python_image,  # noqa: F811
    docker_client,  # noqa: F811
):
    config = ec2_cluster(tmp_path / "cluster", aws, state_url=state_url)
    at = ("--config", str(config.path))
    instances = _boot(config, aws, tmp_path, docker_client).start()
    daemon = AuditedDaemon(config.path, aws)
    try:
        daemon.wait_serving()
        submitted = cli_json("submit", *map(str, _jobs(tmp_path)), *at)["jobs"]
        [train] = [j for j in submitted if j.startswith("sgd-train")]

        running = until("every task to run", lambda: all_running(config, submitted), daemon=daemon)
        assert len({t.instance_id for t in running}) < len(running) == 3  # packed
        # Every task runs on an instance EC2 runs, booted from the user data the daemon wrote.
        assert {t.instance_id for t in running} <= set(instances.tokens.values())
        # Each worker enrolled with its own instance's signed identity document (no token).
        assert instances.user_data and all(
            "TOKEN_PARAMETER" not in v for v in instances.user_data.values()
        )
        assert all(
            any(r.startswith("GET /latest/dynamic/instance-identity/") for r in m.requests)
            for m in instances.metadata.values()
        )

        task = until(
            "the training job to pass 100 iterations",
            lambda: running_past(config, train, 100),
            daemon=daemon,
        )
        code, out = cli("drain", task.instance_id, *at)
        assert code == 0, out

        def finished():
            states = {j: cli_json("job", j, *at)["status"] for j in submitted}
            return states if all(s in FINISHED for s in states.values()) else None

        states = until("every job to finish", finished, daemon=daemon)
        assert set(states.values()) == {"completed"}, states
        assert not instances.errors, instances.errors

        with state_of(config) as store:
            [moved] = store.tasks_of(train)
            assert moved.attempt >= 2 and moved.progress == TRAIN_TOTAL
        logs = cli_json("logs", train, *at)["logs"]
        resumed = [
            int(m) for text in logs.values() for m in re.findall(r"resumed at step (\d+)", text)
        ]
        assert resumed and min(resumed) >= 100, logs
        # The checkpoint it resumed from went through the bucket.
        bucket, _, prefix = config.storage.url.removeprefix("s3://").partition("/")
        keys = [
            o["Key"]
            for page in client("s3", aws)
            .get_paginator("list_objects_v2")
            .paginate(Bucket=bucket, Prefix=f"{prefix}/jobs/{train}/")
            for o in page.get("Contents", [])
        ]
        assert any(k.endswith(".tar.gz") for k in keys), keys

        report = cli_json("cost-report", *at)
        with state_of(config) as store:
            ledger = store.cost_between(0, report["until"])
            known = {i.cloud_id for i in store.instances(include_finished=True)}
        assert ledger > 0
        assert report["spend"] == pytest.approx(ledger, abs=1e-6)
        assert sum(report["spend_by_job"].values()) + report["idle"] == pytest.approx(
            ledger, abs=1e-5
        )
        assert sum(report["spend_by_type"].values()) == pytest.approx(ledger, abs=1e-5)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        code, out = cli("down", "--yes", *at)
        listing = instances.listing()
        instances.close()
    assert code == 0, out
    check_aws_calls(config.path.parent)
    # Everything EC2 started for the cluster is known to the state and is shutting down.
    assert {i["InstanceId"] for i in listing} <= known
    assert all(i["State"]["Name"] in ("shutting-down", "terminated") for i in listing)
    assert len(instances.instance_ids()) == len(set(instances.instance_ids()))


KILL_POINTS = ("launched", "synced", "decided", "recorded", "acted", "stepped")


def test_a_daemon_killed_at_each_point_of_a_round_loses_nothing_and_launches_nothing_twice(
    tmp_path,
    aws,
    python_image,  # noqa: F811
    docker_client,  # noqa: F811
):
    config = ec2_cluster(tmp_path / "cluster", aws)
    at = ("--config", str(config.path))
    instances = _boot(config, aws, tmp_path, docker_client).start()
    submitted: list[str] = []
    daemons: list[Daemon] = []

    def check_invariants(after: str) -> None:
        listing = instances.listing()
        with state_of(config) as store:
            known = {i.instance_id: i for i in store.instances(include_finished=True)}
            jobs = {j.job_id: j for j in store.jobs()}
        # No instance unknown to the state: every one EC2 runs carries a launch token the
        # state recorded before asking (its EC2 id may not be recorded yet).
        for inst in listing:
            if inst["State"]["Name"] in ("pending", "running"):
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                token = tags.get("autoscaler:launch-token")
                assert token in known, f"after {after}: {inst['InstanceId']} unknown ({token})"
        tokens = instances.instance_ids()
        assert len(tokens) == len(set(tokens)), f"after {after}: a launch doubled: {tokens}"
        assert set(submitted) <= set(jobs), f"after {after}: jobs lost"
        assert not [j for j in submitted if jobs[j].status in ("failed", "cancelled")], after

    try:
        for point in KILL_POINTS:
            daemon = AuditedDaemon(
                config.path, aws, env={"AUTOSCALER_TEST_KILL_AT": point}, name=point
            )
            daemons.append(daemon)
            if not submitted:
                daemon.wait_serving()
                submitted = cli_json("submit", *map(str, _jobs(tmp_path, 600)), *at)["jobs"]
            until(f"the daemon to die at {point!r}", lambda d=daemon: d.process.poll() is not None)
            assert daemon.process.returncode == -9, daemon.tail()
            assert [e["point"] for e in daemon.events("test_fault")] == [point]
            check_invariants(point)

        leader = AuditedDaemon(config.path, aws, name="leader")
        daemons.append(leader)
        leader.wait_serving()
        second = AuditedDaemon(config.path, aws, name="second")
        daemons.append(second)
        until("the second daemon to wait", lambda: second.events("waiting"), daemon=second)

        def finished():
            with state_of(config) as store:
                states = {j: store.job(j).status for j in submitted}
            return states if all(s in FINISHED for s in states.values()) else None

        states = until("every job to finish after the restarts", finished, daemon=leader)
        assert set(states.values()) == {"completed"}, states
        check_invariants("the last restart")
        # The second daemon did nothing while the first led: no lead, no API, no round.
        assert not second.events("leading") and not second.events("serving")
        assert not second.events("round")
        assert second.stop() == 0 and leader.stop() == 0
        assert not instances.errors, instances.errors
    finally:
        for daemon in daemons:
            daemon.kill()
        code, out = cli("down", "--yes", *at)
        listing = instances.listing()
        instances.close()
    assert code == 0, out
    assert all(i["State"]["Name"] in ("shutting-down", "terminated") for i in listing)
    check_aws_calls(config.path.parent)
