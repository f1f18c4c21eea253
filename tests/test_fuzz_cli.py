"""Fuzzing the command line in-process: whatever a user feeds it — job files, traces,
throughput CSVs, flag values — it ends with exit status 0 or 2 (one line on stderr),
never a traceback, and tiny inputs never run long."""

from __future__ import annotations

import json
import math
import signal
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from app.config import ClusterConfigFile
from app.files import Trace
from app.jobfile import EvaJobConfig, JobFile
from provisioners.catalog import EvaCatalogFile
from tests.schema_strategies import documents, mutated, toml_document

#: A tiny input that runs longer than this is a hang (generous: the machine may be busy).
TIME_BOUND_S = 60

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same examples every run: a failure reproduces
)


class Hang(Exception):
    pass


@contextmanager
def time_bound(seconds: int):
    def expired(*_):
        raise Hang(f"ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with time_bound(TIME_BOUND_S), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse ends this way
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_handled(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("autoscaler: error:")]
        assert len(errors) == 1, err


numbers = st.one_of(
    st.integers(-10, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 4, 16, 0.5, 1e308, -0.0]),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
)
vectors = st.one_of(st.lists(numbers, min_size=0, max_size=4), numbers)
ids = st.one_of(st.text(max_size=6), st.sampled_from(["a", "b/c", " ", "", "\x00", "j1"]))
tasks = st.dictionaries(
    ids,
    st.one_of(
        st.fixed_dictionaries(
            {"demand": st.dictionaries(st.sampled_from(["any", "c7i", "p3", "zz"]), vectors)},
            optional={"name": ids, "kill_delay": numbers, "image_id": numbers},
        ),
        numbers,
    ),
    max_size=3,
)
jobs = st.dictionaries(
    ids,
    st.one_of(
        st.fixed_dictionaries(
            {"tasks": tasks},
            optional={
                "name": ids,
                "arrival_time": numbers,
                "duration": numbers,
                "total_iters": numbers,
                "full_throughput": numbers,
                "max_tasks_per_instance": numbers,
            },
        ),
        numbers,
    ),
    max_size=3,
)


# Jobs a user would plausibly write, so the fuzz also runs the plans and replays through.
small = st.one_of(st.integers(0, 8), st.floats(0, 64, allow_nan=False))
sensible_tasks = st.dictionaries(
    st.sampled_from(["0", "1", "node0", "w"]),
    st.fixed_dictionaries(
        {"demand": st.fixed_dictionaries({"any": st.tuples(st.integers(0, 2), small, small)})},
        optional={"name": st.sampled_from(["node0", "node1"])},
    ),
    min_size=1,
    max_size=3,
)
sensible_jobs = st.dictionaries(
    st.sampled_from(["a", "b", "c", "7"]),
    st.fixed_dictionaries(
        {"tasks": sensible_tasks, "duration": st.floats(60, 86400), "name": st.just("resnet18")},
        optional={"arrival_time": st.floats(0, 7200), "max_tasks_per_instance": st.integers(1, 3)},
    ),
    min_size=1,
    max_size=3,
)
any_jobs = st.one_of(sensible_jobs, jobs)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def as_json(value) -> str:
    return json.dumps(value, allow_nan=True)


@FUZZ
@given(document=any_jobs)
def test_any_job_file_is_planned_or_refused_in_one_line(tmp_path, document):
    code, _, err = run("plan", "--jobs", write(tmp_path, "jobs.json", as_json(document)))
    assert_handled(code, err)


@FUZZ
@given(document=any_jobs)
def test_any_trace_is_replayed_or_refused_in_one_line(tmp_path, document):
    trace = write(tmp_path, "trace.json", as_json(document))
    code, _, err = run("replay", "--trace", trace, "--scheduler", "eva", "--interval", "3600")
    assert_handled(code, err)


cells = st.one_of(
    st.sampled_from(["x", "", "0.5", "1", "0", "nan", "inf", "-1", "2", "0.9"]), st.text(max_size=3)
)


@FUZZ
@given(rows=st.lists(st.lists(cells, min_size=1, max_size=4), min_size=0, max_size=4))
def test_any_throughput_csv_is_used_or_refused_in_one_line(tmp_path, rows):
    text = "\n".join(",".join(row) for row in rows)
    code, _, err = run("plan", "--throughput", write(tmp_path, "t.csv", text), "--limit", "1")
    assert_handled(code, err)


flag_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e9", "1e308", "", "x", "0.0001", "3"]),
    st.floats(allow_nan=True).map(str),
    st.integers(-(10**12), 10**12).map(str),
)


