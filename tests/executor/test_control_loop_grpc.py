"""The round logic (`autoscaler.control`) drives real agents through `GrpcExecutor`.

The same `ControlLoop` the daemon runs, with the production executor binding:
gRPC with mutual TLS, agents enrolling and heart-beating, and the executor
reading the loop's own state (`app.wiring.StateLedger`) to judge what a worker
reports.
The cloud is a small test binding whose "instances" are agents started in
this process (simulated containers), so the test needs no Docker; a worker
that goes silent is lost by the loop's own clock, its instance terminated and
its task started again on a new one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from app.wiring import StateLedger
from autoscaler.catalog import Catalog, InstanceType, LaunchDelays
from autoscaler.cloud import CloudInstance, LaunchRequest, UnavailableOffering
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.jobs import JobSpec, TaskRun, TaskSpec
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from executor.agent import Agent
from executor.simulated import SimulatedRuntime
from executor.storage import log_key
from state.memory import InMemoryStore
from tests.executor.conftest import PATIENCE_S, Daemon, job_context

CATALOG = Catalog([InstanceType("box", "f", Resources(0, 2, 4), 1.0, LaunchDelays(19.0, 190.0))])


class AgentsCloud:
    """A `Cloud` whose instances are agents in this process (for this test only)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.agents: dict[str, Agent] = {}  # by launch token
        self.gone: set[str] = set()

    def catalog(self) -> Catalog:
        return CATALOG

    def launch(self, request: LaunchRequest) -> CloudInstance:
        if request.instance_id not in self.agents:
            capacity = CATALOG[request.instance_type].capacity
            self.agents[request.instance_id] = self.daemon.agent(
                request.instance_id, capacity=capacity, runtime=SimulatedRuntime()
            )
        return self._view(request.instance_id)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for cloud_id in instance_ids:
            token = cloud_id.removeprefix("local-")
            self.gone.add(token)
            agent = self.agents[token]
            agent.close(grace_s=0)
            for info in agent.runtime.containers({}):
                agent.runtime.remove(info.container_id)

    def list(self) -> list[CloudInstance]:
        return [self._view(token) for token in self.agents if token not in self.gone]

    def unavailable(self) -> list[UnavailableOffering]:
        return []

    def _view(self, token: str) -> CloudInstance:
        return CloudInstance(f"local-{token}", "box", "running", None, token, 0.0)


class LoopClock:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def now(self) -> float:
        return self.daemon.clock()


def training_job(job_id: str, context: str, total: int) -> JobSpec:
    task = TaskSpec(
        f"{job_id}/trainer",
        job_id,
        "trainer",
        f"{job_id}_trainer",
        (("any", Resources(0, 1, 1)),),
        run=TaskRun(build_context=context, env=(("STEP_S", "0.01"), ("TOTAL", str(total)))),
    )
    return JobSpec(job_id, job_id, (task,))


@pytest.fixture
def cluster(daemon_on, tmp_path):
    store = InMemoryStore()
    daemon = daemon_on(f"file://{tmp_path}/store", {}, ledger=StateLedger(store))
    cloud = AgentsCloud(daemon)
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        cloud,
        daemon.executor,
        store,
        LoopClock(daemon),
        ControlOptions(),
    )
    return daemon, store, cloud, loop


def step_until(loop: ControlLoop, condition, what: str) -> None:
    """Run the daemon's steps (every 50 ms here) until `condition()`."""
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        loop.progress()
        time.sleep(0.05)


def test_a_job_is_launched_started_measured_and_completed_by_the_round(cluster, tmp_path):
    daemon, store, cloud, loop = cluster
    context = job_context(daemon.storage, tmp_path)
    store.submit_job(training_job("j1", context, total=400), owner="t", at=daemon.clock())

    outcome = loop.schedule()  # plans one box, launches it (an agent registers), starts the task
    assert [a.kind for a in outcome.record.actions if a.kind == "launch"] == ["launch"]
    step_until(loop, lambda: store.tasks_of("j1")[0].status == "running", "the task runs")
    task = store.tasks_of("j1")[0]
    assert task.attempt == 1 and task.instance_id in cloud.agents

    # A round learns the job's solo throughput from what its worker reports (raw it/s).
    def learned() -> bool:
        loop.schedule()
        return store.job("j1").solo_throughput is not None

    step_until(loop, learned, "a round learns the solo throughput")
    assert 0 < store.job("j1").solo_throughput <= 101  # at most one iteration per 10 ms

    step_until(loop, lambda: store.job("j1").status == "completed", "the job completes")
    saved = tmp_path / "log"
    daemon.storage.get_file(log_key("j1", "j1/trainer", 1), saved)
    assert saved.read_text().splitlines()[-1] == "done at 400"
    # Its terminal report was acknowledged: the executor no longer reports it.
    assert "j1/trainer" not in daemon.executor.report().tasks


def test_a_silent_worker_is_lost_its_instance_terminated_and_its_task_started_again(
    cluster, tmp_path
):
    daemon, store, cloud, loop = cluster
    context = job_context(daemon.storage, tmp_path)
    store.submit_job(training_job("j2", context, total=100_000), owner="t", at=daemon.clock())
    loop.schedule()
    step_until(loop, lambda: store.tasks_of("j2")[0].status == "running", "the task runs")
    first = store.tasks_of("j2")[0].instance_id

    cloud.agents[first].close(grace_s=0)  # the agent dies; the cloud still lists the instance
    daemon.clock.advance(daemon.heartbeat_timeout_s + 1)
    step_until(loop, lambda: first in cloud.gone, "the loop terminates the lost instance")
    instance = store.instance(first)
    assert instance.lost_at is not None
    assert instance.reason.startswith("worker lost: lost worker: silent for 46 s")
    task = store.tasks_of("j2")[0]
    # The infrastructure's doing: retried, never counted toward max_attempts.
    assert (task.failures, task.retries, task.failure) == (0, 1, "infrastructure")
    assert "lost worker: silent for 46 s" in task.reason

    def running_elsewhere() -> bool:
        loop.schedule()
        task = store.tasks_of("j2")[0]
        return task.status == "running" and task.instance_id not in (None, first)

    step_until(loop, running_elsewhere, "the task runs on a new instance")
    assert store.tasks_of("j2")[0].attempt == 2
