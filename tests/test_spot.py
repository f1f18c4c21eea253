"""Spot in the reservation price: the interruption cost, effective prices, capacity
restrictions, the deadline rule and the spread over zones (`autoscaler.spot`)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaler.catalog import SPOT, Catalog, InstanceType, LaunchDelays
from autoscaler.configuration import Configuration, Instance
from autoscaler.pricing import cheapest_type
from autoscaler.resources import Resources
from autoscaler.spot import (
    SpotPolicy,
    effective_price,
    expected_loss_hours,
    exposure_hours,
    from_scratch_pins,
    hourly_rate,
    interruption_cost_per_hour,
    pinned_on_demand,
    planned_rate,
    poisson_sf,
    reclaims_pin,
    restrict_job,
    restricted_demands,
    spot_discount,
    spot_task_value,
    spread,
    without_misfits,
)
from tests.builders import job

DELAYS = LaunchDelays(acquisition_s=20.0, setup_s=80.0)


def offerings(rate: float = 0.0, zones: tuple[str, ...] = ()) -> Catalog:
    od = InstanceType("g", "p", Resources(1, 8, 60), 3.0, DELAYS)
    spots = [
        InstanceType(
            f"g:spot@{z}" if z else "g:spot",
            "p",
            Resources(1, 8, 60),
            1.0 + 0.01 * i,
            DELAYS,
            market=SPOT,
            zone=z or None,
            ec2_type="g",
            interruption_per_hour=rate,
        )
        for i, z in enumerate(zones or ("",))
    ]
    return Catalog([od, *spots])


def test_the_interruption_cost_of_a_hand_computed_case() -> None:
    # λ = 0.01/h, checkpoints every 900 s, restart 300 s: L = (450 + 300) / 3600 h.
    loss = expected_loss_hours(900.0, 300.0)
    assert loss == pytest.approx(750.0 / 3600.0)
    # RP = $3/h: 0.01 × 0.208333 × 3 = $0.00625/h lost to reclaims
    assert interruption_cost_per_hour(0.01, loss, 3.0) == pytest.approx(0.00625)
    # TNRP 0.95 × 3 = 2.85, minus that
    assert spot_task_value(2.85, 3.0, 0.01, 900.0, 300.0) == pytest.approx(2.84375)
    # the effective price p + λ·L·V: λL = 0.5 × 0.2 = 0.1 hours of the tasks' time lost
    # per hour, worth V = $3/h on on-demand → 1 + 0.1 × 3 = 1.3
    assert effective_price(1.0, 0.5, 0.2, 3.0) == pytest.approx(1.3)
    # no on-demand offering holds it: the lost time is worth the effective price itself
    assert effective_price(1.0, 0.5, 0.2, None) == pytest.approx(1.0 / 0.9)
    assert effective_price(1.0, 5.0, 0.2, 3.0) == math.inf  # loses more than it runs
    assert effective_price(1.0, 0.0, math.inf, 3.0) == 1.0  # on-demand: nothing to lose
    # the advisor's 5–10% band at its midpoint: 7.5% of instances a month, Poisson
    assert hourly_rate(0.075) == pytest.approx(-math.log(0.925) / 730.0)
    assert expected_loss_hours(None, 300.0) == math.inf


def test_spot_is_preferred_while_cheap_to_lose_and_avoided_as_its_rate_rises() -> None:
    task = job("a", (1, 4, 10)).tasks[0]
    policy = SpotPolicy(checkpoint_every_s=900.0, restart_s=300.0)
    calm = SpotPolicy(checkpoint_every_s=900.0, restart_s=300.0).planning_catalog(offerings(0.01))
    assert cheapest_type(task, calm).name == "g:spot"
    # λL = 3.6 × 0.2083 = 0.75 → 1 + 0.75 × $3 = $3.25/h effective, above on-demand's $3
    stormy = policy.planning_catalog(offerings(3.6))
    assert stormy["g:spot"].hourly_cost == pytest.approx(3.25)
    assert cheapest_type(task, stormy).name == "g"
    # a rate it cannot survive removes the offering from planning altogether
    assert "g:spot" not in policy.planning_catalog(offerings(10.0))


def test_the_planning_catalog_is_one_object_round_after_round() -> None:
    policy = SpotPolicy()
    catalog = offerings(0.01)
    assert policy.planning_catalog(catalog) is policy.planning_catalog(catalog)
    plain = Catalog([InstanceType("g", "p", Resources(1, 8, 60), 3.0)])
    assert policy.planning_catalog(plain) is plain


def test_capacity_restricts_the_families_a_task_may_use() -> None:
    families = frozenset({"p", "p+spot", "c"})
    demand = Resources(1, 4, 10)
    assert restricted_demands((("p", demand),), "auto", families) == (
        ("p", demand),
        ("p+spot", demand),
    )
    assert restricted_demands((("p", demand),), "spot", families) == (("p+spot", demand),)
    assert restricted_demands((("any", demand),), "on-demand", families) == (
        ("c", demand),
        ("p", demand),
    )
    planning = SpotPolicy().planning_catalog(offerings(0.01))
    on_demand = restrict_job(
        job("a", (1, 4, 10), capacity="on-demand"), "on-demand", planning.families
    )
    assert cheapest_type(on_demand.tasks[0], planning).name == "g"
    spot_only = restrict_job(job("b", (1, 4, 10)), "spot", planning.families)
    assert cheapest_type(spot_only.tasks[0], planning).name == "g:spot"


def test_the_deadline_rule_switches_when_slack_runs_out() -> None:
    common = dict(submitted_at=0.0, deadline_s=10_000.0, restart_s=250.0, margin_s=750.0)
    # 5000 s of work left at t = 1000: 5000 + 1000 < 9000 left
    assert not pinned_on_demand(now=1000.0, remaining_s=5000.0, **common)
    # the same work at t = 4000: 6000 ≥ 6000 left
    assert pinned_on_demand(now=4000.0, remaining_s=5000.0, **common)
    # work of unknown size cannot be promised on spot
    assert pinned_on_demand(now=0.0, remaining_s=None, **common)


def test_a_task_its_instance_no_longer_suits_is_planned_afresh() -> None:
    planning = SpotPolicy().planning_catalog(offerings(0.01))
    pinned = restrict_job(job("a", (1, 4, 10)), "on-demand", planning.families)
    free = restrict_job(job("b", (0, 2, 10)), "auto", planning.families)
    current = Configuration((Instance("i-1", planning["g:spot"], ("a/0", "b/0")),))
    kept = without_misfits(current, {"a": pinned, "b": free})
    assert kept.instances[0].tasks == ("b/0",)


def test_new_spot_instances_spread_over_zones_within_the_price_tolerance() -> None:
    catalog = SpotPolicy().planning_catalog(offerings(0.0, ("z1", "z2", "z3")))
    pick = catalog["g:spot@z1"]
    target = Configuration(tuple(Instance(None, pick, (f"t{i}/0",)) for i in range(4)))
    spread_out = spread(target, catalog, ["g:spot@z1"], SpotPolicy(price_tolerance=0.015))
    zones = [i.type.zone for i in spread_out]
    # z3 costs 2% more: outside the 1.5% tolerance; z1 already holds one live instance,
    # so of the five, z2 takes three and z1 two more (fewest first, then the cheaper)
    assert zones == ["z2", "z1", "z2", "z1"]
    assert [i.tasks for i in spread_out] == [i.tasks for i in target]


def test_spread_leaves_a_regional_offering_alone() -> None:
    catalog = SpotPolicy().planning_catalog(offerings(0.0))
    target = Configuration((Instance(None, catalog["g:spot"], ("a/0",)),))
    assert spread(target, catalog, [], SpotPolicy()) is target


def test_a_spot_offering_keeps_its_delays_and_capacity_in_planning() -> None:
    planning = SpotPolicy().planning_catalog(offerings(0.01))
    spot = planning["g:spot"]
    assert spot.family == "p+spot" and spot.launch_type == "g"
    assert spot.capacity == Resources(1, 8, 60) and spot.delays == DELAYS
    assert replace(spot, family="p") != planning["g"]


def _spot_pair(big_spot_price: float) -> tuple[Catalog, tuple]:
    """On-demand s ($1/h) and b (twice s, $1.9/h), their spot twins at $0.30/h and
    `big_spot_price` (never reclaimed), and two single-task jobs that each fill an s."""
    shape_s, shape_b = Resources(0, 4, 16), Resources(0, 8, 32)

    def spot(name: str, shape: Resources, price: float) -> InstanceType:
        return InstanceType(f"{name}:spot", "c", shape, price, market=SPOT, ec2_type=name)

    catalog = Catalog(
        [
            InstanceType("s", "c", shape_s, 1.0),
            InstanceType("b", "c", shape_b, 1.9),
            spot("s", shape_s, 0.30),
            spot("b", shape_b, big_spot_price),
        ]
    )
    planning = SpotPolicy().planning_catalog(catalog)
    jobs = tuple(
        restrict_job(job(j, (0, 4, 16), family="c"), "auto", planning.families) for j in "xy"
    )
    return planning, jobs


def test_a_slowdown_on_spot_is_charged_at_the_jobs_on_demand_value() -> None:
    from autoscaler.pricing import PriceBook
    from autoscaler.reconfiguration import full_reconfiguration
    from autoscaler.throughput import ThroughputTable
    from autoscaler.view import ClusterView

    planning, jobs = _spot_pair(0.50)
    prices = PriceBook(planning)
    task = jobs[0].tasks[0]
    assert prices.task_rp(task) == pytest.approx(0.30)  # RP: alone on the cheapest, spot
    assert prices.task_value(task) == pytest.approx(1.0)  # V: alone on on-demand
    plain = Catalog([InstanceType("s", "c", Resources(0, 4, 16), 1.0)])
    assert PriceBook(plain).task_value(job("z", (0, 4, 16), family="c").tasks[0]) == 1.0

    table = ThroughputTable(default=0.9)
    # Together on b:spot the pair saves 2 × 0.30 − 0.50 = $0.10/h of instances and
    # loses 10% of each job's time: $0.06/h at the spot RP (Eva's TNRP 0.54 ≥ 0.50
    # would pack them), $0.20/h at the jobs' on-demand value — not worth it.
    alone = full_reconfiguration(ClusterView(planning, jobs, throughput=table))
    assert sorted(i.type.name for i in alone) == ["s:spot", "s:spot"]
    # At $0.35/h the pair saves $0.25/h, more than the $0.20/h of time: packed.
    planning, jobs = _spot_pair(0.35)
    packed = full_reconfiguration(ClusterView(planning, jobs, throughput=table))
    assert [(i.type.name, len(i.tasks)) for i in packed] == [("b:spot", 2)]


def test_the_poisson_tail_of_hand_computed_cases() -> None:
    # P(X ≥ 2 | 0.5) = 1 − e^−0.5 (1 + 0.5); P(X ≥ 4 | 0.5) = 1 − e^−0.5 (1 + .5 + .125 + .0208)
    assert poisson_sf(2, 0.5) == pytest.approx(1.0 - math.exp(-0.5) * 1.5)
    assert poisson_sf(4, 0.5) == pytest.approx(1.0 - math.exp(-0.5) * (1.625 + 0.5**3 / 6))
    assert poisson_sf(0, 0.5) == 1.0
    assert poisson_sf(1, 0.0) == 0.0  # any reclaim where none was expected


def test_a_job_reclaimed_as_often_as_planned_stays_on_spot_and_one_reclaimed_more_moves() -> None:
    policy = SpotPolicy()  # α = 0.01, ceiling 10
    # Planned at 0.05/h over 10 h: 0.5 reclaims expected. Three: P(X ≥ 3) = 0.0144 ≥ α,
    # within what the rate explains; four: 0.00175 < α, the rate is wrong for it.
    assert not reclaims_pin(3, 10.0, 0.05, 1, policy)
    assert reclaims_pin(4, 10.0, 0.05, 1, policy)
    # Two reclaims moved every job before; at that rate they are no evidence.
    assert not reclaims_pin(2, 10.0, 0.05, 1, policy)
    # At an advisor band's 1e-4/h, one reclaim in 10 h is (P = 0.001) ...
    assert reclaims_pin(1, 10.0, 1e-4, 1, policy)
    # ... but not for a 20-task job, one of whose tasks is that likely to see one
    # (Bonferroni: 20 × 0.001 ≥ α).
    assert not reclaims_pin(1, 10.0, 1e-4, 20, policy)
    # The ceiling, whatever the rate: every job ends up on on-demand after ten.
    assert reclaims_pin(10, 1000.0, 1.0, 1, policy)
    assert not reclaims_pin(10, 1000.0, 1.0, 1, replace(policy, max_reclaims=None))
    assert not reclaims_pin(0, 0.0, 0.0, 1, policy)


def test_the_exposure_is_the_whole_run_when_known_so_a_pinned_job_stays_pinned() -> None:
    policy = SpotPolicy(checkpoint_every_s=900.0)
    # Known length: 10 h alone plus one checkpoint interval redone per reclaim, whatever
    # the time — the verdict changes only with a new reclaim.
    assert exposure_hours(36_000.0, 2, 0.0, 5.0, policy) == pytest.approx(10.5)
    assert exposure_hours(36_000.0, 2, 0.0, 1e6, policy) == pytest.approx(10.5)
    # Unknown length: the hours since it first ran (none before it ran).
    assert exposure_hours(None, 2, 3600.0, 3 * 3600.0, policy) == pytest.approx(2.0)
    assert exposure_hours(None, 2, None, 3600.0, policy) == 0.0


def test_the_planned_rate_is_the_highest_of_the_spot_offerings_the_job_fits() -> None:
    small = InstanceType("c", "c", Resources(0, 2, 4), 0.2, DELAYS)
    catalog = Catalog(
        [
            *offerings(0.02),
            replace(small, name="c:spot", market=SPOT, ec2_type="c", interruption_per_hour=0.3),
        ]
    )
    assert planned_rate(job("a", (1, 4, 10)), catalog) == 0.02  # fits the GPU offering only
    assert planned_rate(job("b", (0, 1, 2)), catalog) == 0.3  # fits both
    assert planned_rate(job("a", (1, 4, 10)), offerings(0.0)) == 0.0


def test_the_planner_prices_a_spot_offering_at_p_plus_its_loss_at_the_on_demand_value() -> None:
    # g:spot at $1/h beside g on-demand at $3/h, λ = 0.01/h; checkpoints every 900 s and
    # a restart of 300 s: L = 750/3600 h. p + λ·L·V = 1 + 0.01 × 0.208333 × 3 = 1.00625
    policy = SpotPolicy(checkpoint_every_s=900.0, restart_s=300.0)
    planned = policy.planning_catalog(offerings(0.01))
    assert planned["g:spot"].hourly_cost == pytest.approx(1.00625)
    assert planned["g"].hourly_cost == 3.0
    # the smallest on-demand offering of the family that holds it sets V
    big = InstanceType("g2", "p", Resources(2, 16, 120), 5.0, DELAYS)
    planned = policy.planning_catalog(Catalog([*offerings(0.01), big]))
    assert planned["g:spot"].hourly_cost == pytest.approx(1.00625)


def test_a_job_without_checkpoints_leaves_spot_when_its_price_says_a_restart_costs_too_much():
    # g:spot at $1/h beside g at $3/h: spot saves 1 − 1/3 of the on-demand value.
    assert spot_discount(job("a", (1, 4, 10)), offerings(0.05)) == pytest.approx(2.0 / 3.0)
    assert spot_discount(job("c", (0, 64, 10)), offerings(0.05)) is None  # fits nothing
    # At 0.05/h a 10-hour job restarting from scratch loses 0.05 × (5 + 0.1) = 0.255 of
    # its time per hour, below the 2/3 saved: it stays; a 40-hour one loses 1.005: it goes.
    assert not from_scratch_pins(10.0, 0.1, 0.05, 2.0 / 3.0)
    assert from_scratch_pins(40.0, 0.1, 0.05, 2.0 / 3.0)


def test_a_job_of_known_length_is_judged_on_its_whole_run_and_stays_pinned() -> None:
    from autoscaler.decide import pinned_by_reclaims
    from autoscaler.jobs import TraceFacts
    from autoscaler.store import TaskRecord

    policy = SpotPolicy(checkpoint_every_s=900.0)
    catalog = offerings(0.05)
    ten_hours = job("a", (1, 4, 10), trace=TraceFacts(duration_s=36_000.0))

    def reclaimed(n: int) -> list[TaskRecord]:
        return [TaskRecord("a/0", "a", retries=n)]

    # 10 h alone, 0.75 h redone: 0.05 × 10.75 = 0.54 expected; 3 reclaims P = 0.017,
    # 4 reclaims P = 0.0023 < α: pinned, and at any later time (its exposure is fixed).
    assert not pinned_by_reclaims(policy, ten_hours, reclaimed(3), 0.0, 3600.0, catalog)
    assert pinned_by_reclaims(policy, ten_hours, reclaimed(4), 0.0, 3600.0, catalog)
    assert pinned_by_reclaims(policy, ten_hours, reclaimed(4), 0.0, 1e7, catalog)
    # An attempt the job itself failed is not a reclaim.
    failed = [TaskRecord("a/0", "a", retries=4, failures=1)]
    assert not pinned_by_reclaims(policy, ten_hours, failed, 0.0, 3600.0, catalog)


def test_a_job_that_asked_for_spot_leaves_it_only_at_the_ceiling() -> None:
    # The test of the priced rate decides between markets for the planner; a job whose
    # owner chose spot stays there, however improbable its reclaims, until the ceiling.
    from autoscaler.decide import pinned_by_reclaims
    from autoscaler.jobs import TraceFacts
    from autoscaler.store import TaskRecord

    policy = SpotPolicy(checkpoint_every_s=900.0, max_reclaims=5, max_delay_share=None)
    catalog = offerings(0.05)
    facts = TraceFacts(duration_s=36_000.0)
    auto = job("a", (1, 4, 10), trace=facts)
    spot = replace(auto, capacity="spot")

    def reclaimed(n: int) -> list[TaskRecord]:
        return [TaskRecord("a/0", "a", retries=n)]

    assert pinned_by_reclaims(policy, auto, reclaimed(4), 0.0, 3600.0, catalog)  # as above
    assert not pinned_by_reclaims(policy, spot, reclaimed(4), 0.0, 3600.0, catalog)
    assert pinned_by_reclaims(policy, spot, reclaimed(5), 0.0, 3600.0, catalog)
    unbounded = replace(policy, max_reclaims=None)
    assert not pinned_by_reclaims(unbounded, spot, reclaimed(50), 0.0, 3600.0, catalog)


def test_the_ceiling_rises_with_a_long_job_to_the_reclaims_its_budgets_allow() -> None:
    from autoscaler.catalog import TABLE1_LAUNCH_DELAYS
    from autoscaler.decide import pinned_by_reclaims
    from autoscaler.jobs import TraceFacts
    from autoscaler.spot import reclaim_ceiling, reclaim_loss_s, reclaim_lost_s
    from autoscaler.store import TaskRecord

    policy = SpotPolicy(checkpoint_every_s=900.0)  # count 10, delay 5%, work lost 1.5%
    # 5% of 200 h alone is 36,000 s: 90 reclaims delaying it 400 s each and losing no
    # work; 5% of 2 h is less than one: the count stands.
    assert reclaim_ceiling(200 * 3600.0, 400.0, 0.0, policy) == 90
    assert reclaim_ceiling(2 * 3600.0, 400.0, 0.0, policy) == 10
    assert reclaim_ceiling(None, 400.0, 0.0, policy) == 10  # unknown length: the count
    assert reclaim_ceiling(200 * 3600.0, 0.0, 0.0, policy) == 10  # no loss priced
    assert reclaim_ceiling(200 * 3600.0, 800.0, 0.0, policy) == 45  # dearer reclaims
    # Reclaims that each take back 400 s of work: 1.5% of the run, 10,800 s, is 27 of
    # them, fewer than the delay allows (36,000 / 800 = 45) ...
    assert reclaim_ceiling(200 * 3600.0, 800.0, 400.0, policy) == 27
    # ... with no budget for lost work, the delay's alone
    assert reclaim_ceiling(200 * 3600.0, 800.0, 400.0, replace(policy, max_lost_share=None)) == 45
    # no budget for the delay, or a budget of nothing: the count alone
    assert reclaim_ceiling(200 * 3600.0, 400.0, 0.0, replace(policy, max_delay_share=None)) == 10
    assert reclaim_ceiling(200 * 3600.0, 400.0, 0.0, replace(policy, max_delay_share=0.0)) == 10
    assert reclaim_ceiling(200 * 3600.0, 800.0, 400.0, replace(policy, max_lost_share=0.0)) == 10
    assert reclaim_ceiling(200 * 3600.0, 400.0, 0.0, replace(policy, max_reclaims=None)) is None

    # A reclaim costs the job its restart and the checkpoint its worker takes on the
    # notice, and loses no work; only a checkpoint too long for the window also loses
    # half an interval.
    long_job = job("a", (1, 4, 10), trace=TraceFacts(duration_s=200 * 3600.0))
    restart = TABLE1_LAUNCH_DELAYS.startup_s + long_job.init_delay_s
    stop = long_job.tasks[0].kill_s + long_job.tasks[0].upload_s
    assert reclaim_loss_s(long_job, policy) == restart + stop
    assert reclaim_lost_s(long_job, policy) == 0.0
    slow = replace(long_job, tasks=(replace(long_job.tasks[0], upload_s=300.0),))
    assert reclaim_loss_s(slow, policy) == restart + 450.0
    assert reclaim_lost_s(slow, policy) == 450.0

    # A 200-hour job planned at 0.7/h expects about 140 reclaims: its tenth is no
    # evidence against the rate, and it stays on spot past the count ...
    catalog = offerings(0.7)
    ceiling = int(0.05 * 200 * 3600.0 // (restart + stop))
    assert ceiling > 10

    def reclaimed(n: int) -> list[TaskRecord]:
        return [TaskRecord("a/0", "a", retries=n)]

    assert not pinned_by_reclaims(policy, long_job, reclaimed(10), 0.0, 3600.0, catalog)
    assert not pinned_by_reclaims(policy, long_job, reclaimed(ceiling - 1), 0.0, 3600.0, catalog)
    # ... until its reclaims have cost it its share of the run
    assert pinned_by_reclaims(policy, long_job, reclaimed(ceiling), 0.0, 3600.0, catalog)
    # with the count alone, it moved at the tenth
    count_only = replace(policy, max_delay_share=None)
    assert pinned_by_reclaims(count_only, long_job, reclaimed(10), 0.0, 3600.0, catalog)


def test_a_reclaim_can_take_back_a_whole_checkpoint_interval_of_the_job() -> None:
    from autoscaler.jobs import TaskRun
    from autoscaler.spot import rollback_s

    plain = job("a", (1, 4, 16))
    assert rollback_s(plain, SpotPolicy()) == 900.0  # the policy's (the jobs' default)
    tasks = tuple(
        replace(t, run=TaskRun(image="i", checkpoint_every_s=every))
        for t, every in zip(job("b", (1, 4, 16), (1, 4, 16)).tasks, (600.0, 300.0), strict=True)
    )
    assert rollback_s(replace(plain, tasks=tasks), SpotPolicy()) == 300.0  # its shortest
    # the baselines price no checkpoint loss (L = 0): nothing kept for it
    assert rollback_s(plain, SpotPolicy(checkpoint_every_s=0.0)) == 0.0
    assert rollback_s(plain, SpotPolicy(checkpoint_every_s=None)) == 0.0
