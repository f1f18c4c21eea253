"""Eventual consistency, as real EC2 has it and moto does not: `DescribeInstances` lags
`RunInstances` (injected with botocore hooks), and `ClientToken` is idempotent (emulated).

The round must not end an instance it missed once in a listing, must not launch a second
instance when retrying a launch whose answer was lost, and must not fail a launch that EC2
carried out — across daemon restarts too (each `ControlLoop` here is built from the store).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from botocore.exceptions import ReadTimeoutError

from autoscaler.cloud import LaunchRequest
from autoscaler.control import ControlLoop, ControlOptions, launch_instance
from autoscaler.execution import ExecutorReport
from state.memory import InMemoryStore
from tests.builders import KeepPlanner, NullExecutor, Ticking
from tests.provisioners.conftest import REGION, live_instances, make_cloud, zone_of
from tests.provisioners.test_bootstrap import WHEELHOUSE_URL, worker_bootstrap
from tests.store_writes import request

ZONE_A, ZONE_B = f"{REGION}a", f"{REGION}b"
GRACE_S = ControlOptions().unlisted_grace_s


def loop_over(cloud: Any, store: InMemoryStore, clock: Any, executor: Any = None) -> ControlLoop:
    """A control loop built from nothing but the bindings and the store: as after a restart."""
    return ControlLoop(KeepPlanner(), cloud, executor or NullExecutor(), store, Ticking(clock))


def launched_and_recorded(cloud: Any, store: InMemoryStore, clock: Any, token: str) -> str:
    """Record a request and launch it as a round does; returns the cloud's id."""
    request(store, token, "c7i.large", 0.1, clock())
    outcome, cloud_id = launch_instance(cloud, store, token, clock())
    assert outcome == "done"
    return cloud_id


def statuses(store: InMemoryStore, token: str) -> list[str]:
    return [status for status, _ in store.instance(token).history]


# --- several missed listings before "gone" ------------------------------------------------------


def test_an_instance_missing_from_a_lagging_listing_is_not_ended(config, ec2, clock, sleeps, lag):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    lag.hide_new = True
    launched_and_recorded(cloud, store, clock, "inst-1")

    clock.advance(5)
    loop_over(cloud, store, clock).progress()  # not listed yet
    clock.advance(GRACE_S / 2)
    loop_over(cloud, store, clock).progress()  # a restarted daemon: still not listed
    assert store.instance("inst-1").status == "pending"

    lag.reveal()
    clock.advance(5)
    loop_over(cloud, store, clock).progress()
    assert "terminated" not in statuses(store, "inst-1")
    assert [i.end for i in store.uptime()] == [None]  # still billed, as it really is


