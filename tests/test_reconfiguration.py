"""Full and Partial Reconfiguration on hand-checkable examples (Eva §4.2–4.5)."""

from dataclasses import replace

import pytest

from app.bundled import bundled
from app.files import load_catalog
from autoscaler.catalog import Catalog
from autoscaler.configuration import Configuration, Instance
from autoscaler.patterns import PatternPricer
from autoscaler.planner import EvaPlanner
from autoscaler.reconfiguration import Packer, full_reconfiguration, partial_reconfiguration
from autoscaler.reference import algorithm1
from autoscaler.throughput import ThroughputTable
from autoscaler.view import ClusterView
from tests.builders import (
    configuration,
    itype,
    job,
    placement,
    running,
    table3_catalog,
    table3_jobs,
)

NO_INTERFERENCE = ThroughputTable(default=1.0)


def view(jobs, current=None, table=NO_INTERFERENCE, catalog=None):
    return ClusterView(catalog or table3_catalog(), tuple(jobs), current or Configuration(), table)


def test_table3_full_reconfiguration_packs_to_12_8():
    plan = full_reconfiguration(view(table3_jobs()))
    assert placement(plan) == [("it1", ("t1/0", "t2/0", "t4/0")), ("it3", ("t3/0",))]
    assert plan.hourly_cost == pytest.approx(12.8)


def test_planner_reports_no_packing_cost_beside_the_plan():
    plan = EvaPlanner().plan(view(table3_jobs()))
    assert plan.hourly_cost == pytest.approx(12.8)
    assert plan.no_packing_hourly_cost == pytest.approx(16.2)


def interference(t1: float, t2: float) -> ThroughputTable:
    # workloads of job t1 and t2 are "wt1_node0" and "wt2_node0"
    return (
        ThroughputTable(default=1.0)
        .observe("wt1_node0", ["wt2_node0"], t1)
        .observe("wt2_node0", ["wt1_node0"], t2)
    )


def test_mild_interference_still_packs_onto_it1():
    # $12 × 0.8 + $3 × 0.9 = $12.3 ≥ $12 (§4.3)
    plan = full_reconfiguration(view(table3_jobs()[:2], table=interference(0.8, 0.9)))
    assert placement(plan) == [("it1", ("t1/0", "t2/0"))]
    assert plan.hourly_cost == pytest.approx(12.0)


def test_severe_interference_keeps_tasks_apart():
    # $12 × 0.7 + $3 × 0.8 = $10.8 < $12: τ2 gets its own it2
    plan = full_reconfiguration(view(table3_jobs()[:2], table=interference(0.7, 0.8)))
    assert placement(plan) == [("it1", ("t1/0",)), ("it2", ("t2/0",))]
    assert plan.hourly_cost == pytest.approx(15.0)


def test_a_minimum_throughput_keeps_apart_what_tnrp_would_pack():
    # $12.3 ≥ $12 packs τ1 (at 0.8) with τ2 (§4.3); a user's floor of 0.85 forbids
    # it whatever it saves, and the floor itself is allowed (0.8 packs).
    jobs, table = table3_jobs()[:2], interference(0.8, 0.9)
    for floor, expected in [(0.85, 15.0), (0.8, 12.0)]:
        packer = Packer(view(jobs, table=table), min_throughput=floor)
        assert packer.full().hourly_cost == pytest.approx(expected)
    # A running instance that breaks the floor is released by Partial too.
    current = configuration(running("i-1", table3_catalog()["it1"], "t1/0", "t2/0"))
    plan = EvaPlanner(min_throughput=0.85).plan(view(jobs, current, table))
    assert placement(plan.configuration) == [("it1", ("t1/0",)), ("it2", ("t2/0",))]
    assert [placement(c.configuration) for c in plan.candidates] == [
        placement(plan.configuration)
    ] * 2


def multi_task_next_to_t1():
    """Job m: two tasks of RP $3 (it2), RP(m) = $6; next to τ1 an m task runs at 0.9."""
    multi = job("m", (1, 4, 10), (1, 4, 10), name="m")
    table = (
        ThroughputTable(default=1.0)
        .observe("m_node0", ["wt1_node0"], 0.9)
        .observe("m_node1", ["wt1_node0"], 0.9)
    )
    return view([job("t1", (2, 8, 24)), multi], table=table, catalog=table3_catalog())


