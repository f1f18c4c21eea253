"""Spot on EC2 (`moto_server`), end to end: the daemon as users run it, `[spot] enabled`.

A job with `capacity = "spot"` and one with `capacity = "on-demand"` are quoted (each in its
market) and submitted through the CLI. The daemon launches the first through
`InstanceMarketOptions` (as the audit of its calls shows: moto keeps an instance's lifecycle
to itself, its DescribeInstances answers carry no `InstanceLifecycle`) after making sure of
the spot service-linked role, and the second on-demand; every call is judged against the
policy `deploy policy` wrote for the configuration, which must allow each and need no
statement no call used. EC2's two-minute warning is published on the spot instance's
metadata service (`tests/imds.py`) once its task is past its first steps: the worker stops
the task with a checkpoint, the daemon records the reclaim and moves the task, which resumes
from the checkpoint on another spot instance with no failure counted. The ledger bills each
spot instance its spot price, the on-demand price recorded beside it; `cost-report` agrees
with the ledger; `down` leaves nothing running.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from app.wiring import offline_catalog
from autoscaler.catalog import ON_DEMAND, SPOT
from autoscaler.cloud import offering_parts
from tests.aws_audit import read_log
from tests.e2e.ec2 import AuditedDaemon, check_aws_calls, client, ec2_cluster
from tests.e2e.harness import cli, cli_json, copy_example, running_past, state_of, until
from tests.e2e.test_ec2_cluster import FINISHED, _boot, aws  # noqa: F401 (a fixture)
from tests.executor.conftest import docker_client, moto_endpoint, python_image  # noqa: F401

pytestmark = [pytest.mark.timeout(900), pytest.mark.long]

TRAIN_TOTAL = 1200  # iterations of 0.05 s: a minute alone, long enough to be reclaimed


def _with_capacity(job, capacity: str):
    """The job file with `capacity` set at its top level (after its name)."""
    text = job.read_text()
    text, count = re.subn(
        r'^(name = "[^"]*")$', rf'\1\ncapacity = "{capacity}"', text, count=1, flags=re.M
    )
    assert count == 1, text
    job.write_text(text)
    return job


def _live_spot_price(endpoint: str, zone: str | None, ec2_type: str) -> float:
    """What EC2 (moto) quotes for spot `ec2_type` now in `zone`, where the instance
    landed: what EC2 bills it, whatever the regional figure it was planned at."""
    ec2 = client("ec2", endpoint)
    history = ec2.describe_spot_price_history(InstanceTypes=[ec2_type])["SpotPriceHistory"]
    [price] = {float(p["SpotPrice"]) for p in history if p["AvailabilityZone"] == zone}
    return price


def test_a_spot_job_launches_as_spot_survives_a_reclaim_and_is_billed_at_spot_prices(
    tmp_path,
    aws,  # noqa: F811
    python_image,  # noqa: F811
    docker_client,  # noqa: F811
):
    config = ec2_cluster(tmp_path / "cluster", aws, spot=True)
    at = ("--config", str(config.path))
    on_demand = {t.name: t.hourly_cost for t in offline_catalog(config) if not t.is_spot}
    instances = _boot(config, aws, tmp_path, docker_client).start()
    daemon = AuditedDaemon(config.path, aws)
    jobs = tmp_path / "jobs"
    train_file = _with_capacity(copy_example("train", jobs, {"TOTAL": str(TRAIN_TOTAL)}), "spot")
    shards_file = _with_capacity(copy_example("data-parallel", jobs, {"TOTAL": "300"}), "on-demand")
    try:
        daemon.wait_serving()
        # Quoted first: the spot job at spot, the on-demand one never (their capacities).
        spot_quote, od_quote = cli_json(
            "submit", "--quote", str(train_file), str(shards_file), *at
        )["quotes"]
        assert (spot_quote["capacity"], od_quote["capacity"]) == ("spot", "on-demand")
        assert spot_quote["launch"] and all(":spot" in t for t in spot_quote["launch"])
        assert od_quote["launch"] and not any(":spot" in t for t in od_quote["launch"])
        cheapest = min(on_demand.values())
        assert spot_quote["hourly_cost_no_packing"] < cheapest, spot_quote
        assert od_quote["hourly_cost_no_packing"] >= 2 * cheapest - 1e-9, od_quote  # 2 tasks
        submitted = cli_json("submit", str(train_file), str(shards_file), *at)["jobs"]
        [train] = [j for j in submitted if j.startswith("sgd-train")]
        [shards] = [j for j in submitted if j.startswith("sgd-parallel")]

        task = until(
            "the spot job to pass 100 iterations",
            lambda: running_past(config, train, 100),
            daemon=daemon,
        )
        with state_of(config) as store:
            first = store.instance(task.instance_id)
        assert first is not None and offering_parts(first.instance_type)[1] == SPOT, first
        cloud_id = first.cloud_id
        assert cloud_id is not None
        imds = until(
            "the spot instance's metadata service",
            lambda: instances.metadata.get(cloud_id),
            daemon=daemon,
        )
        warned = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=2)
        imds.notify_reclaim(warned.strftime("%Y-%m-%dT%H:%M:%SZ"))

        def finished():
            states = {j: cli_json("job", j, *at)["status"] for j in submitted}
            return states if all(s in FINISHED for s in states.values()) else None

        states = until("every job to finish", finished, daemon=daemon)
        assert set(states.values()) == {"completed"}, states
        assert not instances.errors, instances.errors
        # The worker asked its metadata service for the notice and found it.
        assert any(r.endswith("/spot/instance-action") for r in imds.requests)

        with state_of(config) as store:
            [moved] = store.tasks_of(train)
            shard_tasks = store.tasks_of(shards)
            records = {i.instance_id: i for i in store.instances(include_finished=True)}
            interruptions = store.interruptions()
            uptime = store.uptime()
        # The reclaim moved the task and counted no failure: it resumed, not restarted.
        assert moved.attempt >= 2 and moved.progress == TRAIN_TOTAL, moved
        assert moved.failures == 0, moved
        reclaimed = records[task.instance_id]
        assert reclaimed.reclaimed_at is not None, reclaimed
        assert [(r.instance_id, r.kind, r.offering) for r in interruptions] == [
            (task.instance_id, "reclaim", reclaimed.instance_type)
        ]
        # Its bill ended with it: EC2 would end it at the notice's time, moto never does, so
        # the daemon terminates a reclaimed instance once its tasks have left.
        assert all(u.end is not None for u in uptime if u.instance_id == task.instance_id)
        [gone] = [i for i in instances.listing() if i["InstanceId"] == cloud_id]
        assert gone["State"]["Name"] in ("shutting-down", "terminated"), gone["State"]
        logs = cli_json("logs", train, *at)["logs"]
        resumed = [
            int(m) for text in logs.values() for m in re.findall(r"resumed at step (\d+)", text)
        ]
        assert resumed and min(resumed) >= task.progress >= 100, (task.progress, logs)

        # Each job ran in its own market: the spot job's attempts on spot instances only,
        # the on-demand job's on on-demand ones only.
        placements: dict[str, set[str]] = {}
        with state_of(config) as store:
            for p in store.placements(0):
                placements.setdefault(p.task_id, set()).add(p.instance_id)
        train_on = placements[moved.task_id]
        assert len(train_on) >= 2 and task.instance_id in train_on, placements
        assert {offering_parts(records[i].instance_type)[1] for i in train_on} == {SPOT}
        shards_on = {i for t in shard_tasks for i in placements[t.task_id]}
        assert {offering_parts(records[i].instance_type)[1] for i in shards_on} == {ON_DEMAND}

        # Billing: each spot instance at the spot price EC2 quotes for its type in the
        # zone it landed in (not the bundled snapshot's), below on-demand, with its type's
        # on-demand price recorded beside it; each on-demand instance at its on-demand
        # price. The ledger bills those.
        for record in records.values():
            if record.cloud_id is None:
                continue
            ec2_type, market, _ = offering_parts(record.instance_type)
            assert record.on_demand_price == pytest.approx(on_demand[ec2_type]), record
            if market == SPOT:
                live = _live_spot_price(aws, record.zone, ec2_type)
                assert record.hourly_price == pytest.approx(live), record
                assert record.hourly_price < on_demand[ec2_type], record
            else:
                assert record.hourly_price == pytest.approx(on_demand[ec2_type]), record
        billed = [u for u in uptime if u.instance_id in records]
        assert billed and all(
            u.hourly_price == records[u.instance_id].hourly_price for u in billed
        ), billed
        assert any(offering_parts(records[u.instance_id].instance_type)[1] == SPOT for u in billed)

        # What a user reads: the job's capacity and its reclaim, named as such.
        code, text = cli("job", train, *at)
        assert code == 0 and "capacity spot: on spot 100% of its task-time; 1 interruption" in (
            text
        ), text
        assert re.search(r"\s1 \(reclaim, 0 counted\)\s", text), text
        code, text = cli("job", shards, *at)
        assert code == 0 and "capacity on-demand: on spot 0% of its task-time" in text, text
        code, text = cli("status", *at)
        assert code == 0 and "1 interruption(s) in the last day" in text, text
        code, text = cli("cost-report", *at)
        assert code == 0 and f"Interruptions            1 (1 {reclaimed.instance_type})" in (
            text
        ), text
        report = cli_json("cost-report", *at)
        assert report["spot"]["interruptions"] == 1 and report["spot"]["spot_share"] > 0
        assert report["spot"]["savings_vs_on_demand"] > 0
        with state_of(config) as store:
            ledger = store.cost_between(0, report["until"])
            known = {i.cloud_id for i in store.instances(include_finished=True)}
        assert ledger > 0
        assert report["spend"] == pytest.approx(ledger, abs=1e-6)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        code, out = cli("down", "--yes", *at)
        listing = instances.listing()
        instances.close()
    assert code == 0, out
    check_aws_calls(config.path.parent)

    # What the daemon asked EC2: the spot job's launches with InstanceMarketOptions (spot,
    # in the policy's words), the on-demand job's without, and the spot service-linked
    # role ensured before the first spot launch (AWS refuses a spot request without it
    # unless the caller may create it; moto does not check, the audit and this do).
    calls = read_log(config.path.parent / "daemon-aws-calls.jsonl")
    launches = [
        (n, r["context"].get("ec2:InstanceMarketType"), r["context"].get("ec2:InstanceType"))
        for n, c in enumerate(calls)
        if c["operation"] == "RunInstances"
        for r in c["requests"]
        if r["action"] == "ec2:RunInstances" and r["resource"].endswith(":instance/*")
    ]
    spot_launches = [n for n, market, _ in launches if market == "spot"]
    assert len(spot_launches) >= 2, launches  # the first attempt's instance, the resumed one's
    assert {market for _, market, _ in launches} == {"spot", "on-demand"}, launches
    roles = [n for n, c in enumerate(calls) if c["operation"] == "CreateServiceLinkedRole"]
    assert roles and roles[0] < spot_launches[0], (roles, spot_launches)
    linked = client("iam", aws).list_roles(PathPrefix="/aws-service-role/spot.amazonaws.com/")
    assert linked["Roles"], "the spot service-linked role was not created"
    # Everything EC2 started for the cluster is known to the state and is shutting down.
    assert {i["InstanceId"] for i in listing} <= known
    assert all(i["State"]["Name"] in ("shutting-down", "terminated") for i in listing)
