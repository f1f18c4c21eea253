"""Spot interruption notices: read from IMDSv2, carried by heartbeats, acted on by the round.

The watcher polls the metadata stand-in (`tests.imds.ImdsServer`) as on EC2; then
the round logic (`autoscaler.control`) drives real agents through `GrpcExecutor`
(simulated containers, no Docker): a notice stops the task with its checkpoint,
the daemon marks the instance reclaimed and plans the task elsewhere at once,
without counting a failure, and records the interruption with its offering.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from app.wiring import StateLedger
from autoscaler.catalog import SPOT, Catalog, InstanceType, LaunchDelays
from autoscaler.cloud import CloudInstance, LaunchRequest, UnavailableOffering
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.decide import RECLAIM_HOLD_S
from autoscaler.execution import INSTANCE_ACTION, REBALANCE, InstanceNotice
from autoscaler.jobs import JobSpec, TaskRun, TaskSpec
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from executor.agent import Agent
from executor.interruption import Notice, NoticeWatcher, parse_notice
from executor.simulated import SimulatedRuntime
from state.memory import InMemoryStore
from tests.executor.conftest import PATIENCE_S, Daemon, checkpointed_step, job_context
from tests.imds import ImdsServer

# -- the watcher --------------------------------------------------------------------------------


@pytest.fixture
def imds():
    server = ImdsServer()
    yield server
    server.close()


def test_no_notice_is_a_404_and_nothing_is_handed_over(imds):
    seen: list[Notice] = []
    watcher = NoticeWatcher(imds.url, seen.append)
    assert watcher.poll() == [] and seen == []
    # IMDSv2: a session token first, then both paths with it.
    assert imds.requests[0] == "PUT /latest/api/token"
    assert "GET /latest/meta-data/spot/instance-action" in imds.requests
    assert "GET /latest/meta-data/events/recommendations/rebalance" in imds.requests


def test_an_instance_action_is_handed_over_once(imds):
    seen: list[Notice] = []
    watcher = NoticeWatcher(imds.url, seen.append)
    imds.notify_reclaim("2026-11-26T19:00:00Z")
    assert watcher.poll() == [Notice(INSTANCE_ACTION, "terminate", "2026-11-26T19:00:00Z")]
    assert watcher.poll() == []  # the same notice, still published: not again
    assert seen == [Notice(INSTANCE_ACTION, "terminate", "2026-11-26T19:00:00Z")]


def test_a_rebalance_recommendation_is_its_own_notice(imds):
    seen: list[Notice] = []
    watcher = NoticeWatcher(imds.url, seen.append)
    imds.recommend_rebalance("2026-11-26T18:50:00Z")
    watcher.poll()
    imds.notify_reclaim("2026-11-26T19:00:00Z")
    watcher.poll()
    assert [n.kind for n in seen] == [REBALANCE, INSTANCE_ACTION]
    assert seen[0].time == "2026-11-26T18:50:00Z"


def test_an_expired_session_token_is_renewed(imds):
    seen: list[Notice] = []
    watcher = NoticeWatcher(imds.url, seen.append)
    watcher.poll()
    imds.expire_token()
    imds.notify_reclaim("2026-11-26T19:00:00Z")
    assert [n.kind for n in watcher.poll()] == [INSTANCE_ACTION]
    assert imds.requests.count("PUT /latest/api/token") == 2


def test_an_unreachable_metadata_service_is_no_notice():
    seen: list[Notice] = []
    watcher = NoticeWatcher("http://127.0.0.1:9", seen.append, timeout_s=0.5)
    assert watcher.poll() == [] and seen == []


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        (INSTANCE_ACTION, b'{"action": "stop", "time": "T"}', Notice(INSTANCE_ACTION, "stop", "T")),
        (REBALANCE, b'{"noticeTime": "T"}', Notice(REBALANCE, "", "T")),
        (INSTANCE_ACTION, b"not json", None),
        (INSTANCE_ACTION, b'{"time": "T"}', None),
        (REBALANCE, b"[]", None),
    ],
)
def test_notices_are_parsed_as_ec2_publishes_them(kind, body, expected):
    assert parse_notice(kind, body) == expected


# -- the round, with agents heeding notices ------------------------------------------------------

SPOT_BOX = InstanceType(
    "box:spot@z1",
    "f",
    Resources(0, 2, 4),
    0.3,
    LaunchDelays(19.0, 190.0),
    market=SPOT,
    zone="z1",
    ec2_type="box",
    interruption_per_hour=0.01,
)
CATALOG = Catalog([SPOT_BOX])


class SpotAgentsCloud:
    """A `Cloud` whose spot instances are agents in this process, each polling its own
    metadata stand-in for notices (for this test only)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.agents: dict[str, Agent] = {}
        self.imds: dict[str, ImdsServer] = {}
        self.gone: set[str] = set()

    def catalog(self) -> Catalog:
        return CATALOG

    def launch(self, request: LaunchRequest) -> CloudInstance:
        if request.instance_id not in self.agents:
            imds = self.imds[request.instance_id] = ImdsServer()
            self.agents[request.instance_id] = self.daemon.agent(
                request.instance_id,
                capacity=CATALOG[request.instance_type].capacity,
                runtime=SimulatedRuntime(),
                notice_endpoint=imds.url,
                notice_interval_s=0.05,
            )
        return self._view(request.instance_id)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for cloud_id in instance_ids:
            token = cloud_id.removeprefix("local-")
            self.gone.add(token)
            self.agents[token].close(grace_s=0)

    def list(self) -> list[CloudInstance]:
        return [self._view(token) for token in self.agents if token not in self.gone]

    def unavailable(self) -> list[UnavailableOffering]:
        return []

    def close(self) -> None:
        for imds in self.imds.values():
            imds.close()

    def _view(self, token: str) -> CloudInstance:
        return CloudInstance(f"local-{token}", SPOT_BOX.name, "running", "z1", token, 0.0, True)