def test_eva_rule_values_a_slowed_task_by_the_whole_jobs_loss():
    # Eva §4.4: the slowed task slows the whole job, so it is worth
    # 3 − 0.1·6 = $2.4, not 0.9·3 — and so is each of two slowed tasks.
    packer = Packer(multi_task_next_to_t1(), job_slowdown="whole")
    assert packer.tnrp_of(["t1/0", "m/0"]) == pytest.approx(12 + 3 - 0.1 * 6)
    assert packer.tnrp_of(["t1/0", "m/0", "m/1"]) == pytest.approx(12 + 2 * (3 - 0.1 * 6))


def test_shared_rule_charges_a_jobs_slowdown_once_when_its_tasks_are_slowed_alike():
    # Both m tasks at 0.9: the job runs at 0.9 and is worth 0.9·$6 = $5.4 — the
    # shared rule's 2 × 0.9·3; Eva's rule charges the same $0.6 loss twice ($4.8).
    packer = Packer(multi_task_next_to_t1())
    assert packer.tnrp_of(["t1/0", "m/0", "m/1"]) == pytest.approx(12 + 0.9 * 6)
    assert packer.tnrp_of(["t1/0", "m/0"]) == pytest.approx(12 + 0.9 * 3)


def test_a_released_instance_is_reused_when_a_larger_type_is_downsized_to_its_type():
    # a ran alone on a c7i.large to be measured (provisional); b arrives. Algorithm 1
    # packs both at r7i.large's turn ($0.1323: worth 2 · 0.08925 · 0.95 = $0.17) and
    # downsizes them to a c7i.large: the one a is on, not a new one (the local
    # daemon launched a second c7i.large and moved a for nothing).
    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = [job("a", (0, 0.5, 1)), job("b", (0, 0.5, 2))]
    current = configuration(running("i-1", catalog["c7i.large"], "a/0"))
    snapshot = ClusterView(
        catalog, tuple(jobs), current, ThroughputTable(), provisional=frozenset({"i-1"})
    )
    plan = partial_reconfiguration(snapshot)
    assert placement(plan) == [("c7i.large", ("a/0", "b/0"))]
    assert plan.by_id()["i-1"].tasks == ("a/0", "b/0")


def test_a_slowed_task_of_a_job_of_unlike_tasks_is_charged_the_whole_jobs_loss():
    # m's tasks differ, (1, 4, 10) on it2 ($3) and (0, 2, 8) on it4 ($0.4): they
    # land in different compositions, and m/0 at 0.9 slows all of m, RP(m) = $3.4.
    # The default rule charges it that ($3 − 0.1 · 3.4), as Eva §4.4 does, where
    # the shared rule (right for replicas) would see 0.9 · $3 and miss m/1's loss.
    multi = job("m", (1, 4, 10), (0, 2, 8), name="m")
    table = ThroughputTable(default=1.0).observe("m_node0", ["wt1_node0"], 0.9)
    snapshot = view([job("t1", (2, 8, 24)), multi], table=table)
    assert Packer(snapshot).tnrp_of(["t1/0", "m/0"]) == pytest.approx(12 + 3 - 0.1 * 3.4)
    shared = Packer(snapshot, job_slowdown="shared")
    assert shared.tnrp_of(["t1/0", "m/0"]) == pytest.approx(12 + 0.9 * 3)


def test_a_task_that_stalls_its_job_is_moved_off_an_instance_its_neighbour_pays_for():
    # s (0, 5, 20) needs the big type alone: RP(s) = $1 = the big's cost. Job m's
    # unlike tasks each fit a small ($0.3): RP(m) = $0.6. Next to s, m/0 runs at
    # 0.3 and so does all of m: it loses 0.7 · $0.6 = $0.42/h of work to save
    # the $0.3/h of its own small. Valued at 0.3 − 0.42 = −$0.12, the big with
    # both is worth $0.88 < $1 and m/0 moves; floored at 0 (worth "nothing"), the
    # big stayed worth exactly its cost, was kept, and m crawled at 0.3 for good.
    catalog = Catalog([itype("big", 0, 8, 32, 1.0), itype("small", 0, 2, 8, 0.3)])
    s = job("s", (0, 5, 20), name="s")
    m = job("m", (0, 2, 8), (0, 1, 4), name="m")
    table = ThroughputTable(default=1.0).observe("m_node0", ["s_node0"], 0.3)
    current = configuration(
        running("i-1", catalog["big"], "s/0", "m/0"), running("i-2", catalog["small"], "m/1")
    )
    snapshot = view([s, m], current, table, catalog)
    assert Packer(snapshot).tnrp_of(["s/0", "m/0"]) == pytest.approx(1.0 + 0.3 - 0.7 * 0.6)
    full = full_reconfiguration(snapshot)
    for plan in (
        partial_reconfiguration(snapshot),
        full,
        EvaPlanner().plan(snapshot).configuration,
    ):
        together = [set(i.tasks) for i in plan if "m/0" in i.tasks]
        assert together == [{"m/0"}], placement(plan)
    # Full puts m/1 (no interference) beside s instead: $1.3/h, where the floored
    # value packed all three onto the big for $1/h and stalled m.
    assert placement(full) == [("big", ("m/1", "s/0")), ("small", ("m/0",))]
    assert full.hourly_cost == pytest.approx(1.3)


