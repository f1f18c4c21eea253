"""`submit --quote` follows the job's `capacity` as the planner does (`decide.capacity_view`):
a spot job is quoted at spot, an on-demand job never is, an auto job at the cheaper.

Prices are read here straight from the bundled data files, not through the code under
test: c7i.large on-demand from Eva's `ec2_config.json` ($0.08925/h, [0 GPU, 1 CPU,
4 GiB]); its spot price from `provisioners/data/spot-us-east-1.json`, the regional
offering at the median of its zones' prices; its interruption rate from that file's
default advisor band (a monthly fraction p: λ = −ln(1 − p) / 730 per hour). The planner
prices spot at its effective price p_spot + λ·L·V, L = (checkpoint interval / 2 +
restart) in hours, V the on-demand price of the capacity (`autoscaler.spot`, stated
there), so the spot quote is the on-demand one times the bundled price ratio, plus λ·L.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest

from app.commands.cluster import render_quotes
from autoscaler.catalog import Catalog
from autoscaler.decide import ControlOptions
from autoscaler.planner import planner_by_name
from autoscaler.spot import SpotPolicy
from provisioners.catalog import bundled_spot_snapshot, spot_offerings
from tests.app.test_quote import demanding
from tests.app.test_users import admin

ROOT = Path(__file__).resolve().parents[2]
ON_DEMAND = json.loads((ROOT / "autoscaler/data/eva/ec2_config.json").read_text())
SPOT_DATA = json.loads((ROOT / "provisioners/data/spot-us-east-1.json").read_text())
CHECKPOINT_S, RESTART_S = 900.0, 300.0


def expected_spot_hourly(ec2_type: str) -> float:
    """The effective spot price of `ec2_type` where it is the family's only type."""
    price = statistics.median(SPOT_DATA["prices"][ec2_type].values())
    value = ON_DEMAND["instance_types"][ec2_type]["cost"]
    bands = SPOT_DATA["interruption"]
    band = bands["types"].get(
        ec2_type, bands["advisor"]["types"].get(ec2_type, bands["default_band"])
    )
    rate = -math.log(1.0 - bands["bands"][band]) / 730.0
    loss_h = (CHECKPOINT_S / 2 + RESTART_S) / 3600.0
    return price + rate * loss_h * value


def with_spot_offerings(catalog: Catalog) -> Catalog:
    """`catalog` with a spot offering beside each type, as `[spot] enabled` adds them."""
    snapshot = bundled_spot_snapshot("us-east-1")
    assert snapshot is not None
    return spot_offerings(catalog, snapshot)


@pytest.fixture
def spot_api(api):
    """The API with the daemon's planner, spot planned (as `[spot] enabled` makes it)."""
    api.service.planner = lambda: planner_by_name("eva", lower_bound=True)
    api.service.options = ControlOptions(
        default_throughput=1.0,
        spot=SpotPolicy(checkpoint_every_s=CHECKPOINT_S, restart_s=RESTART_S),
    )
    return api


def quote_as(api, capacity: str, demand=(0, 1, 2)):
    spec = dataclasses.replace(demanding(f"a-{capacity}", *demand), capacity=capacity)
    with admin(api) as root:
        return root.quote(spec, duration_s=3600.0)


def test_a_spot_job_is_quoted_at_spot_and_an_on_demand_job_at_on_demand(spot_api):
    full = spot_api.service.catalog()
    [large] = [t for t in full if t.name == "c7i.large"]
    spot_api.service.catalog = lambda: with_spot_offerings(Catalog([large], full.region))
    on_demand = ON_DEMAND["instance_types"]["c7i.large"]["cost"]
    spot = expected_spot_hourly("c7i.large")
    assert spot < on_demand  # the premise: spot is cheaper here

    od, sp, auto = (quote_as(spot_api, c) for c in ("on-demand", "spot", "auto"))
    assert od["capacity"] == "on-demand" and sp["capacity"] == "spot"
    # [0, 1, 2] alone, in an empty cluster: packed or not, one instance of its offering.
    assert od["hourly_cost_no_packing"] == pytest.approx(on_demand, abs=1e-6)
    assert od["hourly_cost_packed"] == pytest.approx(on_demand, abs=1e-6)
    assert [i["type"] for i in od["instances"]] == ["c7i.large"]
    assert sp["hourly_cost_no_packing"] == pytest.approx(spot, abs=1e-6)
    assert sp["hourly_cost_packed"] == pytest.approx(spot, abs=1e-6)
    assert [i["type"] for i in sp["instances"]] == ["c7i.large:spot"]
    # The spot quote is the on-demand one by the bundled price ratio, reclaims paid for.
    ratio = statistics.median(SPOT_DATA["prices"]["c7i.large"].values()) / on_demand
    exposure = spot / on_demand - ratio  # λ·L: a small positive share of V
    assert 0.0 < exposure < 0.01
    assert sp["hourly_cost_no_packing"] / od["hourly_cost_no_packing"] == pytest.approx(
        ratio + exposure, rel=1e-4
    )
    assert sp["total_no_packing"] == pytest.approx(spot, abs=1e-6)  # one hour
    # auto takes the cheaper market.
    assert auto["hourly_cost_no_packing"] == pytest.approx(spot, abs=1e-6)
    table = render_quotes([od, sp])
    assert "on-demand" in table and "spot" in table


@pytest.mark.parametrize("demand", [(0, 1, 2), (0, 3, 4), (0, 1, 12), (0, 8, 30)])
def test_an_on_demand_job_is_never_quoted_at_spot(spot_api, demand):
    """With every bundled type offered spot too, an on-demand job's quote is the one it
    gets with spot offered nowhere; a spot job's is below it."""
    plain = spot_api.service.catalog()
    od_alone = quote_as(spot_api, "on-demand", demand)
    spot_api.service.catalog = lambda: with_spot_offerings(plain)
    od = quote_as(spot_api, "on-demand", demand)
    assert od["hourly_cost_no_packing"] == pytest.approx(od_alone["hourly_cost_no_packing"])
    assert od["hourly_cost_packed"] == pytest.approx(od_alone["hourly_cost_packed"])
    assert all(":spot" not in i["type"] for i in od["instances"]), od["instances"]
    sp = quote_as(spot_api, "spot", demand)
    assert sp["hourly_cost_no_packing"] < od["hourly_cost_no_packing"]
    assert all(":spot" in i["type"] for i in sp["instances"]), sp["instances"]
