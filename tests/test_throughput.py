"""The co-location throughput table: lookup, updates and §4.4's attribution rules."""

import pytest

from app.bundled import bundled
from app.files import contention_matrix_from_csv, load_contention_matrix
from autoscaler.errors import InputError
from autoscaler.throughput import ThroughputEntry, ThroughputTable


def test_alone_is_full_throughput():
    assert ThroughputTable(default=0.5).throughput("a", []) == 1.0


def test_unobserved_pair_gets_the_default():
    assert ThroughputTable().throughput("a", ["b"]) == 0.95
    assert ThroughputTable(default=0.8).throughput("a", ["b"]) == 0.8


def test_unobserved_set_is_the_product_of_pairwise_values():
    table = ThroughputTable().observe("a", ["b"], 0.9).observe("a", ["c"], 0.8)
    assert table.throughput("a", ["b", "c"]) == pytest.approx(0.72)
    # one pair unknown: the default stands in for it
    assert table.throughput("a", ["b", "d"]) == pytest.approx(0.9 * 0.95)
    # a workload twice counts twice
    assert table.throughput("a", ["b", "b"]) == pytest.approx(0.81)


def test_exact_set_observation_wins_over_the_product():
    table = (
        ThroughputTable()
        .observe("a", ["b"], 0.9)
        .observe("a", ["c"], 0.8)
        .observe("a", ["c", "b"], 0.85)
    )
    assert table.throughput("a", ["b", "c"]) == 0.85


def test_throughput_is_directional():
    table = ThroughputTable().observe("a", ["b"], 0.7)
    assert table.throughput("a", ["b"]) == 0.7
    assert table.throughput("b", ["a"]) == 0.95


def test_observations_are_immutable_updates_and_counted():
    empty = ThroughputTable()
    once = empty.observe("a", ["b"], 0.7, at_s=10)
    twice = once.observe("a", ["b"], 0.75, at_s=20)
    assert empty.recorded("a", ["b"]) is None
    assert once.recorded("a", ["b"]) == 0.7
    entry = dict(twice.items())[("a", ("b",))]
    assert (entry.throughput, entry.observations, entry.updated_at_s) == (0.75, 2, 20)


def test_noise_above_one_is_recorded_as_one_and_negative_is_rejected():
    assert ThroughputTable().observe("a", ["b"], 1.04).recorded("a", ["b"]) == 1.0
    with pytest.raises(ValueError):
        ThroughputTable().observe("a", ["b"], -0.1)


def test_neutral_only_when_every_lookup_is_one():
    assert ThroughputTable(default=1.0).is_neutral
    assert not ThroughputTable(default=1.0).observe("a", ["b"], 0.9).is_neutral
    assert not ThroughputTable().is_neutral


# A multi-task job j with tasks on three instances:
#   task 0: workload "j" next to ["x"]           (1 co-located task)
#   task 1: workload "j" next to ["y", "z"]      (2 co-located tasks)
#   task 2: workload "j" next to ["x", "y", "z"] (3 co-located tasks)
PLACEMENTS = [("j", ["x"]), ("j", ["y", "z"]), ("j", ["x", "y", "z"])]


def test_rule1_nothing_recorded_blames_the_most_colocated_task():
    table, chosen = ThroughputTable().observe_job(PLACEMENTS, 0.8)
    assert chosen == 2
    assert table.recorded("j", ["x", "y", "z"]) == 0.8
    assert table.recorded("j", ["x"]) is None


def test_rule2_a_recorded_value_below_the_observation_is_raised():
    table = ThroughputTable().observe("j", ["x"], 0.6).observe("j", ["y", "z"], 0.7)
    table, chosen = table.observe_job(PLACEMENTS, 0.8)
    # both recorded values are below 0.8: the lowest one (task 0) is raised
    assert chosen == 0
    assert table.recorded("j", ["x"]) == 0.8
    assert table.recorded("j", ["y", "z"]) == 0.7


def test_rule3_all_recorded_higher_blames_an_unrecorded_task():
    table = ThroughputTable().observe("j", ["x", "y", "z"], 0.95).observe("j", ["x"], 0.9)
    table, chosen = table.observe_job(PLACEMENTS, 0.8)
    # recorded 0.95 and 0.9 both exceed 0.8: the straggler is task 1, the only unrecorded one
    assert chosen == 1
    assert table.recorded("j", ["y", "z"]) == 0.8
    assert table.recorded("j", ["x", "y", "z"]) == 0.95


def test_rule3_prefers_the_unrecorded_task_with_most_colocated():
    table = ThroughputTable().observe("j", ["x"], 0.9)
    table, chosen = table.observe_job(PLACEMENTS, 0.5)
    assert chosen == 2
    assert table.recorded("j", ["x", "y", "z"]) == 0.5


def test_all_recorded_and_higher_lowers_the_lowest():
    table = (
        ThroughputTable()
        .observe("j", ["x"], 0.9)
        .observe("j", ["y", "z"], 0.85)
        .observe("j", ["x", "y", "z"], 0.95)
    )
    table, chosen = table.observe_job(PLACEMENTS, 0.5)
    assert chosen == 1
    assert table.recorded("j", ["y", "z"]) == 0.5


