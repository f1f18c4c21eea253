"""What-if on the cluster's own history: a database recorded by the control loop on SQLite
against the simulated world, replayed `--from-cluster` under every scheduler.

The recorded cluster runs a hidden interference model the planner never sees, jobs of one
and two tasks, half of them with a solo speed the cluster had to learn by running them
alone. Nothing of the recorded trace reaches the replay except through the database: the
history is read from the state alone (the specs' trace facts are replaced by measurements).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import main
from app.config import load_cluster_config
from app.wiring import offline_catalog, open_state
from autoscaler.jobs import TraceFacts
from autoscaler.throughput import ThroughputEntry, ThroughputTable
from simulator.history import cluster_history
from simulator.replay import replay
from tests.builders import job

KINDS = ("train", "etl", "sim", "infer")
#: The cluster's round period in these tests (the replay must run the same).
INTERVAL_S = 300.0
#: How far the replay of the scheduler the cluster ran may sit from the ledger. The
#: replay runs the same control loop on the same submissions, work, solo speeds, prices
#: and round grid; what it lacks is interference the cluster never measured: its learned
#: table holds the co-locations it observed (a two-task job's rate is credited to one of
#: its tasks), and the rest run at the default. Measured here: 0.28% above the ledger;
#: replayed with the hidden table instead of the learned one, 0.00% — so the error is the
#: table's, not the replay's. 1% is that gap with room for a few more unmeasured pairs.
TOLERANCE = 0.01


def trace(seed: int, n: int) -> list:
    """`n` CPU jobs arriving about every 15 minutes, 20 minutes to 3 hours of work each;
    a quarter of them two-task; half give their solo speed, half leave it to be learned."""
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 900)
        tasks = rng.choice((1, 1, 1, 2))
        demands = [
            (0, rng.choice((1, 2, 4, 6)), rng.choice((2, 4, 8, 16, 24))) for _ in range(tasks)
        ]
        seconds = rng.uniform(1200, 3 * 3600)
        speed = rng.choice((None, 2.5))
        facts = TraceFacts(
            arrival_time_s=round(t),
            total_iters=round(seconds * speed) if speed else None,
            duration_s=None if speed else round(seconds),
        )
        name = f"{rng.choice(KINDS)}[{i}]"
        jobs.append(job(f"j{i}", *demands, name=name, full_throughput=speed, trace=facts))
    return jobs


def hidden_interference(seed: int) -> ThroughputTable:
    rng = random.Random(seed)
    pairs = {
        (f"{a}_node{k}", (f"{b}_node0",)): ThroughputEntry(rng.uniform(0.6, 1.0))
        for a in KINDS
        for b in KINDS
        for k in (0, 1)
    }
    return ThroughputTable(pairs, 0.9)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A local cluster's directory whose database a run of `eva` recorded (16 jobs, ~5.5
    simulated hours), with the recorded run's figures."""
    from app.init import init_cluster

    directory = tmp_path_factory.mktemp("cluster")
    init_cluster(directory, name="demo", local=True)
    path = directory / "autoscaler.toml"
    text = re.sub(r"(?m)^interval_s = \d+", f"interval_s = {INTERVAL_S:g}", path.read_text())
    path.write_text(text)
    config = load_cluster_config(path)
    jobs = trace(7, 16)
    store = open_state(config, create=True)
    try:
        run = replay(
            jobs,
            offline_catalog(config),
            hidden_interference(7),
            config.planner.name,
            interval_s=config.cluster.interval_s,
            store=store,
        )
    finally:
        store.close()
    assert run.finished and run.total_cost > 0
    return config, jobs, run


def from_cluster(capsys, config, *extra: str) -> dict:
    code = main(["replay", "--from-cluster", "--config", str(config.path), "--json", *extra])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_the_history_holds_measurements_not_the_trace(recorded):
    config, jobs, _ = recorded
    store = open_state(config)
    try:
        history = cluster_history(
            store, offline_catalog(config), since=0.0, until=1e12, default_throughput=0.95
        )
    finally:
        store.close()
    assert [j.job_id for j in history.jobs] == [j.job_id for j in jobs]
    assert history.scheduler == "eva" and history.left_out == ()
    # the replay starts at the cluster's last round before the first submission
    assert history.origin % INTERVAL_S == 0
    assert 0 <= jobs[0].trace.arrival_time_s - history.origin < INTERVAL_S
    for original, rebuilt in zip(jobs, history.jobs, strict=True):
        assert rebuilt.trace.arrival_time_s == original.trace.arrival_time_s - history.origin
        if original.full_throughput is None:
            # learned alone by the cluster: its work in seconds at its learned speed
            assert rebuilt.trace.total_iters is None
            assert rebuilt.trace.duration_s == pytest.approx(original.trace.duration_s)
        else:
            assert rebuilt.trace.total_iters == pytest.approx(original.trace.total_iters)
    # the replay's interference is what the cluster learned: co-locations it observed
    assert any(colocated for (_, colocated), _ in history.truth.items())


