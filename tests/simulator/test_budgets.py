"""Teams' daily budgets and jobs' `max_cost` in the control loop, against the simulated
world (`autoscaler.fairshare` rule 0; `autoscaler.decide.over_max_cost`).

Setting as in `test_team_share`: one instance type, $1/h, holding exactly one task, so
a job's attributed spend is $1/h for each second its task occupies an instance.
"""

from __future__ import annotations

import dataclasses

from autoscaler.catalog import Catalog
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.fairshare import TeamLimits, TeamPolicy
from autoscaler.planner import planner_by_name
from autoscaler.spend import DAY_S, dominant_share, spending
from autoscaler.store import Placement, UptimeInterval
from simulator.engine import EventLoop
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from state.memory import InMemoryStore
from tests.simulator.test_hand_computed import NO_INTERFERENCE, job
from tests.simulator.test_team_share import one_task_type, team_jobs


def _loop(catalog: Catalog, jobs, options: ControlOptions):  # type: ignore[no-untyped-def]
    engine = EventLoop()
    world = World(engine, catalog, NO_INTERFERENCE, jobs)
    store = InMemoryStore()
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        SimulatedCloud(world),
        SimulatedExecutor(world),
        store,
        engine,
        options,
    )
    return engine, store, loop


def _run(engine: EventLoop, loop: ControlLoop, until: float, period: float = 300.0) -> None:
    t = 0.0
    while t < until:
        engine.at(t, loop.schedule)
        t += period
    engine.after_batch = loop.progress
    engine.at(until, lambda: None)
    engine.run(until=lambda: engine.now() >= until)


def _spent(store: InMemoryStore, catalog: Catalog, now: float):  # type: ignore[no-untyped-def]
    records = {j.job_id: j for j in store.jobs()}
    return spending(
        store.uptime(),
        store.placements(),
        {k: r.spec for k, r in records.items()},
        {k: r.team for k, r in records.items()},
        catalog,
        now,
    )


def test_a_team_at_its_daily_budget_is_paused_until_the_next_utc_day() -> None:
    # research may spend $0.50 a day; its one job would run for two days. Once its
    # attributed spend today reaches $0.50 (30 minutes of its $1/h instance, checked
    # each 5-minute round) it is checkpointed and waits; prod, without a budget, runs on.
    # At 00:00 UTC the next day research's spend today is $0 and it is admitted again.
    catalog = one_task_type()
    jobs = [*team_jobs("research", 1, 2 * DAY_S), *team_jobs("prod", 1, 2 * DAY_S)]
    policy = TeamPolicy({"research": TeamLimits(daily_budget=0.5), "prod": TeamLimits()})
    engine, store, loop = _loop(catalog, jobs, ControlOptions(teams=policy))
    for j in jobs:
        store.submit_job(j, owner=f"{j.trace.team}-user", at=0.0, team=j.trace.team)
    _run(engine, loop, 7200.0)
    tasks = {t.job_id: t for t in store.snapshot(1.0).tasks.values()}
    assert tasks["research0"].status == "pending" and tasks["research0"].instance_id is None
    assert tasks["research0"].checkpoint is not None  # stopped with a checkpoint
    assert tasks["prod0"].status == "running"
    spent = _spent(store, catalog, 7200.0)
    # Reached at a round: at most one round (5 min at $1/h) and a checkpoint past it.
    assert 0.5 <= spent.team_today["research"] <= 0.5 + 300 / 3600 + 60 / 3600
    fair = store.rounds()[-1].numbers["fair_share"]
    assert fair["over_daily_budget"]["research"]["daily_budget"] == 0.5
    assert fair["shares"]["research"] == 0.0
    assert "reached its daily budget" in fair["waiting"]["research0"]
    assert "next UTC day" in fair["waiting"]["research0"]


def test_a_paused_team_resumes_at_the_next_utc_day() -> None:
    catalog = one_task_type()
    jobs = team_jobs("research", 1, 2 * DAY_S)
    policy = TeamPolicy({"research": TeamLimits(daily_budget=0.5)})
    engine, store, loop = _loop(catalog, jobs, ControlOptions(teams=policy))
    store.submit_job(jobs[0], owner="r", at=0.0, team="research")
    # a round each hour (fewer events over a day); the next day starts at 86400 s
    _run(engine, loop, DAY_S + 1800.0, period=3600.0)
    task = store.snapshot(1.0).tasks["research0/0"]
    assert task.status == "running"
    assert "fair_share" not in store.rounds()[-1].numbers or not store.rounds()[-1].numbers[
        "fair_share"
    ].get("over_daily_budget")
    spent = _spent(store, catalog, DAY_S + 1800.0)
    # yesterday's spend is not counted against today's budget
    assert 0 < spent.team_today["research"] < 0.5