def test_a_16_task_data_parallel_job_is_packed_at_the_default_throughput():
    # 16 tasks of (1 GPU, 8 cores, 30 GB): alone each needs a p3.8xlarge ($12.24,
    # 16 cores). Two fill it, each at 0.95 by default: worth 2 · 12.24 · 0.95 =
    # $23.26 ≥ $12.24. A p3.16xlarge (8 GPU, 32 cores, $24.48) takes 4, each at
    # 0.95³: worth 4 · 12.24 · 0.857 = $41.98 ≥ $24.48. Either way $6.12/h a
    # task: $97.92/h. Eva's rule values a second task beside the first at
    # 12.24 − 0.05 · 16 · 12.24 < 0 and never packs: 16 × $12.24 = $195.84/h.
    catalog = load_catalog(bundled("ec2_config.json"))
    ddp = job("ddp", *[(1, 8, 30)] * 16)
    snapshot = ClusterView(catalog, (ddp,), throughput=ThroughputTable())
    shared = EvaPlanner().plan(snapshot)
    assert all(len(i.tasks) >= 2 for i in shared.configuration)
    assert shared.hourly_cost == pytest.approx(97.92)
    whole = EvaPlanner(job_slowdown="whole").plan(snapshot)
    assert whole.hourly_cost == pytest.approx(16 * 12.24)


def test_two_small_tasks_share_the_type_of_the_larger():
    # RP $0.8 (it3) and $0.4 (it4): worth $1.2 together, too little for it1 or it2,
    # but on one it3 they cost $0.8 instead of $1.2.
    jobs = [job("a", (0, 6, 20)), job("b", (0, 2, 8))]
    plan = full_reconfiguration(view(jobs))
    assert placement(plan) == [("it3", ("a/0", "b/0"))]


def test_downsizing_picks_a_cheaper_type_with_room():
    catalog = table3_catalog().__class__(
        [
            itype("big", 0, 16, 64, 1.6),
            itype("small", 0, 8, 32, 0.8),
            itype("tiny", 0, 2, 8, 0.2),
        ]
    )
    # Two tasks of RP $0.8 fill "big" to a value of $1.6 ≥ $1.6 and are kept there
    # when "big" is visited; together they also fit "small", so they move there.
    two = [job("a", (0, 3, 10)), job("b", (0, 3, 10))]
    assert placement(full_reconfiguration(view(two, catalog=catalog))) == [
        ("small", ("a/0", "b/0"))
    ]
    # Four such tasks need 12 CPU: nothing cheaper than "big" holds them.
    four = [*two, job("c", (0, 3, 10)), job("d", (0, 3, 10))]
    assert placement(full_reconfiguration(view(four, catalog=catalog))) == [
        ("big", ("a/0", "b/0", "c/0", "d/0"))
    ]


def test_full_reuses_an_existing_instance_for_its_own_tasks():
    catalog = table3_catalog()
    it1 = catalog["it1"]
    current = configuration(
        running("i-1", it1, "t1/0", "t2/0", "t4/0"), running("i-2", catalog["it3"], "t3/0")
    )
    plan = full_reconfiguration(view(table3_jobs(), current))
    assert sorted((i.instance_id, tuple(sorted(i.tasks))) for i in plan) == [
        ("i-1", ("t1/0", "t2/0", "t4/0")),
        ("i-2", ("t3/0",)),
    ]


def test_full_prefers_resident_tasks_among_equals():
    # Two identical jobs; one is already on i-9. Full keeps that one there.
    catalog = table3_catalog()
    jobs = [job("a", (2, 8, 24)), job("b", (2, 8, 24)), job("c", (0, 4, 12))]
    current = configuration(running("i-9", catalog["it1"], "b/0"))
    plan = full_reconfiguration(view(jobs, current))
    where = {t: i.instance_id for i in plan for t in i.tasks}
    assert where["b/0"] == "i-9"
    assert where["a/0"] == "i-9"  # both 2-GPU tasks fill it1; c no longer fits there
    assert plan.hourly_cost == pytest.approx(12.0 + 0.4)


