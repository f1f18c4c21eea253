"""Failure classes: only the job's own failures count; a deterministic one fails the job
at once; a transient one waits a bounded, doubling back-off (one rule a test)."""

from __future__ import annotations

from autoscaler.execution import TaskReport
from autoscaler.failures import Backoff, attempt_ended, classify
from autoscaler.jobs import TaskRun
from autoscaler.store import TaskRecord

RUN = TaskRun(image="job:1", fatal_exit_codes=(3,))
BACKOFF = Backoff(base_s=10.0, max_s=60.0)


def running(failures: int = 0, retries: int = 0) -> TaskRecord:
    return TaskRecord(
        "a/0", "a", "running", "inst-1", "inst-1", attempt=4, failures=failures, retries=retries
    )


def failed(exit_code: int | None = None, failure=None) -> TaskReport:
    return TaskReport("a/0", "failed", "inst-1", 4, exit_code=exit_code, failure=failure)


def test_the_workers_class_is_taken_as_said():
    assert classify(failed(exit_code=1, failure="infrastructure"), RUN) == "infrastructure"
    assert classify(failed(exit_code=3, failure="transient"), RUN) == "transient"


def test_without_a_class_a_declared_fatal_or_not_runnable_exit_code_is_deterministic():
    assert classify(failed(exit_code=3), RUN) == "deterministic"
    assert classify(failed(exit_code=127), RUN) == "deterministic"
    assert classify(failed(exit_code=1), RUN) == "transient"
    assert classify(failed(), RUN) == "transient"


def test_an_infrastructure_end_is_retried_at_once_and_never_counted():
    end = attempt_ended(
        running(failures=2, retries=5),
        "infrastructure",
        "lost worker",
        now=100.0,
        max_attempts=3,
        backoff=BACKOFF,
    )
    assert not end.counted and end.job_failure == ""
    assert end.update.failures is None  # kept: 2 of 3 stays 2 of 3
    assert (end.update.retries, end.update.failure, end.update.retry_at) == (
        6,
        "infrastructure",
        None,
    )
    assert end.update.status == "pending" and end.update.instance_id is None


def test_a_deterministic_error_fails_the_job_at_once_with_its_reason():
    end = attempt_ended(
        running(), "deterministic", "image not found", now=0.0, max_attempts=3, backoff=BACKOFF
    )
    assert end.job_failure == "task a/0 failed with a deterministic error: image not found"
    assert end.update.failures == 1


def test_a_transient_error_waits_a_doubling_back_off_bounded_by_its_maximum():
    waits = []
    for failures in (0, 1, 2, 3):
        end = attempt_ended(
            running(failures=failures),
            "transient",
            "exit code 1",
            now=1000.0,
            max_attempts=100,
            backoff=BACKOFF,
        )
        assert end.update.retry_at is not None
        waits.append(end.update.retry_at - 1000.0)
    assert waits == [10.0, 20.0, 40.0, 60.0]


def test_the_max_attempts_th_transient_failure_fails_the_job_with_the_last_reason():
    end = attempt_ended(
        running(failures=2), "transient", "exit code 1", now=0.0, max_attempts=3, backoff=BACKOFF
    )
    assert end.update.failures == 3
    assert end.job_failure == (
        "task a/0 failed 3 times; last: attempt 4 failed (transient): exit code 1"
    )
