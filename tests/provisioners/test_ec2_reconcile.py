"""EC2Cloud.list, terminate and reconcile against moto: never lose track of an instance,
never touch one that is not ours."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoscaler.cloud import LaunchRequest
from provisioners.ec2 import DEFAULT_ORPHAN_GRACE_S, TAG_CLUSTER, TAG_LAUNCH_TOKEN
from tests.provisioners.conftest import live_instances, make_cloud


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

    listed = {i.instance_id: i for i in cloud.list()}

    assert set(listed) == {mine.instance_id, stopped}
    assert listed[mine.instance_id].launch_token == "tok-1"
    assert listed[mine.instance_id].instance_type == "c7i.large"
    assert listed[stopped].state in ("stopping", "stopped")


def test_orphan_is_found_and_terminated_per_policy(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(replace(config, orphan_policy="terminate"), ec2, clock, sleeps)
    known = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    orphan = start_instance(ec2, ami, **OURS, **{TAG_LAUNCH_TOKEN: "tok-lost"})
    neighbour = start_instance(ec2, ami, **{TAG_CLUSTER: "other-cluster"})
    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)

    report = cloud.reconcile({known.instance_id, "i-0000000000000dead"})

    assert [o.instance_id for o in report.orphans] == [orphan]
    assert report.terminated == (orphan,)
    assert report.gone == ("i-0000000000000dead",)
    assert state_of(ec2, orphan) in ("shutting-down", "terminated")
    assert state_of(ec2, known.instance_id) in ("pending", "running")
    assert state_of(ec2, neighbour) in ("pending", "running")
    assert cloud.reconcile({known.instance_id}).orphans == ()


def test_orphans_are_only_reported_under_the_report_policy(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(config, ec2, clock, sleeps)  # orphan_policy defaults to "report"
    orphan = start_instance(ec2, ami, **OURS)
    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)

    report = cloud.reconcile(set())

    assert [o.instance_id for o in report.orphans] == [orphan]
    assert report.terminated == ()
    assert state_of(ec2, orphan) in ("pending", "running")


def test_young_orphans_are_reported_but_not_terminated(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(replace(config, orphan_policy="terminate"), ec2, clock, sleeps)
    orphan = start_instance(ec2, ami, **OURS)

    report = cloud.reconcile(set())
    assert [o.instance_id for o in report.orphans] == [orphan] and report.terminated == ()
    assert state_of(ec2, orphan) in ("pending", "running")

    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)
    assert cloud.reconcile(set()).terminated == (orphan,)


def test_instance_with_a_known_launch_token_awaits_recording_and_is_adopted_by_a_retry(
    config, ec2, ami, clock, sleeps
):
    cloud = make_cloud(replace(config, orphan_policy="terminate"), ec2, clock, sleeps)
    unrecorded = cloud.launch(LaunchRequest("c7i.large", "tok-1"))  # result lost in a crash
    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)

    report = cloud.reconcile(set(), known_tokens={"tok-1"})

    assert report.orphans == () and report.terminated == ()
    assert [i.instance_id for i in report.awaiting_record] == [unrecorded.instance_id]
    assert cloud.launch(LaunchRequest("c7i.large", "tok-1")).instance_id == unrecorded.instance_id
    assert len(live_instances(ec2)) == 1


def test_a_second_instance_with_a_recorded_token_is_an_orphan(config, ec2, ami, clock, sleeps):
    cloud = make_cloud(replace(config, orphan_policy="terminate"), ec2, clock, sleeps)
    recorded = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    duplicate = start_instance(ec2, ami, **OURS, **{TAG_LAUNCH_TOKEN: "tok-1"})
    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)

    report = cloud.reconcile({recorded.instance_id}, known_tokens={"tok-1"})

    assert report.terminated == (duplicate,)
    assert state_of(ec2, recorded.instance_id) in ("pending", "running")


def test_terminate_ignores_unknown_and_foreign_ids(config, ec2, ami, clock, sleeps, faults):
    cloud = make_cloud(config, ec2, clock, sleeps)
    mine = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    foreign = start_instance(ec2, ami, **{TAG_CLUSTER: "other-cluster"})
    faults.watch("TerminateInstances")

    cloud.terminate([mine.instance_id, foreign, "i-00000000000000000"])

    assert state_of(ec2, mine.instance_id) in ("shutting-down", "terminated")
    assert state_of(ec2, foreign) in ("pending", "running")
    assert [c["InstanceIds"] for c in faults.calls["TerminateInstances"]] == [[mine.instance_id]]
    assert cloud.list() == []
    cloud.terminate([mine.instance_id])  # already terminated: not an error
    cloud.terminate([])


def test_dry_run_terminate_leaves_the_instance_running(config, ec2, ami, clock, sleeps, faults):
    instance = start_instance(ec2, ami, **OURS)
    cloud = make_cloud(replace(config, dry_run=True, orphan_policy="terminate"), ec2, clock, sleeps)
    faults.watch("TerminateInstances")
    clock.advance(DEFAULT_ORPHAN_GRACE_S + 1)

    report = cloud.reconcile(set())

    assert [o.instance_id for o in report.orphans] == [instance]
    assert report.terminated == ()
    assert [c.get("DryRun") for c in faults.calls["TerminateInstances"]] == [True]
    assert state_of(ec2, instance) in ("pending", "running")


def test_instance_vanishing_between_lookup_and_terminate_does_not_block_the_others(
    config, ec2, ami, clock, sleeps, faults
):
    cloud = make_cloud(config, ec2, clock, sleeps)
    first = cloud.launch(LaunchRequest("c7i.large", "tok-1"))
    second = cloud.launch(LaunchRequest("c7i.large", "tok-2"))
    faults.plan("TerminateInstances", ["InvalidInstanceID.NotFound"])

    cloud.terminate([first.instance_id, second.instance_id])

    assert state_of(ec2, first.instance_id) in ("shutting-down", "terminated")
    assert state_of(ec2, second.instance_id) in ("shutting-down", "terminated")
