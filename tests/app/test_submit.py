"""Submitting jobs through the CLI and the API: checked before anything is uploaded or
queued, uploaded once, refused in one line with the queue left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import grpc
import pytest

from app.api import ApiRefused
from app.cli import main
from app.commands.cluster import connect
from app.jobfile import pack_context
from autoscaler.jobs import spec_from_document
from autoscaler.store import TaskUpdate
from executor.security import secure_channel
from executor.storage import checkpoint_key, log_key, open_storage, upload_context
from tests.store_writes import request


def write_job(directory: Path, body: str, name: str = "job.toml") -> Path:
    context = directory / "train"
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text("FROM autoscaler/python:3.11\nCOPY train.py /app/\n")
    (context / "train.py").write_text("print('training')\n")
    path = directory / name
    path.write_text(body)
    return path


GOOD = """
name = "resnet18"
full_throughput = 2.5
[tasks.node0]
context = "train"
command = ["python", "/app/train.py"]
demand = { any = [0, 1, 2] }
replicas = 2
"""


def submit(api, *paths, extra=()):
    return main(["submit", "--config", str(api.config.path), *map(str, paths), *extra])


def test_a_job_is_checked_packed_uploaded_once_and_queued(api, tmp_path, capsys):
    path = write_job(tmp_path, GOOD)
    assert submit(api, path, extra=["--json"]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    record = api.store.job(job_id)
    assert record.status == "queued" and record.owner
    tasks = record.spec.tasks
    assert [t.name for t in tasks] == ["node0-0", "node0-1"]
    # both replicas share one uploaded context, named by its digest
    _, digest = pack_context(tmp_path / "train")
    assert {t.run.build_context for t in tasks} == {api.storage.ref(f"contexts/{digest}.tar.gz")}
    assert api.storage.list("contexts/") == [f"contexts/{digest}.tar.gz"]
    assert tasks[0].run.command == ("python", "/app/train.py") and not tasks[0].run.network
    # the same directory again: nothing new is uploaded
    assert submit(api, path) == 0
    assert api.storage.list("contexts/") == [f"contexts/{digest}.tar.gz"]
    assert len(api.store.jobs()) == 2


def test_submit_and_the_storage_pack_a_directory_into_one_object(api, tmp_path, capsys):
    path = write_job(tmp_path, GOOD)
    context = tmp_path / "train"
    (context / ".dockerignore").write_text("*.ckpt\n")
    (context / "old.ckpt").write_text("a stale checkpoint, not for the image")
    assert submit(api, path, extra=["--json"]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    [ref] = {t.run.build_context for t in api.store.job(job_id).spec.tasks}
    # The other packing path (`upload_context`, what tests and benchmarks upload with)
    # names the very same object, and finds it stored.
    storage = open_storage(f"file://{api.storage.root}")
    assert upload_context(storage, context) == ref
    assert api.storage.list("contexts/") == [storage.key(ref)]
    with tarfile.open(api.storage.root / storage.key(ref)) as tar:
        names = set(tar.getnames())
    assert {"Dockerfile", ".dockerignore", "train.py"} <= names and "old.ckpt" not in names


def test_a_job_id_given_twice_is_refused_and_the_first_kept(api, tmp_path, capsys):
    path = write_job(tmp_path, 'id = "once"\n' + GOOD)
    assert submit(api, path) == 0
    capsys.readouterr()
    assert submit(api, path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a job with id 'once' already exists" in err
    assert [j.job_id for j in api.store.jobs()] == ["once"]


A = "name = 'x'\n[tasks.a]\ncontext = 'train'\n"  # a job with one task, a context
OK = "demand = { any = [0, 1, 2] }\n"

BAD = [
    (A + "demand = { any = [0, 0, 0] }", "asks for nothing"),
    (
        A + "demand = { any = [0, -1, 2] }",
        "task 'a': field 'demand.any[1]' = -1: must be a number >= 0",
    ),
    (A + "demand = { any = [0, nan, 2] }", "task 'a': field 'demand.any[1]' = nan"),
    (A + "demand = { any = [0, inf, 2] }", "task 'a': field 'demand.any[1]' = inf"),
    (A + "demand = { any = [0, 1] }", "demand.any"),
    (A + "demand = { any = [0.5, 1, 2] }", "field 'demand.any[0]' = 0.5: must be a whole number"),
    (A + "demand = { any = [0, 'one', 2] }", "field 'demand.any[1]' = 'one': must be a number"),
    (A + "demand = {}", "field 'demand' = {}: must not be empty"),
    (A + "demand = { gpu9 = [0, 1, 2] }", "no instance type in the catalog has family 'gpu9'"),
    (A + "demand = { any = [9, 1, 2] }", "fits no instance type"),
    (A + "demand = { any = [0, 999, 2] }", "fits no instance type"),
    (A.replace("'train'", "'nowhere'") + OK, "field 'context' = 'nowhere': is not a directory"),
    (A.replace("'train'", "'.'") + OK, "has no Dockerfile"),
    ("name = 'x'\n[tasks.a]\n" + OK, "give either 'context'"),
    (A + "image = 'i'\n" + OK, "give either 'context'"),
    (A + OK + "replicas = 0", "task 'a': field 'replicas' = 0"),
    (A + OK + "shm_size_gb = -1", "task 'a': field 'shm_size_gb' = -1"),
    (A + OK + "checkpoint_every_s = 0", "task 'a': field 'checkpoint_every_s' = 0"),
    (A + OK + "checkpoint_every_s = true", "field 'checkpoint_every_s' = True"),
    (A + OK + "fatal_exit_codes = [0]", "task 'a': field 'fatal_exit_codes[0]' = 0"),
    (A + OK + "fatal_exit_codes = [256]", "field 'fatal_exit_codes[0]' = 256"),
    (A + OK + "fatal_exit_codes = 3", "field 'fatal_exit_codes' = 3"),
    (A + OK + "fetch_s = 1e12", "task 'a': field 'fetch_s' = 1000000000000.0"),
    (A + OK + "env = { AUTOSCALER_JOB_ID = 'x' }", "is reserved"),
    (A + OK + "env = { '1BAD' = 'x' }", "must be an environment variable name"),
    (A + OK + "colour = 'red'", "task 'a': field 'colour': unknown field"),
    (A.replace("tasks.a", "tasks.'a/b'") + OK, "task 'a/b': is not a valid key"),
    ("name = 'x'\ntasks = {}", "field 'tasks' = {}: must not be empty"),
    ("[tasks.a]\ncontext = 'train'\n" + OK, "field 'name': is required"),
    (A.replace("'x'", "'x y'") + OK, "field 'name' = 'x y'"),
    ("id = '../etc'\n" + A + OK, "field 'id' = '../etc'"),
    ("full_throughput = 0\n" + A + OK, "field 'full_throughput' = 0"),
    ("max_tasks_per_instance = 0\n" + A + OK, "field 'max_tasks_per_instance' = 0"),
    ("priority = 1001\n" + A + OK, "field 'priority' = 1001"),
    ("priority = 1.5\n" + A + OK, "field 'priority' = 1.5: must be a whole number"),
    ("name = 'x'\n[tasks.a\ncontext = 'train'", "malformed TOML"),
    (A + "command = 'python train.py'\n" + OK, "task 'a': field 'command' = 'python train.py'"),
    (A + OK + "network = 1", "task 'a': field 'network' = 1: must be true or false"),
    (A + OK + "replicas = 2.0", "task 'a': field 'replicas' = 2.0: must be a whole number"),
    (A + "demand = { any = [true, true, 2] }", "field 'demand.any[0]' = True: must be a number"),
    (
        A.replace("[tasks.a]", "[tasks.a]\nreplicas = 2")
        + OK
        + "[tasks.a-1]\ncontext = 'train'\n"
        + OK,
        "task 'a-1': task 'a-1' makes a task named 'a-1', which task 'a' makes too",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_job_file_is_one_line_exit_2_and_the_queue_is_unchanged(
    api, tmp_path, capsys, body, message
):
    path = write_job(tmp_path, body)
    before = [(j.job_id, j.status) for j in api.store.jobs()]
    assert submit(api, path) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoscaler: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert "Traceback" not in err
    assert [(j.job_id, j.status) for j in api.store.jobs()] == before
    assert api.storage.list("contexts/") == []  # nothing was uploaded either


def test_the_checkpoint_schedule_and_fatal_exits_reach_the_launch(api, tmp_path, capsys):
    body = A + OK + "checkpoint_every_s = 120\nfatal_exit_codes = [3, 2, 3]\n"
    assert submit(api, write_job(tmp_path, body), extra=["--json"]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    run = api.store.job(job_id).spec.tasks[0].run
    assert run.checkpoint_every_s == 120 and run.fatal_exit_codes == (2, 3)
    assert submit(api, write_job(tmp_path, A + OK), extra=["--json"]) == 0
    [plain] = json.loads(capsys.readouterr().out)["jobs"]
    run = api.store.job(plain).spec.tasks[0].run
    assert run.checkpoint_every_s is None and run.fatal_exit_codes == ()


def test_eva_config_json_is_accepted(api, tmp_path, capsys):
    (tmp_path / "worker0").mkdir()
    (tmp_path / "worker0" / "Dockerfile").write_text("FROM autoscaler/python:3.11\n")
    config = {
        "name": "two_node_resnet18",
        "tasks": [
            {
                "name": "node0",
                "dir": "worker0/",
                "demand": {"any": [0, 4, 24]},
                "shm_size": 4,
                "full_throughput": 2.5,
            },
            {
                "name": "node0",
                "dir": "worker0/",
                "demand": {"any": [0, 4, 24]},
                "shm_size": 4,
                "full_throughput": 2.5,
            },
        ],
        "total_iters": 5050,
        "init_delay": 80,
        "fetch_delay": 1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert submit(api, path, extra=["--json"]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    spec = api.store.job(job_id).spec
    assert [t.name for t in spec.tasks] == ["node0-0", "node0-1"]
    assert spec.full_throughput == 2.5 and spec.init_delay_s == 80
    assert spec.tasks[0].run.shm_size_gb == 4 and spec.tasks[0].fetch_s == 1


def test_calls_without_the_api_token_are_refused(api):
    ca = api.config.secrets.ca_cert.read_bytes()
    with secure_channel(api.config.api.listen, ca, "wrong", server_name="autoscaler-daemon") as ch:
        call = ch.unary_unary(
            "/autoscaler.api.v1.Submission/ListJobs",
            request_serializer=lambda _: b"",
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(None, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_an_oversized_context_is_refused_before_it_is_read(api, tmp_path):
    big = os.urandom(3 * 2**20)  # the fixture's limit is 2 MiB
    import hashlib

    digest = hashlib.sha256(big).hexdigest()
    with connect(api.config) as client, pytest.raises(ApiRefused, match="over the limit of 2 MiB"):
        client.upload_contexts({digest: big})
    assert api.storage.list("contexts/") == []


def test_a_context_whose_bytes_do_not_match_its_digest_is_refused(api):
    with connect(api.config) as client, pytest.raises(ApiRefused, match="does not match"):
        client.upload_contexts({"0" * 64: b"not what the digest says"})
    assert api.storage.list("contexts/") == []


def test_a_spec_from_a_hand_made_client_is_checked_by_the_daemon_too(api):
    # A task id that is not "<job>/<name>" would let one job's task pass for another's.
    task = {"task_id": "other/a", "job_id": "j", "name": "a", "workload": "x_a"}
    spec = spec_from_document(
        {"job_id": "j", "name": "x", "tasks": [{**task, "demands": [["any", [0, 1, 2]]]}]}
    )
    with connect(api.config) as client, pytest.raises(ApiRefused, match="must be 'j/<key>'"):
        client.submit(spec)
    assert api.store.jobs() == []
    # a priority out of range, which the job file's schema would have refused
    good = {**task, "task_id": "j/a", "demands": [["any", [0, 1, 2]]]}
    spec = spec_from_document({"job_id": "j", "name": "x", "priority": 10**6, "tasks": [good]})
    with connect(api.config) as client, pytest.raises(ApiRefused, match="priority"):
        client.submit(spec)
    assert api.store.jobs() == []


def test_a_job_files_priority_reaches_the_queue(api, tmp_path, capsys):
    path = write_job(tmp_path, "priority = 7\n" + GOOD)
    assert submit(api, path, extra=["--json"]) == 0
    [job_id] = json.loads(capsys.readouterr().out)["jobs"]
    assert api.store.job(job_id).spec.priority == 7


def test_orphan_contexts_are_collected_after_a_day(api, tmp_path):
    data, digest = pack_context(write_job(tmp_path, GOOD).parent / "train")
    with connect(api.config) as client:
        client.upload_contexts({digest: data})  # the submit that should follow never comes
    assert api.service.collect_orphan_contexts() == []  # young: maybe a submit in flight
    api.clock[0] += 25 * 3600
    assert api.service.collect_orphan_contexts() == [f"contexts/{digest}.tar.gz"]
    assert api.storage.list("contexts/") == []


def test_a_finished_jobs_checkpoints_are_deleted_after_their_retention_and_its_logs_kept(
    api, tmp_path, capsys
):
    day = 86400.0
    written = tmp_path / "object"
    written.write_bytes(b"a checkpoint, or a log")
    for job_id in ("done", "going"):
        assert submit(api, write_job(tmp_path, f'id = "{job_id}"\n' + GOOD)) == 0
        for step in (10, 20):
            api.storage.put_file(checkpoint_key(job_id, "node0-0", 1, step), written)
        api.storage.put_file(log_key(job_id, "node0-0", 1), written)
    api.store.job_finished("done", api.clock[0])
    sweep = api.service.collect_finished_checkpoints

    assert sweep(retention_s=7 * day) == []  # finished just now: kept for a week
    api.clock[0] += 7 * day + 1
    assert sweep(retention_s=7 * day) == [
        checkpoint_key("done", "node0-0", 1, 10),
        checkpoint_key("done", "node0-0", 1, 20),
    ]
    assert api.storage.list("jobs/done/") == [log_key("done", "node0-0", 1)]
    assert len(api.storage.list("jobs/going/")) == 3  # still queued: nothing touched


def test_cancel_list_job_and_status_through_the_cli(api, tmp_path, capsys):
    path = write_job(tmp_path, 'id = "j1"\n' + GOOD)
    assert submit(api, path) == 0
    capsys.readouterr()
    config = ["--config", str(api.config.path)]
    assert main(["jobs", *config]) == 0
    assert "j1" in capsys.readouterr().out
    assert main(["job", "j1", "--json", *config]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["status"] == "queued" and len(detail["task_list"]) == 2
    assert main(["cancel", "j1", *config]) == 0
    assert "cancelled j1" in capsys.readouterr().out
    assert api.store.job("j1").status == "cancelled"
    assert main(["cancel", "j1", *config]) == 0
    assert "had already finished (cancelled)" in capsys.readouterr().out
    assert main(["job", "nope", *config]) == 2
    assert "no job 'nope'" in capsys.readouterr().err
    assert main(["status", "--json", *config]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == {"cancelled": 1}


def test_a_bad_job_file_is_reported_without_asking_a_daemon(cluster_dir, tmp_path):
    # No daemon runs: the file's own mistake is what the user needs to hear.
    path = write_job(tmp_path, A + "demand = { any = [0, 0, 0] }")
    config = str(cluster_dir / "autoscaler.toml")
    run = subprocess.run(
        [sys.executable, "-m", "app", "submit", str(path), "--config", config],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "asks for nothing" in run.stderr and "daemon" not in run.stderr


def test_no_daemon_is_a_one_line_error_with_exit_1(cluster_dir):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "jobs",
            "--config",
            str(cluster_dir / "autoscaler.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "cannot reach the daemon" in run.stderr and "Traceback" not in run.stderr


def test_drain_wait_returns_once_the_moved_tasks_run_elsewhere_or_times_out_clearly(
    api, tmp_path, capsys, monkeypatch
):
    config = ["--config", str(api.config.path)]
    assert submit(api, write_job(tmp_path, 'id = "j1"\n' + GOOD)) == 0
    now = api.clock[0]
    for instance in ("i-1", "i-2"):
        request(api.store, instance, "c7i.xlarge", 0.1785, now)
        api.store.transition_instance(instance, "running", now + 10, cloud_id=f"c-{instance}")
    tasks = [t.task_id for t in api.store.tasks_of("j1")]
    api.store.update_tasks(
        [TaskUpdate(t, status="running", instance_id="i-1") for t in tasks], now + 20
    )
    capsys.readouterr()
    # Nothing moves them (no daemon here): --wait says which still wait, and why.
    assert main(["drain", "--job", "j1", "--wait", "--timeout", "0", *config]) == 2
    err = capsys.readouterr().err
    assert "not yet running elsewhere after 0 s" in err and tasks[0] in err

    def a_step_moves_them(seconds: float) -> None:  # what the daemon's steps would do
        moved = [TaskUpdate(t, status="running", instance_id="i-2", drain_from="") for t in tasks]
        api.store.update_tasks(moved, api.clock[0])

    monkeypatch.setattr("app.commands.cluster.time.sleep", a_step_moves_them)
    assert main(["drain", "--job", "j1", "--wait", *config]) == 0
    out = capsys.readouterr().out
    assert all(f"{t} runs on i-2" in out for t in tasks)


def test_drain_marks_a_live_instance_draining_once_and_names_unknown_ones(api, capsys):
    request(api.store, "i-1", "c7i.xlarge", 0.1785, api.clock[0])
    api.store.transition_instance("i-1", "running", api.clock[0] + 10, cloud_id="c-1")
    config = ["--config", str(api.config.path)]
    assert main(["drain", "i-1", *config]) == 0
    assert "draining i-1" in capsys.readouterr().out
    record = api.store.instance("i-1")
    assert record.status == "draining" and "operator" in record.reason
    assert main(["drain", "i-1", *config]) == 0  # again: nothing changes, says so
    assert "i-1 is draining: nothing to drain" in capsys.readouterr().out
    assert main(["drain", "i-9", *config]) == 2
    assert "no instance 'i-9'" in capsys.readouterr().err


def test_drain_by_job_moves_only_its_tasks_named_by_id_or_unique_name(api, tmp_path, capsys):
    config = ["--config", str(api.config.path)]
    assert submit(api, write_job(tmp_path, 'id = "j1"\n' + GOOD)) == 0
    assert submit(api, write_job(tmp_path, 'id = "j2"\n' + GOOD.replace("resnet18", "bert"))) == 0
    now = api.clock[0]
    for instance in ("i-1", "i-2"):
        request(api.store, instance, "c7i.xlarge", 0.1785, now)
        api.store.transition_instance(instance, "running", now + 10, cloud_id=f"c-{instance}")
    [a, b] = [t.task_id for t in api.store.tasks_of("j1")]
    [c, _] = [t.task_id for t in api.store.tasks_of("j2")]
    for task, instance in ((a, "i-1"), (b, "i-2"), (c, "i-1")):  # j2 shares i-1 with j1
        running = TaskUpdate(task, status="running", instance_id=instance)
        api.store.update_tasks([running], now + 20)
    capsys.readouterr()

    assert main(["drain", "--job", "resnet18", *config]) == 0  # by name: j1's two tasks
    out = capsys.readouterr().out
    assert "off i-1" in out and "off i-2" in out
    # The instances stay; only j1's tasks are to move, not j2's task beside them.
    assert [api.store.instance(i).status for i in ("i-1", "i-2")] == ["running", "running"]
    drains = {t.task_id: t.drain_from for j in ("j1", "j2") for t in api.store.tasks_of(j)}
    assert (drains[a], drains[b], drains[c]) == ("i-1", "i-2", None)
    assert main(["drain", "--job", "j2", *config]) == 0  # by id
    assert {t.task_id: t.drain_from for t in api.store.tasks_of("j2")}[c] == "i-1"
    capsys.readouterr()
    assert main(["drain", "--job", "gpt", *config]) == 2
    assert "no job 'gpt'" in capsys.readouterr().err
    assert main(["job", "bert", "--json", *config]) == 0  # `job` takes a name too
    assert json.loads(capsys.readouterr().out)["job"] == "j2"
    assert submit(api, write_job(tmp_path, 'id = "j3"\n' + GOOD)) == 0  # a 2nd "resnet18"
    capsys.readouterr()
    assert main(["job", "resnet18", *config]) == 2
    assert "2 jobs have this name (j1, j3): give an id" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # an instance or a job is required
        main(["drain", *config])
    assert usage.value.code == 2


def test_jobs_wait_and_drain_wait_follow_the_cluster_until_it_is_ready(
    api, tmp_path, capsys, monkeypatch
):
    """`jobs --wait` returns once every job finished (1 if one failed); `drain --job --wait`
    moves them once they run, and returns once they run elsewhere. Each poll's sleep moves
    the world one step on."""
    import app.commands.cluster as cli_module

    config = ["--config", str(api.config.path)]
    assert submit(api, write_job(tmp_path, 'id = "j1"\n' + GOOD)) == 0
    assert submit(api, write_job(tmp_path, 'id = "j2"\n' + GOOD.replace("resnet18", "bert"))) == 0
    now = api.clock[0]
    request(api.store, "i-1", "c7i.xlarge", 0.1785, now)
    api.store.transition_instance("i-1", "running", now + 10, cloud_id="c-1")
    world = [
        lambda: api.store.update_tasks(
            [
                TaskUpdate(t.task_id, status="running", instance_id="i-1")
                for t in api.store.tasks_of("j1")[:1]
            ],
            now + 20,
        ),
        lambda: api.store.update_tasks(
            [
                TaskUpdate(t.task_id, status="running", instance_id="i-1")
                for t in api.store.tasks_of("j1")[1:]
            ],
            now + 30,
        ),
        lambda: api.store.update_tasks(  # the next round and steps move them
            [
                TaskUpdate(t.task_id, status="running", instance_id="i-2", drain_from="")
                for t in api.store.tasks_of("j1")
            ],
            now + 60,
        ),
    ]
    sleeps = []

    def step(seconds):
        sleeps.append(seconds)
        world.pop(0)()

    monkeypatch.setattr(cli_module.time, "sleep", step)
    capsys.readouterr()
    assert main(["drain", "--job", "j1", "--wait", *config]) == 0
    # Moved only once both tasks ran, not after the first; returned once they ran again.
    assert len(sleeps) == 3
    out = capsys.readouterr().out
    assert "waiting for j1 to run" in out and "runs on i-2" in out
    assert api.store.instance("i-1").status == "running"  # only the job's tasks moved

    world += [
        lambda: api.store.job_finished("j1", now + 40),
        lambda: api.store.job_finished("j2", now + 50, "failed", "exit code 3"),
    ]
    assert main(["jobs", "--wait", *config]) == 1  # j2 failed
    assert len(sleeps) == 5 and not world
    out = capsys.readouterr().out
    assert "j1: completed" in out and "j2: failed" in out
    assert main(["jobs", "--wait", *config]) == 0  # nothing unfinished: nothing waited for
    assert len(sleeps) == 5
