"""The probes of bad input, kept: every class that once went wrong, against the command
that reads it (files in `tests/inputs/`, the rest made here).

Each must end in one line naming the file, the field and the value with exit status 2
within seconds, or be read exactly as the user meant — and no file a command did not
name as its output is ever changed.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from app.bundled import bundled
from app.files import jobs_from_json, load_jobs
from autoscaler.errors import InputError
from provisioners.documents import gunzip_bounded
from tests.test_fuzz_cli import run

INPUTS = Path(__file__).parent / "inputs"


def refused(code: int, err: str, *fragments: str) -> str:
    """The one error line, checked to hold each fragment."""
    assert code == 2, err
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("autoscaler: error:")]
    for fragment in fragments:
        assert fragment in line, line
    return line


# -- traces ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("trace-duplicate-job.json", ["key 'a' appears twice"]),
        ("trace-duplicate-field.json", ["key 'duration' appears twice"]),
        (
            "trace-boolean-demand.json",
            ["job 'a' task '0': field 'demand.any[0]' = True: must be a number, not true or false"],
        ),
        ("trace-misspelt-key.json", ["job 'a': field 'max_task_per_instance': unknown field"]),
        ("trace-integer-past-4300-digits.json", ["job 'a': field 'duration'"]),
        ("trace-float-overflow.json", ["job 'a': field 'duration'"]),
        ("trace-lone-surrogate.json", ["lone surrogate"]),
        ("trace-nan.json", ["NaN"]),
        ("trace-ids-differ-by-case.json", ["'A' and 'a' differ only by case"]),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_file_field_and_value(name, fragments):
    path = str(INPUTS / name)
    code, out, err = run("plan", "--jobs", path)
    refused(code, err, path, *fragments)
    assert out == ""


def test_a_trace_with_a_byte_order_mark_or_colons_in_its_strings_is_read_as_meant():
    jobs = load_jobs(INPUTS / "trace-with-bom.json")
    assert [(j.job_id, j.trace.duration_s) for j in jobs] == [("a", 600.0)]
    # an escaped colon (\u003a) spoils the fast count of keys: the exact parse decides
    images = [t.run.image for t in load_jobs(INPUTS / "trace-colons-in-strings.json")[0].tasks]
    assert images == ["x:y", "a:b"]


def test_a_duplicate_key_is_found_in_a_trace_of_any_layout():
    task = '"tasks": {"0": {"demand": {"any": [0, 1, 2]}}}'
    for spaced in ('{"a": {%s}, "a" :{%s}}', '{"a":{%s},\n"a"\n:\n{%s}}'):
        with pytest.raises(InputError, match="key 'a' appears twice"):
            jobs_from_json((spaced % (task, task)).encode(), "t.json")
    with pytest.raises(InputError, match="key 'demand' appears twice"):
        jobs_from_json(b'{"a": {"tasks": {"0": {"demand": {}, "demand": {"any": [0,1,2]}}}}}', "t")


def test_what_is_not_a_regular_file_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "jobs.json"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    started = time.monotonic()
    refused(*run("plan", "--jobs", str(fifo))[::2], str(fifo), "is a FIFO")
    refused(*run("plan", "--catalog", str(fifo))[::2], "is a FIFO")
    refused(*run("plan", "--jobs", "/dev/zero")[::2], "/dev/zero", "is a device")
    refused(*run("plan", "--jobs", str(tmp_path))[::2], "is a directory")
    assert time.monotonic() - started < 30


def test_the_configuration_variable_naming_a_device_is_one_line(monkeypatch):
    monkeypatch.setenv("AUTOSCALER_CONFIG", "/dev/zero")
    refused(*run("status")[::2], "/dev/zero", "is a device")


def test_a_gzip_bomb_is_refused_without_being_inflated():
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()  # 64 MiB
    assert len(bomb) < 100_000
    with pytest.raises(InputError, match="decompresses to more than 16 MiB"):
        gunzip_bounded(bomb, "bomb.json.gz", 16 << 20)
    whole = gzip.compress(b'{"a": {"tasks": {"0": {"demand": {"any": [0, 1, 2]}}}}}')
    assert gunzip_bounded(whole, "t.json.gz", 1 << 20).startswith(b'{"a"')
    with pytest.raises(InputError, match="truncated"):
        gunzip_bounded(whole[:-10], "t.json.gz", 1 << 20)


# -- catalogs, contention matrices -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        (
            "catalog-misspelt-delay.json",
            ["instance type 'c7i.large': field 'instantiate_dealy': unknown field"],
        ),
        (
            "catalog-delays-without-instantiate.json",
            ["field 'instantiate_delay': is required with run_worker_delay"],
        ),
        ("catalog-cost-1e300.json", ["field 'cost' = 1e+300: must be USD per hour"]),
    ],
)
def test_a_bad_catalog_is_one_line(name, fragments):
    path = str(INPUTS / name)
    refused(*run("plan", "--catalog", path)[::2], path, *fragments)


def test_a_contention_row_or_column_naming_no_workload_is_an_error_not_dropped():
    path = str(INPUTS / "contention-case-typo.csv")
    line = refused(*run("plan", "--throughput", path)[::2], path)
    assert "'Resnet18_node0': names no workload" in line and "'resnet18_node0'?" in line


def test_a_csv_cell_past_the_limit_is_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(",a\nb," + "x" * 200_000 + "\n")
    refused(*run("plan", "--throughput", str(path))[::2], str(path), "malformed CSV")


# -- job files ------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path) -> Path:
    """A local cluster made by `autoscaler init`, and a build context beside it."""
    assert run("init", "--local", "--dir", str(tmp_path / "c"), "--name", "probe")[0] == 0
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "Dockerfile").write_text("FROM scratch\n")
    return tmp_path / "c" / "autoscaler.toml"


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("job-network-one.toml", ["task 'a': field 'network' = 1: must be true or false"]),
        ("job-boolean-demand.toml", ["field 'demand.any[0]' = True"]),
        ("job-replica-collides.toml", ["makes a task named 'a-1'"]),
        ("eva-config-unknown-key.json", ["tasks[0]: field 'anti_affinity': unknown field"]),
        ("eva-config-duplicate-key.json", ["key 'name' appears twice"]),
    ],
)
def test_a_bad_job_file_is_one_line(cluster, tmp_path, name, fragments):
    path = tmp_path / name
    shutil.copy(INPUTS / name, path)
    code, _, err = run("cost-report", "--config", str(cluster), "--dry-run", str(path))
    refused(code, err, str(path), *fragments)


def test_a_build_context_that_cannot_be_packed_is_refused_before_anything(cluster, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    job = tmp_path / "job.toml"
    job.write_text('name = "j"\n[tasks.a]\ncontext = "loop"\ndemand = { any = [0, 1, 2] }\n')
    code, _, err = run("cost-report", "--config", str(cluster), "--dry-run", str(job))
    refused(code, err, "field 'context' = 'loop': cannot be resolved")
    (tmp_path / "train" / ".dockerignore").write_bytes(b"\xff\xfe*.ckpt\n")
    job.write_text(job.read_text().replace('"loop"', '"train"'))
    code, _, err = run("cost-report", "--config", str(cluster), "--dry-run", str(job))
    refused(code, err, ".dockerignore", "not UTF-8")


# -- the cluster's configuration -------------------------------------------------------------


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("min_throughput = 0.0", "min_throughput = true", "'min_throughput' = True: must be a"),
        ("interval_s = 30", "interval_s = true", "'interval_s' = True: must be a number"),
        ("interval_s = 30", "interval_s = 1e400", "'interval_s' = inf"),
        ("interval_s = 30", "interval_s = 1" + "0" * 5000, "malformed TOML"),
        ("emulate_delays = false", "emulate_delays = 1", "must be true or false"),
        ('path = "state.db"', 'url = "postgresql+psycopg://u@db:port/x"', "not a database URL"),
        ("[cluster]", "[cluster]\n[cluster]", "malformed TOML"),
    ],
)
def test_a_bad_configuration_value_is_one_line(cluster, old, new, fragment):
    edit(cluster, old, new)
    refused(*run("status", "--config", str(cluster))[::2], str(cluster), fragment)


@pytest.mark.parametrize(
    "listen", ["7443", "localhost:99999", "::1:7443", "[::1:7443", "bad host:7443", "1.2.3:7443"]
)
def test_a_malformed_listen_address_is_refused_when_read_not_blamed_on_the_daemon(cluster, listen):
    text = cluster.read_text()
    at = text.index("[api]\nlisten = ")
    end = text.index("\n", at + 6)
    cluster.write_text(text[: at + 6] + f'listen = "{listen}"' + text[end:])
    line = refused(*run("status", "--config", str(cluster))[::2], "[api]: field 'listen'")
    assert "HOST:PORT" in line


def test_a_byte_order_mark_in_the_configuration_is_read_as_meant(cluster):
    cluster.write_bytes(b"\xef\xbb\xbf" + cluster.read_bytes())
    assert run("catalog", "show", "--config", str(cluster))[0] == 0


def test_the_daemon_check_runs_what_its_start_runs(cluster):
    code, out, err = run("daemon", "--check", "--config", str(cluster))
    assert code == 0 and "the daemon would start" in out, err
    secrets = cluster.parent / "secrets"
    (secrets / "worker-ca.key").chmod(0o644)  # the daemon signs workers with it
    refused(*run("daemon", "--check", "--config", str(cluster))[::2], "[secrets]", "worker-ca.key")
    (secrets / "worker-ca.key").chmod(0o600)
    (secrets / "api.token").write_bytes(b"\xff\xfe\n")
    os.chmod(secrets / "api.token", 0o600)
    refused(*run("daemon", "--check", "--config", str(cluster))[::2], "[secrets]")
    shutil.rmtree(secrets)
    refused(*run("daemon", "--check", "--config", str(cluster))[::2], "is not a directory")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [("file:///", "root directory"), ("s3:///", "names no bucket"), ("s3://A_B/x", "bucket")],
)
def test_a_storage_url_the_daemon_cannot_open_is_refused_when_read(cluster, url, fragment):
    text = cluster.read_text()
    at = text.index("[storage]")
    start = text.index("url = ", at)
    end = text.index("\n", start)
    cluster.write_text(text[:start] + f'url = "{url}"' + text[end:])
    refused(*run("daemon", "--check", "--config", str(cluster))[::2], "[storage]", fragment)


def test_the_catalog_commands_read_the_file_init_wrote_with_its_region(tmp_path):
    assert run("init", "--dir", str(tmp_path), "--name", "eu", "--region", "eu-west-1")[0] == 0
    code, out, err = run("catalog", "show", "--config", str(tmp_path / "autoscaler.toml"))
    assert code == 0, err
    assert "EC2 catalog for eu-west-1" in out and "no bundled catalog for eu-west-1" in out


# -- the catalog cache and price table ----------------------------------------------------------


def cache_config(tmp_path: Path) -> Path:
    path = tmp_path / "ec2.toml"
    path.write_text(f'[ec2]\ncluster_id = "c"\ncache_dir = "{tmp_path / "cache"}"\n')
    (tmp_path / "cache").mkdir()
    return path


def test_a_cache_of_another_region_or_dated_in_the_future_is_refused(tmp_path):
    config = cache_config(tmp_path)
    cache = {
        "format": "ec2-batch-autoscaler catalog v1",
        "region": "eu-west-1",
        "fetched_at_s": time.time(),
        "instance_types": {"c7i.large": {"family": "c7i", "capacity": [0, 1, 4], "cost": 0.1}},
    }
    path = tmp_path / "cache" / "catalog-us-east-1.json"
    path.write_text(json.dumps(cache))
    refused(*run("catalog", "show", "--config", str(config))[::2], "field 'region' = 'eu-west-1'")
    path.write_text(json.dumps(cache | {"region": "us-east-1", "fetched_at_s": time.time() + 1e6}))
    refused(*run("catalog", "show", "--config", str(config))[::2], "dated in the future")


def test_a_price_table_with_an_absurd_price_or_of_another_region_is_refused(tmp_path):
    config = cache_config(tmp_path)
    table = {
        "format": "ec2-batch-autoscaler prices v1",
        "region": "us-east-1",
        "retrieved": "2026-01-01",
        "prices": {"c7i.large": 1e300},
    }
    path = tmp_path / "cache" / "prices-us-east-1.json"
    path.write_text(json.dumps(table))
    refused(*run("catalog", "show", "--config", str(config))[::2], "'prices.c7i.large' = 1e+300")
    path.write_text(json.dumps(table | {"region": "eu-west-1", "prices": {"c7i.large": 0.1}}))
    refused(*run("catalog", "show", "--config", str(config))[::2], "prices of eu-west-1")


def test_an_empty_catalog_is_named_not_a_traceback(cluster, tmp_path):
    edit(cluster, 'families = ["c7i", "r7i"]', 'families = ["m5"]')
    job = tmp_path / "job.toml"
    job.write_text('name = "j"\n[tasks.a]\ncontext = "train"\ndemand = { any = [0, 1, 2] }\n')
    code, _, err = run("cost-report", "--config", str(cluster), "--dry-run", str(job))
    refused(code, err, "catalog is empty", "m5")


# -- what a user owns is never overwritten -------------------------------------------------------


def test_no_output_lands_on_an_input_the_configuration_or_the_state(cluster, tmp_path):
    before = cluster.read_bytes()
    refused(*run("cost-report", "--config", str(cluster), "--plot", str(cluster))[::2], "--plot")
    edit(cluster, 'path = "state.db"', 'path = "state.png"')  # a database a plot could name
    state = cluster.parent / "state.png"
    assert run("db", "upgrade", "--config", str(cluster))[0] == 0
    before_state = state.read_bytes()
    refused(*run("cost-report", "--config", str(cluster), "--plot", str(state))[::2], "state")
    assert state.read_bytes() == before_state
    link = tmp_path / "same.toml"
    os.link(cluster, link)  # another name, the same file
    refused(*run("cost-report", "--config", str(link), "--plot", str(cluster))[::2])
    assert cluster.read_bytes() == before.replace(b'"state.db"', b'"state.png"')


def test_a_synthesized_trace_never_overwrites_its_source(tmp_path):
    source = tmp_path / "source.json"
    shutil.copy(bundled("pai_200.json"), source)
    before = source.read_bytes()
    for out in (source, tmp_path / "hard-link.json"):
        if out != source:
            os.link(source, out)
        code, _, err = run(
            "trace", "synthesize", "--jobs", "3", "--from", str(source), "--out", str(out)
        )
        refused(code, err, "--out")
    assert source.read_bytes() == before
    trace = tmp_path / "t.json"
    refused(*run("replay", "--trace", str(source), "--plot", str(source))[::2], "--plot")
    assert (
        run("trace", "synthesize", "--jobs", "3", "--from", str(source), "--out", str(trace))[0]
        == 0
    )
    assert len(load_jobs(trace)) == 3 and source.read_bytes() == before


def test_an_absurd_rate_is_one_line():
    refused(
        *run("trace", "synthesize", "--jobs", "10", "--rate", "1e-300", "--out", "/tmp/x.json")[
            ::2
        ],
        "--rate",
    )
    refused(
        *run("trace", "synthesize", "--jobs", "1000000", "--rate", "0.01", "--out", "/tmp/x.json")[
            ::2
        ],
        "--rate",
    )


def test_an_output_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "out.png"
    os.mkfifo(fifo)
    code, _, err = run("replay", "--plot", str(fifo))
    assert code == 2 and "not a regular file" in err


# -- init ------------------------------------------------------------------------------------

HOSTILE = ['a"b', "a\\b", "a\nb", "ü-ß", "a'b", "a b", "#%:", "\u202e", "a;b?c", "x" * 300]


def every_file_reads_back(directory: Path) -> None:
    from app.config import load_cluster_config
    from executor.security import Authority, read_token

    config = load_cluster_config(directory / "autoscaler.toml")
    secrets = directory / "secrets"
    for purpose in ("server", "worker"):
        Authority.load(secrets / f"{purpose}-ca.pem", secrets / f"{purpose}-ca.key")
        assert stat.S_IMODE(os.stat(secrets / f"{purpose}-ca.key").st_mode) == 0o600
    assert read_token(secrets / "api.token")
    if config.cloud.provider == "local":
        from urllib.parse import unquote, urlsplit

        assert Path(unquote(urlsplit(config.storage.url).path)) == directory.resolve() / "storage"


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("flag", ["--dir", "--name", "--bucket"])
def test_init_refuses_or_writes_only_what_reads_back(tmp_path, flag, value):
    base = tmp_path / "c"
    argv = ["init", "--local", "--dir", str(base), "--name", "n"]
    if flag == "--dir":
        base = tmp_path / value[:200]
        argv[3] = str(base)
    else:
        argv += [flag, value]
    code, _, err = run(*argv)
    if code == 2:
        refused(code, err, flag)
        assert not (base / "autoscaler.toml").exists()  # checked before anything was written
        return
    assert code == 0, err
    every_file_reads_back(base)


def test_init_refuses_a_directory_that_is_a_file(tmp_path):
    file = tmp_path / "f"
    file.write_text("mine")
    refused(*run("init", "--dir", str(file))[::2], "--dir", "not a directory")
    assert file.read_text() == "mine"


def test_init_picks_ports_no_other_cluster_here_listens_on(tmp_path):
    from app.init import DEFAULT_API_PORT

    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", DEFAULT_API_PORT))
        except OSError:
            pass  # something already listens there: the point holds all the same
        else:
            busy.listen()
        assert run("init", "--local", "--dir", str(tmp_path), "--name", "p")[0] == 0
    from app.config import load_cluster_config

    config = load_cluster_config(tmp_path / "autoscaler.toml")
    assert config.api.listen != f"127.0.0.1:{DEFAULT_API_PORT}"
    assert config.api.listen.rpartition(":")[2] != config.metrics.listen.rpartition(":")[2]


# -- Ctrl-C ----------------------------------------------------------------------------------


#: The interpreter's own start-up and runpy finding the package come before any handler of
#: ours can exist: a SIGINT there kills any Python program by the signal. The child says when
#: its interpreter is up; the earliest interrupt lands 0.15 s later (a few milliseconds of
#: CPU after it, `app.__main__` holds the handler), however slowly a busy machine got there.
_STARTED = (
    "import os, runpy, sys; os.write(1, b'!'); "
    "sys.argv = ['autoscaler', 'replay', '--scheduler', 'eva', '--workers', '1']; "
    "runpy.run_module('app', run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize("after_s", [0.15, 0.4, 1.0, 3.0])
def test_ctrl_c_at_any_moment_is_one_line_and_status_130(after_s):
    """Early (while the command's modules are imported) and late (while it replays)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _STARTED],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.read(1) == "!"
    time.sleep(after_s)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    if process.returncode == 0:  # it finished first: nothing to interrupt
        return
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines() == ["autoscaler: interrupted"], err


# -- long work is announced ------------------------------------------------------------------


def test_a_replay_of_much_work_says_so_before_it_starts(tmp_path):
    trace = tmp_path / "long.json"
    days = 30 * 86400
    trace.write_text(
        json.dumps({"a": {"duration": days, "tasks": {"0": {"demand": {"any": [0, 1, 2]}}}}})
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "replay", "--trace", str(trace), "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = ""
        while "long time" not in said and len(said) < 2000:  # a warning, then the estimate
            said += process.stderr.readline()
        said = " ".join(said.split())
        assert "30.0 days" in said and "2,592,000 rounds" in said and "long time" in said, said
    finally:
        process.send_signal(signal.SIGINT)
        # a deadline, not a timing: a loaded machine is slow to unwind
        _, err = process.communicate(timeout=300)
    assert process.returncode == 130 and "Traceback" not in err, err


# -- command-line values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1700000000", "a bare number is ambiguous"),  # epoch seconds need their @
        ("20991123", "in the future"),  # a basic date, read as one: and it is ahead
        ("2099-01-01T00:00Z", "in the future"),
        ("@9999999999", "in the future"),
        ("yesterday", "ISO 8601"),
        ("7 d", "ISO 8601"),
    ],
)
def test_since_refuses_what_it_could_misread(text, problem):
    from app.validation import parse_since

    with pytest.raises(InputError, match=problem):
        parse_since(text, now=1.7e9)


def test_since_is_checked_before_the_report(cluster):
    line = refused(*run("cost-report", "--config", str(cluster), "--since", "2099-01-01")[::2])
    assert "field '--since' = '2099-01-01': is in the future" in line


@pytest.mark.parametrize("value", ["1_000", " 3", "0x10", "٣", "1e999", "nan", "--1", "3."])
def test_a_number_on_the_command_line_is_plain_decimal_or_refused(value):
    code, _, err = run("plan", f"--limit={value}")
    assert code == 2 and "must be a whole number" in err, err


@pytest.mark.parametrize(("value", "seconds"), [("300", 300.0), ("5m", 300.0), ("1h", 3600.0)])
def test_a_duration_on_the_command_line_takes_a_unit(value, seconds):
    from app.validation import seconds_arg

    assert seconds_arg(1.0, 86400.0)(value) == seconds