def test_an_instance_that_is_really_gone_is_ended_after_the_grace_period(
    config, ec2, clock, sleeps
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    cloud_id = launched_and_recorded(cloud, store, clock, "inst-1")
    ec2.terminate_instances(InstanceIds=[cloud_id])  # behind the daemon's back

    clock.advance(GRACE_S - 10)
    loop_over(cloud, store, clock).progress()
    assert store.instance("inst-1").status == "pending"
    clock.advance(10)
    loop_over(cloud, store, clock).progress()  # another process, the same count

    record = store.instance("inst-1")
    assert record.status == "terminated"
    assert record.reason == f"the cloud no longer lists it (last confirmed {GRACE_S:.0f} s ago)"


def test_an_instance_whose_worker_was_lost_is_ended_once_unlisted_without_the_grace(
    config, ec2, clock, sleeps
):
    # Its worker registered, then fell silent past the heartbeat timeout: the instance was
    # listed long ago, so the listing's lag cannot explain its absence. Waiting out the
    # grace would only keep its tasks from starting elsewhere.
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    cloud_id = launched_and_recorded(cloud, store, clock, "inst-1")
    clock.advance(5)
    store.instance_worker("inst-1", clock(), ready=True)
    ec2.terminate_instances(InstanceIds=[cloud_id])  # behind the daemon's back
    clock.advance(1)
    loop_over(cloud, store, clock).progress()
    assert store.instance("inst-1").status != "terminated"  # its worker may still answer

    clock.advance(10)  # the executor finds its worker silent past the heartbeat timeout
    loop_over(cloud, store, clock, LostWorkers("inst-1")).progress()
    assert store.instance("inst-1").status == "terminated"
    assert clock() - store.instance("inst-1").requested_at < GRACE_S


class LostWorkers(NullExecutor):
    def __init__(self, *instances: str) -> None:
        super().__init__()
        self._report = ExecutorReport(
            lost_instances={i: "no heartbeat for 10 s" for i in instances}
        )


class ReachableWorkers(NullExecutor):
    def __init__(self, *instances: str) -> None:
        super().__init__()
        self._report = ExecutorReport(ready_instances=frozenset(instances))


def test_an_instance_whose_worker_still_answers_is_not_ended(config, ec2, clock, sleeps, lag):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    cloud_id = launched_and_recorded(cloud, store, clock, "inst-1")
    lag.hide(cloud_id)

    clock.advance(10 * GRACE_S)
    loop_over(cloud, store, clock, ReachableWorkers("inst-1")).progress()

    assert store.instance("inst-1").status == "pending"


def test_an_instance_being_terminated_is_ended_once_unlisted_though_its_worker_answers(
    config, ec2, clock, sleeps
):
    # Its worker registered (it booted, long visible); the round asked for its end. The
    # worker may answer a few seconds more while the instance shuts down: the ledger must
    # not bill those seconds, nor the grace period meant for launches not yet listed.
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    cloud_id = launched_and_recorded(cloud, store, clock, "inst-1")
    clock.advance(5)
    store.instance_worker("inst-1", clock(), ready=True)
    store.transition_instance("inst-1", "terminating", clock(), reason="drained")
    ec2.terminate_instances(InstanceIds=[cloud_id])

    clock.advance(1)
    loop_over(cloud, store, clock, ReachableWorkers("inst-1")).progress()
    record = store.instance("inst-1")
    assert record.status == "terminated"
    assert [i.end for i in store.uptime()] == [clock()]


# --- retrying a launch whose answer was lost ----------------------------------------------------


def lose_the_first_answer(ec2: Any) -> None:
    """EC2 starts the instance, but its answer never reaches the daemon (once)."""
    lost: list[bool] = []

    def timeout(**_: Any) -> None:
        if not lost:
            lost.append(True)
            raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    ec2.meta.events.register("after-call.ec2.RunInstances", timeout)


def test_a_lost_answer_is_retried_in_its_zone_with_its_token_not_launched_twice(
    config, ec2, client, clock, sleeps, faults, idempotent, lag
):
    config = replace(config, zones=(ZONE_A, ZONE_B))
    # Every render presigns a new wheelhouse URL: the retry must send the first one again.
    fresh = (f"{WHEELHOUSE_URL}{n}" for n in itertools.count())
    bootstrap = worker_bootstrap(config, wheelhouse_url=lambda: next(fresh))
    cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=bootstrap)
    store = InMemoryStore()
    lag.hide_new = True
    faults.watch("RunInstances")
    lose_the_first_answer(ec2)
    request(store, "inst-1", "c7i.large", 0.1, clock())

    assert launch_instance(cloud, store, "inst-1", clock())[0] == "planned"  # CloudUnavailable
    assert store.instance("inst-1").status == "requested"
    inspect = client("ec2")  # a client of the test's own: no lag, no faults
    [started] = live_instances(inspect)  # EC2 did start it, in zone A
    first_token = faults.calls["RunInstances"][0]["ClientToken"]
    # Meanwhile another launch finds no c7i.large capacity in zone A, which cools down.
    faults.when(
        "RunInstances",
        lambda p: zone_of(p) == ZONE_A and p["ClientToken"] != first_token,
        "InsufficientInstanceCapacity",
    )
    assert cloud.launch(LaunchRequest("c7i.large", "inst-2")).zone == ZONE_B

    clock.advance(5)
    loop_over(cloud, store, clock).progress()  # asks again for inst-1 (same token)

    record = store.instance("inst-1")
    assert record.status == "pending" and record.cloud_id == started["InstanceId"]
    assert len(live_instances(inspect)) == 2  # inst-1's one instance and inst-2's
    retries = [c for c in faults.calls["RunInstances"] if c["ClientToken"] == first_token]
    assert len(retries) == 2 and retries[0]["UserData"] == retries[1]["UserData"]


def test_a_retry_with_other_parameters_waits_for_the_listing_instead_of_failing(
    config, ec2, client, clock, sleeps, idempotent, lag
):
    """After a restart the user data of a retried launch differs (a fresh presigned wheelhouse
    URL): EC2 refuses the token with IdempotentParameterMismatch. The instance exists; the
    launch must stay requested and be adopted once listed, never marked failed."""
    store = InMemoryStore()
    lag.hide_new = True
    lose_the_first_answer(ec2)
    request(store, "inst-1", "c7i.large", 0.1, clock())
    before = make_cloud(config, ec2, clock, sleeps, bootstrap=worker_bootstrap(config))
    assert launch_instance(before, store, "inst-1", clock())[0] == "planned"
    inspect = client("ec2")  # a client of the test's own: no lag, no faults
    [started] = live_instances(inspect)

    restarted = make_cloud(
        config,
        ec2,
        clock,
        sleeps,
        bootstrap=worker_bootstrap(config, wheelhouse_url=WHEELHOUSE_URL + "2"),
    )
    clock.advance(5)
    outcome, message = launch_instance(restarted, store, "inst-1", clock())
    assert (
        outcome == "planned"
        and "IdempotentParameterMismatch" not in store.instance("inst-1").reason
    )
    assert "adopted once DescribeInstances lists it" in message
    assert store.instance("inst-1").status == "requested"

    lag.reveal()
    clock.advance(5)
    loop_over(restarted, store, clock).progress()
    record = store.instance("inst-1")
    assert record.status in ("pending", "running") and record.cloud_id == started["InstanceId"]
    assert "failed" not in statuses(store, "inst-1")
    assert len(live_instances(inspect)) == 1
