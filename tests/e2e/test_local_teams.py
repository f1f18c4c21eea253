"""Two users of two teams share a binding budget on a real daemon (`provider = "local"`):
the jobs admitted split by the teams' weights (`autoscaler.fairshare`), a waiting job
says why in `autoscaler job`, and `autoscaler team set` changes the split at the next
round, without a restart.

Prices from the bundled catalog: a task asking [0, 1, 2] fits c7i.large alone,
$0.08925/h. Budget $0.26775/h (three such tasks); research weight 2, prod weight 1: the
shares are $0.1785/h and $0.08925/h — two research jobs and one prod job run, the rest
wait. With prod's weight set to 2 as well, both shares are $0.133875/h: one job each by
share, and the $0.08925/h left goes to the oldest waiting job.
"""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.harness import (
    Daemon,
    all_running,
    cli,
    cli_json,
    local_cluster,
    state_of,
    until,
)
from tests.executor.conftest import docker_client, python_image  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]

JOB = """
name = "{name}"
full_throughput = 1.0
[tasks.a]
image = "autoscaler/python:3.11"
command = ["python", "-c", "import time; time.sleep(600)"]
demand = {{ any = [0, 1, 2] }}
"""

TEAMS = """
[teams.research]
weight = 2.0

[teams.prod]
weight = 1.0
"""


def latest_fair_share(config, after: int = 0):
    """The latest round's `fair_share` numbers, once a round after round `after` has them."""
    with state_of(config) as store:
        rounds = [r for r in store.rounds(5) if (r.round_id or 0) > after]
    for record in reversed(rounds):
        if "fair_share" in record.numbers:
            return record.round_id, record.numbers["fair_share"]
    return None


def test_two_teams_users_share_a_binding_budget_by_weight(
    tmp_path,
    monkeypatch,
    python_image,  # noqa: F811 (the jobs run FROM it)
    docker_client,  # noqa: F811
):
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    config = local_cluster(
        tmp_path / "cluster", name, interval_s="5", step_s="1", max_hourly_spend="0.26775"
    )
    config.path.write_text(config.path.read_text() + TEAMS)
    at = ("--config", str(config.path))
    daemon = Daemon(config.path)
    try:
        daemon.wait_serving()
        tokens = {}
        for user, team in (("alice", "research"), ("bob", "prod")):
            tokens[user] = tmp_path / f"{user}.token"
            code, out = cli(
                "user", "add", user, "--role", "submit", "--team", team,
                "--token-file", str(tokens[user]), *at,
            )  # fmt: skip
            assert code == 0, out
        jobs: dict[str, list[str]] = {"alice": [], "bob": []}
        for user in ("bob", "alice"):  # prod's first: age alone would give prod the budget
            monkeypatch.setenv("AUTOSCALER_TOKEN_FILE", str(tokens[user]))
            for i in range(3):
                path = tmp_path / f"{user}{i}.toml"
                path.write_text(JOB.format(name=f"{user}{i}"))
                jobs[user] += cli_json("submit", str(path), *at)["jobs"]
        monkeypatch.delenv("AUTOSCALER_TOKEN_FILE")
        round_id, fair = until(
            "a round that shares the budget among all six jobs",
            lambda: (
                (found := latest_fair_share(config))
                and found[1]["demands"] == pytest.approx({"research": 0.26775, "prod": 0.26775})
                and found
            ),
            daemon=daemon,
        )
        assert fair["shares"] == pytest.approx({"research": 0.1785, "prod": 0.08925})
        admitted = {
            user: [j for j in ids if j not in fair["waiting"]] for user, ids in jobs.items()
        }
        assert admitted == {"alice": jobs["alice"][:2], "bob": jobs["bob"][:1]}
        with state_of(config) as store:
            assert {j.job_id: j.team for j in store.jobs()} == {
                **dict.fromkeys(jobs["alice"], "research"),
                **dict.fromkeys(jobs["bob"], "prod"),
            }
        # The admitted jobs run: their instances' agents enrolled and serve the workers'
        # port (mutual TLS, the worker CA's certificates).
        running = [j for ids in admitted.values() for j in ids]
        until("the admitted jobs to run", lambda: all_running(config, running), daemon=daemon)
        waiting = cli_json("job", jobs["bob"][1], *at)["waiting"]
        assert waiting.startswith("waiting: team prod at its share $0.09/h of $0.27/h")

        code, out = cli("team", "set", "prod", "--weight", "2", *at)
        assert code == 0, out
        _, fair = until(
            "a round with prod's new weight",
            lambda: (
                (found := latest_fair_share(config, round_id))
                and found[1]["shares"]["prod"] > 0.1
                and found
            ),
            daemon=daemon,
        )
        assert fair["shares"] == pytest.approx({"research": 0.133875, "prod": 0.133875})
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        code, out = cli("down", "--yes", *at)
    assert code == 0, out
