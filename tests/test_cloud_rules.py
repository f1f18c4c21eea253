"""Rules every Cloud binding shares: matching a listing to the state, orphans, the
availability cache and launch guardrails."""

import pytest

from autoscaler.cloud import (
    AvailabilityCache,
    CloudInstance,
    Guardrails,
    LaunchRefused,
    OrphanPolicy,
    live_spend_of,
    match_listing,
    unavailable_types,
)
from tests.builders import itype


def catalog():
    from autoscaler.catalog import Catalog

    return Catalog(
        [itype("gpu.big", 4, 16, 244, 12.0, "p3"), itype("cpu.small", 0, 4, 16, 0.4, "c7i")]
    )


def test_a_listing_is_matched_by_cloud_id_then_by_launch_token():
    listed = [
        CloudInstance("i-known", "cpu.small", "running", instance_id="tok-1"),
        CloudInstance("i-unrecorded", "cpu.small", "pending", instance_id="tok-2"),
        CloudInstance("i-orphan", "cpu.small", "pending"),
        CloudInstance("i-dead", "cpu.small", "terminated", instance_id="tok-3"),
    ]
    known = [("tok-1", "i-known"), ("tok-2", None), ("tok-3", "i-dead"), ("tok-4", "i-lost")]
    result = match_listing(known, listed)
    assert {k: v.cloud_id for k, v in result.by_instance.items()} == {
        "tok-1": "i-known",
        "tok-2": "i-unrecorded",  # a launch whose answer was never recorded: adopted
    }
    assert [o.cloud_id for o in result.orphans] == ["i-orphan"]


def test_a_token_listed_twice_stands_for_its_first_launch_and_the_other_is_an_orphan():
    listed = [
        CloudInstance("i-second", "cpu.small", "running", instance_id="tok-1", launched_at_s=20),
        CloudInstance("i-first", "cpu.small", "running", instance_id="tok-1", launched_at_s=10),
    ]
    result = match_listing([("tok-1", None)], listed)
    assert result.by_instance["tok-1"].cloud_id == "i-first"
    assert [o.cloud_id for o in result.orphans] == ["i-second"]


def test_orphan_policy_reports_or_terminates_after_its_grace_period():
    orphan = CloudInstance("i-9", "cpu.small", "running", launched_at_s=1000.0)
    assert OrphanPolicy("report").judge(orphan, 5000.0)[0] == "report"
    young, why = OrphanPolicy("terminate", grace_s=300).judge(orphan, 1299.0)
    assert young == "report" and "299 s ago, within the 300 s grace period" in why
    assert OrphanPolicy("terminate", grace_s=300).judge(orphan, 1301.0)[0] == "terminate"


def test_availability_cache_cools_an_offering_down_then_forgets_it():
    cache = AvailabilityCache(cooldown_s=180)
    cache.mark("big", "zone-a", now=100.0, reason="InsufficientInstanceCapacity")
    assert cache.is_unavailable("big", "zone-a", 279.0)
    assert not cache.is_unavailable("big", "zone-b", 279.0)
    assert not cache.is_unavailable("big", "zone-a", 280.0)
    cache.mark("big", None, now=100.0, reason="no zone left")  # the whole type
    assert cache.is_unavailable("big", "zone-b", 200.0)
    assert unavailable_types(cache.offerings(200.0), 200.0) == {
        "big": "no zone left; retried after 80 s"
    }
    assert cache.offerings(400.0) == []


def test_a_run_of_capacity_failures_doubles_the_cooldown_up_to_its_cap():
    cache = AvailabilityCache(cooldown_s=100, max_cooldown_s=350)
    until = [cache.mark("big", None, now=0.0, reason="ICE").until_s]
    assert until == [100.0]
    # each retry right after the cooldown fails again: 200, then 350 (capped), 350
    for now in (100.0, 300.0, 650.0):
        until.append(cache.mark("big", None, now=now, reason="ICE").until_s)
    assert until == [100.0, 300.0, 650.0, 1000.0]
    # a failure after a quiet spell longer than the last cooldown starts a new run
    assert cache.mark("big", None, now=1000.0 + 351.0, reason="ICE").until_s == 1451.0
    # runs are per offering, and a given cooldown (a quota's) is taken as it is
    assert cache.mark("big", "zone-a", now=1400.0, reason="ICE").until_s == 1500.0
    assert cache.mark("small", None, now=0.0, reason="quota", cooldown_s=900).until_s == 900.0


def test_guardrails_allow_a_launch_within_every_limit():
    Guardrails(max_instances=3, max_hourly_spend=13.0).check_launch(
        "cpu.small", catalog(), ["gpu.big"]
    )


@pytest.mark.parametrize(
    ("rails", "itype_name", "live", "rule", "numbers"),
    [
        (
            Guardrails(max_instances=2),
            "cpu.small",
            ["cpu.small", "cpu.small"],
            "max_instances",
            "3 instances, over the limit of 2",
        ),
        (
            Guardrails(max_hourly_spend=12.5),
            "cpu.small",
            ["gpu.big", "cpu.small"],
            "max_hourly_spend",
            "from $12.40/h to $12.80/h, over the budget of $12.50/h",
        ),
        (
            Guardrails(allowed_types=frozenset({"cpu.small"})),
            "gpu.big",
            [],
            "allowed_types",
            "gpu.big is not allowed",
        ),
        (
            Guardrails(allowed_families=frozenset({"p3"})),
            "cpu.small",
            [],
            "allowed_families",
            "family c7i of cpu.small is not allowed",
        ),
        (Guardrails(), "x1.huge", [], "catalog", "x1.huge is not in the catalog"),
    ],
)
def test_guardrails_refuse_with_the_numbers(rails, itype_name, live, rule, numbers):
    with pytest.raises(LaunchRefused) as refused:
        rails.check_launch(itype_name, catalog(), live)
    assert refused.value.rule == rule
    assert numbers in str(refused.value)
    assert not refused.value.retryable


def test_a_running_spend_refuses_the_same_launch_with_the_same_numbers_as_a_resummed_one():
    """A round keeps the live spend as it accepts launches (linear, not quadratic): the
    launch it refuses, and the numbers it gives, are those of summing the list afresh."""
    cat = catalog()
    rails = Guardrails(max_hourly_spend=7.3)

    def accepted(keep_running: bool) -> tuple[int, str]:
        live: list[str] = []
        running = live_spend_of(live, cat)
        for n in range(100):
            try:
                rails.check_launch(
                    "cpu.small", cat, live, live_spend=running if keep_running else None
                )
            except LaunchRefused as exc:
                return n, str(exc)
            live.append("cpu.small")
            running += cat["cpu.small"].hourly_cost
        return 100, ""

    assert accepted(True) == accepted(False)
    assert accepted(True)[0] == 18  # 18 × $0.40 = $7.20 ≤ $7.30 < $7.60