def test_tasks_running_alone_are_never_blamed():
    placements = [("j", []), ("j", ["x"])]
    _, chosen = ThroughputTable().observe_job(placements, 0.7)
    assert chosen == 1
    assert ThroughputTable().observe_job([("j", []), ("j", [])], 0.7)[1] is None


def test_bundled_contention_matrix_rows_are_the_observed_workload():
    table = load_contention_matrix(bundled("contention_matrix.csv"))
    # row gpt2, column resnet18: gpt2 runs at 0.793 next to resnet18
    assert table.throughput("gpt2_node0", ["resnet18_node0"]) == 0.793
    assert table.throughput("resnet18_node0", ["gpt2_node0"]) == 0.919
    # 'x' entries are unknown and fall back to the default
    assert table.recorded("seq_node0", ["resnet18_node0"]) is None
    assert table.throughput("seq_node0", ["resnet18_node0"]) == 0.95
    assert len(table) == 9 * 9 - 20


def test_contention_csv_errors_name_the_cell():
    with pytest.raises(InputError, match=r"line 2.*'a/b' = 'fast'.*number or 'x'"):
        contention_matrix_from_csv(",b\na,fast\n")
    with pytest.raises(InputError, match=r"'a/b' = '1.7'.*\(0, 1\]"):
        contention_matrix_from_csv(",b\na,1.7\n")
    with pytest.raises(InputError, match="header"):
        contention_matrix_from_csv("")
    # accepted before: a blank cell read as 'x', a row of nobody's throughputs
    with pytest.raises(InputError, match=r"line 3: field 'b/c': is empty.*or 'x'"):
        contention_matrix_from_csv(",b,c\na,0.9,x\nb,0.8,\n")
    with pytest.raises(InputError, match=r"line 2.*first cell must name the workload"):
        contention_matrix_from_csv(",b\n,0.9\n")
    with pytest.raises(InputError, match=r"line 1 column 3: names no workload"):
        contention_matrix_from_csv(",b,\na,0.9,0.8\n")


def test_a_full_table_forgets_its_oldest_exact_sets_first_and_keeps_pairs():
    table = ThroughputTable().observe("a", ["b"], 0.9, at_s=0.0)  # oldest of all, a pair
    for t in range(1, 10):
        table = table.observe("a", ["b", f"c{t}"], 0.5, at_s=float(t))
    assert len(table) == 10
    small, forgotten = table.bounded(limit=8)
    # 7/8 of the limit stays: the three oldest sets go, the pair stays
    assert len(small) == 7
    assert forgotten == [("a", ("b", f"c{t}")) for t in (1, 2, 3)]
    assert small.recorded("a", ["b"]) == 0.9
    assert small.recorded("a", ["b", "c4"]) == 0.5
    # a forgotten set is estimated like an unseen one: the product of its pairs
    assert small.throughput("a", ["b", "c1"]) == pytest.approx(0.9 * 0.95)


def test_a_table_within_its_limit_is_kept_as_it_is():
    table = ThroughputTable().observe("a", ["b", "c"], 0.5)
    assert table.bounded(limit=1) == (table, [])


def test_estimates_compare_values_not_observation_counts():
    once = ThroughputTable().observe("a", ["b"], 0.8, at_s=1.0)
    twice = once.observe("a", ["b"], 0.8, at_s=2.0)
    assert once.estimates() == twice.estimates()
    assert once.estimates() != once.observe("a", ["b"], 0.7).estimates()


def test_a_revised_table_equals_one_built_from_the_resulting_entries():
    base = ThroughputTable().observe("a", ["b"], 0.9, at_s=1.0).observe("a", ["c"], 0.8)
    base.estimates()  # built, then carried over and patched
    upserts = [
        (("a", ("b",)), ThroughputEntry(0.7, 2, 5.0)),
        (("d", ("a", "b")), ThroughputEntry(0.6)),
    ]
    revised = base.revised(upserts, forget=[("a", ("c",)), ("x", ("y",))])
    fresh = ThroughputTable(
        {("a", ("b",)): ThroughputEntry(0.7, 2, 5.0), ("d", ("a", "b")): ThroughputEntry(0.6)}
    )
    assert list(revised.items()) == list(fresh.items())
    assert revised.estimates() == fresh.estimates() == {("a", ("b",)): 0.7, ("d", ("a", "b")): 0.6}
    assert revised.throughput("a", ["c"]) == 0.95  # forgotten: the default again
    assert base.recorded("a", ["c"]) == 0.8  # the original is untouched
    # an upsert of a key also forgotten wins, as in a store's `record_throughput`
    back = base.revised([(("a", ("c",)), ThroughputEntry(0.5))], forget=[("a", ("c",))])
    assert back.estimates() == {("a", ("b",)): 0.9, ("a", ("c",)): 0.5}
