"""Replays small enough to compute by hand: every second and every cent accounted for.

Shared setting: rounds every 300 s from t = 0; instances take 20 s to acquire
and 30 + 50 s to set up (ready 100 s after the launch request) and 1 s to
terminate; a task fetches for 2 s and builds its image for 10 s, its job then
initializes for 8 s; one iteration per second.
"""

import dataclasses

import pytest

from autoscaler.catalog import Catalog, InstanceType, LaunchDelays
from autoscaler.jobs import JobSpec, TaskRun, TaskSpec, TraceFacts
from autoscaler.resources import Resources
from autoscaler.throughput import ThroughputTable
from simulator.replay import replay

DELAYS = LaunchDelays(acquisition_s=20.0, setup_s=80.0, terminate_s=1.0)
NO_INTERFERENCE = ThroughputTable(default=1.0)


def catalog() -> Catalog:
    return Catalog(
        [
            InstanceType("big", "f", Resources(2, 8, 32), 5.0, DELAYS),
            InstanceType("small", "f", Resources(1, 4, 16), 3.0, DELAYS),
        ]
    )


def job(
    job_id: str, arrival: float, seconds: float, demand: tuple[float, float, float] = (1, 4, 16)
) -> JobSpec:
    task = TaskSpec(
        f"{job_id}/0",
        job_id,
        "node0",
        f"w{job_id}_node0",
        (("any", Resources(*demand)),),
        kill_s=1.0,
        upload_s=5.0,
        fetch_s=2.0,
        build_image_s=10.0,
        run=TaskRun(image=f"img-{job_id}"),
    )
    return JobSpec(
        job_id,
        f"w{job_id}",
        (task,),
        full_throughput=1.0,
        trace=TraceFacts(arrival_time_s=arrival, duration_s=seconds, total_iters=seconds),
        init_delay_s=8.0,
    )


@pytest.mark.parametrize("scheduler", ["eva", "no-packing", "stratus", "synergy", "owl"])
def test_one_job_on_one_instance_costs_its_delays_plus_its_duration(scheduler):
    # Launch at the round at t=0; ready at 100; fetch+build until 112; init until
    # 120; 1000 s of work until 1120; the round at 1200 drains the instance,
    # which terminates at 1201. Billed 1201 s of "small" at $3/h.
    result = replay([job("a", 0.0, 1000.0)], catalog(), NO_INTERFERENCE, scheduler)
    assert result.jct_hours["a"] * 3600 == pytest.approx(1120.0)
    assert result.instances_launched == 1
    assert result.total_cost == pytest.approx(1201 / 3600 * 3.0)
    assert result.billed == pytest.approx(result.total_cost)


def test_two_jobs_that_fit_together_share_one_instance():
    # RP $3 each; together on "big" ($5) they are worth 2 x 3 x 0.95 = $5.70 >= $5.
    # Both start at 100 on the same fresh instance (both build their image):
    # running at 112, progressing from 120, done at 1120; terminated at 1201.
    result = replay(
        [job("a", 0.0, 1000.0), job("b", 0.0, 1000.0)], catalog(), NO_INTERFERENCE, "eva"
    )
    assert result.instances_launched == 1
    assert result.total_cost == pytest.approx(1201 / 3600 * 5.0)
    assert result.jct_hours == pytest.approx({"a": 1120 / 3600, "b": 1120 / 3600})


def test_a_migration_pauses_the_job_for_exactly_its_delays_and_is_billed():
    # Round 0: a alone on a new "small". Round 300: b arrives and Full
    # Reconfiguration puts a and b on a new "big" (ready at 400).
    # a keeps running on "small" until "big" is ready (make before break):
    # stopped at 400, killed at 401 (still progressing), checkpoint uploaded at
    # 406, then fetch+build on "big" until 418, init until 426. So a paused
    # 25 s = upload 5 + fetch 2 + build 10 + init 8: 281 s done, 719 s left,
    # done at 1145. b starts on "big" at 400: running 412, progressing 420,
    # 600 s of work, done at 1020. "small" terminates when a's upload frees it
    # (406 + 1 s); "big" at the round at 1200 (+ 1 s).
    result = replay(
        [job("a", 0.0, 1000.0), job("b", 300.0, 600.0)], catalog(), NO_INTERFERENCE, "eva-full-only"
    )
    assert result.migrations == 1
    assert result.jct_hours["a"] * 3600 == pytest.approx(1145.0)
    assert result.jct_hours["b"] * 3600 == pytest.approx(720.0)
    assert result.total_cost == pytest.approx(407 / 3600 * 3.0 + (1201 - 300) / 3600 * 5.0)
    assert result.billed == pytest.approx(result.total_cost)


