"""`submit --quote` (`app.reports.quote`) over the real API, with prices from the bundled
catalog (Eva's `ec2_config.json`): c7i.2xlarge [0 GPU, 4 CPU, 16 GiB] $0.357/h,
r7i.large [0, 1, 16] $0.1323/h, c7i.large [0, 1, 4] $0.08925/h.

A queued job B asks [0, 3, 4]: alone, its cheapest type is c7i.2xlarge ($0.357/h). The
quoted job A asks [0, 1, 12]: alone, r7i.large ($0.1323/h). Together they fill one
c7i.2xlarge exactly, $0.357/h for both instead of $0.4893/h. Each has a dominant share
of 3/4 there (B: 3 of 4 CPUs; A: 12 of 16 GiB), so A's part is half: $0.1785/h.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.commands.cluster import render_quotes
from autoscaler.decide import ControlOptions
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from tests.app.test_users import admin, job


def demanding(job_id: str, gpu: float, cpu: float, ram: float):
    spec = job(job_id)
    [task] = spec.tasks
    task = dataclasses.replace(task, demands=(("any", Resources(gpu, cpu, ram)),))
    return dataclasses.replace(spec, tasks=(task,), full_throughput=2.0)


@pytest.fixture
def planned(api):
    """The API with the daemon's planner and options (no interference assumed)."""
    api.service.planner = lambda: planner_by_name("eva", lower_bound=True)
    api.service.options = ControlOptions(default_throughput=1.0)
    return api


def test_a_quote_prices_the_job_at_the_current_packing(planned):
    with admin(planned) as root:
        root.submit(demanding("b", 0, 3, 4))
        quote = root.quote(demanding("a", 0, 1, 12), duration_s=7200.0)
    assert quote["hourly_cost_no_packing"] == pytest.approx(0.1323)
    assert quote["hourly_cost_packed"] == pytest.approx(0.357 / 2)
    assert [i["type"] for i in quote["instances"]] == ["c7i.2xlarge"]
    assert quote["cluster_hourly_cost_after"] == pytest.approx(0.357)
    # two hours of it
    assert quote["total_packed"] == pytest.approx(0.357)
    assert quote["total_no_packing"] == pytest.approx(2 * 0.1323)
    # the LP bound split by reservation price: A's 0.1323 of 0.4893
    bound = quote["lower_bound_hourly_cost"]
    assert bound is not None and bound <= 0.357 + 1e-9
    assert quote["hourly_lower_bound_share"] == pytest.approx(bound * 0.1323 / 0.4893, abs=1e-6)
    # nothing was submitted
    assert [j.job_id for j in planned.store.jobs()] == ["b"]


def test_a_quote_alone_is_its_cheapest_type_and_iterations_give_the_total(planned):
    with admin(planned) as root:
        quote = root.quote(demanding("a", 0, 1, 2), iterations=3600.0)
    # [0, 1, 2] alone: c7i.large, $0.08925/h, packed or not; 3600 iterations at 2/s: 0.5 h
    assert quote["hourly_cost_packed"] == pytest.approx(0.08925)
    assert quote["hourly_cost_no_packing"] == pytest.approx(0.08925)
    assert quote["hours"] == pytest.approx(0.5)
    assert quote["total_packed"] == pytest.approx(0.08925 / 2)
    table = render_quotes([quote])
    assert "$0.0892/h" in table and "0.50 h" in table


def test_a_quote_without_a_duration_has_no_total(planned):
    with admin(planned) as root:
        quote = root.quote(dataclasses.replace(demanding("a", 0, 1, 2), full_throughput=None))
    assert quote["hours"] is None and quote["total_packed"] is None
    assert quote["hourly_cost_packed"] == pytest.approx(0.08925)


def test_submit_quote_through_the_cli_submits_nothing(planned, tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "job.toml"
    path.write_text(
        'name = "small"\nfull_throughput = 2.0\nmax_cost = 5.0\n'
        '[tasks.a]\nimage = "busybox"\ndemand = { any = [0, 1, 2] }\n'
    )
    config = ["--config", str(planned.config.path)]
    assert main(["submit", str(path), "--quote", "--iterations", "7200", "--json", *config]) == 0
    [quote] = json.loads(capsys.readouterr().out)["quotes"]
    assert quote["hourly_cost_packed"] == pytest.approx(0.08925)
    assert quote["total_no_packing"] == pytest.approx(0.08925)  # 7200 iterations at 2/s: 1 h
    assert main(["submit", str(path), "--quote", *config]) == 0
    assert "no packing" in capsys.readouterr().out
    assert main(["submit", str(path), "--duration", "60", *config]) == 2
    assert "go with --quote" in capsys.readouterr().err
    assert planned.store.jobs() == []


def test_a_job_files_max_cost_reaches_the_daemon_and_is_bounded(planned, tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "job.toml"
    body = (
        'name = "capped"\nmax_cost = {}\n'
        '[tasks.a]\nimage = "busybox"\ndemand = {{ any = [0, 1, 2] }}\n'
    )
    config = ["--config", str(planned.config.path)]
    path.write_text(body.format("12.5"))
    assert main(["submit", str(path), "--json", *config]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    assert planned.store.job(job_id).spec.max_cost == 12.5
    path.write_text(body.format("-1"))
    assert main(["submit", str(path), *config]) == 2
    assert "max_cost" in capsys.readouterr().err
