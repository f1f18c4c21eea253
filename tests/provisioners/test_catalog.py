"""The EC2 catalog: capacities in the project's units, prices, zones, cache and offline fallback."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from app.bundled import bundled
from app.files import load_catalog
from autoscaler.cloud import CloudRequestError, CloudUnavailable
from autoscaler.errors import InputError
from autoscaler.resources import Resources
from provisioners.aws import AwsCaller
from provisioners.catalog import (
    PriceTable,
    bundled_catalog,
    bundled_price_table_path,
    catalog_cache_path,
    current_catalog,
    current_price_table,
    describe_catalog,
    fetch_price_table,
    load_catalog_cache,
    load_price_table,
    physical_cores,
    price_table_path,
    prices_from_products,
    refreshed_price_table,
    save_catalog_cache,
    save_price_table,
)
from tests.provisioners.conftest import REGION

FIXTURE = Path(__file__).parent / "fixtures" / "pricing_get_products.json"
MOTO_LACKS = ["p3.16xlarge", "p3.2xlarge", "p3.8xlarge"]


def pricing_pages() -> list[dict[str, Any]]:
    """The fixture pages as the API sends them: each PriceList item a JSON string."""
    pages = json.loads(FIXTURE.read_text())["pages"]
    return [
        {**page, "PriceList": [json.dumps(item) for item in page["PriceList"]]} for page in pages
    ]


def bundled_prices() -> PriceTable:
    return load_price_table(bundled_price_table_path(REGION))


# --- units -----------------------------------------------------------------------------------


def test_cores_are_vcpus_divided_by_the_threads_per_core_ec2_reports(ec2):
    described = {
        t["InstanceType"]: t
        for t in ec2.describe_instance_types(InstanceTypes=["c7i.large", "m7g.large"])[
            "InstanceTypes"
        ]
    }
    x86, graviton = described["c7i.large"], described["m7g.large"]
    assert x86["VCpuInfo"]["DefaultVCpus"] == 2 and graviton["VCpuInfo"]["DefaultVCpus"] == 2
    assert physical_cores(x86["VCpuInfo"]) == 1  # two hyperthreads per core
    assert physical_cores(graviton["VCpuInfo"]) == 2  # one thread per core


def test_cores_without_thread_information_never_overstate_x86_capacity():
    assert physical_cores({"DefaultVCpus": 8, "DefaultCores": 4}) == 4
    assert physical_cores({"DefaultVCpus": 8}, ["x86_64"]) == 4
    assert physical_cores({"DefaultVCpus": 8}, ["arm64"]) == 8


def test_catalog_from_ec2_matches_evas_capacities_and_bundled_prices(ec2, config):
    """The conversion (cores, GiB) reproduces Eva's hand-made catalog for every type moto has."""
    built = describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=1000.0)

    eva = load_catalog(bundled("ec2_config.json"))
    names = sorted(t.name for t in built.catalog)
    assert names == sorted(t.name for t in eva if t.name not in MOTO_LACKS)
    for name in names:
        assert built.catalog[name].capacity == eva[name].capacity, name
        assert built.catalog[name].hourly_cost == eva[name].hourly_cost, name
    assert built.catalog["c7i.large"].capacity == Resources(gpu=0, cpu=1, ram_gb=4)
    assert built.vcpus["c7i.large"] == 2
    assert built.origin == "aws" and built.fetched_at_s == 1000.0


def test_types_missing_from_the_region_or_without_a_price_are_skipped_with_a_warning(
    ec2, config, caplog
):
    built = describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=0.0)

    missing = next(n for n in built.notes if "not offered in us-east-1" in n)
    assert missing.endswith(": " + ", ".join(MOTO_LACKS))
    unpriced = next(n for n in built.notes if "no known price" in n)
    assert "c7i.metal-24xl" in unpriced and "catalog refresh" in unpriced
    assert "c7i.metal-24xl" not in built.catalog
    assert any("p3.2xlarge" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_zones_come_from_the_instance_type_offerings(ec2, config):
    built = describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=0.0)
    offerings = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["c7i.large"]}],
    )["InstanceTypeOfferings"]
    assert built.zones["c7i.large"] == tuple(sorted(o["Location"] for o in offerings))
    assert f"{REGION}e" not in built.zones["c7i.large"]  # moto, like us-east-1, has no c7i there


