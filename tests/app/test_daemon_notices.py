"""The daemon runs a round at once when a worker reports its instance is being reclaimed,
rather than at the next period — also when the notice comes while a round runs; a
rebalance recommendation waits for the next round."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from app.daemon import REPLAN_JOB, Daemon, job_scheduler
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


NOTICE = InstanceNotice(INSTANCE_ACTION, "terminate", "2026-11-26T19:02:00Z")


def test_a_reclaim_notice_brings_a_round_forward(daemon):
    daemon, later = daemon
    daemon.noticed("inst-1", NOTICE)
    due = daemon.scheduler.get_job(REPLAN_JOB).next_run_time
    assert due < later and (datetime.now(UTC) - due).total_seconds() < 60


def test_a_notice_during_a_round_gets_a_round_right_after_it():
    """APScheduler skips a run of a job still running: bringing the periodic round
    forward mid-round left the reclaim to the round an hour later."""
    started, release, again = threading.Event(), threading.Event(), threading.Event()
    calls = []

    def round_() -> None:
        calls.append(datetime.now(UTC))
        if len(calls) == 1:
            started.set()
            release.wait(timeout=300)
        else:
            again.set()

    scheduler = job_scheduler()  # the daemon's own: one worker thread, one run per job
    daemon = Daemon.__new__(Daemon)
    daemon.scheduler = scheduler
    daemon.round = round_  # the round the replan job runs
    scheduler.add_job(round_, "interval", seconds=3600, id="round", next_run_time=datetime.now(UTC))
    scheduler.start()
    try:
        assert started.wait(timeout=300), "the first round never ran"
        daemon.noticed("inst-1", NOTICE)  # while that round runs
        release.set()
        # a deadline, not a timing: the next periodic round is an hour away
        assert again.wait(timeout=300), "no round followed the notice"
    finally:
        release.set()
        scheduler.shutdown(wait=False)


def test_a_rebalance_recommendation_does_not(daemon):
    daemon, later = daemon
    daemon.noticed("inst-1", InstanceNotice(REBALANCE, "", "2026-11-26T18:50:00Z"))
    assert daemon.scheduler.get_job("round").next_run_time == later
    assert daemon.scheduler.get_job(REPLAN_JOB) is None
