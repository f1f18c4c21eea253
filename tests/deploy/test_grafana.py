"""deploy/grafana and deploy/prometheus against what the daemon serves: every metric the
dashboard queries is in the daemon's `/metrics` after a round (the real registry, rendered
by prometheus-client, after the daemon's own round and steps), Prometheus scrapes where the
daemons listen, and compose.yaml's `monitoring` profile provisions Grafana with both.

PromQL is parsed by promql-parser (the Rust parser's Python bindings), not by a pattern:
a name inside a label matcher, a `by (…)` list or a function name is not a metric.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.app.simulated_daemon import SimulatedDaemon
from tests.deploy.test_compose import DAEMONS, DEPLOY, compose, mounted_config, mounts  # noqa: F401
from tests.simulator.test_hand_computed import job

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "autoscaler.json"

#: The sample names a family of each type exposes, from its family name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def expressions(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression selects."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def served_names(exposition: str) -> set[str]:
    """Every sample name the exposition declares, whether or not it has a sample yet (a
    labelled counter nothing incremented still has its HELP and TYPE)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The daemon's /metrics after a round that launched, and steps that ran a job."""
    cluster = SimulatedDaemon(tmp_path_factory.mktemp("cluster"), [job("a", 0, 300)])
    try:
        assert cluster.daemon.round() is not None
        cluster.until(1000.0)
        return generate_latest(cluster.daemon.metrics.registry).decode()
    finally:
        cluster.close()


def test_the_parser_finds_metrics_and_nothing_else():
    expr = 'sum by (le) (rate(a_bucket{status!~"b|c"}[5m])) / on(le) d'
    assert metric_names(expr) == {"a_bucket", "d"}


def test_every_metric_the_dashboard_queries_is_served_by_the_daemon(exposition):
    board = dashboard()
    queried = set().union(*(metric_names(e) for e in expressions(board)))
    served = served_names(exposition)
    assert queried and queried <= served, sorted(queried - served)
    # The round and the steps filled in the panels' figures (not only declarations).
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(exposition)
        for s in f.samples
        if not s.labels
    }
    assert samples["autoscaler_round_duration_seconds_count"] >= 1
    assert samples["autoscaler_lower_bound_hourly_cost_dollars"] > 0
    assert 'autoscaler_instances{capacity_type="on-demand",status=' in exposition


def test_the_dashboard_covers_what_operators_watch():
    queried = set().union(*(metric_names(e) for e in expressions(dashboard())))
    for metric in (
        "autoscaler_hourly_cost_dollars",
        "autoscaler_lower_bound_hourly_cost_dollars",
        "autoscaler_instances",
        "autoscaler_jobs",
        "autoscaler_round_duration_seconds_bucket",
        "autoscaler_refused_launches_total",
        "autoscaler_lost_workers_total",
        "autoscaler_interruptions_total",
    ):
        assert metric in queried, metric


def test_every_panel_uses_the_provisioned_datasource():
    board = dashboard()
    [source] = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"]
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_prometheus_scrapes_the_daemons_metrics_where_they_listen(compose):  # noqa: F811
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [scrape] = config["scrape_configs"]
    [target] = [t for c in scrape["static_configs"] for t in c["targets"]]
    host, _, port = target.rpartition(":")
    # The daemon serves prometheus-client's plain HTTP endpoint, without authentication.
    assert scrape["scheme"] == "http" and scrape["metrics_path"] == "/metrics"
    for name in DAEMONS:
        daemon_config, service = mounted_config(compose, name)
        assert daemon_config.metrics.listen.rpartition(":")[2] == port
        assert host in service["networks"]["default"]["aliases"]


def test_the_monitoring_profile_mounts_what_it_provisions(compose):  # noqa: F811
    services = compose["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    for service in (prometheus, grafana):
        for source, read_only in mounts(service).values():
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source
                assert read_only, source
    assert mounts(prometheus)["/etc/prometheus/prometheus.yml"][0] == "./prometheus/prometheus.yml"
    # Grafana reads the datasource at the Prometheus service's port, and the dashboards
    # where the provider looks.
    [source] = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert any(p.endswith(":9090") for p in prometheus["ports"])
    [provider] = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "autoscaler.yaml").read_text()
    )["providers"]
    dashboards_dir = provider["options"]["path"]
    assert mounts(grafana)[dashboards_dir][0] == "./grafana/dashboards"
    assert Path(DEPLOY / "grafana" / "dashboards" / DASHBOARD.name).is_file()
    # The admin password is a file the `secrets` service writes, never in compose.yaml.
    password = Path(grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"])
    volume, read_only = mounts(grafana)[str(password.parent)]
    assert read_only
    secrets = services["secrets"]
    written = [t for t, (src, _) in mounts(secrets).items() if src == volume]
    assert written and f"cd {written[0]}" in secrets["command"][0]
    assert f"mv {password.name}.new {password.name}" in secrets["command"][0]
    # Nothing of the monitoring profile is reachable from outside this host.
    for service in (prometheus, grafana):
        assert all(p.startswith("127.0.0.1:") for p in service["ports"])
