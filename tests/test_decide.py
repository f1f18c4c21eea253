"""The round (`decide`) and the step (`advance`) as pure functions, one rule a test.

Each test fabricates a snapshot of the state — jobs, tasks and instances as plain
records — calls `decide` or `advance` at a given time, and asserts what it decided
(as Ray autoscaler v2's `test_reconciler.py` does per transition). Where the plan
itself is not under test, the planner is a fake: it keeps what exists, or puts the
tasks where the test says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import pytest

from autoscaler.catalog import Catalog
from autoscaler.cloud import CloudInstance, Guardrails, OrphanPolicy, UnavailableOffering
from autoscaler.configuration import Configuration, Instance
from autoscaler.decide import (
    KEPT_STRANDED,
    PLAN_DRAIN,
    RECLAIM_HOLD_S,
    SOLO_PROBE_S,
    ControlOptions,
    InstanceAction,
    RoundDecision,
    StepDecision,
    Timeouts,
    WaitPolicy,
    advance,
    decide,
)
from autoscaler.execution import ResourceLimits
from autoscaler.jobs import JobSpec, TraceFacts
from autoscaler.planner import Plan
from autoscaler.store import (
    InstanceRecord,
    InstanceStatus,
    InterruptionRecord,
    JobRecord,
    StateSnapshot,
    TaskRecord,
    TaskStatus,
    TaskUpdate,
)
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from tests.builders import KeepPlanner, itype
from tests.builders import job as unmeasured_job

CATALOG = Catalog(
    [
        itype("gpu4", 4, 16, 64, 3.0, family="g"),
        itype("cpu8", 0, 8, 32, 0.4, family="c"),
        itype("cpu4", 0, 4, 16, 0.2, family="c"),
    ]
)
TIMEOUTS = Timeouts(boot_s=900.0, register_s=900.0, start_s=1800.0, checkpoint_s=900.0)
OPTIONS = ControlOptions(timeouts=TIMEOUTS, max_attempts=3)


# -- fabricated state ------------------------------------------------------------------------


def job(job_id: str, *demands: tuple[float, float, float]) -> JobSpec:
    """A job with one task per demand, `<job_id>/<i>`, whose solo speed is known."""
    return unmeasured_job(job_id, *demands, full_throughput=1.0)


def record(spec: JobSpec, *, solo: float | None = None) -> JobRecord:
    return JobRecord(spec, "running", "alice", 0.0, solo_throughput=solo)


def task(
    task_id: str,
    status: TaskStatus = "pending",
    *,
    on: str | None = None,
    target: str | None = None,
    since: float = 0.0,
    attempt: int = 0,
    failures: int = 0,
    gpus: tuple[int, ...] = (),
    checkpoint: str | None = None,
) -> TaskRecord:
    return TaskRecord(
        task_id,
        task_id.split("/")[0],
        status,
        instance_id=on,
        target_instance_id=target,
        checkpoint=checkpoint,
        attempt=attempt,
        failures=failures,
        status_since=since,
        gpus=gpus,
    )


def instance(
    instance_id: str,
    instance_type: str = "cpu8",
    status: InstanceStatus = "running",
    *,
    ready: bool = True,
    cloud_id: str | None = "default",
    requested_at: float = 0.0,
    running_at: float = 10.0,
    lost_at: float | None = None,
    reason: str = "",
) -> InstanceRecord:
    history: tuple[tuple[str, float], ...] = (("requested", requested_at),)
    if status not in ("requested", "pending"):
        history += (("pending", requested_at + 1.0), ("running", running_at))
    if status != "running" and status not in ("requested", "pending"):
        history += ((status, running_at + 1.0),)
    return InstanceRecord(
        instance_id,
        instance_type,
        status,
        CATALOG[instance_type].hourly_cost,
        requested_at,
        cloud_id=f"i-{instance_id}" if cloud_id == "default" else cloud_id,
        history=history,
        ready_at=running_at + 5.0 if ready else None,
        lost_at=lost_at,
        reason=reason,
    )


def snapshot(
    jobs: Sequence[JobRecord],
    tasks: Iterable[TaskRecord] = (),
    instances: Sequence[InstanceRecord] = (),
    *,
    requested: int | None = None,
) -> StateSnapshot:
    """Tasks not given are pending and unplaced."""
    given = {t.task_id: t for t in tasks}
    every = {t.task_id: given.get(t.task_id, task(t.task_id)) for j in jobs for t in j.spec.tasks}
    return StateSnapshot(
        tuple(jobs),
        every,
        tuple(instances),
        ThroughputTable(),
        instances_requested=len(instances) if requested is None else requested,
        job_events=len(jobs),
        last_round_job_events=len(jobs),
    )


class Placing:
    """A planner that puts every task of the view where `place` says (an instance that
    exists, or a type name for a new one); it keeps only the instances it places on."""

    name = "placing"

    def __init__(self, place: Callable[[str], str]) -> None:
        self.place = place
        self.views: list[ClusterView] = []

    def plan(self, view: ClusterView) -> Plan:
        self.views.append(view)
        existing = {i.instance_id: i for i in view.current}
        hosted: dict[str, list[str]] = {}
        for spec in view.jobs:
            for t in spec.tasks:
                hosted.setdefault(self.place(t.task_id), []).append(t.task_id)
        instances = [
            Instance(iid, inst.type, tuple(hosted.pop(iid)))
            for iid, inst in existing.items()
            if iid in hosted
        ]
        instances += [Instance(None, CATALOG[name], tuple(ts)) for name, ts in hosted.items()]
        return Plan(Configuration(tuple(instances)), "partial", (), 1.0, 0.0, "as placed")


def round_at(
    snap: StateSnapshot,
    now: float,
    *,
    planner: KeepPlanner | Placing | None = None,
    options: ControlOptions = OPTIONS,
    unavailable: Sequence[UnavailableOffering] = (),
    orphans: Sequence[CloudInstance] = (),
    reclaims: Sequence[InterruptionRecord] = (),
) -> RoundDecision:
    return decide(
        snap,
        CATALOG,
        unavailable,
        options,
        planner=planner or KeepPlanner(),
        now=now,
        orphans=orphans,
        reclaims=reclaims,
    )


def step_at(snap: StateSnapshot, now: float, **world: object) -> StepDecision:
    return advance(snap, CATALOG, OPTIONS, now=now, **world)  # type: ignore[arg-type]


def updated(step: StepDecision, task_id: str) -> TaskUpdate:
    [update] = [u for u in step.updates if u.task_id == task_id]
    return update


# -- a round: launches and their guardrails ----------------------------------------------------


def test_a_planned_instance_is_launched_under_the_next_token_with_its_tasks_targeted():
    snap = snapshot([record(job("a", (0, 2, 8)))], instances=[instance("inst-1")], requested=1)
    decision = round_at(snap, 100.0, planner=Placing(lambda t: "cpu4"))
    [launch] = decision.launches
    assert (launch.instance_id, launch.instance_type, launch.tasks) == ("inst-2", "cpu4", ("a/0",))
    assert launch.hourly_price == CATALOG["cpu4"].hourly_cost
    assert decision.targets == {"a/0": "inst-2"}
    assert [(m.kind, m.target, m.detail) for m in decision.moves] == [
        ("start", "a/0", {"to": "inst-2"})
    ]


def test_a_launch_over_the_instance_cap_is_refused_with_its_numbers():
    snap = snapshot([record(job("a", (0, 2, 8)))], instances=[instance("inst-1")])
    options = ControlOptions(timeouts=TIMEOUTS, guardrails=Guardrails(max_instances=1))
    decision = round_at(snap, 100.0, planner=Placing(lambda t: "cpu4"), options=options)
    assert decision.launches == ()
    [refused] = decision.refused
    assert (refused.instance_type, refused.tasks, refused.rule) == (
        "cpu4",
        ("a/0",),
        "max_instances",
    )
    assert "would make 2 instances, over the limit of 1" in refused.message
    assert decision.targets == {"a/0": None}  # placed nowhere: it waits
    launches = [a for a in decision.record().actions if a.kind == "launch"]
    assert [(a.target, a.outcome, a.message) for a in launches] == [
        ("cpu4", "refused", refused.message)
    ]


def test_a_launch_over_the_hourly_budget_is_refused_and_its_task_stays_where_it_was():
    # cpu8 costs $0.40/h; a cpu4 more ($0.20/h) would make $0.60/h, over $0.50/h.
    on_one = task("a/0", "running", on="inst-1", target="inst-1")
    snap = snapshot([record(job("a", (0, 2, 8)))], [on_one], [instance("inst-1")])
    options = ControlOptions(timeouts=TIMEOUTS, guardrails=Guardrails(max_hourly_spend=0.5))
    decision = round_at(snap, 100.0, planner=Placing(lambda t: "cpu4"), options=options)
    [refused] = decision.refused
    assert refused.rule == "max_hourly_spend"
    assert "from $0.40/h to $0.60/h, over the budget of $0.50/h" in refused.message
    assert decision.targets == {"a/0": "inst-1"}
    assert decision.drains == ()  # the refused launch left a task on it: kept


def test_an_instance_the_plan_no_longer_uses_is_drained():
    snap = snapshot([record(job("a", (0, 2, 8)))], instances=[instance("inst-1")])
    decision = round_at(snap, 100.0, planner=Placing(lambda t: "cpu4"))
    assert decision.drains == (
        InstanceAction("inst-1", "the plan no longer uses it: drain, then terminate", "draining"),
    )


def stranded(source_reason: str) -> StateSnapshot:
    """a/0 runs on inst-1, drained for a move to inst-2, which the cloud lost before the
    task got there (inst-2 is no longer among the live instances)."""
    on_one = task("a/0", "running", on="inst-1", target="inst-2")
    source = instance("inst-1", status="draining", reason=source_reason)
    return snapshot([record(job("a", (0, 2, 8)))], [on_one], [source], requested=2)


def test_a_drained_instance_whose_task_lost_its_destination_is_planned_and_taken_back():
    keeper = Placing(lambda t: "inst-1")
    decision = round_at(stranded(PLAN_DRAIN), 100.0, planner=keeper)
    # the plan saw it as live, with its task on it, and kept it: no launch, no drain
    [view] = keeper.views
    assert [(i.instance_id, i.tasks) for i in view.current] == [("inst-1", ("a/0",))]
    assert decision.launches == () and decision.drains == ()
    assert decision.targets == {"a/0": "inst-1"}
    assert decision.keeps == (InstanceAction("inst-1", KEPT_STRANDED, "running"),)
    assert [(a.kind, a.target, a.outcome) for a in decision.record().actions] == [
        ("migrate", "a/0", "planned"),
        ("adopt", "inst-1", "done"),
    ]
    assert decision.intents().instance_changes()[0].status == "running"


def test_a_stranded_instance_the_plan_does_not_keep_stays_draining_without_a_second_drain():
    decision = round_at(stranded(PLAN_DRAIN), 100.0, planner=Placing(lambda t: "cpu4"))
    [launch] = decision.launches
    assert decision.targets == {"a/0": launch.instance_id}
    assert decision.keeps == () and decision.drains == ()


def test_an_operators_drain_is_never_taken_back():
    keeper = Placing(lambda t: "cpu4")
    decision = round_at(stranded("drained by the operator: its tasks move"), 100.0, planner=keeper)
    [view] = keeper.views
    assert list(view.current) == []  # not plannable: the task is placed anew
    assert decision.keeps == ()


def test_a_draining_instance_whose_task_still_has_a_live_destination_stays_out_of_the_plan():
    on_one = task("a/0", "running", on="inst-1", target="inst-2")
    source = instance("inst-1", status="draining", reason=PLAN_DRAIN)
    booting = instance("inst-2", "cpu4", "pending", ready=False)
    keeper = Placing(lambda t: "inst-2")
    snap = snapshot([record(job("a", (0, 2, 8)))], [on_one], [source, booting])
    decision = round_at(snap, 100.0, planner=keeper)
    [view] = keeper.views
    assert [(i.instance_id, i.tasks) for i in view.current] == [("inst-2", ("a/0",))]
    assert decision.keeps == ()


def test_a_round_with_no_jobs_and_no_instances_plans_nothing():
    decision = round_at(snapshot([]), 100.0)
    assert (decision.chosen, decision.reason, decision.plan) == ("none", "no jobs", None)


# -- a round: waiting for room a departure frees ---------------------------------------------------

WAIT = dataclasses.replace(OPTIONS, waiting=WaitPolicy(jct_factor=1.05, min_saving=0.1))


def worked(job_id: str, demand: tuple[float, float, float], seconds: float, **fields) -> JobSpec:
    """A one-task job whose work the trace states: `seconds` alone at one iteration a second."""
    return unmeasured_job(
        job_id,
        demand,
        full_throughput=1.0,
        trace=TraceFacts(total_iters=seconds),
        **fields,
    )


def resident_leaving_in(left_s: float, *others: JobRecord, now: float = 1000.0) -> StateSnapshot:
    """inst-1 (cpu8) runs r/0 (6 of its 8 CPUs), which has `left_s` seconds of work left;
    `others` are newly arrived jobs, pending."""
    resident = worked("r", (0, 6, 8), 100_000.0)
    return snapshot(
        [JobRecord(resident, "running", "alice", 0.0, started_at=1.0), *others],
        [
            dataclasses.replace(
                task("r/0", "running", on="inst-1", target="inst-1"), progress=100_000.0 - left_s
            )
        ],
        [instance("inst-1")],
    )


def newcomer(job_id: str = "n", cpus: float = 4, seconds: float = 100_000.0, **fields) -> JobRecord:
    """A job submitted at 0 whose budget at factor 1.05 is 5% of `seconds`."""
    return JobRecord(worked(job_id, (0, cpus, 8), seconds, **fields), "queued", "bob", 0.0)


def cpu4_for_new(task_id: str) -> str:
    return "inst-1" if task_id.startswith("r/") else "cpu4"


def test_a_new_job_waits_for_room_a_departure_frees_within_its_budget():
    # n/0 would open a cpu4 at exactly its reservation price; r/0 leaves in 1,000 s, well
    # inside n's 5,000 s budget, and then inst-1 has room for it
    snap = resident_leaving_in(1000.0, newcomer())
    decision = round_at(snap, 1000.0, planner=Placing(cpu4_for_new), options=WAIT)
    assert decision.launches == ()
    assert decision.targets["n/0"] is None and decision.targets["r/0"] == "inst-1"
    assert set(decision.numbers["waiting_for_room"]) == {"n"}
    # without the rule the same round launches it
    plain = round_at(snap, 1000.0, planner=Placing(cpu4_for_new))
    assert [launch.tasks for launch in plain.launches] == [("n/0",)]


@pytest.mark.parametrize(
    ("left_s", "arrival", "now", "fields", "policy"),
    [
        (6000.0, {}, 1000.0, {}, WaitPolicy(1.05, 0.1)),  # r/0 leaves after n's budget
        (1000.0, {}, 5500.0, {}, WaitPolicy(1.05, 0.1)),  # n has waited its budget out
        (1000.0, {}, 1000.0, {"max_jct_factor": 3.0}, WaitPolicy(1.05, 0.1)),  # a deadline
        (1000.0, {}, 1000.0, {}, WaitPolicy(1.05, 0.0)),  # the cpu4 saves what is asked
        (1000.0, {"cpus": 6}, 1000.0, {}, WaitPolicy(1.05, 0.1)),  # 6 CPUs: no room even then
        (1000.0, {"seconds": 10_000.0}, 1000.0, {}, WaitPolicy(1.05, 0.1)),  # budget 500 s
    ],
)
def test_a_new_job_is_placed_at_once_when_waiting_is_not_worth_it(
    left_s, arrival, now, fields, policy
):
    snap = resident_leaving_in(left_s, newcomer(**arrival, **fields))
    options = dataclasses.replace(OPTIONS, waiting=policy)
    decision = round_at(snap, now, planner=Placing(cpu4_for_new), options=options)
    assert [launch.tasks for launch in decision.launches] == [("n/0",)]
    assert "waiting_for_room" not in decision.numbers


def test_a_job_that_has_started_is_never_held_back():
    n = newcomer()
    snap = resident_leaving_in(1000.0, dataclasses.replace(n, started_at=500.0))
    decision = round_at(snap, 1000.0, planner=Placing(cpu4_for_new), options=WAIT)
    assert [launch.tasks for launch in decision.launches] == [("n/0",)]


def test_two_new_jobs_do_not_both_count_on_the_same_room():
    # once r/0 leaves, inst-1's 8 CPUs take two 4-CPU tasks, not three
    snap = resident_leaving_in(1000.0, newcomer("n"), newcomer("m"), newcomer("k"))
    types = {"r": "inst-1", "n": "cpu4", "m": "cpu8", "k": "gpu4"}  # one new instance each
    decision = round_at(
        snap, 1000.0, planner=Placing(lambda t: types[t.split("/")[0]]), options=WAIT
    )
    assert set(decision.numbers["waiting_for_room"]) == {"n", "m"}  # in the plan's order
    assert [(launch.instance_type, launch.tasks) for launch in decision.launches] == [
        ("gpu4", ("k/0",))
    ]


# -- a round: what cannot be planned -----------------------------------------------------------


def test_a_task_that_fits_no_available_type_waits_with_its_reason_and_the_rest_is_planned():
    gpu, cpu = job("g", (2, 4, 16)), job("c", (0, 2, 8))
    out_of_stock = UnavailableOffering("gpu4", None, 400.0, "no capacity in any zone")
    planner = Placing(lambda t: "cpu4")
    decision = round_at(
        snapshot([record(gpu), record(cpu)]), 100.0, planner=planner, unavailable=[out_of_stock]
    )
    assert decision.infeasible == {
        "g/0": "fits no instance type available now (gpu4: no capacity in any zone; "
        "retried after 300 s); it waits and is planned again every round"
    }
    [view] = planner.views
    assert [j.job_id for j in view.jobs] == ["c"]
    assert "gpu4" not in view.catalog
    assert decision.targets["g/0"] is None and decision.targets["c/0"] is not None


def test_an_offering_with_a_reclaim_notice_is_held_for_the_hold_and_only_it():
    # gpu4's capacity is being taken back (a notice at 100 s): a task that fits only
    # gpu4 waits, with the notice as its reason, until the hold ends; a rebalance
    # recommendation for cpu4 holds nothing, and neither does an older notice.
    gpu, cpu = job("g", (2, 4, 16)), job("c", (0, 2, 8))
    history = [
        InterruptionRecord("gpu4", "inst-7", 100.0, "reclaim", "spot interruption notice"),
        InterruptionRecord("cpu4", "inst-8", 100.0, "rebalance", "rebalance recommendation"),
        InterruptionRecord("cpu4", "inst-9", 100.0 - RECLAIM_HOLD_S, "reclaim", "old"),
    ]
    snap = snapshot([record(gpu), record(cpu)])
    held = round_at(snap, 105.0, planner=Placing(lambda t: "cpu4"), reclaims=history)
    assert set(held.infeasible) == {"g/0"}
    assert "inst-7: spot interruption notice" in held.infeasible["g/0"]
    assert f"retried after {RECLAIM_HOLD_S - 5.0:.0f} s" in held.infeasible["g/0"]
    after = round_at(
        snap, 100.0 + RECLAIM_HOLD_S, planner=Placing(lambda t: "cpu4"), reclaims=history
    )
    assert after.infeasible == {}


def test_an_orphan_is_reported_within_its_grace_and_terminated_after_it():
    options = ControlOptions(timeouts=TIMEOUTS, orphans=OrphanPolicy("terminate", grace_s=300.0))
    orphan = CloudInstance("i-stray", "cpu4", "running", instance_id="x-9", launched_at_s=0.0)
    young = round_at(snapshot([]), 100.0, options=options, orphans=[orphan])
    [judged] = young.orphans
    assert judged.action == "report" and "within the 300 s grace period" in judged.reason
    old = round_at(snapshot([]), 301.0, options=options, orphans=[orphan])
    [judged] = old.orphans
    assert judged.action == "terminate"
    [action] = old.actions()
    assert (action.kind, action.target, action.detail["orphan"]) == ("terminate", "i-stray", True)


# -- a round and a step: instances given up ----------------------------------------------------


def test_a_launch_that_never_boots_is_given_up_failed_without_a_cloud_id():
    never = instance("inst-1", status="requested", cloud_id=None, requested_at=0.0)
    assert round_at(snapshot([], instances=[never]), 900.0).terminations == ()
    [action] = round_at(snapshot([], instances=[never]), 901.0).terminations
    assert action == InstanceAction(
        "inst-1", "still requested 901 s after its launch request (limit 900 s)", "failed"
    )


def test_a_boot_that_times_out_with_a_cloud_id_is_terminated():
    pending = instance("inst-1", status="pending", requested_at=0.0)
    [action] = step_at(snapshot([], instances=[pending]), 950.0).terminations
    assert (action.status, action.reason) == (
        "terminating",
        "still pending 950 s after its launch request (limit 900 s)",
    )


def test_a_worker_that_never_registers_is_given_up():
    silent = instance("inst-1", ready=False, running_at=100.0)
    assert step_at(snapshot([], instances=[silent]), 1000.0).terminations == ()
    [action] = step_at(snapshot([], instances=[silent]), 1001.0).terminations
    assert action == InstanceAction(
        "inst-1", "its worker did not register within 900 s of the instance running"
    )


def test_a_lost_worker_terminates_its_instance_and_asks_for_a_round():
    lost = instance("inst-1", lost_at=50.0, reason="no heartbeat for 60 s")
    moving = task("a/0", "running", on="inst-1", target="inst-2")
    spare = instance("inst-2")
    step = step_at(snapshot([record(job("a", (0, 2, 8)))], [moving], [lost, spare]), 60.0)
    assert step.terminations == (InstanceAction("inst-1", "worker lost: no heartbeat for 60 s"),)
    assert step.replan
    assert step.stops == () and step.updates == ()  # its task is left to sync to report


# -- a step: tasks stuck ------------------------------------------------------------------------


def test_a_task_stuck_starting_is_a_failed_attempt_sent_back_to_pending():
    spec = job("a", (0, 2, 8))
    stuck = task("a/0", "starting", on="inst-1", target="inst-1", since=0.0, attempt=1)
    snap = snapshot([record(spec)], [stuck], [instance("inst-1")])
    assert step_at(snap, 1800.0).updates == ()
    step = step_at(snap, 1801.0)
    reason = "attempt 1 still starting after 1801 s (limit 1800 s)"
    assert updated(step, "a/0") == TaskUpdate(
        "a/0",
        status="pending",
        instance_id=None,
        failures=1,
        reason="attempt 1 failed (transient): still starting after 1801 s (limit 1800 s)",
        throughput=None,
        gpus=(),
        retries=1,
        failure="transient",
        retry_at=1801.0 + OPTIONS.backoff.delay_s(1),
    )
    assert [(s.task_id, s.attempt, s.reason) for s in step.stops] == [("a/0", 1, reason)]
    assert step.failed_jobs == ()


def test_a_task_stuck_checkpointing_for_the_last_allowed_time_fails_its_job():
    spec = job("a", (0, 2, 8))
    stuck = task("a/0", "checkpointing", on="inst-1", target=None, since=0.0, attempt=3, failures=2)
    step = step_at(snapshot([record(spec)], [stuck], [instance("inst-1")]), 901.0)
    assert updated(step, "a/0").failures == 3
    [(job_id, why)] = step.failed_jobs
    assert job_id == "a"
    assert why.startswith(
        "task a/0 failed 3 times; last: attempt 3 failed (transient): still checkpointing after"
    )


@pytest.mark.parametrize("failing_first", [True, False])
def test_no_task_of_a_job_failing_in_this_step_is_started(failing_first):
    # Whichever of its tasks the snapshot lists first.
    spec = job("a", (0, 2, 8), (0, 2, 8))
    stuck = task("a/0", "starting", on="inst-1", target="inst-1", since=0.0, failures=2)
    waiting = task("a/1", target="inst-1")
    order = [stuck, waiting] if failing_first else [waiting, stuck]
    snap = StateSnapshot(
        (record(spec),), {t.task_id: t for t in order}, (instance("inst-1"),), ThroughputTable()
    )
    step = step_at(snap, 2000.0)
    assert [j for j, _ in step.failed_jobs] == ["a"]
    assert step.starts == ()


# -- a step: make before break -------------------------------------------------------------------


def test_a_task_leaves_only_once_its_destination_is_ready():
    spec = job("a", (0, 2, 8))
    moving = task("a/0", "running", on="inst-1", target="inst-2", attempt=1)
    booting = instance("inst-2", ready=False)
    snap = snapshot([record(spec)], [moving], [instance("inst-1"), booting])
    assert step_at(snap, 100.0).stops == ()  # it keeps running where it is

    ready = snapshot([record(spec)], [moving], [instance("inst-1"), instance("inst-2")])
    # Registered once, but its worker cannot be reached right now: still not.
    assert step_at(ready, 100.0, ready=frozenset({"inst-1"})).stops == ()
    step = step_at(ready, 100.0, ready=frozenset({"inst-1", "inst-2"}))
    assert [(s.task_id, s.attempt, s.reason) for s in step.stops] == [
        ("a/0", 1, "moving to inst-2")
    ]
    assert updated(step, "a/0") == TaskUpdate(
        "a/0", status="checkpointing", reason="moving to inst-2", moves=1
    )


def test_a_task_no_longer_planned_is_checkpointed_and_stopped_at_once():
    spec = job("a", (0, 2, 8))
    unplanned = task("a/0", "running", on="inst-1", target=None, attempt=2)
    step = step_at(snapshot([record(spec)], [unplanned], [instance("inst-1")]), 100.0)
    assert [(s.task_id, s.attempt, s.reason) for s in step.stops] == [
        ("a/0", 2, "no longer planned")
    ]


def test_a_task_already_checkpointing_is_not_asked_to_stop_again():
    spec = job("a", (0, 2, 8))
    leaving = task("a/0", "checkpointing", on="inst-1", target="inst-2", since=90.0)
    snap = snapshot([record(spec)], [leaving], [instance("inst-1"), instance("inst-2")])
    step = step_at(snap, 100.0)
    assert step.stops == () and step.updates == ()


def test_a_task_starts_on_its_destination_only_once_the_tasks_leaving_it_are_gone():
    # cpu4 has 4 cores: the leaving task's 3 and the arriving task's 2 do not fit together.
    leaving, arriving = job("l", (0, 3, 8)), job("n", (0, 2, 8))
    dest = instance("inst-1", "cpu4")
    still_there = task("l/0", "running", on="inst-1", target=None, attempt=1)
    waiting = task("n/0", target="inst-1")
    step = step_at(
        snapshot([record(leaving), record(arriving)], [still_there, waiting], [dest]), 100.0
    )
    assert [s.task_id for s in step.stops] == ["l/0"]
    assert step.starts == ()

    gone = task("l/0", "pending", on=None, target=None, attempt=1, checkpoint="s3://b/l0")
    step = step_at(snapshot([record(leaving), record(arriving)], [gone, waiting], [dest]), 130.0)
    [start] = step.starts
    assert (start.task_id, start.instance_id, start.attempt) == ("n/0", "inst-1", 1)


def test_a_pending_task_starts_on_its_ready_target_with_its_limits_and_checkpoint():
    spec = job("a", (0, 2, 8))
    resuming = task("a/0", target="inst-1", attempt=2, checkpoint="s3://b/ckpt-2")
    step = step_at(snapshot([record(spec)], [resuming], [instance("inst-1")]), 100.0)
    [start] = step.starts
    assert (start.task_id, start.job_id, start.attempt, start.instance_id) == (
        "a/0",
        "a",
        3,
        "inst-1",
    )
    assert start.limits == ResourceLimits(2.0, 8.0, (), None)
    assert start.checkpoint == "s3://b/ckpt-2"
    assert updated(step, "a/0") == TaskUpdate(
        "a/0",
        status="starting",
        instance_id="inst-1",
        attempt=3,
        reason="attempt 3 on inst-1 from its checkpoint",
        gpus=(),
    )


def test_gpus_are_picked_least_loaded():
    # GPUs 0 and 2 are taken, one task each: a two-GPU task gets the idle 1 and 3.
    specs = [job("x", (1, 2, 8)), job("y", (1, 2, 8)), job("z", (2, 2, 8))]
    tasks = [
        task("x/0", "running", on="g", target="g", gpus=(0,)),
        task("y/0", "running", on="g", target="g", gpus=(2,)),
        task("z/0", target="g"),
    ]
    step = step_at(snapshot([record(s) for s in specs], tasks, [instance("g", "gpu4")]), 100.0)
    [start] = step.starts
    assert start.limits.gpus == (1, 3)
    assert updated(step, "z/0").gpus == (1, 3)


# -- a step: instances ---------------------------------------------------------------------------


def test_a_drained_instance_terminates_once_no_task_is_left_on_it():
    spec = job("a", (0, 2, 8))
    draining = instance("inst-1", status="draining")
    leaving = task("a/0", "checkpointing", on="inst-1", target="inst-2", since=90.0)
    busy = snapshot([record(spec)], [leaving], [draining, instance("inst-2")])
    assert step_at(busy, 100.0).terminations == ()
    moved = task("a/0", "pending", target="inst-2")
    empty = snapshot([record(spec)], [moved], [draining, instance("inst-2")])
    assert step_at(empty, 120.0).terminations == (
        InstanceAction("inst-1", "drained: no task left on it"),
    )


def test_a_requested_instance_the_cloud_never_confirmed_is_asked_for_again():
    unconfirmed = instance("inst-1", status="requested", cloud_id=None, requested_at=50.0)
    confirmed = instance("inst-2", status="requested", cloud_id="i-2", requested_at=50.0)
    assert step_at(snapshot([], instances=[unconfirmed, confirmed]), 100.0).relaunch == ("inst-1",)


def test_a_terminating_instance_the_cloud_still_runs_is_terminated_again():
    going = [instance("inst-1", status="terminating"), instance("inst-2", status="terminating")]
    step = step_at(
        snapshot([], instances=going),
        100.0,
        listed={"inst-1": "running", "inst-2": "shutting-down"},
    )
    assert step.reterminate == ("inst-1",)


def test_a_task_of_a_job_no_longer_active_is_stopped():
    step = step_at(snapshot([]), 100.0, strays=[("gone/0", 4)])
    assert [(s.task_id, s.attempt, s.reason) for s in step.stops] == [
        ("gone/0", 4, "its job is no longer active")
    ]
    assert step  # something to do


# -- a round: learning a job's solo speed ---------------------------------------------------------


def test_a_job_of_unknown_solo_speed_runs_alone_first():
    known = job("k", (0, 2, 8))
    unknown = unmeasured_job("u", (0, 1, 4))  # no full_throughput, none learned yet
    on_one = task("k/0", "running", on="inst-1", target="inst-1")
    snap = snapshot([record(known), record(unknown)], [on_one], [instance("inst-1")])
    planner = Placing(lambda t: "inst-1")  # would pack everything on inst-1
    decision = round_at(snap, 100.0, planner=planner)
    assert [j.job_id for j in planner.views[0].jobs] == ["k"]
    [launch] = decision.launches
    assert (launch.instance_type, launch.tasks) == ("cpu4", ("u/0",))  # its cheapest type
    assert "1 job(s) alone until their solo speed is measured: u" in decision.reason

    # Measured since (its solo throughput learned): planned with the others.
    planner = Placing(lambda t: "inst-1")
    snap = snapshot([record(known), record(unknown, solo=5.0)], [on_one], [instance("inst-1")])
    decision = round_at(snap, 100.0, planner=planner)
    assert sorted(j.job_id for j in planner.views[0].jobs) == ["k", "u"]
    assert decision.launches == () and decision.targets["u/0"] == "inst-1"


def test_a_job_alone_past_the_probe_without_a_throughput_is_packed():
    unknown = unmeasured_job("u", (0, 1, 4))
    alone = task("u/0", "running", on="inst-1", target="inst-1", since=0.0)
    snap = snapshot([record(unknown)], [alone], [instance("inst-1", "cpu4")])
    planner = Placing(lambda t: "inst-1")
    round_at(snap, SOLO_PROBE_S - 1.0, planner=planner)
    assert planner.views == []  # still probing: the planner is not asked about it
    round_at(snap, SOLO_PROBE_S + 1.0, planner=planner)
    assert [j.job_id for j in planner.views[0].jobs] == ["u"]


# -- a step: failures and moves ----------------------------------------------------------------


def test_a_task_waiting_out_its_back_off_is_not_started_until_it_ends():
    spec = job("a", (0, 2, 8))
    waiting = dataclasses.replace(task("a/0", target="inst-1", attempt=1), retry_at=130.0)
    snap = snapshot([record(spec)], [waiting], [instance("inst-1")])
    assert step_at(snap, 129.0).starts == ()
    [launch] = step_at(snap, 130.0).starts
    assert (launch.task_id, launch.attempt) == ("a/0", 2)


def test_a_task_the_plan_moves_counts_a_move_and_no_retry():
    spec = job("a", (0, 2, 8))
    moving = dataclasses.replace(task("a/0", "running", on="inst-1", target="inst-2"), moves=2)
    snap = snapshot([record(spec)], [moving], [instance("inst-1"), instance("inst-2")])
    update = updated(step_at(snap, 100.0), "a/0")
    assert (update.moves, update.retries, update.failures) == (3, None, None)


def test_a_stuck_start_is_a_transient_failure_with_its_back_off():
    spec = job("a", (0, 2, 8))
    stuck = task("a/0", "starting", on="inst-1", target="inst-1", since=0.0, attempt=2, failures=1)
    update = updated(
        step_at(snapshot([record(spec)], [stuck], [instance("inst-1")]), 1801.0), "a/0"
    )
    assert (update.failure, update.failures) == ("transient", 2)
    assert update.retry_at == 1801.0 + OPTIONS.backoff.delay_s(2)


# -- a round: drain --job --------------------------------------------------------------------------


def test_a_task_drained_off_its_instance_alone_moves_and_its_neighbour_stays():
    a, b = job("a", (0, 2, 8)), job("b", (0, 2, 8))
    drained = dataclasses.replace(
        task("a/0", "running", on="inst-1", target="inst-1"), drain_from="inst-1"
    )
    neighbour = task("b/0", "running", on="inst-1", target="inst-1")
    snap = snapshot([record(a), record(b)], [drained, neighbour], [instance("inst-1")])
    decision = round_at(snap, 100.0)  # the planner keeps both where they are
    assert decision.targets["b/0"] == "inst-1"
    assert decision.targets["a/0"] not in (None, "inst-1")
    [launch] = decision.launches  # no other instance has room: the cheapest that fits
    assert (launch.instance_type, launch.tasks) == ("cpu4", ("a/0",))
    assert decision.drains == ()  # the instance stays


def test_a_drained_task_goes_to_another_planned_instance_with_room_before_a_new_one():
    a, b = job("a", (0, 2, 8)), job("b", (0, 2, 8))
    drained = dataclasses.replace(
        task("a/0", "running", on="inst-1", target="inst-1"), drain_from="inst-1"
    )
    elsewhere = task("b/0", "running", on="inst-2", target="inst-2")
    snap = snapshot(
        [record(a), record(b)], [drained, elsewhere], [instance("inst-1"), instance("inst-2")]
    )
    decision = round_at(snap, 100.0)
    assert decision.targets["a/0"] == "inst-2" and decision.launches == ()
    # inst-1 held only the drained task: the plan no longer uses it
    assert [d.instance_id for d in decision.drains] == ["inst-1"]


def test_a_drained_task_that_started_elsewhere_forgets_the_drain():
    spec = job("a", (0, 2, 8))
    leaving = dataclasses.replace(task("a/0", target="inst-2", attempt=1), drain_from="inst-1")
    snap = snapshot([record(spec)], [leaving], [instance("inst-1"), instance("inst-2")])
    assert updated(step_at(snap, 100.0), "a/0").drain_from == ""