def test_single_allowed_types_join_the_allowed_families(ec2, config):
    prices = PriceTable(REGION, {"c7i.large": 0.1, "g5.xlarge": 1.0}, "2026-11-22", "test")
    config = replace(config, families=("c7i",), types=("g5.xlarge",))
    built = describe_catalog(AwsCaller(ec2), config, prices, now_s=0.0)
    assert sorted(t.name for t in built.catalog) == ["c7i.large", "g5.xlarge"]
    assert built.catalog["g5.xlarge"].capacity == Resources(gpu=1, cpu=2, ram_gb=16)


def test_a_type_ec2_describes_against_its_name_is_skipped_so_no_wrong_image_boots(ec2, config):
    """The image a type boots is chosen by its family's name (c7i: x86_64, g5: NVIDIA);
    a type whose description contradicts it is left out, never launched on a wrong image."""

    def contradict(parsed: dict, **_: object) -> None:
        for description in parsed.get("InstanceTypes", []):
            if description["InstanceType"] == "c7i.large":
                description["ProcessorInfo"]["SupportedArchitectures"] = ["arm64"]
            if description["InstanceType"] == "g5.xlarge":
                description["GpuInfo"]["Gpus"][0]["Manufacturer"] = "AMD"

    ec2.meta.events.register("after-call.ec2.DescribeInstanceTypes", contradict)
    prices = PriceTable(
        REGION, {"c7i.large": 0.1, "c7i.xlarge": 0.2, "g5.xlarge": 1.0}, "2026-11-22", "test"
    )
    config = replace(config, families=("c7i",), types=("g5.xlarge",))
    built = describe_catalog(AwsCaller(ec2), config, prices, now_s=0.0)
    assert "c7i.xlarge" in built.catalog
    assert "c7i.large" not in built.catalog and "g5.xlarge" not in built.catalog
    [note] = [n for n in built.notes if "than its family name says" in n]
    assert note.endswith("c7i.large, g5.xlarge")


# --- prices ----------------------------------------------------------------------------------


def test_bundled_price_table_is_evas_prices_with_its_date():
    table = bundled_prices()
    eva = load_catalog(bundled("ec2_config.json"))
    assert dict(table.prices) == {t.name: t.hourly_cost for t in eva}
    assert table.region == REGION
    assert table.retrieved == "2026-11-22"
    assert "unknown" in table.note


def test_prices_from_products_keeps_only_linux_shared_no_software_used_in_the_region():
    items = [item for page in pricing_pages() for item in page["PriceList"]]
    assert prices_from_products(items, REGION) == {
        "c7i.large": 0.10,
        "r7i.large": 0.15,
        "g5.xlarge": 1.00,
        "c7i.metal-24xl": 4.50,
    }


def test_prices_from_products_keeps_the_higher_of_two_hourly_prices():
    [first] = [json.loads(i) for i in pricing_pages()[0]["PriceList"][:1]]
    second = copy.deepcopy(first)
    term = next(iter(second["terms"]["OnDemand"].values()))
    next(iter(term["priceDimensions"].values()))["pricePerUnit"]["USD"] = "0.125"
    assert prices_from_products([json.dumps(first), json.dumps(second)], REGION) == {
        "c7i.large": 0.125
    }


def _stubbed_pricing(botocore_session: Any) -> tuple[Any, Stubber]:
    client = botocore_session.create_client("pricing", region_name="us-east-1")
    return client, Stubber(client)


