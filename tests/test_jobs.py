"""Jobs in Eva's trace format: workload keys, defaults and the anti-affinity field."""

import pytest

from app.files import jobs_from_eva
from autoscaler.errors import InputError
from autoscaler.jobs import DEFAULT_INIT_S, workload_key


@pytest.mark.parametrize(
    ("job", "task", "key"),
    [
        ("resnet18[3]", "node0", "resnet18_node0"),
        ("gpt2", "node1", "gpt2_node1"),
        ("vit[]", "node0", "vit_node0"),
        ("odd[a]b]", "node0", "odd[a]b]_node0"),  # only a trailing [index] is dropped
        ("gpt2[12]x", "node0", "gpt2[12]x_node0"),
    ],
)
def test_workload_key_drops_the_trailing_index(job, task, key):
    assert workload_key(job, task) == key


def test_only_demands_are_required_and_the_rest_defaults():
    (job,) = jobs_from_eva({"7": {"tasks": {"a": {"demand": {"any": [1, 2, 3]}}}}})
    (task,) = job.tasks
    assert (job.name, task.task_id, task.name, task.workload) == ("7", "7/a", "a", "7_a")
    assert job.init_delay_s == DEFAULT_INIT_S and job.trace.arrival_time_s == 0.0
    assert job.max_tasks_per_instance is None


def test_jobs_sharing_a_demand_block_still_get_their_own_errors():
    good = {"tasks": {"0": {"demand": {"any": [1, 4, 8]}}}}
    bad = {"tasks": {"0": {"demand": {"any": [1, 4, -8]}}}}
    with pytest.raises(InputError, match=r"job '2' task '0': field 'demand.any\[2\]' = -8"):
        jobs_from_eva({"1": good, "2": bad, "3": good})


@pytest.mark.parametrize("limit", [0, -1, 1.5, "2", True])
def test_anti_affinity_limit_must_be_a_positive_integer(limit):
    spec = {"tasks": {"0": {"demand": {"any": [1, 4, 8]}}}, "max_tasks_per_instance": limit}
    with pytest.raises(InputError, match=rf"max_tasks_per_instance' = {limit!r}: must be a whole"):
        jobs_from_eva({"j": spec})


@pytest.mark.parametrize("gpus", [0.5, 1.25])
def test_a_fraction_of_a_gpu_is_refused(gpus):
    # Docker hands a container whole devices: half a GPU would be planned as
    # shareable and run on a whole one.
    spec = {"tasks": {"0": {"demand": {"any": [gpus, 4, 8]}}}}
    with pytest.raises(InputError, match=rf"field 'demand.any\[0\]' = {gpus}: .*whole number"):
        jobs_from_eva({"j": spec})


def test_a_family_the_cluster_lacks_is_ignored_with_a_note_when_another_listed_one_fits():
    from dataclasses import replace as _replace

    from autoscaler.catalog import Catalog
    from autoscaler.jobs import validate_against_catalog, without_missing_families
    from autoscaler.resources import Resources
    from tests.builders import itype
    from tests.builders import job as built

    catalog = Catalog([itype("c7i.large", 0, 2, 4, 0.1, family="c7i")])
    base = built("e", (0, 1, 2))
    task = _replace(
        base.tasks[0], demands=(("c7i", Resources(0, 1, 2)), ("p3", Resources(1, 4, 16)))
    )
    eva = _replace(base, tasks=(task,))
    kept, notes = without_missing_families(eva, catalog)
    assert kept.tasks[0].demands == (("c7i", Resources(0, 1, 2)),)
    assert notes == ("task 'e/0': ignored family p3 (no such type in the catalog); it runs on c7i",)
    validate_against_catalog((kept,), catalog)  # accepted now

    only_missing = _replace(base, tasks=(_replace(task, demands=(("p3", Resources(1, 4, 16)),)),))
    assert without_missing_families(only_missing, catalog) == (only_missing, ())
    with pytest.raises(InputError, match="family 'p3'"):
        validate_against_catalog((only_missing,), catalog)
