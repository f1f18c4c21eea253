"""What the daemon has learned prices spot offerings (`app.spot_rates`): its reclaim
history per offering blended with the advisor band, and a rebalance recommendation
raising its instance's offering; on fabricated state, with the clock injected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.spot_rates import SpotRates
from autoscaler.catalog import SPOT, Catalog, InstanceType, LaunchDelays
from autoscaler.control import record
from autoscaler.decide import ControlOptions, advance, decide
from autoscaler.jobs import TraceFacts
from autoscaler.planner import planner_by_name
from autoscaler.pricing import cheapest_type
from autoscaler.resources import Resources
from autoscaler.spot import SpotPolicy, blended_rate, spot_hours
from autoscaler.store import Store, TaskUpdate
from state.memory import InMemoryStore
from tests.builders import job
from tests.store_writes import adopted_round, request

DELAYS = LaunchDelays(acquisition_s=20.0, setup_s=80.0)
BAND = 0.01  # interruptions per instance-hour the band says, for both zones
HOUR = 3600.0
DAY = 86400.0


def offering(zone: str, price: float) -> InstanceType:
    return InstanceType(
        f"g:spot@{zone}",
        "p",
        Resources(1, 8, 60),
        price,
        DELAYS,
        market=SPOT,
        zone=zone,
        ec2_type="g",
        interruption_per_hour=BAND,
    )


CATALOG = Catalog(
    [
        InstanceType("g", "p", Resources(1, 8, 60), 3.0, DELAYS),
        offering("a", 1.0),
        offering("b", 1.01),
    ]
)
POLICY = SpotPolicy(checkpoint_every_s=900.0, restart_s=300.0)
OPTIONS = ControlOptions(spot=POLICY)


def ran(store: Store, instance_id: str, name: str, start: float, end: float | None):
    """An instance of offering `name` billed from `start` to `end` (None: still running)."""
    request(store, instance_id, name, CATALOG[name].hourly_cost, start)
    store.transition_instance(instance_id, "running", start, cloud_id=f"c-{instance_id}")
    if end is not None:
        store.transition_instance(instance_id, "terminated", end)


def test_the_blend_of_band_and_history_by_hand() -> None:
    # H0 = 100 h at the band's 0.01/h is 1 reclaim of prior evidence; 3 seen over 50 h:
    # (0.01 × 100 + 3) / (100 + 50) = 4 / 150
    assert blended_rate(0.01, 3, 50.0, 100.0) == pytest.approx(4.0 / 150.0)
    assert blended_rate(0.01, 0, 0.0, 100.0) == 0.01  # no history: the band
    assert blended_rate(0.01, 0, 900.0, 100.0) == pytest.approx(1.0 / 1000.0)  # calm history
    # uptime within the window only: [10, 20) h of an interval [5, 20) h, window from 10 h
    assert spot_hours([("x", 5 * HOUR, 20 * HOUR)], 10 * HOUR, 30 * HOUR) == {
        "x": pytest.approx(10.0)
    }
    assert spot_hours([("x", 5 * HOUR, None)], 10 * HOUR, 30 * HOUR) == {"x": pytest.approx(20.0)}


def test_an_offering_reclaimed_often_is_priced_up_and_the_planner_leaves_it() -> None:
    store = InMemoryStore()
    now = 40 * DAY
    # 20 instances on zone a, 2.5 h each, every one reclaimed: 20 reclaims over 50 h;
    # zone b ran 100 h without one. And one old reclaim outside the 30-day window.
    for i in range(20):
        start = now - 3 * DAY + i * 3 * HOUR
        ran(store, f"a{i}", "g:spot@a", start, start + 2.5 * HOUR)
        store.instance_notice(f"a{i}", "reclaim", start + 2.4 * HOUR, "reclaimed")
    ran(store, "b0", "g:spot@b", now - 5 * DAY, now - 5 * DAY + 100 * HOUR)
    ran(store, "old", "g:spot@a", now - 35 * DAY, now - 34 * DAY)
    store.instance_notice("old", "reclaim", now - 34.5 * DAY, "reclaimed")
    rates = SpotRates(store, prior_hours=100.0, history_days=30.0, refresh_s=600.0)

    priced = rates.catalog(CATALOG, now)
    a = (BAND * 100.0 + 20) / (100.0 + 50.0)
    b = (BAND * 100.0 + 0) / (100.0 + 100.0)
    assert priced["g:spot@a"].interruption_per_hour == pytest.approx(a)
    assert priced["g:spot@b"].interruption_per_hour == pytest.approx(b)
    assert rates.catalog(CATALOG, now + 60.0) is priced  # the same object round after round

    task = job("t", (1, 4, 10)).tasks[0]
    assert cheapest_type(task, POLICY.planning_catalog(CATALOG)).name == "g:spot@a"
    # λL = 0.14 × (450 + 300) / 3600 → a at $1.03/h effective, b at $1.0105/h
    assert cheapest_type(task, POLICY.planning_catalog(priced)).name == "g:spot@b"


def test_rates_are_refreshed_at_most_every_period() -> None:
    store = InMemoryStore()
    now = 10 * DAY
    ran(store, "a0", "g:spot@a", now - 10 * HOUR, None)
    rates = SpotRates(store, prior_hours=100.0, refresh_s=600.0)
    first = rates.catalog(CATALOG, now)["g:spot@a"].interruption_per_hour
    assert first == pytest.approx(1.0 / 110.0)
    store.instance_notice("a0", "reclaim", now + 10.0, "reclaimed")
    # within the period the rate stands; after it the reclaim (and the hours) count
    assert rates.catalog(CATALOG, now + 300.0)["g:spot@a"].interruption_per_hour == first
    later = now + 600.0
    hours = 10.0 + 600.0 / HOUR
    expected = (1.0 + 1) / (100.0 + hours)
    assert rates.catalog(CATALOG, later)["g:spot@a"].interruption_per_hour == pytest.approx(
        expected
    )


def test_a_rebalance_recommendation_raises_its_live_instances_offering_for_an_hour() -> None:
    store = InMemoryStore()
    now = 10 * DAY
    ran(store, "a0", "g:spot@a", now - HOUR, None)
    rates = SpotRates(store, prior_hours=100.0, rebalance_rate_per_hour=1.0)
    calm = rates.catalog(CATALOG, now)["g:spot@a"].interruption_per_hour
    assert calm == pytest.approx(1.0 / 101.0)  # the band and one calm hour
    store.instance_notice("a0", "rebalance", now + 5.0, "rebalance recommendation")
    raised = rates.catalog(CATALOG, now + 10.0)
    assert raised["g:spot@a"].interruption_per_hour == 1.0  # a reclaim within the hour
    assert raised["g:spot@b"].interruption_per_hour == BAND
    # not a reclaim: the history's rate is untouched, and after the hour it is over
    assert rates.observed(CATALOG, now + 10.0)["g:spot@a"] == pytest.approx(calm, rel=1e-3)
    after = rates.catalog(CATALOG, now + 5.0 + HOUR + 1.0)["g:spot@a"].interruption_per_hour
    assert after < 0.011
    # nor, within the hour, once the instance is gone
    store.transition_instance("a0", "terminated", now + 20.0)
    assert rates.catalog(CATALOG, now + 30.0)["g:spot@a"].interruption_per_hour < 0.011


# -- a rebalance moves work when the migration criterion says it pays -------------------------


def planned_after_rebalance(
    seconds_left: float, *, rebalance: bool = True, store: InMemoryStore | None = None
) -> str | None:
    """Where the Eva round puts a task running on a spot instance in zone a for 10 h, with
    `seconds_left` of its work to go, after a rebalance recommendation for that instance:
    that instance's id, or the new instance planned for it (the round is recorded)."""
    store = store or InMemoryStore()
    start = 100 * DAY
    now = start + 10 * HOUR
    total = 10 * HOUR + seconds_left  # iterations at one a second
    spec = replace(job("t", (1, 4, 10)), full_throughput=1.0, trace=TraceFacts(total_iters=total))
    store.submit_job(spec, owner="alice", at=start)
    ran(store, "i-a", "g:spot@a", start, None)
    store.instance_worker("i-a", start, ready=True)
    adopted_round(store, start, targets={"t/0": "i-a"})
    store.update_tasks(
        [TaskUpdate("t/0", status="running", instance_id="i-a", progress=10 * HOUR, attempt=1)],
        start,
    )
    if rebalance:
        store.instance_notice("i-a", "rebalance", now - 60.0, "rebalance recommendation")
    catalog = SpotRates(store).catalog(CATALOG, now)
    decision = decide(
        store.snapshot(),
        catalog,
        (),
        OPTIONS,
        planner=planner_by_name("eva"),
        now=now,
    )
    record(store, decision)
    return decision.targets["t/0"]


