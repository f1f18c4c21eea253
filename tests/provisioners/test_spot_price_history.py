"""A running spot instance billed at the price in effect, from `DescribeSpotPriceHistory`.

A refresh asks for the history since the previous one; each change after an instance's
open ledger stretch began becomes a segment from the history's time, the price in force
when it began corrects a landing price already superseded. AWS answers a `StartTime`
with every change since it and the last change before it ("DescribeSpotPriceHistory",
EC2 API Reference): botocore's Stubber answers in that shape for the segments. moto is
laxer: it ignores `StartTime`, `EndTime` and `ProductDescriptions` and answers one entry
per (type, zone), price 0.00001, dated 2006-01-02 — a history in which nothing ever
changes after an instance starts. Over moto_server the test therefore checks what moto
can show (the window asked for, the parsing, the price in force at the start correcting
the landing price, nothing written twice) and leaves the segments to the Stubber."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from app.config import load_provisioner_config
from app.daemon import record_refresh
from autoscaler.catalog import SPOT, offering_name
from autoscaler.cloud import LaunchRequest
from autoscaler.spot import price_changes
from autoscaler.store import InstanceChange
from provisioners.aws import AwsCaller
from provisioners.ec2 import EC2Cloud
from provisioners.spot_prices import (
    SPOT_HISTORY_WINDOW_S,
    SpotPriceTable,
    fetch_spot_prices,
    load_spot_prices,
    refreshed_spot_prices,
    save_spot_prices,
    spot_prices_path,
)
from state.memory import InMemoryStore
from tests.provisioners.conftest import REGION, Clock, register_worker_image
from tests.provisioners.test_moto_server import moto_server  # noqa: F401
from tests.store_writes import request

T0 = 1.8e9  # 2027-01-15T08:00:00Z
HOUR = 3600.0


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def entry(zone: str, price: str, when: float, itype: str = "c7i.large") -> dict:
    return {
        "InstanceType": itype,
        "AvailabilityZone": zone,
        "SpotPrice": price,
        "Timestamp": at(when),
        "ProductDescription": "Linux/UNIX",
    }


def stubbed(pages: list[list[dict]], since: float, types=("c7i.large",)):
    client = boto3.client("ec2", region_name=REGION)
    stub = Stubber(client)
    for n, page in enumerate(pages):
        response: dict = {"SpotPriceHistory": page}
        expected = {
            "InstanceTypes": list(types),
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": at(since),
        }
        if n + 1 < len(pages):
            response["NextToken"] = f"page-{n + 1}"
        if n > 0:
            expected["NextToken"] = f"page-{n}"
        stub.add_response("describe_spot_price_history", response, expected)
    stub.activate()
    return client, stub


def test_a_refresh_asks_for_the_changes_since_the_previous_one_and_keeps_them_dated():
    since = T0 - 2 * HOUR
    client, stub = stubbed(
        [
            [entry("us-east-1a", "0.0300", since - 500), entry("us-east-1a", "0.0400", T0 - HOUR)],
            [
                entry("us-east-1a", "0.0400", T0 - HOUR),  # repeated across pages: once
                entry("us-east-1a", "0.0350", T0 - 600),
                entry("us-east-1b", "0.0280", since - 90),
            ],
        ],
        since,
    )
    table = fetch_spot_prices(AwsCaller(client), REGION, ["c7i.large"], T0, since)
    stub.assert_no_pending_responses()
    assert table.history == {
        "c7i.large": {
            "us-east-1a": ((since - 500, 0.03), (T0 - HOUR, 0.04), (T0 - 600, 0.035)),
            "us-east-1b": ((since - 90, 0.028),),
        }
    }
    assert table.prices == {"c7i.large": {"us-east-1a": 0.035, "us-east-1b": 0.028}}


def test_the_window_is_bounded_and_an_entry_ahead_of_our_clock_is_taken_as_of_now():
    long_ago = T0 - 30 * 86400.0
    client, stub = stubbed(
        [[entry("us-east-1a", "0.0300", T0 - 100), entry("us-east-1a", "0.0500", T0 + 30)]],
        T0 - SPOT_HISTORY_WINDOW_S,
    )
    table = fetch_spot_prices(AwsCaller(client), REGION, ["c7i.large"], T0, long_ago)
    stub.assert_no_pending_responses()
    assert table.history["c7i.large"]["us-east-1a"] == ((T0 - 100, 0.03), (T0, 0.05))


def test_a_cached_refresh_is_the_start_of_the_next_and_its_history_reads_back(tmp_path):
    cached = SpotPriceTable(
        REGION,
        {"c7i.large": {"us-east-1a": 0.03}},
        T0 - 2 * HOUR,
        history={"c7i.large": {"us-east-1a": ((T0 - 3 * HOUR, 0.03),)}},
    )
    save_spot_prices(cached, spot_prices_path(tmp_path, REGION))
    assert load_spot_prices(spot_prices_path(tmp_path, REGION)) == cached
    client, stub = stubbed([[entry("us-east-1a", "0.0300", T0 - 3 * HOUR)]], T0 - 2 * HOUR)
    fresh, note = refreshed_spot_prices(tmp_path, REGION, AwsCaller(client), ["c7i.large"], T0)
    stub.assert_no_pending_responses()
    assert note is None and fresh is not None and fresh.retrieved_s == T0


def test_changes_become_ledger_segments_at_the_historys_times_not_the_refreshs():
    """An instance landed at 0.030 in us-east-1a; the hourly refresh at T0 finds the price
    moved twice since the previous refresh: the ledger closes and opens a segment at each
    change's time. The instance in us-east-1b kept its price: nothing is written for it."""
    since = T0 - HOUR
    client, stub = stubbed(
        [
            [
                entry("us-east-1a", "0.0300", since - 900),
                entry("us-east-1a", "0.0400", since + 600),
                entry("us-east-1a", "0.0350", since + 2400),
                entry("us-east-1b", "0.0280", since - 900),
            ]
        ],
        since,
    )
    table = fetch_spot_prices(AwsCaller(client), REGION, ["c7i.large"], T0, since)
    stub.assert_no_pending_responses()
    store = InMemoryStore()
    for name, zone, price in (("a", "us-east-1a", 0.03), ("b", "us-east-1b", 0.028)):
        request(store, name, "c7i.large:spot", price, at=since - 300)
        store.transition_instances([InstanceChange(name, "running", name, zone)], since - 300)
    assert record_refresh(store, table) == {"a"}
    ledger = [(u.instance_id, u.hourly_price, u.start, u.end) for u in store.uptime()]
    assert ledger == [
        ("a", 0.03, since - 300, since + 600),
        ("b", 0.028, since - 300, None),
        ("a", 0.04, since + 600, since + 2400),
        ("a", 0.035, since + 2400, None),
    ]
    expected = (600 * 0.03 + 1800 * 0.04 + 1200 * 0.035) / HOUR
    assert store.cost_between(since, T0) == pytest.approx(expected + 0.028)
    assert store.spot_prices(REGION).retrieved_at == T0
    assert record_refresh(store, table) == set()  # replayed: nothing written twice
    assert len(store.uptime()) == 4


