"""The daemon and spot price refreshes: each refresh reaches the ledger (price segments at
the history's times) and the state (the prices, dated) before the round that uses it,
once across restarts; a restarted daemon hands the cloud the prices it kept, within
`[spot] history_days`, so its quotes and first plan use them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.daemon import Daemon
from app.reports import cost_report
from autoscaler.catalog import Catalog
from autoscaler.store import (
    InstanceChange,
    PriceChange,
    RefreshedPrices,
    RoundIntents,
    RoundRecord,
    TaskUpdate,
)
from provisioners.spot_prices import SpotPriceTable
from state.memory import InMemoryStore
from tests.app.simulated_daemon import SimulatedDaemon
from tests.builders import job as spec
from tests.simulator.test_hand_computed import job
from tests.store_writes import request

REGION = "us-east-1"
HOUR = 3600.0
DAY = 86400.0


class Priced:
    """The simulated cloud with what EC2Cloud adds for spot prices: the table of its last
    refresh (`table`, set by the test) and the prices it was seeded with; its catalog
    notes what the state kept when the round read it."""

    def __init__(self, inner, store) -> None:
        self.inner = inner
        self.store = store
        self.table: SpotPriceTable | None = None
        self.seeded: list[SpotPriceTable] = []
        self.kept_when_planned: list[RefreshedPrices | None] = []

    def spot_prices(self) -> SpotPriceTable | None:
        return self.table

    def seed_spot_prices(self, table: SpotPriceTable) -> bool:
        self.seeded.append(table)
        return True

    def catalog(self):
        self.kept_when_planned.append(self.store.spot_prices(REGION))
        return self.inner.catalog()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def spot_cluster(tmp_path, extra: str = "", jobs=()) -> SimulatedDaemon:
    return SimulatedDaemon(
        tmp_path / "cluster", list(jobs), extra="[spot]\nenabled = true\n" + extra
    )


def restarted(cluster: SimulatedDaemon, cloud: Priced) -> Daemon:
    bindings = replace(cluster.daemon.bindings, cloud=cloud)
    return Daemon(cluster.config, bindings, clock=cluster.engine)


def test_a_refresh_is_in_the_ledger_and_the_state_before_the_round_plans(tmp_path):
    cluster = spot_cluster(tmp_path, jobs=[job("a", 0, 3000, (2, 8, 32))])
    try:
        store = cluster.store
        cluster.until(2 * HOUR)
        request(store, "i1", "c7i.large:spot", 0.03, at=0.0)
        store.transition_instances([InstanceChange("i1", "running", "c-1", "us-east-1a")], 0.0)
        cloud = Priced(cluster.daemon.bindings.cloud, store)
        daemon = restarted(cluster, cloud)
        cloud.table = SpotPriceTable(
            REGION,
            {"c7i.large": {"use1-az1": 0.05}},
            2 * HOUR,
            history={"c7i.large": {"us-east-1a": ((-HOUR, 0.03), (HOUR, 0.05))}},
        )
        daemon.round()
        kept = RefreshedPrices(
            REGION, {"c7i.large": {"use1-az1": 0.05}}, 2 * HOUR, cloud.table.source
        )
        assert cloud.kept_when_planned and cloud.kept_when_planned[0] == kept
        # At the history's time, not the refresh's (the round may end the instance after,
        # the simulated world not knowing it: the segments are the ledger's either way).
        ledger = [(u.hourly_price, u.start) for u in store.uptime() if u.instance_id == "i1"]
        assert ledger == [(0.03, 0.0), (0.05, HOUR)]
        assert store.cost_between(0.0, 2 * HOUR) == pytest.approx(0.03 + 0.05)
        # The next round, and a restarted daemon, apply the same refresh: nothing twice.
        daemon.round()
        again = restarted(cluster, cloud)
        assert again.record_spot_prices() == set()
        assert [
            (u.hourly_price, u.start) for u in store.uptime() if u.instance_id == "i1"
        ] == ledger
    finally:
        cluster.close()


def test_a_refresh_that_fails_to_be_recorded_is_tried_again_at_the_next_round(tmp_path):
    cluster = spot_cluster(tmp_path)
    try:
        store = cluster.store
        request(store, "i1", "c7i.large:spot", 0.03, at=0.0)
        store.transition_instances([InstanceChange("i1", "running", "c-1", "us-east-1a")], 0.0)
        cloud = Priced(cluster.daemon.bindings.cloud, store)
        daemon = restarted(cluster, cloud)
        cloud.table = SpotPriceTable(
            REGION,
            {"c7i.large": {"use1-az1": 0.04}},
            HOUR,
            history={"c7i.large": {"us-east-1a": ((600.0, 0.04),)}},
        )
        original = store.record_spot_prices
        store.record_spot_prices = lambda prices: (_ for _ in ()).throw(OSError("disk full"))
        try:
            assert daemon.record_spot_prices() == set()  # logged, the round goes on
        finally:
            store.record_spot_prices = original
        assert store.spot_prices(REGION) is None
        # The segments were written first: they are in.
        assert [(u.hourly_price, u.start) for u in store.uptime()] == [(0.03, 0.0), (0.04, 600.0)]
        assert daemon.record_spot_prices() == set()  # segments already there
        assert store.spot_prices(REGION).retrieved_at == HOUR
        assert [(u.hourly_price, u.start) for u in store.uptime()] == [(0.03, 0.0), (0.04, 600.0)]
    finally:
        cluster.close()


@pytest.mark.parametrize(
    ("extra", "age_days", "seeded"),
    [("", 2.0, True), ("", 31.0, False), ("history_days = 1.0\n", 2.0, False)],
)
def test_a_restarted_daemon_seeds_the_cloud_with_kept_prices_younger_than_the_history(
    tmp_path, extra, age_days, seeded
):
    cluster = spot_cluster(tmp_path, extra)
    try:
        cluster.until(40 * DAY)
        now = cluster.engine.now()
        kept = RefreshedPrices(
            REGION, {"p3.2xlarge": {"use1-az2": 0.9}}, now - age_days * DAY, "EC2"
        )
        cluster.store.record_spot_prices(kept)
        cloud = Priced(cluster.daemon.bindings.cloud, cluster.store)
        restarted(cluster, cloud)
        expected = [SpotPriceTable(REGION, kept.prices, kept.retrieved_at, "EC2")] if seeded else []
        assert cloud.seeded == expected
    finally:
        cluster.close()


def test_without_spot_nothing_is_seeded_or_recorded(tmp_path):
    cluster = SimulatedDaemon(tmp_path / "cluster", [])
    try:
        cluster.store.record_spot_prices(RefreshedPrices(REGION, {"c7i.large": {"z": 0.1}}, 0.0))
        cloud = Priced(cluster.daemon.bindings.cloud, cluster.store)
        cloud.table = SpotPriceTable(REGION, {"c7i.large": {"z": 0.2}}, 10.0)
        daemon = restarted(cluster, cloud)
        assert cloud.seeded == [] and daemon.record_spot_prices() == set()
        assert cluster.store.spot_prices(REGION).retrieved_at == 0.0
    finally:
        cluster.close()


def test_cost_report_and_the_daily_guardrail_sum_the_price_segments():
    """The report's spend, its split among jobs, its spot savings and the 24-hour spend the
    guardrail reads are each the sum over the instance's price segments."""

    store = InMemoryStore()
    store.submit_job(spec("j", (1, 4, 8)), owner="ana", at=0.0)
    intents_request = (("i1", "c7i.large:spot", 0.03),)

    store.record_round(
        RoundRecord(0.0, "test", "none", False, "set up"),
        RoundIntents(requests=intents_request, on_demand_prices={"i1": 0.09}),
    )
    store.transition_instances([InstanceChange("i1", "running", "c-1", "us-east-1a")], 0.0)
    store.update_tasks([TaskUpdate("j/0", status="running", instance_id="i1", attempt=1)], 0.0)
    store.reprice_instances([PriceChange("i1", 0.06, HOUR)])
    report = cost_report(store, Catalog([]), 3 * HOUR)
    assert report["spend"] == pytest.approx(0.03 + 2 * 0.06)
    assert report["spend_by_job"] == {"j": pytest.approx(0.03 + 2 * 0.06)}
    assert report["hourly_cost_now"] == pytest.approx(0.06)
    spot = report["spot"]
    assert spot["spot_spend"] == pytest.approx(0.15)
    assert spot["savings_vs_on_demand"] == pytest.approx((0.09 - 0.03) + 2 * (0.09 - 0.06))
    assert store.cost_between(3 * HOUR - 86400.0, 3 * HOUR) == pytest.approx(0.15)
