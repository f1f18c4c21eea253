"""EC2Cloud.list and terminate, and the round's orphan handling, against moto: never lose
track of an instance, never touch one that is not ours."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoscaler.cloud import DEFAULT_ORPHAN_GRACE_S, LaunchRequest, OrphanPolicy
from autoscaler.control import ControlLoop, ControlOptions
from provisioners.ec2 import TAG_CLUSTER, TAG_LAUNCH_TOKEN
from state.memory import InMemoryStore
from tests.builders import KeepPlanner, NullExecutor, Ticking
from tests.provisioners.conftest import live_instances, make_cloud
from tests.store_writes import request


def start_instance(ec2: Any, ami: str, **tags: str) -> str:
    """An instance started behind the provisioner's back (a crashed daemon, a colleague)."""
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    response = ec2.run_instances(
        ImageId=ami,
        InstanceType="c7i.large",
        MinCount=1,
        MaxCount=1,
        **({"TagSpecifications": spec} if tags else {}),
    )
    return response["Instances"][0]["InstanceId"]


def state_of(ec2: Any, instance_id: str) -> str:
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservation["Instances"][0]["State"]["Name"]


OURS = {TAG_CLUSTER: "test-cluster"}


def test_list_returns_only_this_clusters_live_instances_with_their_state(
    config, ec2, ami, clock, sleeps
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    mine = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    stopped = start_instance(ec2, ami, **OURS)
    ec2.stop_instances(InstanceIds=[stopped])
    gone = start_instance(ec2, ami, **OURS)
    ec2.terminate_instances(InstanceIds=[gone])
    start_instance(ec2, ami, **{TAG_CLUSTER: "other-cluster"})
    start_instance(ec2, ami)  # untagged

    listed = {i.cloud_id: i for i in cloud.list()}

    assert set(listed) == {mine.cloud_id, stopped}
    assert listed[mine.cloud_id].instance_id == "tok-1"
    assert listed[mine.cloud_id].instance_type == "c7i.large"
    assert listed[stopped].state in ("stopping", "stopped")


def round_over(cloud, store, clock, action="terminate"):
    """One round of the control loop against EC2 (moto); nothing to plan."""
    options = ControlOptions(orphans=OrphanPolicy(action))
    loop = ControlLoop(KeepPlanner(), cloud, NullExecutor(), store, Ticking(clock), options)
    return loop.schedule().record


def known_to(store, cloud_instance, at):
    """The state records an instance the cloud has (as a round would have)."""
    token = cloud_instance.instance_id
    request(store, token, cloud_instance.instance_type, 0.1, at)
    store.transition_instance(token, "pending", at, cloud_id=cloud_instance.cloud_id)


def orphan_actions(record):
    return [(a.kind, a.target, a.outcome) for a in record.actions if a.detail.get("orphan")]


def past_grace(clock, ec2, instance_id):
    """Move the test clock past the orphan grace period of this instance's launch."""
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    launched = reservation["Instances"][0]["LaunchTime"].timestamp()
    clock.now = launched + DEFAULT_ORPHAN_GRACE_S + 1


def test_orphan_is_found_and_terminated_by_the_round_per_policy(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    known = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    known_to(store, known, clock())
    orphan = start_instance(ec2, ami, **OURS, **{TAG_LAUNCH_TOKEN: "tok-lost"})
    neighbour = start_instance(ec2, ami, **{TAG_CLUSTER: "other-cluster"})
    past_grace(clock, ec2, orphan)

    record = round_over(cloud, store, clock)

    assert orphan_actions(record) == [("terminate", orphan, "done")]
    assert "unknown to the state" in next(a.reason for a in record.actions if a.target == orphan)
    assert state_of(ec2, orphan) in ("shutting-down", "terminated")
    assert state_of(ec2, known.cloud_id) in ("pending", "running")
    assert state_of(ec2, neighbour) in ("pending", "running")
    assert orphan_actions(round_over(cloud, store, clock)) == []


def test_orphans_are_only_reported_under_the_report_policy(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)
    orphan = start_instance(ec2, ami, **OURS)
    past_grace(clock, ec2, orphan)

    record = round_over(cloud, InMemoryStore(), clock, action="report")

    assert orphan_actions(record) == [("report", orphan, "planned")]
    assert state_of(ec2, orphan) in ("pending", "running")


def test_young_orphans_are_reported_but_not_terminated(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    orphan = start_instance(ec2, ami, **OURS)
    past_grace(clock, ec2, orphan)
    clock.advance(-2)  # one second inside the grace period

    record = round_over(cloud, store, clock)
    assert orphan_actions(record) == [("report", orphan, "planned")]
    assert "grace period" in record.actions[0].reason
    assert state_of(ec2, orphan) in ("pending", "running")

    clock.advance(2)
    assert orphan_actions(round_over(cloud, store, clock)) == [("terminate", orphan, "done")]


def test_instance_with_a_known_launch_token_is_adopted_not_orphaned(
    config, ec2, ami, clock, sleeps
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    request(store, "tok-1", "c7i.large", 0.1, clock())  # recorded before the call
    unrecorded = cloud.launch(LaunchRequest("c7i.large", "tok-1"))  # answer lost in a crash
    past_grace(clock, ec2, unrecorded.cloud_id)

    record = round_over(cloud, store, clock)

    assert orphan_actions(record) == []
    assert store.instance("tok-1").cloud_id == unrecorded.cloud_id
    assert len(live_instances(ec2)) == 1


def test_a_second_instance_with_a_recorded_token_is_an_orphan(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)
    store = InMemoryStore()
    recorded = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    known_to(store, recorded, clock())
    duplicate = start_instance(ec2, ami, **OURS, **{TAG_LAUNCH_TOKEN: "tok-1"})
    past_grace(clock, ec2, duplicate)

    record = round_over(cloud, store, clock)

    assert orphan_actions(record) == [("terminate", duplicate, "done")]
    assert state_of(ec2, recorded.cloud_id) in ("pending", "running")


def test_terminate_ignores_unknown_and_refuses_foreign_ids(config, ec2, ami, clock, sleeps, faults):
    cloud = make_cloud(config, ec2, clock, sleeps)
    mine = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    foreign = start_instance(ec2, ami, **{TAG_CLUSTER: "other-cluster"})
    untagged = start_instance(ec2, ami)
    faults.watch("TerminateInstances")

    cloud.terminate([mine.cloud_id, foreign, untagged, "i-00000000000000000"])

    assert state_of(ec2, mine.cloud_id) in ("shutting-down", "terminated")
    assert state_of(ec2, foreign) in ("pending", "running")
    assert state_of(ec2, untagged) in ("pending", "running")
    asked = [i for c in faults.calls["TerminateInstances"] for i in c["InstanceIds"]]
    assert foreign not in asked and untagged not in asked
    assert cloud.list() == []
    calls = len(faults.calls["TerminateInstances"])
    cloud.terminate([mine.cloud_id])  # already terminated: not an error, not asked again
    cloud.terminate([])
    assert len(faults.calls["TerminateInstances"]) == calls


def test_terminate_reaches_an_instance_describe_does_not_list_yet(config, ec2, clock, sleeps, lag):
    """DescribeInstances lags RunInstances: an id it does not list yet is terminated by id."""
    cloud = make_cloud(config, ec2, clock, sleeps)
    lag.hide_new = True
    fresh = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    assert cloud.list() == []  # not listed yet

    cloud.terminate([fresh.cloud_id])

    lag.reveal()
    assert state_of(ec2, fresh.cloud_id) in ("shutting-down", "terminated")


def test_dry_run_terminate_stays_dry_when_an_id_is_unknown(config, ec2, ami, clock, sleeps, faults):
    """The per-id fallback after InvalidInstanceID.NotFound keeps DryRun=True."""
    first = start_instance(ec2, ami, **OURS)
    second = start_instance(ec2, ami, **OURS)
    cloud = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps)
    faults.plan("TerminateInstances", ["InvalidInstanceID.NotFound"])

    cloud.terminate([first, second])

    calls = faults.calls["TerminateInstances"]
    assert len(calls) == 3  # the batch, then each id alone
    assert [c.get("DryRun") for c in calls] == [True, True, True]
    assert state_of(ec2, first) in ("pending", "running")
    assert state_of(ec2, second) in ("pending", "running")


def test_dry_run_terminate_leaves_the_instance_running(config, ec2, ami, clock, sleeps, faults):
    instance = start_instance(ec2, ami, **OURS)
    cloud = make_cloud(replace(config, dry_run=True), ec2, clock, sleeps)
    faults.watch("TerminateInstances")

    cloud.terminate([instance])

    assert [c.get("DryRun") for c in faults.calls["TerminateInstances"]] == [True]
    assert state_of(ec2, instance) in ("pending", "running")


def test_instance_vanishing_between_lookup_and_terminate_does_not_block_the_others(
    config, ec2, ami, clock, sleeps, faults
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    first = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    second = cloud.launch(LaunchRequest("c7i.large", "tok-2"))
    faults.plan("TerminateInstances", ["InvalidInstanceID.NotFound"])

    cloud.terminate([first.cloud_id, second.cloud_id])

    assert state_of(ec2, first.cloud_id) in ("shutting-down", "terminated")
    assert state_of(ec2, second.cloud_id) in ("shutting-down", "terminated")
