"""The fault benchmark's bookkeeping, without Docker: goals judged from the measured
figures, checkpoint steps read from references, and duplicates counted from samples."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.faults import (
    CHECKPOINT_EVERY_S,
    STEP_S,
    TAKEOVER_GOAL_S,
    Outcome,
    Sampler,
    _step_of,
    table,
)
from executor.runtime import LABEL_ATTEMPT, LABEL_TASK
from executor.storage import checkpoint_key

INTERVAL = CHECKPOINT_EVERY_S / STEP_S


def met(fault: str = "kill-agent", **figures) -> Outcome:
    base = dict(
        checkpoint_step=200,
        progress_at_fault=250.0,
        resumed_step=200,
        lost=50.0,
        detect_s=9.0,
        recover_s=3.0,
        job_status="completed",
        leaks={"containers": 0, "running": 0, "agents": 0, "instances": 0},
    )
    return Outcome(fault, **{**base, **figures})


def test_every_goal_is_met_by_figures_within_it():
    assert all(met().goals().values())


def test_each_figure_past_its_goal_misses_that_goal_only():
    cases = {
        "lost ≤ interval": {"lost": INTERVAL + 1},
        "resumed ≥ checkpoint": {"resumed_step": 0},
        "detect": {"detect_s": 10.5},
        "recover ≤ round": {"recover_s": 40.0},
        "no duplicates": {"duplicates": 1},
        "no leaks": {"leaks": {"containers": 1, "running": 0, "agents": 0, "instances": 0}},
        "completed": {"job_status": "failed"},
    }
    for goal, figures in cases.items():
        goals = met(**figures).goals()
        assert [k for k, v in goals.items() if v is False] == [goal], (goal, goals)


def test_a_standby_has_thirty_seconds_to_take_over_and_unmeasured_figures_are_not_judged():
    leader = Outcome("kill-leader", detect_s=TAKEOVER_GOAL_S - 1, job_status="completed")
    goals = leader.goals()
    assert goals["detect"] is True
    assert goals["lost ≤ interval"] is None and goals["resumed ≥ checkpoint"] is None
    assert Outcome("kill-leader", detect_s=TAKEOVER_GOAL_S + 1).goals()["detect"] is False


def test_the_step_of_a_checkpoint_is_read_from_its_storage_key():
    ref = "file:///x/" + checkpoint_key("job-1", "job-1/trainer", 3, 1700)
    assert _step_of(ref) == 1700
    assert _step_of(None) is None
    assert _step_of("file:///x/jobs/job-1/trainer/3/output.log") is None


class FakeDocker:
    """Docker's `containers.list` answering a scripted sequence of running containers."""

    def __init__(self, samples):
        self.samples = list(samples)
        self.containers = self

    def list(self, filters):
        return [
            SimpleNamespace(labels={LABEL_TASK: task, LABEL_ATTEMPT: str(attempt)})
            for task, attempt in self.samples.pop(0)
        ]


def test_two_attempts_of_one_task_seen_running_together_are_a_duplicate():
    docker = FakeDocker(
        [
            [("j/t", 1), ("j/u", 1)],  # two tasks: not a duplicate
            [("j/t", 1), ("j/t", 2), ("j/u", 1)],  # attempt 2 starts before 1 stopped
            [("j/t", 2), ("j/u", 1)],
        ]
    )
    sampler = Sampler(docker, "j")
    for now in (10.0, 10.2, 10.4):
        sampler.sample(now)
    assert sampler.max_copies == 2
    assert sampler.overlap_s > 0
    assert sampler.running_since("j/t", after_attempt=1) == 10.2
    assert sampler.running_since("j/t", after_attempt=2) is None


def test_one_attempt_at_a_time_is_no_duplicate():
    docker = FakeDocker([[("j/t", 1)], [], [("j/t", 2)]])
    sampler = Sampler(docker, "j")
    for now in (1.0, 2.0, 3.0):
        sampler.sample(now)
    assert sampler.max_copies == 1 and sampler.overlap_s == 0


def test_the_table_names_the_missed_goals():
    text = table([met(), met("pause-agent", duplicates=1)])
    [ok_row] = [line for line in text.splitlines() if "kill-agent" in line]
    [bad_row] = [line for line in text.splitlines() if "pause-agent" in line]
    assert ok_row.rstrip().endswith("none")
    assert "no duplicates" in bad_row