def test_a_job_at_its_max_cost_is_checkpointed_and_stopped_not_failed() -> None:
    # max_cost $0.10: six minutes of its $1/h instance. Rounds every 5 minutes find it
    # over at the first round after that, stop it with a checkpoint, then end it.
    catalog = one_task_type()
    spec = dataclasses.replace(job("capped", 0.0, DAY_S), max_cost=0.1)
    other = job("free", 0.0, DAY_S)
    engine, store, loop = _loop(catalog, [spec, other], ControlOptions())
    store.submit_job(spec, owner="u", at=0.0)
    store.submit_job(other, owner="u", at=0.0)
    _run(engine, loop, 3600.0)
    record = store.job("capped")
    assert record is not None and record.status == "cancelled"
    assert record.reason.startswith("stopped: max_cost $0.10 reached")
    task = store.tasks_of("capped")[0]
    assert task.checkpoint is not None and task.failures == 0
    free = store.job("free")
    assert free is not None and free.status == "running"
    spent = _spent(store, catalog, 3600.0).job_total["capped"]
    assert 0.1 <= spent <= 0.1 + 300 / 3600 + 60 / 3600
    states = [
        r.numbers["max_cost"]["capped"]["state"] for r in store.rounds() if "max_cost" in r.numbers
    ]
    assert states[0] == "stopping" and states[-1] == "stopped"


def test_spend_today_is_the_ledger_split_from_utc_midnight() -> None:
    """Hand-computed: a $2/h instance billed from 23:00 to 01:00 hosts a task of team a
    and one of team b with equal dominant shares: each job is charged $2 in all, $1
    of it today."""
    catalog = one_task_type()
    a, b = job("a", 0.0, 1.0, (0, 1, 1)), job("b", 0.0, 1.0, (0, 1, 1))
    start, end = DAY_S - 3600.0, DAY_S + 3600.0
    uptime = [UptimeInterval("i", "one", 2.0, start, end)]
    placements = [
        Placement("a/0", "a", "i", 1, start, None),
        Placement("b/0", "b", "i", 1, start, None),
    ]
    assert dominant_share({"a": a}, catalog)(placements[0], "one") == 0.25
    spent = spending(uptime, placements, {"a": a, "b": b}, {"a": "ta", "b": "tb"}, catalog, end)
    assert spent.team_today == {"ta": 1.0, "tb": 1.0}
    assert spent.job_total == {"a": 2.0, "b": 2.0}


def test_job_shows_why_a_waiting_job_waits() -> None:
    # test_team_share's setting: budget $6/h, research weight 2, prod weight 1, eight
    # $1/h jobs each: prod's share is $2/h, two jobs; its third waits for the share.
    from app.reports import job_detail
    from autoscaler.cloud import Guardrails
    from tests.simulator.test_team_share import BUDGET, POLICY

    catalog = one_task_type()
    jobs = [*team_jobs("research", 8, 30000.0), *team_jobs("prod", 8, 30000.0)]
    options = ControlOptions(guardrails=Guardrails(max_hourly_spend=BUDGET), teams=POLICY)
    engine, store, loop = _loop(catalog, jobs, options)
    for j in jobs:
        store.submit_job(
            j, owner=f"{j.trace.team}-user", at=j.trace.arrival_time_s, team=j.trace.team
        )
    _run(engine, loop, 900.0)
    detail = job_detail(store, "prod2", catalog, 900.0)
    assert detail is not None and detail["team"] == "prod"
    assert detail["waiting"] == (
        "waiting: team prod at its share $2.00/h of $6.00/h "
        "($2.00/h in use; this job needs $1.00/h)"
    )
    running = job_detail(store, "prod0", catalog, 900.0)
    assert running is not None and running["waiting"] is None


def test_job_shows_a_job_stopped_at_its_max_cost() -> None:
    from app.reports import job_detail

    catalog = one_task_type()
    spec = dataclasses.replace(job("capped", 0.0, DAY_S), max_cost=0.1)
    engine, store, loop = _loop(catalog, [spec], ControlOptions())
    store.submit_job(spec, owner="u", at=0.0)
    _run(engine, loop, 3600.0)
    detail = job_detail(store, "capped", catalog, 3600.0)
    assert detail is not None
    assert (detail["status"], detail["max_cost"]) == ("cancelled", 0.1)
    assert detail["reason"].startswith("stopped: max_cost $0.10 reached")
    assert detail["cost"] >= 0.1
