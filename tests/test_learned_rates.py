"""The learned interruption rates a replay's planner prices spot at (`LearnedRates`)."""

from __future__ import annotations

import pytest

from autoscaler.catalog import SPOT, Catalog, InstanceType, LaunchDelays
from autoscaler.resources import Resources
from autoscaler.spot import LearnedRates

DELAYS = LaunchDelays(acquisition_s=20.0, setup_s=80.0, terminate_s=1.0)


def catalog() -> Catalog:
    return Catalog(
        [
            InstanceType("a", "f", Resources(1, 4, 16), 3.0, DELAYS),
            InstanceType(
                "a:spot",
                "f",
                Resources(1, 4, 16),
                1.0,
                DELAYS,
                market=SPOT,
                ec2_type="a",
                interruption_per_hour=0.01,
            ),
        ]
    )


def test_rates_blend_the_band_with_reclaims_and_spot_hours_in_the_window() -> None:
    asked: list[float] = []

    def reclaims(since: float) -> dict[str, int]:
        asked.append(since)
        return {"a:spot": 5}

    # 10 h of a:spot inside the window, 5 h before it, and on-demand hours that do not count
    uptime = [("a:spot", 0.0, 36_000.0), ("a:spot", -36_000.0, -18_000.0), ("a", 0.0, None)]
    learned = LearnedRates(reclaims, lambda since: uptime, prior_hours=100.0, history_s=36_000.0)
    out = learned.catalog(catalog(), 36_000.0)
    assert asked == [0.0]
    assert out["a:spot"].interruption_per_hour == pytest.approx((0.01 * 100 + 5) / 110)
    assert out["a"] == catalog()["a"]


def test_the_catalog_is_the_same_object_until_the_refresh() -> None:
    counts = {"a:spot": 0}
    learned = LearnedRates(lambda since: dict(counts), lambda since: [], refresh_s=600.0)
    base = catalog()
    first = learned.catalog(base, 0.0)
    counts["a:spot"] = 3
    assert learned.catalog(base, 599.0) is first  # not refreshed yet
    later = learned.catalog(base, 600.0)
    assert later is not first
    assert later["a:spot"].interruption_per_hour == pytest.approx((0.01 * 100 + 3) / 100)
    assert learned.catalog(base, 1200.0) is later  # refreshed, rates unchanged: same object


def test_a_catalog_without_spot_is_returned_as_is() -> None:
    base = Catalog([catalog()["a"]])
    learned = LearnedRates(lambda since: {}, lambda since: [])
    assert learned.catalog(base, 0.0) is base