def test_a_rebalance_moves_a_long_task_when_the_criterion_pays() -> None:
    assert planned_after_rebalance(10 * HOUR, rebalance=False) == "i-a"  # calm: it stays
    store = InMemoryStore()
    target = planned_after_rebalance(10 * HOUR, store=store)
    assert target != "i-a"
    [new] = [i for i in store.instances() if i.instance_id == target]
    assert new.instance_type == "g:spot@b"  # the other zone, now the cheaper to run on
    # make before break: until the new instance is ready the task runs where it is
    step = advance(
        store.snapshot(),
        CATALOG,
        OPTIONS,
        now=100 * DAY + 10 * HOUR + 1.0,
        ready=frozenset({"i-a"}),
    )
    assert step.stops == ()
    assert [u for u in step.updates if u.task_id == "t/0"] == []


def test_a_rebalance_leaves_a_task_about_to_finish_where_it_is() -> None:
    assert planned_after_rebalance(60.0) == "i-a"


def test_the_daemon_prices_spot_with_its_clusters_history_and_settings(tmp_path) -> None:
    from tests.app.simulated_daemon import SimulatedDaemon

    cluster = SimulatedDaemon(
        tmp_path / "cluster", [], extra="[spot]\nenabled = true\nprior_hours = 50.0\n"
    )
    try:
        now = 3 * DAY
        ran(cluster.store, "a0", "g:spot@a", now - 25 * HOUR, now - 15 * HOUR)
        cluster.store.instance_notice("a0", "reclaim", now - 15 * HOUR, "reclaimed")
        priced = cluster.daemon.loop.priced(CATALOG, now)
        # (0.01 × 50 + 1) / (50 + 10)
        assert priced["g:spot@a"].interruption_per_hour == pytest.approx(1.5 / 60.0)
    finally:
        cluster.close()