def test_eva_learns_hidden_interference_and_separates_the_pair():
    # Each job runs at 0.8 next to the other — the planner is not told. At 0 the
    # pair looks worth 2 x 3 x 0.95 = $5.70 >= $5 and shares "big". By the round
    # at 300 it has observed 0.8: worth $4.80 < $5, so Partial Reconfiguration
    # releases "big" and puts each job on a new "small" (ready at 400). Both keep
    # running at 0.8 until killed at 401 (224.8 iterations done), pause for
    # upload, fetch, build and init until 426, then finish the other 775.2 at
    # full speed: done at 1201.2. "big" ends at 407; the smalls at the round
    # at 1500 (+1 s).
    truth = (
        ThroughputTable(default=1.0)
        .observe("wa_node0", ["wb_node0"], 0.8)
        .observe("wb_node0", ["wa_node0"], 0.8)
    )
    result = replay([job("a", 0.0, 1000.0), job("b", 0.0, 1000.0)], catalog(), truth, "eva")
    assert result.instances_launched == 3
    assert result.migrations == 2
    assert result.jct_hours["a"] * 3600 == pytest.approx(426 + (1000 - 0.8 * 281))
    assert result.total_cost == pytest.approx(407 / 3600 * 5.0 + 2 * (1501 - 300) / 3600 * 3.0)


def test_mild_hidden_interference_keeps_the_pair_together_and_slows_it():
    # Same pair, but the hidden slowdown is mild (0.9): worth $5.40 >= $5, so
    # they stay together; both run at 0.9 from 120: done at 120 + 1000 / 0.9.
    truth = (
        ThroughputTable(default=1.0)
        .observe("wa_node0", ["wb_node0"], 0.9)
        .observe("wb_node0", ["wa_node0"], 0.9)
    )
    result = replay([job("a", 0.0, 1000.0), job("b", 0.0, 1000.0)], catalog(), truth, "eva")
    assert result.instances_launched == 1 and result.migrations == 0
    assert result.jct_hours["a"] * 3600 == pytest.approx(120 + 1000 / 0.9)
    assert result.normalized_throughput == pytest.approx(0.9)


def test_jobs_with_no_solo_speed_are_measured_alone_then_packed_then_separated():
    # The pair of the test above, but neither job states its solo speed: a
    # throughput seen beside the other could not be normalized, so the 0.8 would
    # never be learned and the pair would stay packed at 0.8 for good. Round 0:
    # each alone on a "small"; both run from 120 at one iteration per second.
    # Round 300: both solo speeds are known (1.0), so the smalls are provisional:
    # Partial re-places the pair as new jobs, together on "big" (ready at 400).
    # Killed at 401 (281 done), upload until 406 (the smalls end at 407),
    # fetch, build and init until 426, then 0.8 each. Round 600: 0.8 observed,
    # worth $4.80 < $5: each to a new "small" (ready at 700), killed at 701 (220
    # more), resumed at 726 at full speed for the last 499: done at 1225. "big"
    # ends at 707, the new smalls at the round at 1500 (+1 s).
    truth = (
        ThroughputTable(default=1.0)
        .observe("wa_node0", ["wb_node0"], 0.8)
        .observe("wb_node0", ["wa_node0"], 0.8)
    )
    jobs = [
        dataclasses.replace(job(name, 0.0, 1000.0), full_throughput=None) for name in ("a", "b")
    ]
    result = replay(jobs, catalog(), truth, "eva")
    assert result.instances_launched == 5
    assert result.migrations == 4
    assert result.jct_hours["a"] * 3600 == pytest.approx(726 + (1000 - 281 - 0.8 * 275))
    assert result.total_cost == pytest.approx(
        2 * 407 / 3600 * 3.0 + (707 - 300) / 3600 * 5.0 + 2 * (1501 - 600) / 3600 * 3.0
    )