def test_partial_keeps_cost_efficient_instances_and_places_new_tasks():
    catalog = table3_catalog()
    current = configuration(running("i-1", catalog["it1"], "t1/0"))
    jobs = table3_jobs()  # τ2..τ4 are new
    plan = partial_reconfiguration(view(jobs, current))
    kept = plan.by_id()["i-1"]
    # τ2 and τ4 join τ1 on i-1 (most TNRP gained); τ3 no longer fits there
    assert sorted(kept.tasks) == ["t1/0", "t2/0", "t4/0"]
    assert placement(plan) == [("it1", ("t1/0", "t2/0", "t4/0")), ("it3", ("t3/0",))]


def test_partial_releases_an_instance_that_is_no_longer_cost_efficient():
    catalog = table3_catalog()
    # τ1 finished: i-1 (it1, $12) now hosts only τ2 and τ4, worth $3.4 < $12
    jobs = [j for j in table3_jobs() if j.job_id != "t1"]
    current = configuration(
        running("i-1", catalog["it1"], "t2/0", "t4/0"), running("i-2", catalog["it3"], "t3/0")
    )
    plan = partial_reconfiguration(view(jobs, current))
    assert "i-1" not in plan.by_id()
    assert plan.by_id()["i-2"].tasks == ("t3/0",)
    assert plan.hourly_cost == pytest.approx(3.0 + 0.8 + 0.4)


def test_partial_does_not_move_tasks_full_would_move():
    catalog = table3_catalog()
    it1 = catalog["it1"]
    # two half-used it1 instances, each cost-efficient on its own ($12 ≥ $12)
    jobs = [job("a", (2, 8, 24)), job("b", (2, 8, 24))]
    current = configuration(running("i-1", it1, "a/0"), running("i-2", it1, "b/0"))
    partial = partial_reconfiguration(view(jobs, current))
    full = full_reconfiguration(view(jobs, current))
    assert sorted(partial.by_id()) == ["i-1", "i-2"]
    assert partial.hourly_cost == pytest.approx(24.0)
    assert full.hourly_cost == pytest.approx(12.0)


def test_partial_re_places_the_task_of_a_provisional_instance():
    # As above, but i-2 hosts b only until b's solo speed was measured: Partial
    # re-places b as it would a new job, beside a on i-1 where it adds $12 of TNRP.
    it1 = table3_catalog()["it1"]
    jobs = [job("a", (2, 8, 24)), job("b", (2, 8, 24))]
    current = configuration(running("i-1", it1, "a/0"), running("i-2", it1, "b/0"))
    provisional = replace(view(jobs, current), provisional=frozenset({"i-2"}))
    plan = partial_reconfiguration(provisional)
    assert plan.by_id() == {"i-1": Instance("i-1", it1, ("a/0", "b/0"))}


def test_equal_alignment_is_a_tie_broken_by_class_order_in_both_transcriptions():
    # On an empty (0, 19, 57) instance, j1 (0, 1, 31) and j2 (0, 2, 28) align
    # equally: 1/19 + 31/57 = 2/19 + 28/57 = 34/57. Equal TNRP, equal alignment:
    # the smaller class key (j1's demand vector) goes first, then j0 fills in;
    # j2 no longer fits (31 + 28 > 57 GB).
    catalog = Catalog(
        [itype("t0", 0, 19, 57, 0.01)] + [itype(f"t{i}", 0, 1, 1, 0.01) for i in range(1, 5)]
    )
    jobs = (job("j0", (0, 1, 0)), job("j1", (0, 1, 31)), job("j2", (0, 2, 28)))
    expected = [("t0", ("j0/0", "j1/0")), ("t0", ("j2/0",))]
    assert placement(full_reconfiguration(view(jobs, catalog=catalog))) == expected
    assert placement(algorithm1(jobs, catalog, NO_INTERFERENCE)) == expected


def test_planner_replans_when_a_learned_throughput_changes_and_only_then():
    planner, catalog, jobs = EvaPlanner(), table3_catalog(), table3_jobs()[:2]
    mild = planner.plan(view(jobs, table=interference(0.8, 0.9), catalog=catalog))
    assert mild.hourly_cost == pytest.approx(12.0)
    # Seen again with the same value: more observations, the same estimate, and
    # the last round's candidates are reused as they are.
    again = interference(0.8, 0.9).observe("wt1_node0", ["wt2_node0"], 0.8, at_s=600.0)
    assert planner.plan(view(jobs, table=again, catalog=catalog)).configuration is (
        mild.configuration
    )
    severe = planner.plan(view(jobs, table=interference(0.7, 0.8), catalog=catalog))
    assert severe.hourly_cost == pytest.approx(15.0)


