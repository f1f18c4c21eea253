"""The whole system on this machine: the daemon with `provider = "local"`, its
instances real worker agents, its tasks real containers built from the examples.

One scenario, as a user would run it: submit the three examples, see them packed, drain the
instance under the training job and see it resume from its checkpoint elsewhere, see every
job complete, compare the ledger with what the instances' uptimes cost, stop the daemon, run
`autoscaler down`, and find no agent or container left.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from executor.runtime import LABEL_INSTANCE
from tests.e2e.harness import (
    Daemon,
    all_running,
    cli,
    cli_json,
    containers_labelled,
    copy_example,
    local_cluster,
    processes_mentioning,
    running_past,
    state_of,
    until,
)
from tests.executor.conftest import docker_client, python_image  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(900), pytest.mark.long]

TRAIN_TOTAL = 1200  # iterations of 0.05 s: a minute alone, long enough to be moved


def test_examples_are_packed_moved_from_a_checkpoint_completed_and_cleaned_up(
    tmp_path,
    python_image,  # noqa: F811 (the examples build FROM it; made here once, as init would)
    docker_client,  # noqa: F811
):
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    config = local_cluster(tmp_path / "cluster", name, interval_s="6", step_s="1")
    jobs_dir = tmp_path / "jobs"
    files = [
        copy_example("train", jobs_dir, {"TOTAL": str(TRAIN_TOTAL)}),
        copy_example("data-parallel", jobs_dir, {"TOTAL": "300"}),
        copy_example("memory", jobs_dir, {"TOTAL": "200", "MEGABYTES": "300"}),
    ]
    at = ("--config", str(config.path))
    daemon = Daemon(config.path)
    tokens: list[str] = []
    try:
        daemon.wait_serving()
        submitted = cli_json("submit", *map(str, files), *at)["jobs"]
        assert len(submitted) == 3
        [train] = [j for j in submitted if j.startswith("sgd-train")]

        # Packed: four tasks of 0.5 cores run on fewer instances than tasks.
        running = until("every task to run", lambda: all_running(config, submitted), daemon=daemon)
        hosts = {t.instance_id for t in running}
        assert len(hosts) < len(running) == 4

        # A forced migration: drain the training task's instance once it has made progress.
        task = until(
            "the training job to pass 100 iterations",
            lambda: running_past(config, train, 100),
            daemon=daemon,
        )
        code, out = cli("drain", task.instance_id, *at)
        assert code == 0 and f"draining {task.instance_id}" in out

        def finished():
            states = {j: cli_json("job", j, *at)["status"] for j in submitted}
            return (
                states
                if all(s in ("completed", "failed", "cancelled") for s in states.values())
                else None
            )

        states = until("every job to finish", finished, daemon=daemon)
        assert set(states.values()) == {"completed"}, states

        with state_of(config) as store:
            [moved] = store.tasks_of(train)
            assert moved.attempt >= 2 and moved.progress == TRAIN_TOTAL
            drained = store.instance(task.instance_id)
            assert drained.entered("draining") is not None
            tokens = [i.instance_id for i in store.instances(include_finished=True)]
        logs = cli_json("logs", train, *at)["logs"]
        resumed = [
            int(m.group(1))
            for text in logs.values()
            for m in re.finditer(r"resumed at step (\d+)", text)
        ]
        assert resumed and min(resumed) >= 100, logs  # from its checkpoint, not from step 0
        assert any(f"done at step {TRAIN_TOTAL}" in text for text in logs.values())

        assert daemon.stop() == 0  # SIGTERM: finishes its step; instances keep running
    finally:
        daemon.kill()
        code, out = cli("down", "--yes", *at)
    assert code == 0, out

    # Nothing left: no agent of this cluster, no container of its instances.
    assert tokens
    assert processes_mentioning(f"--instance-id {name}-") == []
    assert containers_labelled(docker_client, LABEL_INSTANCE, tokens) == []

    # The ledger is what the instances' uptimes cost: from the local cloud's own records
    # (launch to terminate), at the catalog price. The state counts a little more, never
    # less: it bills from the round that asked (before the launch call) until it saw the
    # instance gone (at most a step or two after the terminate call).
    records = [
        json.loads(p.read_text())
        for p in (tmp_path / "cluster" / "local-cloud" / "instances").glob("*/instance.json")
    ]
    assert {r["token"] for r in records} == set(tokens)
    assert all(r["state"] == "terminated" for r in records)
    catalog = {t.name: t.hourly_cost for t in _catalog(config)}
    bill = sum((r["terminated_at"] - r["launched_at"]) / 3600 * catalog[r["type"]] for r in records)
    report = cli_json("cost-report", *at)
    with state_of(config) as store:
        ledger = store.cost_between(0, report["until"])
    assert report["spend"] == pytest.approx(ledger, abs=1e-6)
    assert sum(report["spend_by_job"].values()) + report["idle"] == pytest.approx(ledger, abs=1e-5)
    slack = sum(15 / 3600 * catalog[r["type"]] for r in records)
    assert bill - 1e-9 <= ledger <= bill + slack, (bill, ledger)
    code, out = cli("cost-report", *at)
    assert code == 0 and "Spend" in out, out

    # Nothing init, the daemon or its workers wrote (config, state.db, checkpoints, logs,
    # agent.log, work directories) is open to other local users.
    exposed = [
        f"{p} {p.stat().st_mode & 0o777:o}"
        for p in (tmp_path / "cluster").rglob("*")
        if not p.is_symlink() and (p.is_file() or p.is_dir()) and p.stat().st_mode & 0o077
    ]
    assert exposed == []


def _catalog(config):
    from app.wiring import offline_catalog

    return offline_catalog(config)