def test_price_changes_leave_on_demand_zoneless_and_unpriced_instances_alone():
    from autoscaler.store import UptimeInterval

    history = {"c7i.large": {"z": ((0.0, 0.03), (100.0, 0.04))}}
    stretches = [
        (UptimeInterval("od", "c7i.large", 0.09, 10.0), "z"),
        (UptimeInterval("nozone", "c7i.large:spot", 0.03, 10.0), None),
        (UptimeInterval("other", "r7i.large:spot@use1-az1", 0.03, 10.0), "z"),
        (UptimeInterval("closed", "c7i.large:spot", 0.03, 10.0, 50.0), "z"),
        (UptimeInterval("late", "c7i.large:spot@use1-az1", 0.05, 10.0), "z"),
    ]
    changes = price_changes(stretches, history)
    assert [(c.instance_id, c.hourly_price, c.at) for c in changes] == [
        ("late", 0.03, 10.0),  # landed at a price no longer in force: corrected at its start
        ("late", 0.04, 100.0),
    ]


def test_over_moto_server_a_landing_price_moto_supersedes_is_corrected_once(
    moto_server,  # noqa: F811
    tmp_path: Path,
):
    url, _ = moto_server
    raw = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    ami = register_worker_image(raw)
    subnets = [s["SubnetId"] for s in raw.describe_subnets()["Subnets"]]
    group = raw.create_security_group(GroupName="workers", Description="workers")["GroupId"]
    iam = boto3.client("iam", region_name=REGION, endpoint_url=url)
    iam.create_instance_profile(InstanceProfileName="autoscaler-worker")
    config_path = tmp_path / "autoscaler.toml"
    config_path.write_text(
        f'[ec2]\ncluster_id = "e2e"\nzones = ["{REGION}b", "{REGION}c"]\n'
        f'cache_dir = "{tmp_path / "cache"}"\nsubnet_ids = {json.dumps(subnets)}\n'
        f'security_group_ids = ["{group}"]\niam_instance_profile = "autoscaler-worker"\n'
        'families = ["c7i", "r7i"]\ndry_run = false\n'
        f'[ec2.ami]\nx86_64 = "{ami}"\n'
        "[guardrails]\nmax_instances = 3\nmax_hourly_spend = 5.0\n"
    )
    config = load_provisioner_config(config_path)
    ec2 = replace(config.ec2, spot_enabled=True, spot_types=("c7i",))
    clock = Clock()
    # The cluster refreshed its prices a minute ago (the cache file): the launch lands at them.
    landed = {f"{REGION}b": 0.021, f"{REGION}c": 0.023}
    save_spot_prices(
        SpotPriceTable(REGION, {"c7i.large": landed}, clock() - 60),
        spot_prices_path(ec2.cache_dir, REGION),
    )
    client = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    asked: list[dict] = []
    client.meta.events.register(
        "provide-client-params.ec2.DescribeSpotPriceHistory",
        lambda params, **_: asked.append(dict(params)),
    )
    cloud = EC2Cloud(ec2, config.guardrails, ec2=client, iam=iam, clock=clock, endpoint_url=url)
    launched = cloud.launch(LaunchRequest(offering_name("c7i.large", SPOT), "tok-1"))
    assert launched.spot and launched.hourly_price == landed[launched.zone]
    assert asked == []  # the cached prices were fresh
    store = InMemoryStore()
    request(store, "tok-1", "c7i.large:spot", launched.hourly_price, at=clock())
    store.transition_instances(
        [InstanceChange("tok-1", "running", launched.cloud_id, launched.zone)], clock()
    )
    start = clock()

    clock.advance(2 * HOUR)
    table = cloud.spot_prices()
    assert table is not None and table.retrieved_s == clock()
    [params] = asked
    assert params["StartTime"] == at(start - 60)  # since the previous refresh
    # moto's history: one entry per zone, dated 2006, at 0.00001 (what AWS's "last change
    # before StartTime" would be, had nothing changed since).
    [(when, price)] = table.history["c7i.large"][launched.zone]
    assert price == 0.00001 and when < start
    assert record_refresh(store, table) == {"tok-1"}
    [stretch] = store.uptime()
    assert (stretch.hourly_price, stretch.start, stretch.end) == (0.00001, start, None)
    assert store.instance("tok-1").hourly_price == 0.00001
    kept = store.spot_prices(REGION)
    assert kept is not None and kept.retrieved_at == clock()
    assert set(kept.prices["c7i.large"]) == set(table.prices["c7i.large"])  # by AZ ID
    assert record_refresh(store, table) == set()
    assert len(store.uptime()) == 1


