"""Admission under a budget (`autoscaler.fairshare`): one test per rule, a hand-computed case."""

from __future__ import annotations

import pytest

from autoscaler.fairshare import Claim, TeamLimits, TeamPolicy, admit, weighted_max_min


def _jobs(team: str, count: int, price: float, *, start: float = 0.0) -> list[Claim]:
    return [Claim(f"{team}{i}", team, price, submitted_at=start + i) for i in range(count)]


def test_hand_computed_water_filling() -> None:
    # B = $10/h; a (w 1) wants $2/h, b (w 1) $8/h, c (w 2) $8/h.
    # Level λ: a's cap 2 is below its part 10·1/4 = 2.5, so a gets 2; 8 is left for b
    # and c by weight 1:2 — b 8/3, c 16/3 (c's cap 8 is above 16/3, so it binds).
    shares = weighted_max_min({"a": 2.0, "b": 8.0, "c": 8.0}, {"a": 1.0, "b": 1.0, "c": 2.0}, 10.0)
    assert shares == pytest.approx({"a": 2.0, "b": 8 / 3, "c": 16 / 3})


def test_rule1_demand_is_the_sum_of_reservation_prices() -> None:
    claims = [Claim("x", "a", 1.5), Claim("y", "a", 2.5), Claim("z", "b", 3.0)]
    assert admit(claims, TeamPolicy(), None).demands == {"a": 4.0, "b": 3.0}


def test_rule2_team_caps_bound_the_share() -> None:
    policy = TeamPolicy({"a": TeamLimits(max_hourly_spend=2.0), "b": TeamLimits(max_share=0.25)})
    admission = admit([*_jobs("a", 4, 1.0), *_jobs("b", 4, 1.0)], policy, 8.0)
    # a: its own $2/h; b: a quarter of $8/h. Nothing else binds, so 4 jobs run.
    assert admission.shares == {"a": 2.0, "b": 2.0}
    assert admission.admitted == {"a0", "a1", "b0", "b1"}


def test_rule3_unused_share_is_redistributed_by_weight() -> None:
    # B = 12, weights 1:1:2; team a wants only 1, so 11 is left for b and c, 1:2.
    policy = TeamPolicy({"c": TeamLimits(weight=2.0)})
    claims = [*_jobs("a", 1, 1.0), *_jobs("b", 10, 1.0), *_jobs("c", 10, 1.0)]
    admission = admit(claims, policy, 12.0)
    assert admission.shares == pytest.approx({"a": 1.0, "b": 11 / 3, "c": 22 / 3})


def test_rule3_nothing_binds_when_demand_fits() -> None:
    admission = admit([*_jobs("a", 3, 1.0), *_jobs("b", 2, 1.0)], TeamPolicy(), 5.0)
    assert admission.admitted == {"a0", "a1", "a2", "b0", "b1"}
    assert not admission.binds


def test_rule4_priority_then_age_and_no_overtaking() -> None:
    claims = [
        Claim("old", "a", 1.0, submitted_at=0.0),
        Claim("urgent", "a", 1.0, priority=5, submitted_at=9.0),
        Claim("big", "a", 3.0, submitted_at=1.0),
        Claim("small", "a", 1.0, submitted_at=2.0),
    ]
    # one team: its share is the whole B = 3; urgent then old fit, big does not and
    # stops the queue, so small (later) does not overtake it.
    admission = admit(claims, TeamPolicy(), 3.0)
    assert admission.admitted == {"urgent", "old"}
    assert set(admission.waiting) == {"big", "small"}


def test_rule5_rounding_leftover_goes_to_the_next_in_line() -> None:
    # B = 5, equal weights: shares 2.5 each; jobs of $1/h — each team admits 2 by its
    # share, and the $1/h left goes to the oldest waiting job (a2 before b2).
    claims = [*_jobs("a", 4, 1.0), *_jobs("b", 4, 1.0, start=0.5)]
    admission = admit(claims, TeamPolicy(), 5.0)
    assert admission.admitted == {"a0", "a1", "a2", "b0", "b1"}
    assert "share" in admission.waiting["b2"]


def test_two_teams_share_a_binding_budget_two_to_one() -> None:
    policy = TeamPolicy({"research": TeamLimits(weight=2.0), "prod": TeamLimits(weight=1.0)})
    claims = [*_jobs("research", 10, 1.0), *_jobs("prod", 10, 1.0)]
    admission = admit(claims, policy, 6.0)
    running = {t: sum(1 for j in admission.admitted if j.startswith(t)) for t in policy.teams}
    assert running == {"research": 4, "prod": 2}


def test_rule4_a_jobs_priority_defaults_to_its_teams_and_is_held_to_its_bound() -> None:
    policy = TeamPolicy({"a": TeamLimits(priority=3, max_priority=5)})
    assert policy.priority("a", None) == 3  # the team's default
    assert policy.priority("a", 4) == 4  # an override within the bound
    assert policy.priority("a", 50) == 5  # held to the bound
    assert policy.priority("b", None) == 0 and policy.priority("b", 50) == 50  # no bound


def test_rule0_a_team_over_its_daily_budget_waits_and_the_others_share_the_budget() -> None:
    # B = $6/h, weights 1:1. Team ml spent $20.00 today of its $20 budget: it claims
    # nothing, so team cv (demand $8/h) gets the whole $6/h instead of $3/h.
    policy = TeamPolicy({"ml": TeamLimits(daily_budget=20.0), "cv": TeamLimits()})
    claims = [*_jobs("ml", 4, 1.0), *_jobs("cv", 8, 1.0)]
    admission = admit(claims, policy, 6.0, {"ml": 20.0, "cv": 50.0})
    assert admission.admitted == {f"cv{i}" for i in range(6)}
    assert admission.shares == {"cv": 6.0, "ml": 0.0}
    assert admission.demands == {"ml": 4.0, "cv": 8.0}
    assert admission.over_daily_budget == {"ml": (20.0, 20.0)}
    assert admission.waiting["ml0"] == (
        "waiting: team ml reached its daily budget ($20.00 of $20.00 spent since "
        "00:00 UTC); it resumes at the next UTC day"
    )


def test_rule0_below_the_daily_budget_nothing_changes() -> None:
    policy = TeamPolicy({"ml": TeamLimits(daily_budget=20.0), "cv": TeamLimits()})
    claims = [*_jobs("ml", 4, 1.0), *_jobs("cv", 8, 1.0)]
    assert admit(claims, policy, 6.0, {"ml": 19.99}) == admit(claims, policy, 6.0)


def test_a_waiting_job_says_its_teams_share_of_the_budget() -> None:
    # B = $6/h, ml weight 2 of 3: its share is $4/h, four $1/h jobs in use; the fifth waits.
    policy = TeamPolicy({"ml": TeamLimits(weight=2.0), "cv": TeamLimits()})
    admission = admit([*_jobs("ml", 5, 1.0), *_jobs("cv", 5, 1.0)], policy, 6.0)
    assert admission.waiting["ml4"] == (
        "waiting: team ml at its share $4.00/h of $6.00/h ($4.00/h in use; this job needs $1.00/h)"
    )