def test_replaying_the_scheduler_the_cluster_ran_reproduces_its_ledger(recorded, capsys):
    config, _, run = recorded
    doc = from_cluster(capsys, config, "--scheduler", "eva", "stratus", "--workers", "1")
    cluster = doc["cluster"]
    assert cluster["paid"] == pytest.approx(run.total_cost)  # the ledger, idle included
    assert cluster["scheduler"] == "eva" and cluster["jobs"] == 16
    eva = doc["results"]["eva"]["total_cost"]
    assert eva == pytest.approx(cluster["paid"], rel=TOLERANCE)
    assert cluster["replayed_as_run"] == eva
    # another scheduler pays something else, and plausibly: never under the clairvoyant
    # bound, and within a factor of two of what the cluster paid
    for name in ("stratus", "no-packing"):
        cost = doc["results"][name]["total_cost"]
        assert doc["clairvoyant_bound"] <= cost <= 2 * cluster["paid"]
        assert doc["results"][name]["jobs_completed"] == 16
    # Stratus packs by runtime, blind to interference: a different figure
    assert abs(doc["results"]["stratus"]["total_cost"] - eva) > 0.05 * eva


def test_the_clusters_waiting_rule_is_replayed_unless_the_command_names_one(recorded, capsys):
    config, _, _ = recorded
    # the same cluster, its [planner] letting new jobs wait (a sibling file: same database)
    waiting = config.path.with_name("waiting.toml")
    text = config.path.read_text()
    assert "wait_jct_factor = 1.0 " in text
    waiting.write_text(text.replace("wait_jct_factor = 1.0 ", "wait_jct_factor = 1.3 "))
    args = ("--scheduler", "eva", "--workers", "1")
    plain = from_cluster(capsys, config, *args)
    assert "waiting" not in plain
    code = main(["replay", "--from-cluster", "--config", str(waiting), "--json", *args])
    assert code == 0
    held = json.loads(capsys.readouterr().out)
    assert held["waiting"] == {"jct_factor": 1.3, "min_saving": 0.1}
    assert held["cluster"]["paid"] == plain["cluster"]["paid"]  # the same history
    code = main(
        [
            "replay",
            "--from-cluster",
            "--config",
            str(waiting),
            "--json",
            "--wait-jct-factor",
            "1.2",
            *args,
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["waiting"]["jct_factor"] == 1.2


def test_a_window_replays_the_jobs_submitted_within_it(recorded, capsys):
    config, jobs, run = recorded
    since = 3600.0  # the database's clock is the recorded run's virtual one
    doc = from_cluster(capsys, config, "--since", f"@{since:g}", "--scheduler", "no-packing")
    inside = [j for j in jobs if j.trace.arrival_time_s >= since]
    assert 0 < len(inside) < len(jobs)
    assert doc["cluster"]["jobs"] == len(inside)
    assert doc["results"]["no-packing"]["jobs_total"] == len(inside)
    # jobs submitted earlier still ran into the window: said, not replayed
    assert doc["cluster"]["jobs_submitted_earlier_running_in_window"] > 0
    # the ledger is cut at the window's start
    assert doc["cluster"]["paid"] < run.total_cost


def test_the_window_starts_on_the_clusters_round_grid(recorded):
    config, jobs, _ = recorded
    store = open_state(config)
    try:
        history = cluster_history(store, offline_catalog(config), since=3700.0, until=1e12)
    finally:
        store.close()
    first = min(j.trace.arrival_time_s for j in jobs if j.trace.arrival_time_s >= 3700.0)
    assert history.origin % INTERVAL_S == 0 and history.origin <= first
    assert min(j.trace.arrival_time_s for j in history.jobs) == first - history.origin


def test_an_empty_database_says_so_in_one_line(cluster_dir: Path, capsys):
    config = load_cluster_config(cluster_dir / "autoscaler.toml")
    open_state(config, create=True).close()
    assert main(["replay", "--from-cluster", "--config", str(config.path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing to replay: no job was submitted") and out.count("\n") == 1


def test_trace_options_and_from_cluster_exclude_each_other(cluster_dir: Path, capsys):
    config = cluster_dir / "autoscaler.toml"
    assert main(["replay", "--from-cluster", "--config", str(config), "--synthesize", "3"]) == 2
    assert "--synthesize and --from-cluster" in capsys.readouterr().err
    assert main(["replay", "--since", "7d"]) == 2
    assert "--from-cluster" in capsys.readouterr().err


def test_cost_report_what_if_prints_each_scheduler_beside_what_was_paid(recorded, capsys):
    config, _, run = recorded
    assert main(["cost-report", "--config", str(config.path), "--what-if", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["what_if"]
    assert doc["paid"] == pytest.approx(run.total_cost)
    assert doc["would_have_cost"]["eva"] == pytest.approx(doc["paid"], rel=TOLERANCE)
    assert set(doc["would_have_cost"]) >= {"eva", "no-packing", "stratus"}
    assert main(["cost-report", "--config", str(config.path), "--what-if"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Everything so far under eva / eva-full-only" in text
    assert f"(paid ${run.total_cost:,.2f}; replayed from the database)" in text


def test_a_job_that_did_no_work_is_left_out_with_the_reason(recorded, tmp_path):
    from state.database import create_state_engine
    from state.migrate import upgrade
    from state.store import SqlStore

    config, jobs, _ = recorded
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_state_engine(url)
    upgrade(engine)
    engine.dispose()
    with SqlStore(url) as store:
        queued = replace(jobs[0], trace=TraceFacts())
        store.submit_job(queued, owner="ana", at=10.0)
        store.cancel_job(queued.job_id, 20.0)
        history = cluster_history(store, offline_catalog(config), since=0.0, until=100.0)
    assert history.jobs == ()
    assert history.left_out == ((queued.job_id, "did no work (cancelled)"),)
