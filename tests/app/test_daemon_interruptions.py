"""`autoscaler_interruptions_total` counts each reclaim notice the daemon records once:
not again at the rounds and steps that see it again, nor after a restart."""

from __future__ import annotations

from dataclasses import replace

from app.daemon import Daemon
from autoscaler.execution import INSTANCE_ACTION, REBALANCE, ExecutorReport, InstanceNotice
from tests.app.simulated_daemon import SimulatedDaemon
from tests.simulator.test_hand_computed import job

RECLAIM = InstanceNotice(INSTANCE_ACTION, "terminate", "2026-11-26T19:02:00Z")


class Noticing:
    """The world's executor, with notices its workers report (`notices`: instance → kinds)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.notices: dict[str, tuple[InstanceNotice, ...]] = {}

    def report(self) -> ExecutorReport:
        return replace(self.inner.report(), notices=dict(self.notices))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def reclaims(daemon: Daemon, offering: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "autoscaler_interruptions_total", {"type": offering, "capacity_type": "on-demand"}
    )
    return value or 0.0


def test_each_reclaim_is_counted_once_across_rounds_steps_and_a_restart(tmp_path):
    cluster = SimulatedDaemon(
        tmp_path / "cluster", [job("a", 0, 3000, (2, 8, 32)), job("b", 0, 3000, (2, 8, 32))]
    )
    try:
        daemon = cluster.daemon
        executor = Noticing(daemon.bindings.executor)
        daemon.bindings.executor = daemon.loop.executor = executor
        daemon.round()
        cluster.until(200.0)
        first, second = sorted(i.instance_id for i in cluster.store.instances())
        offering = cluster.store.instance(first).instance_type
        executor.notices = {first: (RECLAIM,), second: (InstanceNotice(REBALANCE, "", ""),)}
        daemon.step()
        assert reclaims(daemon, offering) == 1.0  # the rebalance recommendation is no reclaim
        daemon.round()
        daemon.step()
        assert reclaims(daemon, offering) == 1.0  # seen again: not counted again

        restarted = Daemon(cluster.config, daemon.bindings, clock=cluster.engine)
        restarted.step()
        assert reclaims(restarted, offering) == 0.0  # its predecessor counted that one
        executor.notices[second] = (RECLAIM,)
        restarted.round()
        restarted.step()
        assert reclaims(restarted, cluster.store.instance(second).instance_type) == 1.0
    finally:
        cluster.close()
