"""Whose doing an attempt's end was, and what follows from it: one owner for the rule.

An attempt that ends without completing is one of three classes
(`autoscaler.execution.FailureClass`), and only the job's own failures count
against it:

- **infrastructure** — the worker or its instance was lost or reclaimed, the
  daemon stopped it, the cluster was brought down, storage was out of reach:
  the task goes back to pending and resumes from its newest checkpoint, at
  once, and nothing is counted against `max_attempts`;
- **deterministic** — the job's own error, which a retry would repeat (the
  build fails, the image cannot be pulled, the command is not found, an exit
  code the job file declares fatal): the job fails at once, with the reason;
- **transient** — the job failed but a retry may not: it is retried after a
  back-off that doubles with each counted failure (bounded), recorded in the
  state (`TaskRecord.retry_at`) so a restarted daemon keeps it; the
  `max_attempts`-th counted failure fails the job.

The worker says the class (`TaskReport.failure`); an agent too old to say is
classified here from its exit code (`classify`), the one place that knows how.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.execution import FailureClass, TaskReport
from autoscaler.jobs import TaskRun
from autoscaler.store import TaskRecord, TaskUpdate

#: Exit codes a shell gives a command it could not run (126: not executable; 127:
#: not found): retrying cannot help.
NOT_RUNNABLE_EXIT_CODES: frozenset[int] = frozenset({126, 127})


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a task waits before its next attempt after a transient failure:
    `base_s` after the first, doubling with each counted failure, at most `max_s`."""

    base_s: float = 10.0
    max_s: float = 300.0

    def delay_s(self, failures: int) -> float:
        """The wait after the `failures`-th counted failure (0 before any)."""
        if failures <= 0:
            return 0.0
        return min(self.max_s, self.base_s * 2.0 ** min(failures - 1, 30))


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """An attempt that ended without completing, as the state records it: the task's
    update, its class, and the job's failure when this end fails the job ("" if not)."""

    task_id: str
    attempt: int
    failure: FailureClass
    reason: str
    update: TaskUpdate
    job_failure: str = ""

    @property
    def counted(self) -> bool:
        """Whether it counts toward `max_attempts`."""
        return self.failure != "infrastructure"


def classify(report: TaskReport, run: TaskRun) -> FailureClass:
    """The class of a failed attempt: the worker's word when it gives one; otherwise
    (an agent older than the field) from its exit code — a code the job declares fatal,
    or one saying the command could not run, is deterministic; any other is transient."""
    if report.failure is not None:
        return report.failure
    code = report.exit_code
    if code is not None and (code in run.fatal_exit_codes or code in NOT_RUNNABLE_EXIT_CODES):
        return "deterministic"
    return "transient"


def attempt_ended(
    task: TaskRecord,
    failure: FailureClass,
    why: str,
    *,
    now: float,
    max_attempts: int,
    backoff: Backoff,
    checkpoint: str | None = None,
) -> AttemptEnd:
    """What an attempt ending with `failure` (and `why`) does to its task and its job.

    Every class sends the task back to pending, to resume from its newest
    checkpoint (`checkpoint`, when the end reported a newer one), and counts a
    retry; only a counted failure adds to `failures` and waits its back-off.
    """
    counted = failure != "infrastructure"
    failures = task.failures + 1 if counted else task.failures
    reason = f"attempt {task.attempt} failed ({failure}): {why}"
    job_failure = ""
    if failure == "deterministic":
        job_failure = f"task {task.task_id} failed with a deterministic error: {why}"
    elif counted and failures >= max_attempts:
        job_failure = f"task {task.task_id} failed {failures} times; last: {reason}"
    update = TaskUpdate(
        task.task_id,
        status="pending",
        instance_id=None,
        checkpoint=checkpoint,
        failures=failures if counted else None,
        reason=reason,
        throughput=None,
        gpus=(),
        retries=task.retries + 1,
        failure=failure,
        retry_at=now + backoff.delay_s(failures) if failure == "transient" else None,
    )
    return AttemptEnd(task.task_id, task.attempt, failure, why, update, job_failure)