@FUZZ
@given(
    flag=st.sampled_from(
        [
            ("plan", "--default-throughput"),
            ("plan", "--pop-parts"),
            ("plan", "--pop-threshold"),
            ("plan", "--limit"),
            ("replay", "--interval"),
            ("replay", "--unknown-throughput"),
            ("replay", "--seed"),
            ("trace synthesize", "--jobs"),
            ("trace synthesize", "--rate"),
            ("trace synthesize", "--multi-task"),
        ]
    ),
    value=flag_values,
)
def test_any_flag_value_is_taken_or_refused_in_one_line(tmp_path, flag, value):
    command, name = flag
    argv = [*command.split(), f"{name}={value}"]
    if command == "replay":
        # a tiny trace, so an accepted value runs quickly
        argv += ["--synthesize", "2", "--scheduler", "no-packing"]
    if command == "trace synthesize":
        argv += ["--out", str(tmp_path / "t.json")]
        if name != "--jobs":
            argv += ["--jobs", "3"]
    code, _, err = run(*argv)
    assert_handled(code, err)
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        assert code == 2, (argv, err)  # nan and inf are never taken


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        '{"a": 1}',
        '{"a": {"tasks": []}}',
        "\udcff".encode(errors="surrogateescape").decode("latin-1"),
    ],
)
def test_malformed_job_files_are_one_line(tmp_path, text):
    path = tmp_path / "jobs.json"
    path.write_bytes(text.encode("latin-1", errors="replace"))
    code, _, err = run("plan", "--jobs", str(path))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


# -- documents drawn from the formats' own schemas ------------------------------------------------
#
# Each format's strict schema (msgspec) is read by `tests/schema_strategies.py`: the
# documents it describes, and the same broken in one place. Every entry point that
# reads the format must take the first or refuse the second in one line naming the
# file, in bounded time.

SCHEMA_FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
    derandomize=True,
)


def assert_one_line_naming(code: int, err: str, path: str) -> None:
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        [line] = [line for line in err.splitlines() if line.startswith("autoscaler: error:")]
        assert path in line, line
        assert len(line) < 2_000, line[:200]  # a megabyte value is never repeated whole


def as_strict_json(value) -> str:
    return json.dumps(value)  # ensure_ascii: a lone surrogate travels as its escape


@SCHEMA_FUZZ
@given(document=st.one_of(documents(Trace), mutated(Trace)))
def test_a_trace_drawn_from_its_schema_is_planned_or_refused_naming_the_file(tmp_path, document):
    path = write(tmp_path, "jobs.json", as_strict_json(document))
    code, _, err = run("plan", "--jobs", path, "--limit", "1")
    assert_one_line_naming(code, err, path)


@SCHEMA_FUZZ
@given(document=st.one_of(documents(EvaCatalogFile), mutated(EvaCatalogFile)))
def test_a_catalog_drawn_from_its_schema_is_used_or_refused_naming_the_file(tmp_path, document):
    path = write(tmp_path, "catalog.json", as_strict_json(document))
    jobs = write(tmp_path, "jobs.json", '{"a": {"tasks": {"0": {"demand": {"any": [0, 1, 1]}}}}}')
    code, _, err = run("plan", "--catalog", path, "--jobs", jobs, "--limit", "1")
    if code == 2 and path not in err:  # the catalog is fine; the job fits none of its types
        assert "fits no instance type" in err or "has family" in err, err
        return
    assert_one_line_naming(code, err, path)


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory) -> Path:
    """A local cluster made by `autoscaler init`, for the commands that need one."""
    directory = tmp_path_factory.mktemp("cluster")
    assert run("init", "--local", "--dir", str(directory), "--name", "fuzz")[0] == 0
    return directory / "autoscaler.toml"


def toml_or_none(document) -> str | None:
    try:
        return toml_document(document) if isinstance(document, dict) else None
    except ValueError:  # None, a lone surrogate: nothing a TOML file can say
        return None


@SCHEMA_FUZZ
@given(document=st.one_of(documents(JobFile), mutated(JobFile)))
def test_a_job_file_drawn_from_its_schema_is_planned_or_refused(tmp_path, local_cluster, document):
    text = toml_or_none(document)
    if text is None:
        return
    (tmp_path / "train").mkdir(exist_ok=True)
    (tmp_path / "train" / "Dockerfile").write_text("FROM scratch\n")
    path = write(tmp_path, "job.toml", text)
    code, _, err = run("cost-report", "--config", str(local_cluster), "--dry-run", path)
    assert_one_line_naming(code, err, path)


@SCHEMA_FUZZ
@given(document=st.one_of(documents(EvaJobConfig), mutated(EvaJobConfig)))
def test_an_eva_config_json_drawn_from_its_schema_is_planned_or_refused(
    tmp_path, local_cluster, document
):
    path = write(tmp_path, "config.json", as_strict_json(document))
    code, _, err = run("cost-report", "--config", str(local_cluster), "--dry-run", path)
    assert_one_line_naming(code, err, path)


@SCHEMA_FUZZ
@given(document=st.one_of(documents(ClusterConfigFile), mutated(ClusterConfigFile)))
def test_a_cluster_configuration_drawn_from_its_schema_is_checked_or_refused(tmp_path, document):
    text = toml_or_none(document)
    if text is None:
        return
    path = write(tmp_path, "autoscaler.toml", text)
    for command in (("catalog", "show"), ("daemon", "--check")):
        code, _, err = run(*command, "--config", path)
        assert_one_line_naming(code, err, path)
