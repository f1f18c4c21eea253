"""Cost reports from the database alone: who pays for a shared instance, what no packing
would have cost, and what adding jobs would do."""

from __future__ import annotations

import json
import time

import pytest

from app.cli import main
from app.commands.cluster import render_status
from app.config import load_cluster_config
from app.metrics import Metrics
from app.reports import attribute, cluster_status, timeline
from app.validation import parse_since
from app.wiring import open_state
from autoscaler.store import Placement, TaskUpdate, UptimeInterval
from state.memory import InMemoryStore
from tests.app.test_submit import GOOD, write_job
from tests.builders import job
from tests.store_writes import request
from tests.test_spend_brakes import held_gpu_decision


def test_a_shared_instance_is_split_by_weight_and_idle_time_is_nobodys():
    # $3.6/h = $0.001/s from 0 to 1000. j1 (weight 1) is on it 100-600, j2 (weight 3)
    # 300-800: idle 0-100 and 800-1000, j1 alone 100-300, shared 1:3 300-600, j2 alone
    # 600-800.
    uptime = [UptimeInterval("i-1", "big", 3.6, 0.0, 1000.0)]
    placements = [
        Placement("j1/0", "j1", "i-1", 1, 100.0, 600.0),
        Placement("j2/0", "j2", "i-1", 1, 300.0, 800.0),
    ]
    weights = {"j1/0": 1.0, "j2/0": 3.0}
    jobs, idle = attribute(uptime, placements, lambda p, _: weights[p.task_id], 0.0, 1000.0)
    assert jobs == pytest.approx({"j1": 0.2 + 0.075, "j2": 0.225 + 0.2})
    assert idle == pytest.approx(0.1 + 0.2)
    assert sum(jobs.values()) + idle == pytest.approx(1.0)  # the ledger, to the cent
    # a window cuts both ledgers alike
    jobs, idle = attribute(uptime, placements, lambda p, _: weights[p.task_id], 500.0, 700.0)
    assert jobs == pytest.approx({"j1": 0.025, "j2": 0.075 + 0.1}) and idle == 0


def test_the_timeline_steps_with_the_ledger():
    uptime = [UptimeInterval("a", "t", 3.6, 0.0, 100.0), UptimeInterval("b", "t", 7.2, 50.0, None)]
    points = timeline(uptime, 0.0, 150.0)
    expected = [(0.0, 3.6, 0.0), (50.0, 10.8, 0.05), (100.0, 7.2, 0.2), (150.0, 7.2, 0.3)]
    assert [p[0] for p in points] == [e[0] for e in expected]
    for got, want in zip(points, expected, strict=True):
        assert got == pytest.approx(want)


@pytest.fixture
def history(cluster_dir):
    """A small history in the cluster's database, as a daemon would have written it: two
    jobs sharing one c7i.2xlarge-priced instance, then one moving to its own."""
    config = load_cluster_config(cluster_dir / "autoscaler.toml")
    store = open_state(config, create=True)
    t0 = time.time() - 10 * 3600  # a history of the last ten hours
    store.submit_job(job("a", (0, 2, 8)), owner="ana", at=t0, team="ml")
    store.submit_job(job("b", (0, 2, 8)), owner="bo", at=t0)
    request(store, "i-1", "c7i.2xlarge", 0.357, t0)
    store.transition_instance("i-1", "running", t0 + 10, cloud_id="c-1")
    both = [TaskUpdate(t, status="running", instance_id="i-1", attempt=1) for t in ("a/0", "b/0")]
    store.update_tasks(both, t0 + 100)
    request(store, "i-2", "c7i.large", 0.08925, t0 + 3600)
    store.transition_instance("i-2", "running", t0 + 3610, cloud_id="c-2")
    store.update_tasks([TaskUpdate("b/0", instance_id="i-2", attempt=2)], t0 + 3700)
    store.job_finished("a", t0 + 7200)
    store.transition_instance("i-1", "terminated", t0 + 7300)
    store.close()
    return config, t0