def test_prices_kept_in_the_state_price_the_offerings_until_a_refresh_succeeds(
    config, ec2, client, clock, sleeps, faults
):
    """A daemon restarted where no refresh can be had yet (a new machine, EC2 refusing)
    plans and quotes with the prices it kept in its state, not the bundled snapshot, and
    its first refresh asks for the history since they were retrieved."""
    from tests.provisioners.conftest import make_cloud

    seen: list = []

    def offerings(listed, live):
        seen.append(live)
        return listed

    cfg = replace(config, spot_enabled=True, spot_types=("c7i",))
    cloud = make_cloud(cfg, ec2, clock, sleeps, iam=client("iam"), offerings=offerings)
    kept = SpotPriceTable(REGION, {"c7i.large": {"use1-az1": 0.02}}, clock() - 3 * HOUR, "kept")
    assert cloud.seed_spot_prices(kept)
    faults.plan("DescribeSpotPriceHistory", ["UnauthorizedOperation"])
    cloud.catalog()
    assert seen[-1] is kept  # the offerings (and so quotes and the first plan) use them
    [params] = faults.calls["DescribeSpotPriceHistory"]
    assert params["StartTime"] == at(kept.retrieved_s)
    # Older ones, or another region's, do not replace them.
    assert not cloud.seed_spot_prices(replace(kept, retrieved_s=kept.retrieved_s - 1))
    assert not cloud.seed_spot_prices(replace(kept, region="eu-west-1", retrieved_s=clock()))
    clock.advance(HOUR + 1)
    cloud.catalog()
    assert seen[-1] is not kept and seen[-1].retrieved_s == clock()
    assert faults.calls["DescribeSpotPriceHistory"][-1]["StartTime"] == at(kept.retrieved_s)
    # Seeded after a refresh: the newer refresh stands.
    assert not cloud.seed_spot_prices(kept)


