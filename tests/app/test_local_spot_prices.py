"""`[cloud] spot_price_trace` on the local cloud, end to end: the file (relative to the
configuration) replays from the cloud's epoch, the catalog's spot offerings are priced
with it, and the daemon turns each change into a ledger segment of a running local spot
instance at the trace's time — once, across a daemon killed and started again. The
expected charges are computed from the trace's numbers, not read back from the ledger."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from app.config import load_cluster_config
from app.daemon import Daemon
from app.files import load_spot_price_trace
from app.reports import cost_report
from app.wiring import local_cloud, offline_catalog
from autoscaler.catalog import Catalog
from autoscaler.cloud import LaunchRequest
from autoscaler.errors import InputError
from autoscaler.store import InstanceChange
from provisioners.local_spot_prices import LOCAL_ZONE
from tests.app.simulated_daemon import SimulatedDaemon
from tests.store_writes import request

HOUR = 3600.0
EPOCH = 1_000_000.0

#: c7i.large in one zone: 0.030 from the start, 0.045 after 30 minutes, 0.025 after two hours.
TRACE = {
    "SpotPriceHistory": [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "c7i.large",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": price,
            "Timestamp": stamp,
        }
        for price, stamp in (
            ("0.025000", "2026-11-01T02:00:00+00:00"),
            ("0.045000", "2026-11-01T00:30:00+00:00"),
            ("0.030000", "2026-11-01T00:00:00+00:00"),
        )
    ]
}
PRICES = ((0.0, 0.030), (1800.0, 0.045), (2 * HOUR, 0.025))  # (after the epoch, USD/h)


def expected_cost(start: float, end: float) -> float:
    """What a c7i.large spot instance up from `start` to `end` (after the epoch) costs at
    the trace's prices, summed piece by piece."""
    total = 0.0
    for i, (at, price) in enumerate(PRICES):
        until = PRICES[i + 1][0] if i + 1 < len(PRICES) else float("inf")
        total += price * max(0.0, min(end, until) - max(start, at)) / HOUR
    return total


class Clock:
    """The daemon's clock and the cloud's, moved by the test."""

    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    def __call__(self) -> float:
        return self.t


def with_trace(root: Path, settings: str = 'spot_price_trace = "traces/prices.json"') -> Path:
    (root / "traces").mkdir(exist_ok=True)
    (root / "traces" / "prices.json").write_text(json.dumps(TRACE))
    path = root / "autoscaler.toml"
    text = path.read_text()
    line = next(line for line in text.splitlines() if line.startswith("emulate_delays"))
    path.write_text(text.replace(line, f"{line}\n{settings}", 1))
    return path


def enable_spot(path: Path, zones: str = "") -> None:
    path.write_text(path.read_text() + f"\n[spot]\nenabled = true\n{zones}\n")


def test_the_trace_prices_the_local_catalogs_spot_offerings_from_the_clouds_epoch(cluster_dir):
    path = with_trace(cluster_dir)
    enable_spot(path)
    cloud = local_cloud(load_cluster_config(path))
    try:
        # The availability traces' epoch, kept in the cloud's directory (a restarted
        # daemon replays from the same one).
        epoch = cloud.spot_epoch_s
        assert epoch == float((cluster_dir / "local-cloud" / "epoch").read_text())
        assert local_cloud(load_cluster_config(path)).spot_epoch_s == epoch
        snapshot = offline_catalog(load_cluster_config(path))  # the bundled spot prices
        assert snapshot["c7i.large:spot"].hourly_cost != pytest.approx(0.03)
        cloud.clock = lambda: epoch - 1.0  # before the trace: nothing in force yet
        assert cloud.spot_prices() is None
        assert cloud.catalog()["c7i.large:spot"] == snapshot["c7i.large:spot"]
        cloud.clock = lambda: epoch + 60.0
        assert cloud.catalog()["c7i.large:spot"].hourly_cost == pytest.approx(0.03)
        cloud.clock = lambda: epoch + 1800.0
        assert cloud.catalog()["c7i.large:spot"].hourly_cost == pytest.approx(0.045)
        # A type the trace does not name keeps the snapshot's price.
        assert cloud.catalog()["c7i.xlarge:spot"] == snapshot["c7i.xlarge:spot"]
    finally:
        cloud.close()


def test_zoned_offerings_are_priced_alike_the_local_cloud_having_one_zone(cluster_dir):
    path = with_trace(cluster_dir)
    enable_spot(path, 'zones = ["use1-az1", "use1-az2"]')
    cloud = local_cloud(load_cluster_config(path))
    try:
        cloud.clock = lambda: cloud.spot_epoch_s + 1800.0
        catalog = cloud.catalog()
        for zone in ("use1-az1", "use1-az2"):
            assert catalog[f"c7i.large:spot@{zone}"].hourly_cost == pytest.approx(0.045)
    finally:
        cloud.close()