class LoopClock:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def now(self) -> float:
        return self.daemon.clock()


@pytest.fixture
def cluster(daemon_on, tmp_path):
    store = InMemoryStore()
    daemon = daemon_on(f"file://{tmp_path}/store", {}, ledger=StateLedger(store))
    cloud = SpotAgentsCloud(daemon)
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        cloud,
        daemon.executor,
        store,
        LoopClock(daemon),
        ControlOptions(),
    )
    yield daemon, store, cloud, loop
    cloud.close()


def step_until(loop: ControlLoop, condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        loop.progress()
        time.sleep(0.05)


def training_job(job_id: str, context: str) -> JobSpec:
    task = TaskSpec(
        f"{job_id}/trainer",
        job_id,
        "trainer",
        f"{job_id}_trainer",
        (("any", Resources(0, 1, 1)),),
        run=TaskRun(
            build_context=context,
            env=(("STEP_S", "0.01"), ("TOTAL", "1000000")),
            checkpoint_every_s=0.2,
        ),
    )
    return JobSpec(job_id, job_id, (task,))


def test_a_reclaimed_spot_instance_hands_its_task_on_from_its_checkpoint(cluster, tmp_path):
    daemon, store, cloud, loop = cluster
    noticed: list[tuple[str, InstanceNotice]] = []
    daemon.executor.on_notice = lambda instance, notice: noticed.append((instance, notice))
    context = job_context(daemon.storage, tmp_path)
    store.submit_job(training_job("j1", context), owner="t", at=daemon.clock())
    loop.schedule()
    step_until(loop, lambda: store.tasks_of("j1")[0].status == "running", "the task runs")
    first = store.tasks_of("j1")[0].instance_id
    assert store.instance(first).hourly_price == 0.3  # the spot price it was bought at
    step_until(
        loop, lambda: store.tasks_of("j1")[0].checkpoint is not None, "a periodic checkpoint"
    )

    cloud.imds[first].notify_reclaim("2026-11-26T19:02:00Z")
    # The agent checkpoints and stops its task, and reports the notice at once.
    daemon.until(lambda r: first in r.notices, "the notice reaches the daemon")
    assert noticed == [
        (first, InstanceNotice(INSTANCE_ACTION, "terminate", "2026-11-26T19:02:00Z"))
    ]
    daemon.until(lambda r: r.tasks["j1/trainer"].state == "stopped", "the task stops")
    stopped = daemon.executor.report().tasks["j1/trainer"]
    assert stopped.failure == "infrastructure" and stopped.checkpoint

    # The round the notice asks for: the instance is reclaimed, never placed on again.
    loop.schedule()
    instance = store.instance(first)
    assert instance.reclaimed_at is not None
    assert "spot interruption notice" in instance.reason
    assert store.interruption_counts(0.0) == {SPOT_BOX.name: 1}
    [record] = store.interruptions()
    assert (record.offering, record.instance_id, record.kind) == (SPOT_BOX.name, first, "reclaim")

    # Its offering, the only one here, is held for RECLAIM_HOLD_S after the notice: the
    # task waits, with the notice as its reason, and nothing is launched into the pool
    # being reclaimed; once the hold is over, a new instance takes it.
    held = loop.schedule()
    assert store.tasks_of("j1")[0].status == "pending" and len(cloud.agents) == 1
    assert "spot interruption notice" in held.record.numbers["infeasible"]["j1/trainer"]
    daemon.clock.advance(RECLAIM_HOLD_S)

    def resumed_elsewhere() -> bool:
        loop.schedule()
        task = store.tasks_of("j1")[0]
        return task.status == "running" and task.instance_id not in (None, first)

    step_until(loop, resumed_elsewhere, "the task resumes on a new instance")
    task = store.tasks_of("j1")[0]
    assert task.attempt == 2 and task.failures == 0 and task.failure == "infrastructure"
    # It went on from the checkpoint taken as it stopped, not from the start.
    saved = checkpointed_step(daemon.storage, stopped.checkpoint, tmp_path)
    assert saved > 0 and task.progress >= saved
    # Emptied, the reclaimed instance is given up (the provider takes it anyway).
    step_until(loop, lambda: first in cloud.gone, "the reclaimed instance is terminated")
    rounds = [r for r in store.rounds() if "reclaimed" in r.numbers]
    assert rounds and rounds[0].numbers["reclaimed"][first]["offering"] == SPOT_BOX.name


def test_a_rebalance_recommendation_is_recorded_and_changes_nothing_else(cluster, tmp_path):
    daemon, store, cloud, loop = cluster
    context = job_context(daemon.storage, tmp_path)
    store.submit_job(training_job("j2", context), owner="t", at=daemon.clock())
    loop.schedule()
    step_until(loop, lambda: store.tasks_of("j2")[0].status == "running", "the task runs")
    first = store.tasks_of("j2")[0].instance_id

    cloud.imds[first].recommend_rebalance("2026-11-26T18:50:00Z")
    daemon.until(lambda r: first in r.notices, "the recommendation reaches the daemon")
    loop.schedule()
    assert [r.kind for r in store.interruptions()] == ["rebalance"]
    assert store.interruption_counts(0.0) == {}  # not a reclaim
    assert store.instance(first).reclaimed_at is None
    task = store.tasks_of("j2")[0]
    assert (task.status, task.instance_id, task.attempt) == ("running", first, 1)