def test_forty_small_tasks_are_spread_over_smaller_types_not_one_large_one():
    # 40 tasks of (0, 0.3, 1.2) = 12 CPUs, 48 GB. Algorithm 1 fills one c7i.8xlarge
    # ($1.428/h); c7i types cost $0.0892 per CPU-hour, so 13 CPUs' worth of
    # smaller ones — e.g. three c7i.2xlarge and a c7i.large — cost $1.160/h.
    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = tuple(job(f"s{i}", (0, 0.3, 1.2)) for i in range(40))
    plain = EvaPlanner(packing="plain").plan(view(jobs, catalog=catalog))
    assert plain.hourly_cost == pytest.approx(1.428)
    plan = EvaPlanner().plan(view(jobs, catalog=catalog))
    assert plan.hourly_cost == pytest.approx(3 * 0.357 + 0.08925)


def test_a_plan_does_not_depend_on_what_the_planner_planned_before():
    # A restarted daemon has planned nothing yet and must decide as the one it
    # replaces. Patterns kept in memory from a round of 26 such tasks used to
    # steer the 40 above back onto one c7i.8xlarge ($1.428/h against $1.160/h).
    catalog = load_catalog(bundled("ec2_config.json"))

    def small_tasks(n):
        return view(tuple(job(f"s{i}", (0, 0.3, 1.2)) for i in range(n)), catalog=catalog)

    fresh = EvaPlanner().plan(small_tasks(40))
    for before in (26, 27, 60):
        seasoned = EvaPlanner()
        seasoned.plan(small_tasks(before))
        again = seasoned.plan(small_tasks(40))
        assert again.hourly_cost == pytest.approx(fresh.hourly_cost)
        assert sorted(i.type.name for i in again.configuration) == sorted(
            i.type.name for i in fresh.configuration
        )


def test_a_catalog_restricted_to_all_its_types_is_itself():
    # Planners recognise a catalog by identity (its price book, last round's
    # candidates): restricting to every type must not make a new one.
    catalog = load_catalog(bundled("ec2_config.json"))
    assert catalog.restricted_to({t.name for t in catalog}) is catalog
    fewer = catalog.restricted_to({t.name for t in catalog} - {"p3.2xlarge"})
    assert len(fewer) == len(catalog) - 1 and "p3.2xlarge" not in fewer


def test_an_instance_holding_more_than_its_room_is_no_column_for_the_priced_packing():
    # Mid-move, it1 (16 vCPU) runs a (1, 8) task that waits for its new instance beside
    # the (1, 12) task placed in its stead: 20 vCPU. As a seed column the pattern LP
    # could keep that composition, and the task placed there would never find room.
    catalog = Catalog([itype("it1", 4, 16, 244, 12.0)])
    jobs = [job("a", (1, 8, 30)), job("b", (1, 12, 30))]
    current = configuration(running("i-1", catalog["it1"], "a/0", "b/0"))
    packer = Packer(
        view(jobs, current, catalog=catalog), pricer=PatternPricer(), pattern_min_tasks=0
    )
    plan = packer.full_placement().instances
    assert sorted(t for i in plan for t in i.tasks) == ["a/0", "b/0"]
    for inst in plan:
        cpu = sum({"a/0": 8, "b/0": 12}[t] for t in inst.tasks)
        assert cpu <= 16, (inst.instance_id, inst.tasks)


def test_nine_tiny_tasks_fill_three_of_the_smallest_type_not_one_larger():
    # 2.73 CPUs in all. Every type costs at least $0.08925 per CPU of capacity (c7i)
    # and capacities are whole CPUs, so no plan beats 3 CPUs' worth: three c7i.large
    # ($0.26775/h), which hold these nine (e.g. in threes: ≤ 1 CPU and 4 GB each). Before
    # the integer master the planner packed them onto one c7i.2xlarge ($0.357/h).
    catalog = load_catalog(bundled("ec2_config.json"))
    demands = [
        (0, 0.35, 0.74),
        (0, 0.27, 1.04),
        (0, 0.26, 0.60),
        (0, 0.36, 0.72),
        (0, 0.40, 1.75),
        (0, 0.16, 0.55),
        (0, 0.31, 0.48),
        (0, 0.44, 1.69),
        (0, 0.18, 0.11),
    ]
    jobs = tuple(job(f"t{i}", d) for i, d in enumerate(demands))
    plain = EvaPlanner(packing="plain").plan(view(jobs, catalog=catalog))
    assert plain.hourly_cost == pytest.approx(0.357)
    plan = EvaPlanner().plan(view(jobs, catalog=catalog))
    assert plan.hourly_cost == pytest.approx(3 * 0.08925)
    assert [i.type.name for i in plan.configuration.instances] == ["c7i.large"] * 3
