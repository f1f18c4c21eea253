"""Admission under a budget: which jobs a round may plan when teams share `max_hourly_spend`.

A cluster shared by teams must keep each within what is theirs when the money runs
short (AWS Batch's fair-share scheduling policies, Slurm's fair share). The rule,
applied each round to the unfinished jobs (queued and running alike):

1. **A job's hourly spend is its reservation price** — the sum over its tasks of the
   cheapest type each fits alone (Eva §4.2): what it costs with no packing, an upper
   bound on what packing makes it cost. A team's *demand* is the sum over its jobs.
2. **A team's cap** is the least of its demand, its own `max_hourly_spend` and
   `max_share` × the cluster's `max_hourly_spend` (absent limits: no cap).
3. **Shares are weighted max-min fair** (water-filling, Bertsekas & Gallager, *Data
   Networks* §6.5.2): with budget B, each team t gets min(cap_t, λ·w_t), λ the largest
   level whose shares sum to at most B. A team capped below its weighted level keeps
   only its cap, and the rest of B is redistributed among the others in proportion to
   their weights. When the caps sum to at most B, every team gets its cap (nothing
   binds). Without a cluster budget each team gets its cap.
4. **Within a team, the queue admits by priority, then age** (higher priority first,
   then earlier submission, then job id; a job's priority is its own, else its team's
   default, and never above its team's `max_priority`): jobs are admitted in that order while the
   team's admitted spend stays within its share; the first that does not fit stops the
   team's queue (no later, smaller job overtakes it).
5. **What rounding leaves is redistributed**: the budget left unadmitted after rule 4
   goes to the waiting jobs in the same order across teams — each team's next job is
   admitted if it fits both what is left of B and its team's cap, and a team's queue
   stops at its first job that does not.

Before these, **a team over its daily budget waits until the next UTC day** (rule 0): a
team with a `daily_budget` whose attributed spend since 00:00 UTC (the ledger split among
jobs by dominant share, as `cost-report --by team` splits it: `autoscaler.spend`) has
reached it claims nothing — none of its jobs is admitted, its running ones are
checkpointed — until the day turns and its spend today is back at zero. Its demand is
still shown; its share is 0, and rules 1-5 share the budget among the others.

A job not admitted is not planned this round: it waits (a running one is checkpointed
and resumes once admitted again), with the reason recorded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Slack for float sums of prices (a share equal to a demand must admit it).
_EPS = 1e-9
#: The team of a job whose owner has none.
NO_TEAM = ""
#: Priorities are whole numbers within ±this.
MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class TeamLimits:
    """A team's weight in the fair share, and its own limits ($/h; None: none)."""

    weight: float = 1.0
    max_hourly_spend: float | None = None
    max_share: float | None = None  # of the cluster's max_hourly_spend, in (0, 1]
    priority: int = 0  # of its jobs that state none
    max_priority: int | None = None  # the most a job of the team may ask for (None: any)
    daily_budget: float | None = None  # $ per UTC day (rule 0; None: none)


@dataclass(frozen=True, slots=True)
class TeamPolicy:
    """The teams' limits by name; a team not named (and jobs of no team) gets `default`."""

    teams: Mapping[str, TeamLimits] = field(default_factory=dict)
    default: TeamLimits = TeamLimits()

    def limits(self, team: str) -> TeamLimits:
        return self.teams.get(team, self.default)

    def priority(self, team: str, asked: int | None) -> int:
        """Rule 4's priority of a job of `team` that asked for `asked` (None: the team's
        default): a job's override is held within its team's `max_priority`."""
        limits = self.limits(team)
        wanted = limits.priority if asked is None else asked
        return wanted if limits.max_priority is None else min(wanted, limits.max_priority)

    def cap(self, team: str, demand: float, budget: float | None) -> float:
        """Rule 2: the most `team` may spend, its demand included."""
        limits = self.limits(team)
        cap = demand
        if limits.max_hourly_spend is not None:
            cap = min(cap, limits.max_hourly_spend)
        if limits.max_share is not None and budget is not None:
            cap = min(cap, limits.max_share * budget)
        return cap


@dataclass(frozen=True, slots=True)
class Claim:
    """One job asking to run: its team, its reservation price ($/h), its queue position."""

    job_id: str
    team: str
    hourly_price: float
    priority: int = 0
    submitted_at: float = 0.0

    def order(self) -> tuple[int, float, str]:
        """Rule 4's queue order: priority (higher first), then age, then id."""
        return (-self.priority, self.submitted_at, self.job_id)


@dataclass(frozen=True, slots=True)
class Admission:
    """Which jobs a round plans, each team's demand and share ($/h), why the rest wait."""

    admitted: frozenset[str]
    waiting: Mapping[str, str]  # job -> why it waits
    demands: Mapping[str, float]
    shares: Mapping[str, float]
    # Rule 0: teams waiting for the next UTC day, each (spent today, daily budget) in $.
    over_daily_budget: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def binds(self) -> bool:
        return bool(self.waiting)