def test_price_refresh_reads_every_page_of_get_products(botocore_session):
    client, stubber = _stubbed_pricing(botocore_session)
    first, second = pricing_pages()
    expected = {
        "ServiceCode": "AmazonEC2",
        "FormatVersion": "aws_v1",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": REGION},
            {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
            {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
            {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
            {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        ],
    }
    stubber.add_response("get_products", first, expected)
    stubber.add_response("get_products", second, {**expected, "NextToken": "page-2-token"})

    with stubber:
        table = fetch_price_table(AwsCaller(client), REGION, today="2026-11-22")

    stubber.assert_no_pending_responses()
    assert table.prices["g5.xlarge"] == 1.0  # from the second page
    assert table.prices["c7i.large"] == 0.1
    assert table.retrieved == "2026-11-22" and "Pricing API" in table.source


def test_price_refresh_without_permission_is_a_request_error(botocore_session):
    client, stubber = _stubbed_pricing(botocore_session)
    stubber.add_client_error("get_products", "AccessDeniedException", "not allowed")
    with (
        stubber,
        pytest.raises(CloudRequestError, match=r"GetProducts.*`autoscaler deploy policy`"),
    ):
        fetch_price_table(AwsCaller(client), REGION, today="2026-11-22")


def test_price_refresh_with_no_prices_for_the_region_is_an_error(botocore_session):
    client, stubber = _stubbed_pricing(botocore_session)
    stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []})
    with stubber, pytest.raises(CloudRequestError, match="no on-demand Linux prices"):
        fetch_price_table(AwsCaller(client), "eu-west-9", today="2026-11-22")


def test_refreshed_price_table_takes_precedence_over_the_bundled_one(config):
    assert current_price_table(config) == bundled_prices()
    refreshed = PriceTable(REGION, {"c7i.large": 0.5}, "2026-12-01", "AWS Pricing API")
    save_price_table(refreshed, price_table_path(config))
    assert current_price_table(config) == refreshed
    assert current_price_table(replace(config, region="eu-west-1")) is None


def test_damaged_price_table_is_an_input_error_naming_the_entry(config):
    path = price_table_path(config)
    save_price_table(PriceTable(REGION, {"c7i.large": 0.5}, "2026-12-01", "x"), path)
    path.write_text(path.read_text().replace("0.5", '"cheap"'))
    with pytest.raises(InputError, match=r"field 'prices.c7i.large' = 'cheap'"):
        current_price_table(config)


def test_a_region_without_prices_is_priced_from_the_pricing_api_not_left_empty(
    aws, botocore_session, config
):
    """Outside us-east-1 there is no bundled table: without the Pricing API the catalog is
    empty and says why; the daemon, given the API, fetches the region's prices, saves them
    dated, and plans with them (the fixture prices m7g.large in us-west-2)."""
    west = replace(config, region="us-west-2", families=("m7g",))
    ec2 = boto3.Session(botocore_session=botocore_session).client("ec2", region_name="us-west-2")

    unpriced = current_catalog(AwsCaller(ec2), west, now_s=0.0)
    assert len(unpriced.catalog) == 0
    assert any("no on-demand prices for us-west-2" in n for n in unpriced.notes)

    client, stubber = _stubbed_pricing(botocore_session)
    for page in pricing_pages():
        stubber.add_response("get_products", page)
    catalog_cache_path(west).unlink()
    with stubber:
        priced = current_catalog(AwsCaller(ec2), west, now_s=0.0, pricing=AwsCaller(client))
    stubber.assert_no_pending_responses()
    assert priced.catalog["m7g.large"].hourly_cost == 0.08
    saved = load_price_table(price_table_path(west))
    assert saved.region == "us-west-2" and saved.retrieved == "1970-01-01"
    assert not any("no on-demand prices" in n for n in priced.notes)


def test_prices_older_than_90_days_are_refreshed_and_kept_with_a_warning_when_refused(
    botocore_session, config
):
    retrieved = datetime.fromisoformat(bundled_prices().retrieved).replace(tzinfo=UTC)
    fresh_s = retrieved.timestamp() + 89 * 86400
    client, stubber = _stubbed_pricing(botocore_session)
    with stubber:  # nothing stubbed: a call would fail the test
        table, warning = refreshed_price_table(config, AwsCaller(client), fresh_s)
    assert table == bundled_prices() and warning is None

    old_s = retrieved.timestamp() + 120 * 86400
    stubber.add_client_error("get_products", "AccessDeniedException", "not allowed")
    with stubber:
        table, warning = refreshed_price_table(config, AwsCaller(client), old_s)
    stubber.assert_no_pending_responses()
    assert table == bundled_prices()  # kept: old prices beat none
    assert warning is not None and "120 days ago" in warning and "longer ago than 90" in warning
    assert "AccessDeniedException" in warning

    table, warning = refreshed_price_table(config, None, old_s)
    assert warning is not None and "catalog refresh" in warning


# --- offline catalog and cache ----------------------------------------------------------------


def test_bundled_catalog_needs_no_aws_and_says_so(config):
    offline = bundled_catalog(replace(config, families=("r7i",)), bundled_prices())
    assert offline.origin == "bundled" and offline.zones == {}
    assert sorted(t.family for t in offline.catalog) == ["r7i"] * 9
    assert offline.catalog["r7i.large"].hourly_cost == 0.1323

    elsewhere = bundled_catalog(replace(config, region="eu-west-1"), None)
    assert len(elsewhere.catalog) == 0
    assert "no bundled catalog for eu-west-1" in elsewhere.notes[0]


def test_cache_round_trip_keeps_types_prices_zones_and_age(ec2, config):
    built = describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=5000.0)
    path = catalog_cache_path(config)
    save_catalog_cache(built, path)

    loaded = load_catalog_cache(path)

    assert loaded is not None and loaded.origin == "cache"
    assert [(t.name, t.capacity, t.hourly_cost) for t in loaded.catalog] == [
        (t.name, t.capacity, t.hourly_cost) for t in built.catalog
    ]
    assert loaded.zones == built.zones and loaded.notes == built.notes
    assert loaded.age_s(now_s=5000.0 + 3600) == 3600
    # The cache is an Eva-format catalog: `autoscaler plan --catalog <cache>` reads it.
    assert sorted(t.name for t in load_catalog(path)) == sorted(t.name for t in built.catalog)


