"""`autoscaler plan` as a user runs it: output, JSON, and bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.bundled import bundled
from app.cli import main


def write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


TABLE3_CATALOG = {
    "instance_types": {
        "it1": {"family": "f", "capacity": [4, 16, 244], "cost": 12},
        "it2": {"family": "f", "capacity": [1, 4, 61], "cost": 3},
        "it3": {"family": "f", "capacity": [0, 8, 32], "cost": 0.8},
        "it4": {"family": "f", "capacity": [0, 4, 16], "cost": 0.4},
    }
}
TABLE3_JOBS = {
    "1": {"name": "a[0]", "tasks": {"1": {"name": "node0", "demand": {"any": [2, 8, 24]}}}},
    "2": {"name": "b[0]", "tasks": {"2": {"name": "node0", "demand": {"any": [1, 4, 10]}}}},
    "3": {"name": "c[0]", "tasks": {"3": {"name": "node0", "demand": {"any": [0, 6, 20]}}}},
    "4": {"name": "d[0]", "tasks": {"4": {"name": "node0", "demand": {"f": [0, 4, 12]}}}},
}


def test_plan_writes_the_documented_json(tmp_path, capsys):
    catalog = write(tmp_path, "catalog.json", TABLE3_CATALOG)
    jobs = write(tmp_path, "jobs.json", TABLE3_JOBS)
    args = ["plan", "--catalog", str(catalog), "--jobs", str(jobs), "--default-throughput", "1.0"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # the document alone on standard output
    assert doc["hourly_cost"] == pytest.approx(12.8)
    assert doc["no_packing_hourly_cost"] == pytest.approx(16.2)
    assert isinstance(doc["seconds"], float) and doc["seconds"] >= 0
    assert sorted((i["type"], sorted(i["tasks"])) for i in doc["instances"]) == [
        ("it1", ["1/1", "2/2", "4/4"]),
        ("it3", ["3/3"]),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "$12.80/h" in text and "$16.20/h" in text and "$3.40/h (21.0%)" in text


def test_plan_on_bundled_data_saves_money(tmp_path, capsys):
    assert main(["plan", "--json", "--limit", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tasks = [t for inst in doc["instances"] for t in inst["tasks"]]
    assert len(tasks) == len(set(tasks)) == 200
    assert doc["hourly_cost"] < doc["no_packing_hourly_cost"]
    assert main(["plan", "--limit", "5"]) == 0
    assert "more instances" in capsys.readouterr().out


def test_plan_with_contention_matrix_packs_less_than_without(tmp_path, capsys):
    main(["plan", "--default-throughput", "1.0", "--json"])
    a = json.loads(capsys.readouterr().out)
    main(["plan", "--throughput", str(bundled("contention_matrix.csv")), "--json"])
    b = json.loads(capsys.readouterr().out)
    assert a["hourly_cost"] <= b["hourly_cost"]
    assert len(a["instances"]) < len(b["instances"])


@pytest.mark.parametrize("pop", [[], ["--pop-threshold", "10", "--pop-parts", "2"]])
def test_plan_with_a_minimum_throughput_co_locates_nothing_that_would_break_it(
    tmp_path, pop, capsys
):
    # At the default 0.95 every co-location is expected below 1.0: nothing shares,
    # whether planned whole or in POP parts.
    assert main(["plan", "--min-throughput", "1.0", *pop, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["min_throughput"] == 1.0 and doc["partitions"] == (2 if pop else 1)
    assert doc["instances"] and all(len(i["tasks"]) == 1 for i in doc["instances"])
    assert doc["hourly_cost"] == pytest.approx(doc["no_packing_hourly_cost"])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=60
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        (
            {"any": [9, 4, 10]},
            r"job '2' task '2': field 'demand': fits no instance type in the catalog "
            r"\(demand any: \[9, 4, 10\]; closest: it1 \[4, 16, 244\]\)",
        ),
        (
            {"any": [1, -4, 10]},
            r"job '2' task '2': field 'demand.any\[1\]' = -4: must be a number >= 0",
        ),
        (
            {"any": [1, "four", 10]},
            r"job '2' task '2': field 'demand.any\[1\]' = 'four': must be a number",
        ),
        (
            {"g5": [1, 4, 10]},
            r"job '2' task '2': field 'demand.g5': no instance type .* family 'g5'",
        ),
        ({"any": [1, 4]}, r"job '2' task '2': field 'demand.any' = \[1, 4\]: must be a list"),
        ([1, 4, 10], r"job '2' task '2': field 'demand' = \[1, 4, 10\]: must be an object"),
    ],
)
def test_bad_task_is_one_line_naming_job_task_and_field(tmp_path, demand, expected):
    jobs = dict(TABLE3_JOBS)
    jobs["2"] = {"name": "b", "tasks": {"2": {"name": "node0", "demand": demand}}}
    catalog = write(tmp_path, "catalog.json", TABLE3_CATALOG)
    path = write(tmp_path, "jobs.json", jobs)
    line = one_line_error(run_cli("plan", "--catalog", str(catalog), "--jobs", str(path)))
    assert str(path) in line
    assert re.search(expected, line), line


@pytest.mark.parametrize(
    ("field", "extra", "expected"),
    [
        # an LP over a $1e300/h type or a 8e300-GPU one ended in a HiGHS traceback
        ("cost", {"cost": 1e300}, "field 'cost' = 1e+300: must be USD per hour in (0, 100,000]"),
        (
            "capacity",
            {"capacity": [8e300, 96, 1536]},
            "field 'capacity[0]' = 8e+300: must be a whole number of GPUs from 0 to 1,024",
        ),
        # accepted before, and planned on: half a GPU, a type nothing fits, a family
        # that every "any" demand would also name
        (
            "gpu",
            {"capacity": [0.5, 96, 1536]},
            "field 'capacity[0]' = 0.5: must be a whole number of GPUs",
        ),
        ("empty", {"capacity": [0, 0, 0]}, "field 'capacity' = [0, 0, 0]: a type with no"),
        ("any", {"family": "any"}, "field 'family' = 'any': must not be 'any'"),
        # a replay waited 10^12 s of simulated time for the instance to boot
        (
            "delay",
            {"instantiate_delay": 1e12},
            "field 'instantiate_delay' = 1000000000000.0: must be",
        ),
    ],
)
def test_absurd_catalog_numbers_are_refused_where_they_are_read(tmp_path, field, extra, expected):
    spec = {"family": "p3", "capacity": [8, 96, 1536], "cost": 1.0} | extra
    catalog = write(tmp_path, "cat.json", {"instance_types": {"x": spec}})
    line = one_line_error(run_cli("plan", "--catalog", str(catalog)))
    assert f"cat.json: instance type 'x': {expected}" in line


def test_an_instance_type_with_an_empty_name_is_refused(tmp_path):
    spec = {"family": "p3", "capacity": [8, 96, 1536], "cost": 1.0}
    catalog = write(tmp_path, "cat.json", {"instance_types": {" ": spec}})
    line = one_line_error(run_cli("plan", "--catalog", str(catalog)))
    assert "cat.json: instance type ' ': is not a valid key: must be an instance type name" in line


@pytest.mark.parametrize("where", ["job", "task"])
def test_a_delay_longer_than_a_day_is_refused_before_a_replay_waits_for_it(tmp_path, where):
    task = {"name": "n", "demand": {"any": [1, 4, 8]}}
    spec = {"name": "a", "duration": 100, "tasks": {"0": task}}
    (spec if where == "job" else task)["init_delay" if where == "job" else "fetch_delay"] = 1e12
    path = write(tmp_path, "t.json", {"0": spec})
    line = one_line_error(run_cli("replay", "--trace", str(path), "--scheduler", "eva"))
    assert "_delay' = 1000000000000.0: must be a number <= 86,400" in line


def test_missing_and_malformed_files_are_one_line_errors(tmp_path):
    line = one_line_error(run_cli("plan", "--jobs", str(tmp_path / "nope.json")))
    assert "nope.json: jobs file not found" in line
    bad = write(tmp_path, "bad.json", '{"1": {"tasks": ')
    line = one_line_error(run_cli("plan", "--jobs", str(bad)))
    assert "bad.json: malformed JSON at line 1" in line
    catalog = write(
        tmp_path,
        "cat.json",
        {"instance_types": {"x": {"family": "f", "capacity": [1, 2, 3], "cost": -1}}},
    )
    line = one_line_error(run_cli("plan", "--catalog", str(catalog)))
    assert "instance type 'x': field 'cost' = -1: must be USD per hour in (0, 100,000]" in line


def test_a_minimum_throughput_above_one_is_refused_by_name():
    result = run_cli("plan", "--min-throughput", "1.2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--min-throughput: must be a number in [0, 1], got '1.2'" in result.stderr


def test_bad_flag_value_exits_2_without_traceback():
    result = run_cli("plan", "--default-throughput", "1.5")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--default-throughput: must be a number in (0, 1], got '1.5'" in result.stderr
    assert result.stderr.count("\n") == 1  # one line, not argparse's usage block


def test_a_directory_no_file_can_be_created_in_is_refused_before_the_work(tmp_path):
    # /proc passes os.access(W_OK) for root; creating a file there fails.
    result = run_cli("replay", "--plot", "/proc/out.png")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--plot: directory '/proc' is not writable" in one_line_error(result)
    assert result.stdout == ""


def test_a_plot_in_a_format_matplotlib_cannot_write_is_refused_before_the_replay(tmp_path):
    result = run_cli("replay", "--plot", str(tmp_path / "out.txt"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--plot: cannot write a '.txt' file" in one_line_error(result)
    assert ".png, .pdf, .svg" in result.stderr
    assert result.stdout == ""  # refused before the replay, not after it


def test_json_nested_deeper_than_the_parser_goes_is_a_one_line_error(tmp_path):
    deep = tmp_path / "jobs.json"
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = run_cli("plan", "--jobs", str(deep))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "malformed JSON: nested too deeply" in one_line_error(result)


def test_an_unwritable_output_is_refused_before_the_work(tmp_path):
    result = run_cli("replay", "--plot", str(tmp_path / "missing-dir" / "out.png"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "missing-dir' does not exist" in result.stderr
    assert result.stdout == ""  # nothing was planned: the mistake costs no waiting


@pytest.mark.parametrize("columns", ["100", "70"])
def test_the_plan_report_fits_the_width_and_wraps_values_under_their_value(columns):
    result = subprocess.run(
        [sys.executable, "-m", "app", "plan"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": columns},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= int(columns)
    # the bound's line is longer than 70 columns: it continues under its value
    at = next(i for i, line in enumerate(lines) if line.startswith("LP lower bound"))
    assert lines[at + 1].startswith(" " * 24) and lines[at + 1].strip()


def test_no_saving_reads_zero_not_minus_zero():
    # Σ of RPs and Σ of instance prices, added in another order, differ in the last bit.
    from app.commands.plan import _saved

    assert 0.3 - (0.1 + 0.2) < 0
    assert f"{_saved(0.3, 0.1 + 0.2):.4f}" == "0.0000"
    assert _saved(1.428, 1.16) == pytest.approx(0.268)


def test_plan_json_reports_the_whole_task_bounds_beside_the_fluid_one(tmp_path, capsys):
    # Table 3 at full speed: the plan is Algorithm 1's $12.8/h, and nothing hosting τ1's
    # two GPUs is cheaper, so the MIP proves it optimal; the fluid LP pools resources
    # and stays below.
    catalog = write(tmp_path, "catalog.json", TABLE3_CATALOG)
    jobs = write(tmp_path, "jobs.json", TABLE3_JOBS)
    args = ["plan", "--catalog", str(catalog), "--jobs", str(jobs), "--default-throughput", "1"]
    assert main([*args, "--bounds", "exact", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    bounds = doc["bounds"]
    assert bounds["fluid"] == doc["lower_bound_hourly_cost"] < 12.8
    assert bounds["fluid"] <= bounds["configuration"]["lower_bound"] <= 12.8 + 1e-9
    assert bounds["mip"]["optimal"] and bounds["mip"]["hourly_cost"] == pytest.approx(12.8)
    assert doc["tightest_lower_bound_hourly_cost"] == pytest.approx(12.8)
    assert doc["gap_to_tightest_bound"] == pytest.approx(0.0, abs=1e-9)
    assert main([*args, "--bounds", "exact"]) == 0
    assert "Optimum (MIP)           $12.80/h" in capsys.readouterr().out
    assert main([*args, "--bounds", "fluid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bounds"] is None


def test_plan_reports_the_pooled_bound_of_tasks_that_fill_an_instance_s_gpus(tmp_path, capsys):
    # Two 8-GPU tasks fill the one GPU type's GPUs alone; four 1-GPU tasks of 16 CPUs
    # need two more instances: $32. The fluid LP puts their CPUs beside the 8-GPU
    # tasks (98 CPUs: $24.50); the pooled LP keeps them apart, and says so.
    catalog = write(
        tmp_path,
        "catalog.json",
        {"instance_types": {"p": {"family": "p", "capacity": [8, 32, 488], "cost": 8}}},
    )
    tasks = [[8, 2, 10]] * 2 + [[1, 16, 10]] * 4 + [[0, 15, 10]] * 2
    jobs = write(
        tmp_path,
        "jobs.json",
        {
            str(i): {"name": f"j[{i}]", "tasks": {str(i): {"name": "n", "demand": {"any": d}}}}
            for i, d in enumerate(tasks)
        },
    )
    args = ["plan", "--catalog", str(catalog), "--jobs", str(jobs), "--default-throughput", "1"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pooled = doc["bounds"]["pooled"]
    assert doc["bounds"]["fluid"] == pytest.approx(24.5)
    assert pooled["lower_bound"] == pytest.approx(32.0)
    assert pooled["exclusive_resource"] == "gpu" and pooled["exclusive_tasks"] == 2
    assert doc["tightest_lower_bound_hourly_cost"] == pytest.approx(32.0)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Pooled LP bound         $32.00/h" in out
    assert "2 tasks filling the gpu of every type they fit pooled apart" in " ".join(out.split())