def weighted_max_min(
    caps: Mapping[str, float], weights: Mapping[str, float], budget: float | None
) -> dict[str, float]:
    """Rule 3: each team's share of `budget`, weighted max-min fair, none above its cap.

    Water-filling: teams in order of cap/weight each take their cap while it is below
    their weighted part of what is left; once one's is not, all that remain split what
    is left in proportion to their weights."""
    if budget is None or sum(caps.values()) <= budget + _EPS:
        return dict(caps)
    shares: dict[str, float] = {}
    left, weight_left = budget, sum(weights[t] for t in caps)
    ranked = sorted(caps, key=lambda t: (caps[t] / weights[t], t))
    for position, team in enumerate(ranked):
        if caps[team] <= left * weights[team] / weight_left + _EPS:
            shares[team] = caps[team]
            left -= caps[team]
            weight_left -= weights[team]
            continue
        for other in ranked[position:]:
            shares[other] = left * weights[other] / weight_left
        break
    return shares


def over_daily_budget(
    policy: TeamPolicy, spent_today: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """Rule 0: the teams whose spend today has reached their daily budget, each with
    (spent, budget) in dollars."""
    over = {}
    for team, spent in spent_today.items():
        budget = policy.limits(team).daily_budget
        if budget is not None and spent >= budget - _EPS:
            over[team] = (spent, budget)
    return over


def team_label(team: str) -> str:
    """How a reason names a team (a job of no team's owner has none)."""
    return f"team {team}" if team else "jobs of no team"


def admit(
    claims: Sequence[Claim],
    policy: TeamPolicy,
    budget: float | None,
    spent_today: Mapping[str, float] | None = None,
) -> Admission:
    """Rules 0-5: the jobs a round may plan under the cluster's `budget` ($/h; None: none),
    given each team's attributed spend since 00:00 UTC (`spent_today`, dollars)."""
    over = over_daily_budget(policy, spent_today or {})
    paused = {
        c.job_id: (
            f"waiting: {team_label(c.team)} reached its daily budget "
            f"(${over[c.team][0]:.2f} of ${over[c.team][1]:.2f} spent since 00:00 UTC); "
            "it resumes at the next UTC day"
        )
        for c in claims
        if c.team in over
    }
    admission = _admit([c for c in claims if c.team not in over], policy, budget)
    if not paused:
        return admission
    demands = dict(admission.demands)
    for claim in claims:
        if claim.team in over:
            demands[claim.team] = demands.get(claim.team, 0.0) + claim.hourly_price
    return Admission(
        admission.admitted,
        {**admission.waiting, **paused},
        demands,
        {**admission.shares, **dict.fromkeys(over.keys() & demands.keys(), 0.0)},
        over,
    )


def _admit(claims: Sequence[Claim], policy: TeamPolicy, budget: float | None) -> Admission:
    """Rules 1-5."""
    demands: dict[str, float] = {}
    for claim in claims:
        demands[claim.team] = demands.get(claim.team, 0.0) + claim.hourly_price
    caps = {t: policy.cap(t, d, budget) for t, d in demands.items()}
    weights = {t: policy.limits(t).weight for t in demands}
    shares = weighted_max_min(caps, weights, budget)
    queued = sorted(claims, key=Claim.order)
    admitted: set[str] = set()
    spent = dict.fromkeys(demands, 0.0)
    stopped: set[str] = set()
    for claim in queued:  # rule 4
        if claim.team in stopped:
            continue
        if spent[claim.team] + claim.hourly_price <= shares[claim.team] + _EPS:
            admitted.add(claim.job_id)
            spent[claim.team] += claim.hourly_price
        else:
            stopped.add(claim.team)
    left = math.inf if budget is None else budget - sum(spent.values())
    stopped = set()
    for claim in queued:  # rule 5
        if claim.job_id in admitted or claim.team in stopped:
            continue
        after = spent[claim.team] + claim.hourly_price
        if claim.hourly_price <= left + _EPS and after <= caps[claim.team] + _EPS:
            admitted.add(claim.job_id)
            spent[claim.team] = after
            left -= claim.hourly_price
        else:
            stopped.add(claim.team)
    of = f" of ${budget:.2f}/h" if budget is not None else ""
    waiting = {
        c.job_id: (
            f"waiting: {team_label(c.team)} at its share ${shares[c.team]:.2f}/h{of} "
            f"(${spent[c.team]:.2f}/h in use; this job needs ${c.hourly_price:.2f}/h)"
        )
        for c in queued
        if c.job_id not in admitted
    }
    return Admission(frozenset(admitted), waiting, demands, shares)
