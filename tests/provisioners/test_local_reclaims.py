"""Spot reclaims on the local cloud: when (a seeded rate, or an availability trace in Can't
Be Late's format), the notice its agents read from the metadata stand-in, and the end of
the instance once the notice window is over. Clocks are injected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autoscaler.availability import AvailabilityTrace
from autoscaler.catalog import SPOT, Catalog, InstanceType
from autoscaler.cloud import InsufficientCapacity, LaunchRequest
from autoscaler.errors import InputError
from autoscaler.resources import Resources
from executor.interruption import INSTANCE_ACTION, Notice, NoticeWatcher
from provisioners.local import LocalCloud
from provisioners.local_reclaims import ReclaimPlan
from tests.provisioners.test_local_cloud import Clock, wait_for

SPOT_OFFERING = InstanceType(
    "c7i.large:spot", "c7i", Resources(0, 1, 4), 0.03, market=SPOT, ec2_type="c7i.large"
)
ON_DEMAND = InstanceType("c7i.large", "c7i", Resources(0, 1, 4), 0.09)
CATALOG = Catalog([SPOT_OFFERING, ON_DEMAND])


def trace(gap: float, *data: int) -> AvailabilityTrace:
    return AvailabilityTrace.from_document({"metadata": {"gap_seconds": gap}, "data": list(data)})


# -- when -------------------------------------------------------------------------------------


def test_a_trace_says_when_capacity_is_gone_and_repeats():
    t = trace(600, 0, 0, 1, 0)
    assert [t.available(s) for s in (0, 1199, 1200, 1799, 1800, 2400 + 1200)] == [
        True,
        True,
        False,
        False,
        True,
        False,  # past its end it starts again
    ]
    assert t.next_unavailable(0) == 1200
    assert t.next_unavailable(1300) == 2400 + 1200  # the next 1, one repetition later
    assert trace(60, 0, 0).next_unavailable(0) is None


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"metadata": {"gap_seconds": 0}, "data": [0]}, "metadata.gap_seconds"),
        ({"metadata": {"gap_seconds": 600}, "data": [0, 2]}, "data[1]"),
        ({"metadata": {"gap_seconds": 600}, "data": [0, True]}, "data[1]"),
        ({"metadata": {"gap_seconds": 600}, "data": []}, "data"),
    ],
)
def test_a_malformed_trace_is_refused_naming_the_field(document, field):
    with pytest.raises(InputError, match=re.escape(f"field '{field}'")):
        AvailabilityTrace.from_document(document, "t.json")


def test_rates_draw_each_instances_reclaim_from_its_seed_and_token_alone():
    plan = ReclaimPlan({"c7i.large:spot": 2.0}, seed=7)
    first = plan.reclaim_at("c7i.large:spot", "tok-1", 100.0)
    assert first is not None and first > 100.0
    assert (
        ReclaimPlan({"c7i.large:spot": 2.0}, seed=7).reclaim_at("c7i.large:spot", "tok-1", 100.0)
        == first
    )  # repeatable
    assert (
        ReclaimPlan({"c7i.large:spot": 2.0}, seed=8).reclaim_at("c7i.large:spot", "tok-1", 100.0)
        != first
    )
    assert plan.reclaim_at("c7i.large", "tok-1", 100.0) is None  # no rate: never
    # Exponential with 2 reclaims per hour: the mean lifetime over many instances is ~30 min.
    draws = [plan.reclaim_at("c7i.large:spot", f"tok-{i}", 0.0) for i in range(4000)]
    mean = sum(d for d in draws if d is not None) / len(draws)
    assert 1650 < mean < 1950


# -- the local cloud --------------------------------------------------------------------------


def make(tmp_path: Path, python: str, clock: Clock, plan: ReclaimPlan) -> LocalCloud:
    return LocalCloud(
        CATALOG,
        tmp_path / "cloud",
        daemon_address="127.0.0.1:7443",
        ca_path=tmp_path / "ca.pem",
        python=python,
        clock=clock,
        reclaims=plan,
        notice_window_s=30.0,
        notice_poll_s=0.5,
    )


def argv_of(tmp_path: Path, token: str) -> list[str]:
    path = tmp_path / "cloud" / "instances" / token / "work" / "argv"
    wait_for(lambda: path.exists() and path.read_text())
    return path.read_text().split()


def test_a_reclaim_is_noticed_then_the_instance_ends_after_the_window(tmp_path, fake_agent):
    clock = Clock()
    cloud = make(tmp_path, fake_agent, clock, ReclaimPlan())
    try:
        cloud.launch(LaunchRequest("c7i.large:spot", "tok-1"))
        argv = argv_of(tmp_path, "tok-1")
        url = argv[argv.index("--imds-url") + 1]
        assert argv[argv.index("--notice-poll") + 1] == "0.5"
        seen: list[Notice] = []
        watcher = NoticeWatcher(url, seen.append)
        assert watcher.poll() == []  # no notice yet: 404

        cloud.reclaim("tok-1")  # at 1000.0
        clock.now = 1010.0
        [notice] = watcher.poll()
        assert notice == Notice(INSTANCE_ACTION, "terminate", "1970-01-01T00:17:10Z")
        assert [i.instance_id for i in cloud.list()] == ["tok-1"]  # still inside the window
        clock.now = 1030.0
        assert cloud.list() == []  # the window is over: the provider took it
        record = json.loads(
            (tmp_path / "cloud" / "instances" / "tok-1" / "instance.json").read_text()
        )
        assert record["reclaimed"] is True
    finally:
        cloud.terminate_all()
        cloud.close()


def test_a_spot_instance_is_reclaimed_when_its_trace_runs_out_of_capacity(tmp_path, fake_agent):
    clock = Clock()  # 1000 s after the epoch
    plan = ReclaimPlan(traces={"c7i.large:spot": trace(600, 0, 1, 0, 0)}, epoch_s=0.0)
    cloud = make(tmp_path, fake_agent, clock, plan)
    try:
        # 1000 s is in the second interval, which has no capacity: no launch.
        with pytest.raises(InsufficientCapacity, match="no spot capacity"):
            cloud.launch(LaunchRequest("c7i.large:spot", "tok-0"))
        assert [o.instance_type for o in cloud.unavailable()] == ["c7i.large:spot"]
        clock.now = 1300.0
        cloud.launch(LaunchRequest("c7i.large:spot", "tok-1"))
        url = argv_of(tmp_path, "tok-1")[argv_of(tmp_path, "tok-1").index("--imds-url") + 1]
        watcher = NoticeWatcher(url, lambda n: None)
        clock.now = 2999.0
        assert watcher.poll() == []  # capacity until 2400 + 600 = 3000 s: the next 1
        clock.now = 3000.0
        assert [n.kind for n in watcher.poll()] == [INSTANCE_ACTION]
        clock.now = 3000.0 + 30.0
        assert cloud.list() == []
        # On-demand offerings are never reclaimed, and get no metadata stand-in.
        cloud.launch(LaunchRequest("c7i.large", "tok-2"))
        assert "--imds-url" in argv_of(tmp_path, "tok-2")  # reclaims are on: every agent polls
        assert (
            json.loads(
                (tmp_path / "cloud" / "instances" / "tok-2" / "instance.json").read_text()
            ).get("reclaim_at")
            is None
        )
    finally:
        cloud.terminate_all()
        cloud.close()


def test_without_reclaims_an_on_demand_agent_polls_nothing(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent, Clock(), ReclaimPlan())
    try:
        cloud.launch(LaunchRequest("c7i.large", "tok-1"))
        assert "--imds-url" not in argv_of(tmp_path, "tok-1")
    finally:
        cloud.terminate_all()
        cloud.close()


def test_a_restarted_daemons_notice_reaches_an_agent_started_before(tmp_path, fake_agent):
    clock = Clock()
    before = make(tmp_path, fake_agent, clock, ReclaimPlan())
    after = None
    try:
        before.launch(LaunchRequest("c7i.large:spot", "tok-1"))
        argv = argv_of(tmp_path, "tok-1")
        seen: list[Notice] = []
        watcher = NoticeWatcher(argv[argv.index("--imds-url") + 1], seen.append)
        assert watcher.poll() == []  # the first daemon's stand-in: no notice yet
        before.close()  # the daemon stops; its agent keeps running and polling that URL

        after = make(tmp_path, fake_agent, clock, ReclaimPlan())  # the next daemon
        after.resume_notices()  # as it starts leading, before any launch
        after.reclaim("tok-1")
        clock.now = 1010.0
        [notice] = watcher.poll()  # a fresh IMDSv2 session (the old token gets a 401)
        assert notice == Notice(INSTANCE_ACTION, "terminate", "1970-01-01T00:17:10Z")
    finally:
        (after or before).terminate_all()
        if after is not None:
            after.close()


def test_without_an_earlier_stand_in_resuming_serves_nothing(tmp_path, fake_agent):
    cloud = make(tmp_path, fake_agent, Clock(), ReclaimPlan())
    cloud.resume_notices()  # no agent polls any port: none is taken
    assert not (tmp_path / "cloud" / "imds-port").exists()
    cloud.close()
