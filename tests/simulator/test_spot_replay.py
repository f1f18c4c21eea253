"""Replays with spot offerings: reclaims lose only the work since the newest checkpoint
and never fail a job, capacity and deadlines hold, availability traces parse and repeat."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from autoscaler.availability import AvailabilityTrace
from autoscaler.catalog import SPOT, Catalog, InstanceType, LaunchDelays
from autoscaler.decide import RECLAIM_HOLD_S
from autoscaler.errors import InputError
from autoscaler.jobs import JobSpec, TaskRun, TaskSpec, TraceFacts
from autoscaler.resources import Resources
from autoscaler.spot import SpotPolicy, exposure_hours, pinned_on_demand, rollback_s
from autoscaler.throughput import ThroughputTable
from provisioners.catalog import bundled_spot_snapshot, spot_offerings
from simulator.replay import ReplayResult, SpotReplay, replay, spot_variant
from simulator.spot import NOTICE_POLL_S, NOTICE_S, parse_trace_flag
from simulator.world import ground_truth
from state.memory import InMemoryStore

DELAYS = LaunchDelays(acquisition_s=20.0, setup_s=80.0, terminate_s=1.0)
NO_INTERFERENCE = ThroughputTable(default=1.0)


def catalog(rate: float = 0.0) -> Catalog:
    return Catalog(
        [
            InstanceType("small", "f", Resources(1, 4, 16), 3.0, DELAYS),
            InstanceType(
                "small:spot",
                "f",
                Resources(1, 4, 16),
                1.0,
                DELAYS,
                market=SPOT,
                ec2_type="small",
                interruption_per_hour=rate,
            ),
        ]
    )


def job(
    job_id: str, seconds: float, arrival: float = 0.0, upload_s: float = 5.0, **fields
) -> JobSpec:
    task = TaskSpec(
        f"{job_id}/0",
        job_id,
        "node0",
        f"w{job_id}_node0",
        (("any", Resources(1, 4, 16)),),
        kill_s=1.0,
        upload_s=upload_s,
        fetch_s=2.0,
        build_image_s=10.0,
        run=TaskRun(image=f"img-{job_id}", checkpoint_every_s=900.0),
    )
    return JobSpec(
        job_id,
        f"w{job_id}",
        (task,),
        full_throughput=1.0,
        trace=TraceFacts(arrival_time_s=arrival, duration_s=seconds, total_iters=seconds),
        init_delay_s=8.0,
        **fields,
    )


def types_used(store: InMemoryStore) -> dict[str, list[str]]:
    """Job id -> the instance types its tasks were placed on, in order."""
    kinds = {i.instance_id: i.instance_type for i in store.instances(include_finished=True)}
    used: dict[str, list[str]] = {}
    for p in store.placements():
        used.setdefault(p.job_id, []).append(kinds[p.instance_id])
    return used


def test_a_calm_spot_offering_runs_the_job_and_the_ledger_charges_its_price() -> None:
    store = InMemoryStore()
    result = replay(
        [job("a", 3000.0)], catalog(0.0), NO_INTERFERENCE, "eva", store=store, spot=SpotReplay()
    )
    assert types_used(store) == {"a": ["small:spot"]}
    assert result.finished and result.spot is not None
    assert result.spot["spot_share"] == 1.0 and result.spot["interruptions"] == 0
    # billed at $1/h from launch (t=0) to termination, as the world billed it
    assert result.total_cost == pytest.approx(result.billed)
    assert result.total_cost < 3000.0 / 3600.0 * 3.0 / 2


#: Spot capacity until 2400 s, then none until 4800 s: notice at 2280 s, reclaim at 2400 s.
OUT_AT_2400 = AvailabilityTrace(2400.0, (0, 1))


def one_job_reclaimed_at_2400(
    store: InMemoryStore | None = None, upload_s: float = 5.0
) -> ReplayResult:
    """A 6000 s job on `small:spot` under `OUT_AT_2400`, replayed with eva."""
    return replay(
        [job("a", 6000.0, upload_s=upload_s)],
        catalog(0.0),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": OUT_AT_2400}),
    )


def test_a_reclaim_notice_checkpoints_the_task_and_nothing_is_lost() -> None:
    # No capacity in [2400, 4800): notice at 2280, reclaim at 2400. As the worker agent
    # does, the task is checkpointed and stopped when it sees the notice at its next poll
    # (1 s kill, 5 s upload), long before the reclaim, so none of its work is redone.
    store = InMemoryStore()
    result = one_job_reclaimed_at_2400(store)
    assert result.finished and result.jobs_completed == 1
    assert result.spot["interruptions"] == 1 and result.spot["lost_task_hours"] == 0.0
    first = min(store.placements(), key=lambda p: p.start)
    heard = 2400.0 - NOTICE_S + NOTICE_POLL_S
    assert first.end == pytest.approx(heard + 1.0 + 5.0)  # kill, upload
    [noticed] = store.interruptions()
    assert (noticed.kind, noticed.offering) == ("reclaim", "small:spot")
    assert noticed.at == pytest.approx(heard)  # the daemon heard it with the agent


def test_a_checkpoint_the_notice_cannot_fit_loses_the_work_since_the_periodic_one() -> None:
    # The same reclaim, but the checkpoint takes 300 s to upload: the instance goes in
    # the middle of it. The job ran from 120 s until its kill ended at 2286 s (notice
    # seen at 2285 s), 2166 s, with periodic checkpoints at 900 and 1800 s of running:
    # 366 s are lost.
    result = one_job_reclaimed_at_2400(upload_s=300.0)
    assert result.finished and result.spot["interruptions"] == 1
    assert result.spot["lost_task_hours"] == pytest.approx(366.0 / 3600.0, abs=1e-6)
    assert result.spot["lost_gpu_hours"] == pytest.approx(366.0 / 3600.0, abs=1e-6)


def test_without_checkpoints_a_reclaim_restarts_the_job_from_scratch() -> None:
    row = spot_variant("spot-restart", SpotReplay(traces={"small": OUT_AT_2400}))
    assert (row.scheduler, row.on_spot, row.settings.checkpoints) == ("no-packing", True, False)
    result = replay(
        [job("a", 6000.0)], catalog(0.0), NO_INTERFERENCE, row.scheduler, spot=row.settings
    )
    assert result.finished
    # stopped on the notice, with nothing to resume from: all its running, 120 s to 2286 s
    assert result.spot["lost_task_hours"] == pytest.approx(2166.0 / 3600.0, abs=1e-6)


def test_after_a_notice_the_replacement_goes_elsewhere_not_into_the_reclaimed_pool() -> None:
    # The trace says spot is there until 2400 s, but the notice at 2280 s says its
    # capacity is being taken back: the round at the notice launches on-demand, and no
    # spot instance is asked for until the hold ends, 180 s after the daemon heard it.
    store = InMemoryStore()
    one_job_reclaimed_at_2400(store)
    heard = 2400.0 - NOTICE_S + NOTICE_POLL_S
    launches = [
        (r.at, a.detail["type"])
        for r in store.rounds()
        for a in r.actions
        if a.kind == "launch" and a.outcome in ("done", "failed")
    ]
    assert (heard, "small") in launches
    assert not [t for at, t in launches if heard <= at < heard + RECLAIM_HOLD_S and t != "small"]
    assert len(store.interruptions()) == 1  # the replacement was never reclaimed


def test_capacity_on_demand_is_never_placed_on_spot() -> None:
    store = InMemoryStore()
    jobs = [
        job("od", 2000.0, capacity="on-demand"),
        job("auto", 2000.0),
        job("sp", 2000.0, capacity="spot"),
    ]
    result = replay(jobs, catalog(0.0), NO_INTERFERENCE, "eva", store=store, spot=SpotReplay())
    used = types_used(store)
    assert result.finished
    assert set(used["od"]) == {"small"}
    assert set(used["auto"]) == {"small:spot"} and set(used["sp"]) == {"small:spot"}


def test_a_deadline_job_switches_to_on_demand_when_a_reclaim_eats_its_slack() -> None:
    # 10,000 s of work due 12,300 s after arrival; the rule keeps 217 s of restart
    # (Table 1's start-up and the job's init), a 900 s margin and the 900 s a reclaim
    # can take back (its checkpoint interval): on spot at first (10,000 + 2,017 <
    # 12,300). Its checkpoint takes 300 s to upload, so the one the notice asks for is
    # cut by the reclaim at 2400 s, which takes the job back to its periodic checkpoint
    # at 1,800 s of running: 8,200 + 2,017 ≥ 12,300 − 2,400, pinned to on-demand, where
    # it stays. (Unpinned, it returns to spot when capacity does, at 4,800 s.)
    store = InMemoryStore()
    result = replay(
        [job("a", 10_000.0, upload_s=300.0, deadline_s=12_300.0)],
        catalog(0.0),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": OUT_AT_2400}),
    )
    used = types_used(store)["a"]
    assert used[0] == "small:spot" and set(used[1:]) == {"small"}
    assert result.spot["deadlines_met"] == result.spot["jobs_with_deadline"] == 1
    assert result.jct_hours["a"] * 3600.0 <= 12_300.0
    # the same job without a deadline goes back to spot
    store = InMemoryStore()
    replay(
        [job("a", 10_000.0, upload_s=300.0)],
        catalog(0.0),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": OUT_AT_2400}),
    )
    assert types_used(store)["a"].count("small:spot") > 1


def test_the_spot_checkpoint_baseline_keeps_eva_s_deadline_margin_at_the_raw_price() -> None:
    # Its jobs checkpoint every 900 s as eva's do, so a reclaim can take as much back
    # from them: the deadline rule keeps the same margin for it (`rollback_s`) and the
    # reclaim test counts the same redone work — the two rows run one safety net — while
    # the baseline plans spot at the raw price, pricing no loss.
    base = SpotReplay()
    eva = spot_variant("eva", base).settings.policy
    row = spot_variant("spot-checkpoint", base)
    assert (row.scheduler, row.on_spot, row.settings.checkpoints) == ("no-packing", True, True)
    policy = row.settings.policy
    assert eva is not None and policy is not None
    a = job("a", 10_000.0, deadline_s=12_300.0)
    assert rollback_s(a, policy) == rollback_s(a, eva) == 900.0
    assert exposure_hours(10_000.0, 2, 0.0, 0.0, policy) == pytest.approx(11_800.0 / 3600.0)
    # After a reclaim leaves 8,200 s of work with 9,839 s to the deadline, the margin
    # with the rollback pins it (8,200 + 217 + 900 + 900 ≥ 9,839); without it, not.
    margin = policy.deadline_margin_s + rollback_s(a, policy)
    common = {"submitted_at": 0.0, "deadline_s": 12_300.0, "restart_s": 217.0}
    assert pinned_on_demand(now=2_461.0, remaining_s=8_200.0, margin_s=margin, **common)
    assert not pinned_on_demand(
        now=2_461.0, remaining_s=8_200.0, margin_s=policy.deadline_margin_s, **common
    )
    spot_types = [t for t in catalog(0.5) if t.is_spot]
    assert spot_types and all(policy.loss_hours(t) == 0.0 for t in spot_types)
    assert all(eva.loss_hours(t) > 0.0 for t in spot_types)
    planned = policy.planning_catalog(catalog(0.5))
    assert all(planned[t.name].hourly_cost == t.hourly_cost for t in spot_types)


def one_long_job_under(trace: AvailabilityTrace) -> InMemoryStore:
    """The state after replaying one 20,000 s job whose spot offering follows `trace`
    (it finished)."""
    store = InMemoryStore()
    result = replay(
        [job("a", 20_000.0)],
        catalog(0.05),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": trace}),
    )
    assert result.finished
    return store


def test_a_task_waits_out_an_outage_on_one_on_demand_instance() -> None:
    # Spot for the first 600 s, then none for 3 h. Each time the refused offering's
    # cooldown ends the plan tries spot again and the cloud refuses it: the task must
    # stay on the on-demand instance it runs on, not be moved to a new one each time.
    store = one_long_job_under(AvailabilityTrace(600.0, (0,) + (1,) * 18))
    used = types_used(store)["a"]
    assert used[:2] == ["small:spot", "small"]  # reclaimed at 600 s, onto on-demand
    refused = [
        a
        for r in store.rounds()
        for a in r.actions
        if a.kind == "launch" and a.outcome == "failed" and a.detail["type"] == "small:spot"
    ]
    assert len(refused) >= 2  # spot was asked for again during the outage
    assert used.count("small") == 1  # and the task stayed on its one on-demand instance
    # the drains that would have stranded it, undone and recorded as such
    drains = [a for r in store.rounds() for a in r.actions if a.kind == "terminate"]
    assert any(a.outcome == "skipped" and a.message.startswith("kept:") for a in drains)


def test_a_task_whose_spot_destination_is_lost_before_it_moves_stays_on_its_instance() -> None:
    # No spot until 900 s (the task starts on on-demand at 600 s, after two refusals),
    # spot for 50 s at 900 s: the round moves the task to a new spot instance, which is
    # reclaimed before it is ready. The task never left its on-demand instance, so that
    # instance is taken back, not replaced by a second one it would migrate to.
    store = one_long_job_under(AvailabilityTrace(50.0, (1,) * 18 + (0,) + (1,) * 400))
    launched = [
        i.instance_type
        for i in store.instances(include_finished=True)
        if i.cloud_id is not None  # the cloud started it
    ]
    assert launched == ["small", "small:spot"]  # the spot one was lost
    assert types_used(store) == {"a": ["small"]}  # the task never moved
    adopted = [a for r in store.rounds() for a in r.actions if a.kind == "adopt"]
    assert adopted and adopted[0].reason.startswith("kept: the instance its task(s)")


def test_every_job_completes_under_a_harsh_trace_and_harsh_rates() -> None:
    jobs = [job(f"j{i}", 1500.0 + 700.0 * i, arrival=400.0 * i) for i in range(8)]
    harsh = AvailabilityTrace(600.0, (1, 0, 1, 1, 0, 0, 1))
    for spot in (
        SpotReplay(traces={"small": harsh}),
        SpotReplay(rate_per_hour=4.0, seed=7),
        SpotReplay(rate_per_hour=4.0, seed=7, checkpoints=False),
    ):
        result = replay(jobs, catalog(0.5), NO_INTERFERENCE, "eva", spot=spot)
        assert result.finished and result.jobs_completed == len(jobs)
        assert result.spot is not None


def test_a_replay_without_spot_settings_has_no_spot_figures() -> None:
    result = replay([job("a", 1000.0)], catalog(0.0), NO_INTERFERENCE, "eva")
    assert result.spot is None and "spot" not in result.document()


def test_seeded_reclaims_are_reproducible() -> None:
    jobs = [job(f"j{i}", 4000.0, arrival=300.0 * i) for i in range(4)]
    runs = [
        replay(jobs, catalog(1.0), NO_INTERFERENCE, "eva", spot=SpotReplay(seed=3)).document()
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and runs[0]["spot"]["interruptions"] > 0


# -- traces --------------------------------------------------------------------------------


def test_an_availability_trace_parses_and_repeats() -> None:
    trace = AvailabilityTrace.from_document({"metadata": {"gap_seconds": 600}, "data": [0, 1, 1]})
    assert [trace.unavailable(t) for t in (0, 599, 600, 1799, 1800, 2400)] == [
        False,
        False,
        True,
        True,
        False,  # the trace repeats after 3 intervals
        True,
    ]
    assert trace.next_unavailable(0.0) == 600.0
    assert trace.next_unavailable(700.0) == 1200.0  # the next interval's start, not this one's
    assert trace.next_unavailable(1300.0) == 2400.0
    assert AvailabilityTrace(600.0, (0, 0)).next_unavailable(0.0) is None


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"data": [0, 1]},
        {"metadata": {"gap_seconds": 0}, "data": [0]},
        {"metadata": {"gap_seconds": 600}, "data": []},
        {"metadata": {"gap_seconds": 600}, "data": [0, 2]},
        {"metadata": {"gap_seconds": 600}, "data": [True]},
        {"metadata": {"gap_seconds": 600}, "data": [0, 1], "comment": "x"},
    ],
)
def test_a_malformed_trace_is_refused(document) -> None:
    with pytest.raises(InputError):
        AvailabilityTrace.from_document(document)


def test_a_bad_trace_file_is_one_line_naming_file_field_and_value(tmp_path, capsys) -> None:
    from app.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {"gap_seconds": 600}, "data": [0, 1, 2, 0]}')
    code = main(["replay", "--spot", "--spot-trace", f"p3.2xlarge={bad}", "--scheduler", "eva"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(bad) in err and "field 'data[2]' = 2" in err
    twice = tmp_path / "twice.json"  # a duplicate key is refused as the other inputs' are
    twice.write_text('{"metadata": {"gap_seconds": 600}, "data": [0], "data": [1]}')
    code = main(["replay", "--spot", "--spot-trace", f"p3.2xlarge={twice}", "--scheduler", "eva"])
    assert code == 2 and str(twice) in capsys.readouterr().err


def test_the_trace_flag_names_an_offering_and_a_file(tmp_path) -> None:
    assert parse_trace_flag("p3.2xlarge@use1-az1=a.json") == ("p3.2xlarge@use1-az1", "a.json")
    with pytest.raises(InputError):
        parse_trace_flag("p3.2xlarge")


def test_the_command_replays_with_a_spot_trace(tmp_path, capsys) -> None:
    from app.cli import main

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [0, 0, 1]}))
    trace_jobs = tmp_path / "jobs.json"
    everything = json.loads(bundled("pai_200.json").read_text())
    trace_jobs.write_text(json.dumps(dict(list(everything.items())[:6])))
    code = main(
        [
            "replay",
            "--trace",
            str(trace_jobs),
            "--spot",
            "--spot-trace",
            f"p3.2xlarge={path}",
            "--spot-rate",  # every other offering: reclaimed twice an hour
            "2",
            "--scheduler",
            "eva",
            "spot-restart",
            "--workers",
            "1",
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(document["results"]) == {"eva", "spot-restart", "no-packing"}
    assert document["spot"]["traces"] == ["p3.2xlarge"]
    assert all(r["finished"] for r in document["results"].values())
    assert document["results"]["eva"]["spot"]["interruptions"] >= 1


def test_the_command_prints_no_log_line_per_simulated_notice(tmp_path) -> None:
    # The replayed control loop warns of each notice, as the daemon does; run as a user
    # runs it (no logging configured), the command's stderr shows none of them.
    trace_jobs = tmp_path / "jobs.json"
    everything = json.loads(bundled("pai_200.json").read_text())
    trace_jobs.write_text(json.dumps(dict(list(everything.items())[:6])))
    args = ["replay", "--trace", str(trace_jobs), "--spot", "--spot-rate", "2"]
    ran = subprocess.run(
        [sys.executable, "-m", "app", *args, "--scheduler", "eva", "--workers", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["results"]["eva"]["spot"]["interruptions"] >= 1
    assert "interruption notice" not in ran.stderr
    # The same from a script calling the simulator itself, as the benchmarks do.
    script = (
        "from simulator.replay import SpotReplay, replay\n"
        "from app.bundled import bundled\n"
        "from app.files import load_catalog, load_jobs\n"
        "from provisioners.catalog import bundled_spot_snapshot, spot_offerings\n"
        "from autoscaler.throughput import ThroughputTable\n"
        "base = load_catalog(bundled('ec2_config.json'))\n"
        "snapshot = bundled_spot_snapshot(base.region or 'us-east-1')\n"
        "with_spot = spot_offerings(base, snapshot)\n"
        f"jobs = load_jobs({str(trace_jobs)!r}, with_spot)\n"
        "result = replay(jobs, with_spot, ThroughputTable(default=1.0), 'eva',\n"
        "                spot=SpotReplay(rate_per_hour=2.0))\n"
        "print(result.spot['interruptions'])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    assert int(ran.stdout) >= 1
    assert "interruption notice" not in ran.stderr


def test_bundled_spot_offerings_cover_the_bundled_catalog() -> None:
    base = load_catalog(bundled("ec2_config.json"))
    snapshot = bundled_spot_snapshot("us-east-1")
    assert snapshot is not None
    regional = spot_offerings(base, snapshot)
    spot = [t for t in regional if t.is_spot]
    assert len(spot) == len(base) == 21
    for t in spot:
        on_demand = base[t.launch_type]
        prices = sorted(snapshot.prices[t.launch_type].values())
        assert prices[0] <= t.hourly_cost <= prices[-1] < on_demand.hourly_cost
        assert t.family == on_demand.family and t.capacity == on_demand.capacity
        assert t.interruption_per_hour > 0
    zonal = spot_offerings(base, snapshot, zones=["use1-az1", "use1-az3"])
    p3 = [t.name for t in zonal if t.is_spot and t.launch_type == "p3.2xlarge"]
    assert p3 == ["p3.2xlarge:spot@use1-az1"]  # the snapshot prices no p3 in use1-az3
    observed = spot_offerings(base, snapshot, observed={"c7i.large:spot": 0.5})
    assert observed["c7i.large:spot"].interruption_per_hour == 0.5
    # The advisor's band rates a type unless the cluster names another.
    assert snapshot.band_of("c7i.large") == snapshot.advisor_bands["c7i.large"] == ">20%"
    calmer = spot_offerings(base, snapshot, bands={"c7i.large": "<5%"})
    assert (
        calmer["c7i.large:spot"].interruption_per_hour
        < regional["c7i.large:spot"].interruption_per_hour
    )


def test_pai_jobs_load_with_spot_offerings_in_the_catalog() -> None:
    base = load_catalog(bundled("ec2_config.json"))
    with_spot = spot_offerings(base, bundled_spot_snapshot("us-east-1"))
    jobs = load_jobs(bundled("pai_200.json"), with_spot)[:3]
    result = replay(
        [replace(j, trace=replace(j.trace, arrival_time_s=0.0)) for j in jobs],
        with_spot,
        ground_truth(None),
        "eva",
        spot=SpotReplay(policy=SpotPolicy()),
    )
    assert result.finished and result.spot["spot_share"] > 0.5


def test_the_planner_learns_a_harsh_trace_s_rate_from_the_replay_s_reclaims() -> None:
    # Capacity for 1200 s of every 2400: each spot instance is reclaimed within the
    # hour, far more than the band's 0.001 per hour, and the rate the replay's planner
    # prices the offering at rises towards what the reclaims show, as the daemon's would.
    band = 0.001
    trace = AvailabilityTrace(1200.0, (0, 1))
    jobs = [job(f"j{i}", 4000.0, arrival=300.0 * i) for i in range(4)]
    store = InMemoryStore()
    result = replay(
        jobs,
        catalog(band),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": trace}),
    )
    assert result.finished
    reclaims = result.spot["interruptions"]
    assert reclaims >= 1
    learned = result.spot["learned_rates"]["small:spot"]
    spot_h = sum(
        ((u.end if u.end is not None else result.end_time_s) - u.start) / 3600.0
        for u in store.uptime()
        if u.instance_type == "small:spot"
    )
    # (band · 100 + reclaims) / (100 + spot hours): the band counts as 100 hours
    assert learned == pytest.approx((band * 100.0 + reclaims) / (100.0 + spot_h), rel=1e-6)
    assert learned > band


def test_without_learning_a_replay_plans_at_the_catalog_s_rates() -> None:
    trace = AvailabilityTrace(1200.0, (0, 1))
    result = replay(
        [job("a", 4000.0)],
        catalog(0.001),
        NO_INTERFERENCE,
        "eva",
        spot=SpotReplay(traces={"small": trace}, learn_rates=False),
    )
    assert result.finished and "learned_rates" not in result.spot


def test_a_long_outage_is_retried_with_backoff_and_the_job_returns_to_spot() -> None:
    # Out in [600, 12600) (20 intervals), then back for good. The planner cannot know
    # when capacity returns (a cloud never says), so a refused offering is retried as
    # the daemon's bindings retry it: a run of refusals doubles its cooldown
    # (`AvailabilityCache`), so the 12,000 s outage sees a handful of requests, not one
    # per 180 s cooldown (66), and the job still goes back to spot afterwards.
    trace = AvailabilityTrace(600.0, (0,) + (1,) * 20 + (0,) * 1000)
    store = InMemoryStore()
    result = replay(
        [job("a", 30000.0, arrival=700.0)],
        catalog(),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": trace}, learn_rates=False),
    )
    assert result.finished
    spot_requests = [
        i.requested_at
        for i in store.instances(include_finished=True)
        if i.instance_type == "small:spot"
    ]
    refused = [t for t in spot_requests if 600.0 <= t < 12600.0]
    assert 2 <= len(refused) <= 7  # 180 + 360 + … doubling to the cap: 6 tries cover it
    assert any(t >= 12600.0 for t in spot_requests)  # back on spot once capacity is


def test_a_job_out_of_deadline_slack_runs_alone_and_is_not_moved() -> None:
    # "pair" holds two tasks for less than two "small" (4 against 6): packing pays on
    # on-demand, where the other jobs ask to run, and without interference the planner
    # would pack the deadline job with them.
    # "tight" has 10,000 s of work due in 11,500 s: the slack rule keeps 217 s of
    # restart, a 900 s margin and a 900 s checkpoint interval, so it is out of slack
    # at once (10,000 + 2,017 ≥ 11,500) and runs alone, where it is, from then on —
    # though the later arrivals would pack beside it — and meets its deadline; the
    # jobs without a deadline are packed as before.
    base = catalog(0.0)
    pair = InstanceType("pair", "f", Resources(2, 8, 32), 4.0, DELAYS)
    both = Catalog([*base, pair])
    jobs = [
        job("tight", 10_000.0, deadline_s=11_500.0),
        job("loose", 10_000.0, capacity="on-demand"),
        job("late1", 4_000.0, arrival=2_000.0, capacity="on-demand"),
        job("late2", 4_000.0, arrival=2_000.0, capacity="on-demand"),
    ]
    store = InMemoryStore()
    result = replay(jobs, both, NO_INTERFERENCE, "eva", store=store, spot=SpotReplay())
    assert result.finished and result.spot["deadlines_met"] == 1
    placements = [p for p in store.placements() if p.job_id == "tight"]
    assert len(placements) == 1  # placed once, never moved
    alone_on = placements[0].instance_id
    sharing = [p.job_id for p in store.placements() if p.instance_id == alone_on]
    assert sharing == ["tight"]
    kinds = {i.instance_id: i.instance_type for i in store.instances(include_finished=True)}
    assert "pair" in {kinds[p.instance_id] for p in store.placements() if p.job_id != "tight"}
    assert any("out of deadline slack: tight" in r.reason for r in store.rounds())


def market_changes(types: list[str]) -> int:
    """How often consecutive placements changed market (the spot suffix)."""
    spot = [t.endswith(":spot") for t in types]
    return sum(a != b for a, b in itertools.pairwise(spot))


def test_market_moves_count_the_restarts_on_the_other_market() -> None:
    # No spot capacity in [2400, 4800), then back for good: reclaimed at 2400, the job
    # restarts on on-demand, and the planner takes it back to spot once it can (one
    # reclaim is what its 0.05/h rate expects, so it is not pinned) — two market moves,
    # as the placements the store recorded say; the calm job, none.
    trace = AvailabilityTrace(2400.0, (0, 1) + (0,) * 100)
    store = InMemoryStore()
    result = replay(
        [job("a", 30000.0)],
        catalog(0.05),
        NO_INTERFERENCE,
        "eva",
        store=store,
        spot=SpotReplay(traces={"small": trace}, learn_rates=False),
    )
    assert result.finished and result.spot["interruptions"] == 1
    placed = types_used(store)["a"]
    assert market_changes(placed) == 2, placed
    assert result.spot["market_moves_per_job"] == result.spot["max_market_moves"] == 2
    calm = replay([job("b", 3000.0)], catalog(0.0), NO_INTERFERENCE, "eva", spot=SpotReplay())
    assert calm.spot["market_moves_per_job"] == calm.spot["max_market_moves"] == 0


def test_eva_full_speed_row_packs_no_task_it_expects_slowed() -> None:
    # Two one-task jobs never seen together (expected at 0.95 each): one "two:spot" holding
    # both saves $0.80/h of $2/h against a slowdown charged at the on-demand value
    # (2 × 0.05 × $3/h), so eva packs them; eva-full-speed keeps each at full speed.
    delays = DELAYS
    cpu = Resources(0, 4, 16)
    kinds = []
    for name, capacity, price, spot_price in (
        ("one", Resources(0, 4, 16), 3.0, 1.0),
        ("two", Resources(0, 8, 32), 3.6, 1.2),
    ):
        kinds.append(InstanceType(name, "f", capacity, price, delays))
        kinds.append(
            InstanceType(
                f"{name}:spot", "f", capacity, spot_price, delays, market=SPOT, ec2_type=name
            )
        )
    jobs = [
        replace(j, tasks=tuple(replace(t, demands=(("any", cpu),)) for t in j.tasks))
        for j in (job("a", 20000.0), job("b", 20000.0))
    ]
    slowed = ThroughputTable(default=0.95)
    used = {}
    results = {}
    for name in ("eva", "eva-full-speed"):
        row = spot_variant(name, SpotReplay())
        store = InMemoryStore()
        results[name] = replay(
            jobs,
            Catalog(kinds),
            slowed,
            row.scheduler,
            store=store,
            spot=row.settings,
            planner_options=dict(row.planner_options),
        )
        used[name] = types_used(store)
    assert all(r.finished for r in results.values())
    assert used["eva"] == {"a": ["two:spot"], "b": ["two:spot"]}
    assert used["eva-full-speed"] == {"a": ["one:spot"], "b": ["one:spot"]}
    eva, full = results["eva"], results["eva-full-speed"]
    assert eva.total_cost < full.total_cost
    assert full.avg_jct_hours < eva.avg_jct_hours
    assert full.normalized_throughput == pytest.approx(1.0)


def test_reclaims_may_delay_a_long_job_by_its_delay_budget_before_it_leaves_spot() -> None:
    # An 80-hour job reclaimed about once an hour, the rate it is priced at (so the
    # rate test never moves it): each reclaim delays it by its restart (209 s start-up,
    # 8 s init) and the checkpoint taken on the notice (6 s), 223 s, and loses no work.
    # The default budget lets that cost 5% of its run, 64 reclaims; a budget of 1.5%
    # moves it to on-demand for good at 0.015 × 288,000 / 223 = 19.4, the 19th.
    long_job = job("a", 80 * 3600.0)
    runs = {}
    for share in (0.05, 0.015):
        settings = SpotReplay(SpotPolicy(max_delay_share=share), rate_per_hour=1.0, seed=3)
        store = InMemoryStore()
        result = replay(
            [long_job], catalog(1.0), NO_INTERFERENCE, "eva", store=store, spot=settings
        )
        assert result.finished and result.spot is not None
        runs[share] = (result, types_used(store)["a"])
    tight, tight_types = runs[0.015]
    loose, _ = runs[0.05]
    assert tight.spot["interruptions"] == 19
    assert tight_types[-1] == "small"  # on on-demand since
    assert loose.spot["interruptions"] > 2 * 19  # about 64 at its ceiling (to the notice)
    assert loose.spot["lost_share"] == tight.spot["lost_share"] == 0.0
    assert loose.total_cost < tight.total_cost