def test_a_trace_without_spot_enabled_is_refused_naming_the_field(cluster_dir):
    with pytest.raises(InputError, match=r"\[cloud\]: field 'spot_price_trace'"):
        local_cloud(load_cluster_config(with_trace(cluster_dir)))


def test_a_bad_trace_of_the_config_is_refused_naming_the_file(cluster_dir):
    path = with_trace(cluster_dir)
    enable_spot(path)
    broken = json.loads(json.dumps(TRACE))
    broken["SpotPriceHistory"][2]["SpotPrice"] = "0.03 USD"
    (cluster_dir / "traces" / "prices.json").write_text(json.dumps(broken))
    with pytest.raises(InputError) as refused:
        local_cloud(load_cluster_config(path))
    line = str(refused.value)
    assert "prices.json" in line and "SpotPriceHistory[2].SpotPrice' = '0.03 USD'" in line


def test_the_daemon_bills_a_running_local_spot_instance_at_the_traces_prices(tmp_path, fake_agent):
    cluster = SimulatedDaemon(tmp_path / "cluster", [], extra="[spot]\nenabled = true\n")
    root = tmp_path / "cluster"
    with_trace(root)
    (root / "local-cloud").mkdir()
    (root / "local-cloud" / "epoch").write_text(f"{EPOCH!r}\n")
    config = load_cluster_config(root / "autoscaler.toml")
    clock = Clock(EPOCH + 600.0)
    clouds = []

    def started() -> Daemon:
        """A daemon (and its local cloud) on the cluster's directory, as after a restart."""
        cloud = local_cloud(config)
        cloud.clock, cloud.python = clock, fake_agent
        clouds.append(cloud)
        bindings = replace(cluster.daemon.bindings, cloud=cloud, catalog=cloud.catalog)
        return Daemon(config, bindings, clock=clock)

    store = cluster.store
    try:
        daemon = started()
        cloud = clouds[0]
        # As the control loop does: the request recorded at its planned price, then the
        # launch, whose answer names the zone and the price the instance landed at.
        planned = cloud.catalog()["c7i.large:spot"].hourly_cost
        assert planned == pytest.approx(0.03)
        request(store, "i1", "c7i.large:spot", planned, at=clock.t)
        got = cloud.launch(LaunchRequest("c7i.large:spot", "i1"))
        assert (got.zone, got.hourly_price) == (LOCAL_ZONE, 0.03)
        store.transition_instances(
            [InstanceChange("i1", "running", got.cloud_id, got.zone, hourly_price=0.03)], clock.t
        )
        assert daemon.record_spot_prices() == set()  # the price it landed at is in force
        clock.t = EPOCH + 2400.0
        assert daemon.record_spot_prices() == {"i1"}
        ledger = [(u.hourly_price, u.start) for u in store.uptime() if u.instance_id == "i1"]
        # A new segment at the trace's time (30 minutes after the epoch), not the refresh's.
        assert ledger == [(0.03, EPOCH + 600.0), (0.045, EPOCH + 1800.0)]
        report = cost_report(store, Catalog([]), EPOCH + HOUR)
        assert report["spend"] == pytest.approx(expected_cost(600.0, HOUR))
        assert report["spend"] == pytest.approx((0.03 * 1200 + 0.045 * 1800) / HOUR)

        # The daemon is killed; another starts on the same directory, past the trace's
        # end: the changes it had not seen are billed, those it had are not written again.
        clock.t = EPOCH + 3 * HOUR
        again = started()
        assert again.record_spot_prices() == {"i1"}
        assert again.record_spot_prices() == set()
        third = started()
        assert third.record_spot_prices() == set()
        ledger = [(u.hourly_price, u.start) for u in store.uptime() if u.instance_id == "i1"]
        assert ledger == [
            (0.03, EPOCH + 600.0),
            (0.045, EPOCH + 1800.0),
            (0.025, EPOCH + 2 * HOUR),
        ]
        report = cost_report(store, Catalog([]), EPOCH + 3 * HOUR)
        assert report["spend"] == pytest.approx(expected_cost(600.0, 3 * HOUR))
        kept = store.spot_prices(config.cluster.region)
        assert kept is not None and kept.prices == {"c7i.large": {LOCAL_ZONE: 0.025}}
    finally:
        for cloud in clouds:
            cloud.terminate_all()
            cloud.close()
        cluster.close()


def test_the_example_trace_loads_and_moves_the_walk_throughs_offerings():
    """The README's made-up trace stays a valid one: c7i.large's price changes in it."""
    example = Path(__file__).parents[2] / "examples" / "spot-prices" / "made-up-c7i.json"
    trace = load_spot_price_trace(example)
    assert set(trace.changes) == {"c7i.large", "c7i.xlarge"}
    assert [at for at, _ in trace.changes["c7i.large"]] == [0.0, 120.0, 300.0]
