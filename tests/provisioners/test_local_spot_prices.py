"""Spot prices that move on the local cloud: a `describe-spot-price-history` dump (the AWS
CLI's JSON), read strictly and bounded, replayed from the cloud's epoch; the cloud answers
as EC2's refresh does, prices its spot offerings with it and bills a launch at the price
in force. Clocks are injected; the expected prices are the trace's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import app.files
from app.files import load_spot_price_trace
from autoscaler.catalog import SPOT, Catalog, InstanceType
from autoscaler.cloud import LaunchRequest
from autoscaler.errors import InputError
from autoscaler.resources import Resources
from provisioners.local import LocalCloud
from provisioners.local_spot_prices import LOCAL_ZONE, SpotPriceTrace
from tests.provisioners.test_local_cloud import Clock

HOUR = 3600.0
EPOCH = 1000.0


def entry(itype: str, zone: str, price: str, stamp: str, product: str = "Linux/UNIX") -> dict:
    return {
        "AvailabilityZone": zone,
        "InstanceType": itype,
        "ProductDescription": product,
        "SpotPrice": price,
        "Timestamp": stamp,
    }


#: As the AWS CLI prints it: newest first, strings for prices, a Windows entry among them.
DUMP = {
    "SpotPriceHistory": [
        entry("c7i.large", "us-east-1a", "0.025000", "2026-11-01T02:00:00+00:00"),
        entry("c7i.large", "us-east-1a", "0.045000", "2026-11-01T00:30:00+00:00"),
        entry("c7i.large", "us-east-1a", "0.900000", "2026-10-31T00:00:00+00:00", "Windows"),
        entry("c7i.large", "us-east-1a", "0.030000", "2026-11-01T00:00:00+00:00"),
        entry("m7i.large", "us-east-1b", "0.040000", "2026-11-01T01:00:00Z"),
    ]
}


def write(tmp_path: Path, document: object, name: str = "prices.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document, indent=1))
    return path


# -- the file ---------------------------------------------------------------------------------


def test_a_dump_becomes_each_types_changes_from_its_earliest_linux_entry(tmp_path):
    trace = load_spot_price_trace(write(tmp_path, DUMP))
    # 00:00 is the epoch (the Windows entry the day before is left out, and does not move
    # it); m7i.large's first entry, an hour later, is its first price.
    assert trace.changes == {
        "c7i.large": ((0.0, 0.03), (1800.0, 0.045), (2 * HOUR, 0.025)),
        "m7i.large": ((HOUR, 0.04),),
    }


def test_a_types_zones_fold_into_the_one_local_zone_at_their_median():
    trace = SpotPriceTrace.from_document(
        {
            "SpotPriceHistory": [
                entry("c7i.large", "us-east-1a", "0.02", "2026-11-01T00:00:00Z"),
                entry("c7i.large", "us-east-1b", "0.04", "2026-11-01T00:10:00Z"),
                entry("c7i.large", "us-east-1c", "0.10", "2026-11-01T00:20:00Z"),
                entry("c7i.large", "us-east-1c", "0.05", "2026-11-01T00:30:00Z"),
                entry("c7i.large", "us-east-1a", "0.06", "2026-11-01T00:40:00Z"),
            ]
        }
    )
    # {0.02}; {0.02, 0.04}: 0.03; {0.02, 0.04, 0.10}: 0.04; {0.02, 0.04, 0.05}: 0.04 still,
    # no change; {0.06, 0.04, 0.05}: 0.05.
    changes = trace.changes["c7i.large"]
    assert [at for at, _ in changes] == [0.0, 600.0, 1200.0, 2400.0]
    assert [price for _, price in changes] == pytest.approx([0.02, 0.03, 0.04, 0.05])


def bad(field: str, value: object, index: int = 1) -> dict:
    entries = [dict(e) for e in DUMP["SpotPriceHistory"]]
    entries[index][field] = value
    return {"SpotPriceHistory": entries}


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (bad("SpotPrice", "-0.01"), "field 'SpotPriceHistory[1].SpotPrice' = '-0.01'"),
        (bad("SpotPrice", "cheap"), "field 'SpotPriceHistory[1].SpotPrice' = 'cheap'"),
        (bad("SpotPrice", "NaN"), "field 'SpotPriceHistory[1].SpotPrice' = 'NaN'"),
        (bad("Timestamp", "yesterday"), "field 'SpotPriceHistory[1].Timestamp' = 'yesterday'"),
        (bad("InstanceType", ""), "field 'SpotPriceHistory[1].InstanceType' = ''"),
        (bad("Spotprice", "0.03"), "field 'SpotPriceHistory[1].Spotprice'"),
        ({**DUMP, "NextToken": "abc"}, "NextToken"),
        ({"SpotPriceHistory": []}, "field 'SpotPriceHistory'"),
        ({"SpotPriceHistory": [7]}, "field 'SpotPriceHistory[0]' = 7"),
        (
            {"SpotPriceHistory": [DUMP["SpotPriceHistory"][2]]},
            "no entry of Linux/UNIX",
        ),
    ],
)
def test_a_bad_trace_is_refused_in_one_line_naming_the_file_field_and_value(
    tmp_path, document, named
):
    path = write(tmp_path, document)
    with pytest.raises(InputError) as refused:
        load_spot_price_trace(path)
    line = str(refused.value)
    assert line.startswith(str(path)) and named in line and "\n" not in line


def test_a_missing_field_and_a_duplicate_key_are_refused(tmp_path):
    entries = [dict(e) for e in DUMP["SpotPriceHistory"]]
    del entries[0]["Timestamp"]
    with pytest.raises(InputError, match=r"field 'SpotPriceHistory\[0\]\.Timestamp': is required"):
        load_spot_price_trace(write(tmp_path, {"SpotPriceHistory": entries}))
    path = tmp_path / "twice.json"
    path.write_text('{"SpotPriceHistory": [], "SpotPriceHistory": []}')
    with pytest.raises(InputError, match="appears twice"):
        load_spot_price_trace(path)


def test_an_oversized_trace_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = write(tmp_path, DUMP)
    monkeypatch.setattr(app.files, "SPOT_PRICE_TRACE_LIMIT", path.stat().st_size - 1)
    with pytest.raises(InputError) as refused:
        load_spot_price_trace(path)
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)
    monkeypatch.setattr(app.files, "SPOT_PRICE_TRACE_LIMIT", path.stat().st_size)
    assert load_spot_price_trace(path).changes  # at the limit: read


# -- the local cloud --------------------------------------------------------------------------

SPOT_OFFERING = InstanceType(
    "c7i.large:spot", "c7i", Resources(0, 1, 4), 0.0317, market=SPOT, ec2_type="c7i.large"
)
CATALOG = Catalog([SPOT_OFFERING, InstanceType("c7i.large", "c7i", Resources(0, 1, 4), 0.09)])


def make(tmp_path: Path, clock: Clock, **kwargs) -> LocalCloud:
    return LocalCloud(
        CATALOG,
        tmp_path / "cloud",
        daemon_address="127.0.0.1:7443",
        ca_path=tmp_path / "ca.pem",
        clock=clock,
        spot_prices=SpotPriceTrace.from_document(DUMP, "prices.json"),
        spot_epoch_s=EPOCH,
        **kwargs,
    )


def test_the_price_in_force_moves_at_the_traces_times_and_holds_after_its_end(tmp_path):
    clock = Clock()
    cloud = make(tmp_path, clock)

    def price_at(offset: float) -> float | None:
        clock.now = EPOCH + offset
        table = cloud.spot_prices()
        assert table is not None
        return table.price("c7i.large", LOCAL_ZONE)

    assert price_at(0.0) == 0.03
    assert price_at(1799.0) == 0.03
    assert price_at(1800.0) == 0.045
    assert price_at(2 * HOUR - 1) == 0.045
    assert price_at(2 * HOUR) == 0.025
    assert price_at(30 * 24 * HOUR) == 0.025  # after the trace's end, its last price holds
    # m7i.large has no spot offering in this catalog: left out.
    assert "m7i.large" not in cloud.spot_prices().prices


def test_an_answer_is_new_only_when_a_change_comes_into_force(tmp_path):
    clock = Clock()
    clock.now = EPOCH + 600.0
    cloud = make(tmp_path, clock)
    first = cloud.spot_prices()
    assert first is not None and first.retrieved_s == EPOCH + 600.0
    # The first answer: everything up to now.
    assert first.history == {"c7i.large": {LOCAL_ZONE: ((EPOCH, 0.03),)}}
    clock.now = EPOCH + 1700.0
    assert cloud.spot_prices() is first  # nothing new: the daemon records nothing
    clock.now = EPOCH + 2 * HOUR + 5.0
    second = cloud.spot_prices()
    assert second is not None and second.retrieved_s == EPOCH + 2 * HOUR + 5.0
    # Since the previous answer: the price in force then, and the changes after it.
    assert second.history == {
        "c7i.large": {
            LOCAL_ZONE: ((EPOCH, 0.03), (EPOCH + 1800.0, 0.045), (EPOCH + 2 * HOUR, 0.025))
        }
    }
    clock.now = EPOCH + 3 * HOUR
    third = cloud.spot_prices()
    assert third is second


def test_without_a_trace_there_are_no_spot_prices_and_the_catalog_is_as_given(tmp_path):
    cloud = LocalCloud(
        CATALOG, tmp_path / "cloud", daemon_address="127.0.0.1:7443", ca_path=tmp_path / "ca"
    )
    assert cloud.spot_prices() is None
    assert cloud.catalog() is CATALOG


def test_the_catalog_prices_its_spot_offerings_with_the_price_in_force(tmp_path):
    def offerings(listed: Catalog, live) -> Catalog:
        price = live.price("c7i.large", LOCAL_ZONE) if live is not None else 0.0317
        spot = InstanceType(
            "c7i.large:spot", "c7i", Resources(0, 1, 4), price, market=SPOT, ec2_type="c7i.large"
        )
        return Catalog([*listed, spot])

    clock = Clock()
    clock.now = EPOCH + 10.0
    cloud = LocalCloud(
        Catalog([InstanceType("c7i.large", "c7i", Resources(0, 1, 4), 0.09)]),
        tmp_path / "cloud",
        daemon_address="127.0.0.1:7443",
        ca_path=tmp_path / "ca.pem",
        clock=clock,
        spot_prices=SpotPriceTrace.from_document(DUMP),
        spot_epoch_s=EPOCH,
        offerings=offerings,
    )
    assert cloud.catalog()["c7i.large:spot"].hourly_cost == 0.03
    before = cloud.catalog()
    assert cloud.catalog() is before  # not built again while the prices hold
    clock.now = EPOCH + 1800.0
    assert cloud.catalog()["c7i.large:spot"].hourly_cost == 0.045
    assert cloud.catalog()["c7i.large"].hourly_cost == 0.09


def test_a_launch_is_billed_at_the_price_in_force_and_keeps_it(tmp_path, fake_agent):
    clock = Clock()
    clock.now = EPOCH + 1900.0
    cloud = make(tmp_path, clock, python=fake_agent)
    try:
        got = cloud.launch(LaunchRequest("c7i.large:spot", "tok-1"))
        assert (got.zone, got.hourly_price) == (LOCAL_ZONE, 0.045)
        on_demand = cloud.launch(LaunchRequest("c7i.large", "tok-2"))
        assert on_demand.hourly_price is None  # the request's price
        # Asked again later (a daemon retrying the token): the price it landed at.
        clock.now = EPOCH + 3 * HOUR
        again = cloud.launch(LaunchRequest("c7i.large:spot", "tok-1"))
        assert (again.cloud_id, again.hourly_price) == (got.cloud_id, 0.045)
    finally:
        cloud.terminate_all()
