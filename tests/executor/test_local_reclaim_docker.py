"""A spot reclaim on the local cloud, with real Docker: worker agent processes, containers
built from the test job, checkpoints uploaded while it runs.

The round logic (`autoscaler.control`) drives the local cloud's agents through
`GrpcExecutor`, as the daemon wires them; the catalog has one spot offering, built by
hand. A reclaim injected while the job runs and checkpoints: the agent reads the notice
from the cloud's metadata stand-in, checkpoints and stops the task, and reports the
notice; the one round that follows plans the task on a new instance, where it resumes
from that checkpoint; its failure count is unchanged; the ledger charges the spot price.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from app.wiring import StateLedger
from autoscaler.catalog import SPOT, Catalog, InstanceType
from autoscaler.control import ControlLoop, ControlOptions
from autoscaler.execution import InstanceNotice
from autoscaler.jobs import JobSpec, TaskRun, TaskSpec
from autoscaler.planner import planner_by_name
from autoscaler.resources import Resources
from executor.storage import log_key
from provisioners.local import LocalCloud
from provisioners.local_reclaims import ReclaimPlan
from state.memory import InMemoryStore
from tests.executor.conftest import PATIENCE_S, checkpointed_step, job_context

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]

SPOT_BOX = InstanceType(
    "box:spot@local",
    "box",
    Resources(0, 1, 2),
    0.03,
    market=SPOT,
    zone="local",
    ec2_type="box",
    interruption_per_hour=0.05,
)
ON_DEMAND_BOX = InstanceType("box", "box", Resources(0, 1, 2), 0.09)
TOTAL = 600  # iterations of 0.05 s: 30 s of work, long enough to be reclaimed half way


class LoopClock:
    def __init__(self, clock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock()


def step_until(loop: ControlLoop, condition, what: str, timeout: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        loop.progress()
        time.sleep(0.2)


def test_a_reclaimed_spot_instances_task_resumes_from_its_checkpoint_on_docker(
    daemon_on, python_image, tmp_path
):
    store = InMemoryStore()
    daemon = daemon_on(f"file://{tmp_path}/store", {}, ledger=StateLedger(store))
    ca = tmp_path / "ca.pem"
    ca.write_bytes(daemon.server_ca.cert_pem)
    cloud = LocalCloud(
        Catalog([SPOT_BOX, ON_DEMAND_BOX]),
        tmp_path / "cloud",
        daemon_address=daemon.address,
        ca_path=ca,
        docker_url=os.environ.get("DOCKER_HOST"),
        throughput_window_s=0.5,
        reclaims=ReclaimPlan(),  # nothing reclaimed unless the test says so
        notice_window_s=60.0,
        notice_poll_s=0.5,
    )
    daemon.executor.verifier = cloud  # agents enroll with the cloud's one-time secrets
    noticed: list[tuple[str, InstanceNotice]] = []
    daemon.executor.on_notice = lambda instance, notice: noticed.append((instance, notice))
    loop = ControlLoop(
        planner_by_name("eva", lower_bound=False),
        cloud,
        daemon.executor,
        store,
        LoopClock(time.time),
        ControlOptions(),
    )
    try:
        context = job_context(daemon.storage, tmp_path)
        task = TaskSpec(
            "j1/trainer",
            "j1",
            "trainer",
            "j1_trainer",
            (("any", Resources(0, 0.5, 0.25)),),
            run=TaskRun(
                build_context=context,
                env=(("STEP_S", "0.05"), ("TOTAL", str(TOTAL))),
                checkpoint_every_s=1.0,
            ),
        )
        store.submit_job(JobSpec("j1", "j1", (task,)), owner="t", at=time.time())
        loop.schedule()
        [first] = [i.instance_id for i in store.instances()]
        assert store.instance(first).instance_type == SPOT_BOX.name  # the cheaper offering

        def checkpointed() -> bool:
            task = store.tasks_of("j1")[0]
            return task.status == "running" and task.checkpoint is not None

        step_until(loop, checkpointed, "the job runs and has uploaded a checkpoint", 300.0)

        cloud.reclaim(first)  # the provider's two-minute warning, now
        step_until(loop, lambda: store.instance(first).reclaimed_at is not None, "the notice")
        assert [(i, n.kind) for i, n in noticed] == [(first, "instance-action")]
        step_until(loop, lambda: store.tasks_of("j1")[0].status == "pending", "the task stops")
        left = store.tasks_of("j1")[0]
        assert left.checkpoint is not None and left.failures == 0
        saved = checkpointed_step(daemon.storage, left.checkpoint, tmp_path)
        rounds_before = len(store.rounds())
        loop.schedule()  # the round the notice asks for (the daemon runs it at once)

        def resumed_elsewhere() -> bool:
            task = store.tasks_of("j1")[0]
            return task.status == "running" and task.instance_id not in (None, first)

        step_until(loop, resumed_elsewhere, "the task resumes on another instance", 300.0)
        assert len(store.rounds()) == rounds_before + 1  # within that one round
        task_now = store.tasks_of("j1")[0]
        assert task_now.attempt == 2
        assert (task_now.failures, task_now.failure) == (0, "infrastructure")

        def completed() -> bool:
            loop.schedule()
            return store.job("j1").status == "completed"

        step_until(loop, completed, "the job completes", 300.0)
        # The second attempt resumed from the checkpoint taken on the notice, not from 0.
        daemon.storage.get_file(log_key("j1", "j1/trainer", 2), tmp_path / "log2")
        log = (tmp_path / "log2").read_text()
        [resumed] = re.findall(r"resumed at (\d+)", log)
        assert int(resumed) == saved > 0, log
        # The interruption is in the history, with its offering; the ledger charged the
        # spot instance the spot price it was bought at, and the replacement, on-demand
        # because the reclaimed offering is held after its notice, the on-demand price.
        assert store.interruption_counts(0.0) == {SPOT_BOX.name: 1}
        prices = {u.instance_id: (u.instance_type, u.hourly_price) for u in store.uptime()}
        assert prices.pop(first) == (SPOT_BOX.name, SPOT_BOX.hourly_cost)
        assert set(prices.values()) == {(ON_DEMAND_BOX.name, ON_DEMAND_BOX.hourly_cost)}
    finally:
        cloud.terminate_all()
        cloud.close()