def test_the_advisors_bands_are_bundled_dated_and_rate_each_type_unless_overridden():
    """The Spot Instance Advisor's band of each of the 21 bundled types, from a dated copy
    of its data (cited in provisioners/data/README.md), is what a type's rate starts from;
    `[spot.bands]` and the file's own `types` take precedence, and a type the advisor's
    copy lacks takes `default_band`."""
    from dataclasses import replace

    from autoscaler.spot import hourly_rate
    from provisioners.catalog import bundled_spot_snapshot

    snapshot = bundled_spot_snapshot(REGION)
    assert snapshot is not None
    assert set(snapshot.advisor_bands) == set(snapshot.prices) and len(snapshot.prices) == 21
    assert set(snapshot.advisor_bands.values()) <= set(snapshot.bands)
    assert dt.date.fromisoformat(snapshot.advisor_as_of) == dt.date(2025, 6, 28)
    assert "alexei-led/spotinfo" in snapshot.advisor_source
    assert "5bdc33cee2e185c2f62df29dd9c4ad0ad7102a74" in snapshot.advisor_source
    for ec2_type, band in snapshot.advisor_bands.items():
        assert snapshot.band_of(ec2_type) == band
        other = next(b for b in snapshot.bands if b != band)
        assert snapshot.band_of(ec2_type, {ec2_type: other}) == other
        assert replace(snapshot, type_bands={ec2_type: other}).band_of(ec2_type) == other
    assert snapshot.band_of("x9.unlisted") == snapshot.default_band
    # The bands differ between types, so the rates do: not one band for all.
    rates = {hourly_rate(snapshot.monthly_fraction(t)) for t in snapshot.prices}
    assert len(rates) > 1
    readme = (Path(__file__).parents[2] / "provisioners" / "data" / "README.md").read_text()
    assert "5bdc33cee2e185c2f62df29dd9c4ad0ad7102a74" in readme and "2025-06-28" in readme


def test_an_advisor_band_the_file_does_not_define_is_refused(tmp_path):
    from autoscaler.errors import InputError
    from provisioners.catalog import bundled_spot_snapshot_path, load_spot_snapshot

    data = json.loads(bundled_spot_snapshot_path(REGION).read_text())
    data["interruption"]["advisor"]["types"]["p3.2xlarge"] = "30-40%"
    path = tmp_path / "spot.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="30-40%"):
        load_spot_snapshot(path)
