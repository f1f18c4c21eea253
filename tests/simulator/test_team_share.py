"""Two teams with budgets share a binding `max_hourly_spend` in the stated proportion
(`autoscaler.fairshare`: weighted max-min fair), in a replay and in the control loop
against the simulated world.

Setting: one instance type, $1/h, that holds exactly one task, so a job's reservation
price is what it costs and no packing blurs the split. Budget $6/h; team research has
weight 2, team prod weight 1, each with far more work queued than the budget: research's
share is 6·2/3 = $4/h (four jobs at a time), prod's 6·1/3 = $2/h (two).
"""

from __future__ import annotations

import dataclasses

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.cloud import Guardrails
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.fairshare import TeamLimits, TeamPolicy
from autoscaler.jobs import JobSpec
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from autoscaler.store import Store
from simulator.engine import EventLoop
from simulator.replay import replay
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from state.memory import InMemoryStore
from tests.simulator.test_hand_computed import DELAYS, NO_INTERFERENCE, job

BUDGET = 6.0
POLICY = TeamPolicy({"research": TeamLimits(weight=2.0), "prod": TeamLimits(weight=1.0)})


def one_task_type() -> Catalog:
    return Catalog([InstanceType("one", "f", Resources(1, 4, 16), 1.0, DELAYS)])


def team_jobs(team: str, count: int, seconds: float) -> list[JobSpec]:
    jobs = []
    for i in range(count):
        spec = job(f"{team}{i}", float(i), seconds)
        jobs.append(dataclasses.replace(spec, trace=dataclasses.replace(spec.trace, team=team)))
    return jobs


def spend_by_team(store: Store) -> dict[str, float]:
    """$/h of the live instances, each charged to the team of the task it hosts."""
    snap = store.snapshot(1.0)
    team_of = {j.job_id: j.team for j in snap.jobs}
    price = {"one": 1.0}
    spend = {"research": 0.0, "prod": 0.0}
    hosted = {
        t.instance_id: team_of[t.job_id]
        for t in snap.tasks.values()
        if t.status == "running" and t.instance_id is not None
    }
    for inst in snap.instances:
        if inst.status == "running" and inst.instance_id in hosted:
            spend[hosted[inst.instance_id]] += price[inst.instance_type]
    return spend


def test_replay_two_teams_share_a_binding_budget_two_to_one() -> None:
    store = InMemoryStore()
    seen: list[tuple[float, dict[str, float]]] = []
    jobs = [*team_jobs("research", 8, 3000.0), *team_jobs("prod", 8, 3000.0)]
    result = replay(
        jobs,
        one_task_type(),
        NO_INTERFERENCE,
        "eva",
        store=store,
        on_round=lambda now, done, total: seen.append((now, spend_by_team(store))),
        max_hourly_spend=BUDGET,
        teams=POLICY,
    )
    assert result.finished
    # While both teams have more queued than their share (the first 3000 s batch), the
    # running spend splits $4/h : $2/h — the budget's 2:1 by weight.
    during = [s for now, s in seen if 600.0 <= now <= 3000.0]
    assert during and all(s == {"research": 4.0, "prod": 2.0} for s in during)
    # and the budget is never passed
    assert all(sum(s.values()) <= BUDGET for _, s in seen)


def test_without_teams_the_oldest_jobs_take_the_budget() -> None:
    """The same trace without a team policy: the guardrail alone refuses launches past
    the budget, and who gets the money follows the trace's order, not the weights."""
    store = InMemoryStore()
    seen: list[dict[str, float]] = []
    jobs = [*team_jobs("research", 8, 3000.0), *team_jobs("prod", 8, 3000.0)]
    replay(
        jobs,
        one_task_type(),
        NO_INTERFERENCE,
        "eva",
        store=store,
        on_round=lambda now, done, total: seen.append(spend_by_team(store)) if now == 900 else None,
        max_hourly_spend=BUDGET,
    )
    assert seen and seen[0] != {"research": 4.0, "prod": 2.0}


def test_control_loop_two_teams_share_a_binding_budget_two_to_one() -> None:
    jobs = [*team_jobs("research", 8, 30000.0), *team_jobs("prod", 8, 30000.0)]
    engine = EventLoop()
    world = World(engine, one_task_type(), NO_INTERFERENCE, jobs)
    store = InMemoryStore()
    options = ControlOptions(guardrails=Guardrails(max_hourly_spend=BUDGET), teams=POLICY)
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        SimulatedCloud(world),
        SimulatedExecutor(world),
        store,
        engine,
        options,
    )
    # prod's jobs are submitted first: age alone would give prod the whole budget.
    for j in sorted(jobs, key=lambda j: j.trace.team != "prod"):
        store.submit_job(j, owner=f"{j.trace.team}-user", at=0.0, team=j.trace.team)
    for t in (0.0, 300.0, 600.0):
        engine.at(t, loop.schedule)
    engine.after_batch = loop.progress  # the daemon's steps between rounds
    engine.at(900.0, lambda: None)
    engine.run(until=lambda: engine.now() >= 900.0)
    assert spend_by_team(store) == {"research": 4.0, "prod": 2.0}
    assert len(store.snapshot(1.0).instances) == 6
    shares = store.rounds()[-1].numbers["fair_share"]["shares"]
    assert shares == {"research": 4.0, "prod": 2.0}


def test_within_a_team_a_higher_priority_job_is_admitted_before_older_ones() -> None:
    # One team, budget $2/h: two of three jobs run. The newest asks for priority 5, held
    # to the team's bound of 3 — still above the others' default 0, so it runs.
    jobs = team_jobs("prod", 3, 30000.0)
    jobs[2] = dataclasses.replace(jobs[2], priority=5)
    engine = EventLoop()
    world = World(engine, one_task_type(), NO_INTERFERENCE, jobs)
    store = InMemoryStore()
    policy = TeamPolicy({"prod": TeamLimits(max_priority=3)})
    options = ControlOptions(guardrails=Guardrails(max_hourly_spend=2.0), teams=policy)
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        SimulatedCloud(world),
        SimulatedExecutor(world),
        store,
        engine,
        options,
    )
    for j in jobs:
        store.submit_job(j, owner="p", at=j.trace.arrival_time_s, team="prod")
    engine.at(0.0, loop.schedule)
    engine.after_batch = loop.progress
    engine.at(300.0, lambda: None)
    engine.run(until=lambda: engine.now() >= 300.0)
    placed = {t.job_id for t in store.snapshot(1.0).tasks.values() if t.target_instance_id}
    assert placed == {"prod0", "prod2"}
    assert "prod1" in store.rounds()[-1].numbers["fair_share"]["waiting"]