def test_a_file_that_is_not_a_catalog_cache_is_an_input_error(config):
    path = catalog_cache_path(config)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"instance_types": {}}))
    with pytest.raises(InputError, match="not a catalog cache"):
        load_catalog_cache(path)


def test_fresh_cache_is_used_without_asking_aws(ec2, config, faults):
    save_catalog_cache(
        describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=1000.0),
        catalog_cache_path(config),
    )
    faults.watch("DescribeInstanceTypes")

    used = current_catalog(AwsCaller(ec2), config, now_s=1000.0 + 60, max_age_s=3600)

    assert used.origin == "cache" and len(used.catalog) == 18
    assert faults.calls["DescribeInstanceTypes"] == []


def test_stale_cache_is_rebuilt_from_aws_and_saved(ec2, config, faults):
    save_catalog_cache(
        describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=1000.0),
        catalog_cache_path(config),
    )
    faults.watch("DescribeInstanceTypes")

    used = current_catalog(AwsCaller(ec2), config, now_s=1000.0 + 7200, max_age_s=3600)

    assert used.origin == "aws" and len(faults.calls["DescribeInstanceTypes"]) == 1
    assert load_catalog_cache(catalog_cache_path(config)).fetched_at_s == 1000.0 + 7200


def test_changed_families_rebuild_a_fresh_cache(ec2, config, faults):
    save_catalog_cache(
        describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=1000.0),
        catalog_cache_path(config),
    )
    faults.watch("DescribeInstanceTypes")
    narrower = replace(config, families=("c7i",))
    used = current_catalog(AwsCaller(ec2), narrower, now_s=1001.0, max_age_s=3600)
    assert len(faults.calls["DescribeInstanceTypes"]) == 1
    assert {t.family for t in used.catalog} == {"c7i"}


def _unreachable(ec2: Any) -> None:
    def refuse(**_: Any) -> None:
        raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    ec2.meta.events.register("provide-client-params.ec2.DescribeInstanceTypes", refuse)


def test_unreachable_aws_falls_back_to_the_cache_whatever_its_age(ec2, config):
    save_catalog_cache(
        describe_catalog(AwsCaller(ec2), config, bundled_prices(), now_s=1000.0),
        catalog_cache_path(config),
    )
    _unreachable(ec2)

    used = current_catalog(AwsCaller(ec2), config, now_s=1000.0 + 10 * 86400, max_age_s=3600)

    assert used.origin == "cache" and len(used.catalog) == 18
    assert "AWS unavailable" in used.notes[-1] and "10.0 days ago" in used.notes[-1]


def test_unreachable_aws_without_a_cache_is_cloud_unavailable(ec2, config):
    _unreachable(ec2)
    with pytest.raises(CloudUnavailable, match="cannot reach AWS") as failed:
        current_catalog(AwsCaller(ec2), config, now_s=0.0)
    assert failed.value.retryable
    assert not catalog_cache_path(config).exists()


def test_damaged_cache_is_replaced_from_aws(ec2, config):
    path = catalog_cache_path(config)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    used = current_catalog(AwsCaller(ec2), config, now_s=0.0)
    assert used.origin == "aws"
    assert load_catalog_cache(path) is not None


def test_unwritable_cache_does_not_stop_the_daemon(ec2, config, tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    used = current_catalog(AwsCaller(ec2), replace(config, cache_dir=blocker), now_s=0.0)
    assert used.origin == "aws" and len(used.catalog) == 18
    assert any(
        "not cached" in r.getMessage() and "cache_dir" in r.getMessage() for r in caplog.records
    )
