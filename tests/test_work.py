"""One definition of a job's work, read by the simulator, every bound and every report."""

import gzip
import json

import pytest

from app.bundled import bundled
from app.files import jobs_from_eva
from autoscaler.errors import InputError
from autoscaler.jobs import TraceFacts
from autoscaler.work import Work, check_work, job_work, solo_seconds
from tests.builders import job


def _job(duration=None, total_iters=None, full_throughput=None):
    return job(
        "j",
        (0, 4, 8),
        full_throughput=full_throughput,
        trace=TraceFacts(arrival_time_s=0.0, duration_s=duration, total_iters=total_iters),
    )


def test_iterations_at_the_solo_speed_are_the_work_when_both_are_given():
    # 26,103 iterations at 2.1/s is 12,430 s: duration agrees to the iteration.
    work = job_work(_job(duration=12430, total_iters=26103, full_throughput=2.1))
    assert work == Work(26103, 2.1)
    assert work.seconds == pytest.approx(12430.0)


def test_a_duration_alone_is_that_many_seconds_of_work():
    assert job_work(_job(duration=3600)) == Work(3600, 1.0)
    # A solo speed without iterations says nothing about how long the job runs.
    assert solo_seconds(_job(duration=3600, full_throughput=5.0)) == 3600


def test_a_rounded_iteration_count_is_not_a_disagreement():
    # 0.0083 iterations/s: 299 is 0.67 iteration under duration × speed, 80 s less.
    speed = 0.008324104361236095
    seconds = solo_seconds(_job(duration=36_000, total_iters=299, full_throughput=speed))
    assert seconds == pytest.approx(299 / speed)
    assert abs(seconds - 36_000) > 60


def test_a_trace_saying_two_things_is_refused_in_one_line_naming_job_and_both_values():
    # A duration twice its iterations: bounds once read the one, the world the other.
    bad = _job(duration=7200, total_iters=3600, full_throughput=1.0)
    with pytest.raises(InputError) as refused:
        check_work([bad], "t.json")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("t.json: job 'j': 'duration' = 7200 s but")
    assert "3600 / 1 = 3600 s" in message
    # Two iterations off is already beyond rounding.
    with pytest.raises(InputError):
        job_work(_job(duration=1000, total_iters=1002, full_throughput=1.0))


def test_a_job_without_work_is_refused():
    with pytest.raises(InputError, match=r"job 'j'.*needs 'duration' or 'total_iters'"):
        job_work(_job(total_iters=100))


@pytest.mark.parametrize("name", ["pai_200.json", "pai_full.json.gz"])
def test_the_bundled_traces_agree_to_within_an_iteration(name):
    # Most of their jobs differ by a fraction of an iteration: they must load.
    path = bundled(name)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        jobs = jobs_from_eva(json.load(f))
    check_work(jobs)
    differ = sum(abs(solo_seconds(j) - j.trace.duration_s) > 1e-6 for j in jobs)
    assert differ > len(jobs) // 2
