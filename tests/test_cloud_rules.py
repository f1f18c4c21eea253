"""Rules every Cloud binding shares: orphan reconciliation and launch guardrails."""

import pytest

from autoscaler.cloud import CloudInstance, Guardrails, LaunchRefused, reconcile
from tests.builders import itype


def catalog():
    from autoscaler.catalog import Catalog

    return Catalog(
        [itype("gpu.big", 4, 16, 244, 12.0, "p3"), itype("cpu.small", 0, 4, 16, 0.4, "c7i")]
    )


def test_reconcile_finds_orphans_and_gone_instances():
    listed = [
        CloudInstance("i-known", "cpu.small", "running"),
        CloudInstance("i-orphan", "cpu.small", "pending"),
        CloudInstance("i-dead", "cpu.small", "terminated"),
    ]
    result = reconcile({"i-known", "i-dead", "i-lost"}, listed)
    assert [o.instance_id for o in result.orphans] == ["i-orphan"]
    assert result.gone == ("i-dead", "i-lost")


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
