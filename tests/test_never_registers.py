"""Six hours of a cluster whose instances boot but whose workers never register, run by the
daemon's own control loop (rounds and steps, the store, the round's options as a daemon
sets them): the case where one task launched 19 instances in 6 hours, its job still
queued and no failure counted.

Here the launches of each type stay within the hourly bound and the back-off, every type
ends up held (the cause is common to all of them), and the cause the cloud diagnosed
shows in the job's pending reason and the decision log.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.catalog import Catalog
from autoscaler.cloud import CloudInstance, Guardrails, LaunchRequest, UnavailableOffering
from autoscaler.control import ControlLoop
from autoscaler.decide import BootBackoff, ControlOptions, boot_failed
from autoscaler.planner import planner_by_name
from state.memory import InMemoryStore
from tests.builders import NullExecutor
from tests.test_decide import CATALOG, TIMEOUTS, job

CAUSE = "bootstrap: FAILED while installing the wheelhouse (hash mismatch)"


class NeverRegisters:
    """A `Cloud` whose instances run at once and whose workers never register; it
    diagnoses each as EC2's binding would (`autoscaler.cloud.Diagnoses`)."""

    def __init__(self, now) -> None:
        self.now = now
        self.launches: list[tuple[float, str]] = []  # (when, type)
        self.live: dict[str, CloudInstance] = {}
        self.diagnosed: list[str] = []

    def catalog(self) -> Catalog:
        return CATALOG

    def launch(self, request: LaunchRequest) -> CloudInstance:
        for inst in self.live.values():
            if inst.instance_id == request.instance_id:
                return inst
        cloud_id = f"i-{len(self.launches)}"
        self.launches.append((self.now(), request.instance_type))
        inst = CloudInstance(
            cloud_id, request.instance_type, "running", "zone-a", request.instance_id, self.now()
        )
        self.live[cloud_id] = inst
        return inst

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for cloud_id in instance_ids:
            self.live.pop(cloud_id, None)

    def list(self) -> list[CloudInstance]:
        return list(self.live.values())

    def unavailable(self) -> list[UnavailableOffering]:
        return []

    def diagnose(self, cloud_id: str, instance_id: str) -> str:
        self.diagnosed.append(cloud_id)
        return CAUSE


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_six_hours_of_boots_that_never_register_launch_within_the_bound_and_say_why():
    clock = Clock()
    cloud = NeverRegisters(clock.now)
    store = InMemoryStore()
    store.submit_job(job("j", (0, 2, 8)), owner="ana", at=0.0)
    per_hour = 4
    options = ControlOptions(
        timeouts=TIMEOUTS,
        guardrails=Guardrails(max_launches_per_type_hour=per_hour),
        boot_backoff=BootBackoff(),  # as the daemon sets it (`app.config.control_options`)
    )
    eva = planner_by_name("eva", lower_bound=False)
    loop = ControlLoop(eva, cloud, NullExecutor(), store, clock, options)

    hours, interval, step = 6, 60.0, 5.0
    while clock.t < hours * 3600:
        if clock.t % interval == 0:
            loop.schedule()
        else:
            loop.progress()
        clock.t += step

    # Whatever happens, no type is launched more than the bound in any hour.
    for itype in {t for _, t in cloud.launches}:
        times = [t for t, of in cloud.launches if of == itype]
        assert all(sum(1 for u in times if t <= u < t + 3600) <= per_hour for t in times)
    # The planner turns to the next type while one backs off; once six boots in a row of
    # any types failed, every type is held (a cause common to all of them is not learnt
    # type by type): far below the 19 launches in 6 hours for one task.
    failed = [i for i in store.instances(include_finished=True) if boot_failed(i)]
    assert len(failed) == BootBackoff().cluster_hold_after
    assert len({i.instance_type for i in failed}) > 1
    assert len(cloud.launches) < 19
    # Each given-up boot is recorded with the cloud's diagnosis of it.
    assert all(CAUSE in i.reason for i in failed)
    assert {i.cloud_id for i in failed} <= set(cloud.diagnosed)
    # The job waits, queued, with the cause; the decision log names every held type.
    assert store.job("j").status == "queued"
    [last] = store.rounds(limit=1)
    assert sorted(last.numbers["held"]) == sorted(t.name for t in CATALOG)
    assert all(
        "held: 6 launches in a row, of " in why and CAUSE in why
        for why in last.numbers["held"].values()
    )
    [why] = last.numbers["infeasible"].values()
    assert "held" in why and CAUSE in why