def test_cost_report_sums_equal_the_ledger_and_work_without_a_daemon(history, tmp_path, capsys):
    config, _ = history
    plot = tmp_path / "cost"
    assert main(["cost-report", "--config", str(config.path), "--json", "--plot", str(plot)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # --json: the document alone on standard output
    store = open_state(config)
    ledger = store.cost_between(0, report["until"])
    store.close()
    assert report["spend"] == pytest.approx(ledger, abs=1e-5)
    assert sum(report["spend_by_type"].values()) == pytest.approx(ledger, abs=1e-5)
    assert sum(report["spend_by_job"].values()) + report["idle"] == pytest.approx(ledger, abs=1e-5)
    # i-1 ran 0..7300 at $0.357/h: idle 0-100 and 7200-7300; a and b shared it 100-3700.
    assert report["spend_by_job"]["a"] == pytest.approx(0.357 * (3600 / 2 + 3500) / 3600, rel=1e-6)
    assert report["hourly_cost_now"] == pytest.approx(0.08925)  # only i-2 bills now
    assert "plot written to" in captured.err and (tmp_path / "cost.png").stat().st_size > 10_000
    # Saved = no-packing cost − actual spend, idle included; the parts add up.
    parts = report["savings_parts"]
    assert parts["spend_on_tasks"] + parts["idle"] == pytest.approx(report["spend"], abs=1e-5)
    assert report["savings"] == pytest.approx(
        parts["no_packing_spend"] - parts["spend_on_tasks"] - parts["idle"], abs=1e-5
    )
    assert report["savings"] < parts["no_packing_spend"] - parts["spend_on_tasks"]  # idle > 0
    assert main(["cost-report", "--config", str(config.path)]) == 0
    text = capsys.readouterr().out
    assert "Spend" in text and "(idle: no task on the instance)" in text
    assert "− idle spend" in text and "= saved" in text


def test_cost_report_by_user_and_by_team_keeps_the_total(history, capsys):
    config, _ = history
    assert main(["cost-report", "--config", str(config.path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    store = open_state(config)
    ledger = store.cost_between(0, report["until"])
    store.close()
    # a (ana, team ml) shared i-1 with b for 3600 s, then had it alone for 3500 s.
    a_spend = 0.357 * (3600 / 2 + 3500) / 3600
    for by in ("spend_by_user", "spend_by_team"):
        assert sum(report[by].values()) + report["idle"] == pytest.approx(ledger, abs=1e-5)
    assert report["spend_by_user"]["ana"] == pytest.approx(a_spend, abs=1e-5)
    assert report["spend_by_team"]["ml"] == pytest.approx(a_spend, abs=1e-5)
    assert report["spend_by_team"]["(no team)"] == pytest.approx(
        ledger - a_spend - report["idle"], abs=1e-5
    )
    assert main(["cost-report", "--config", str(config.path), "--by", "team"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0] for line in text.splitlines() if line.strip()}
    assert {"team", "ml", "(no"} <= rows and not {"bo", "ana", "a", "b"} & rows


def test_a_dry_run_shows_what_the_next_round_would_launch_and_changes_nothing(
    history, tmp_path, capsys
):
    config, _ = history
    path = write_job(tmp_path, GOOD)
    store = open_state(config)
    rounds, instances = len(store.rounds()), len(store.instances(include_finished=True))
    store.close()
    assert main(["cost-report", "--config", str(config.path), "--dry-run", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Dry run: adding 1 job(s), 2 task(s)" in text
    assert (
        "the next round would launch" in text and "$/h would go from $0.089" in text
    )  # i-2: $0.357/4
    store = open_state(config)
    assert (len(store.rounds()), len(store.instances(include_finished=True))) == (rounds, instances)
    assert [j.job_id for j in store.jobs()] == ["a", "b"]
    store.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@86400", 86400.0),
        ("24h", 1e6 - 86400),
        ("19700102", 86400.0),  # ISO 8601 basic: a date, never epoch seconds
        ("19700102T0100+0100", 86400.0),
        ("1970-01-02T01:00:00+01:00", 86400.0),
        ("7d", 1e6 - 7 * 86400),
        ("1970-01-02", 86400.0),
        ("99999999999999999999d", 0.0),  # longer than the epoch's age: everything
    ],
)
def test_since_reads_epochs_spans_and_dates(text, expected):
    assert parse_since(text, 1e6) == pytest.approx(expected)


def test_a_bad_since_is_one_line(history, capsys):
    config, _ = history
    assert main(["cost-report", "--config", str(config.path), "--since", "yesterday"]) == 2
    assert "field '--since' = 'yesterday'" in capsys.readouterr().err


def test_a_type_held_after_failed_boots_shows_in_status_and_the_metrics_with_its_cause():
    store = InMemoryStore()
    record = held_gpu_decision().record()
    store.record_round(record)
    status = cluster_status(store, 6000.0)
    [(itype, why)] = status["last_round"]["held"].items()
    assert itype == "gpu4" and "3 launches in a row never registered a worker" in why
    shown = render_status(status)
    assert "gpu4 held: 3 launches in a row" in shown
    assert "FAILED while checking the NVIDIA driver" in shown
    metrics = Metrics()
    metrics.observe_round(record, 0.1)
    assert metrics.registry.get_sample_value("autoscaler_held_instance_types") == 1.0
