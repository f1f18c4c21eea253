"""The daemon runs a round at once when a worker reports its instance is being reclaimed,
rather than at the next period; a rebalance recommendation waits for the next round."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from app.daemon import Daemon
from autoscaler.execution import INSTANCE_ACTION, REBALANCE, InstanceNotice


@pytest.fixture
def daemon():
    """A daemon's scheduling part only: its APScheduler with the round due in an hour."""
    scheduler = BackgroundScheduler(timezone=UTC)
    later = datetime.now(UTC) + timedelta(hours=1)
    scheduler.add_job(lambda: None, "interval", seconds=3600, id="round", next_run_time=later)
    scheduler.start(paused=True)
    daemon = Daemon.__new__(Daemon)  # nothing else of it is needed here
    daemon.scheduler = scheduler
    yield daemon, later
    scheduler.shutdown(wait=False)


def test_a_reclaim_notice_brings_the_round_forward(daemon):
    daemon, later = daemon
    daemon.noticed("inst-1", InstanceNotice(INSTANCE_ACTION, "terminate", "2026-11-26T19:02:00Z"))
    due = daemon.scheduler.get_job("round").next_run_time
    assert due < later and (datetime.now(UTC) - due).total_seconds() < 60


def test_a_rebalance_recommendation_does_not(daemon):
    daemon, later = daemon
    daemon.noticed("inst-1", InstanceNotice(REBALANCE, "", "2026-11-26T18:50:00Z"))
    assert daemon.scheduler.get_job("round").next_run_time == later
