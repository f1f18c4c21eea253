"""What `autoscaler down` means for unfinished work: jobs stay queued, each task resumes
from its newest checkpoint — including one an agent kept on local disk, which `down`
uploads — and the next daemon says so (its `resuming` event names them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.cli import main
from app.config import load_cluster_config
from app.daemon import resuming_event
from app.down import graceful_down, upload_kept
from app.wiring import build_cloud, open_state
from autoscaler.store import TaskUpdate
from executor.attempts import KEPT_FILE, attempt_directory, save_launch
from executor.storage import checkpoint_key, checkpoint_step, open_storage
from tests.builders import job
from tests.executor.conftest import launch
from tests.store_writes import adopted_round

CONTEXT = "contexts/" + "0" * 64 + ".tar.gz"


@pytest.fixture
def cluster(cluster_dir):
    """The local cluster of `cluster_dir`, its state holding job `a` (task a/0 running on
    test-1 at attempt 2, with a checkpoint of step 400 uploaded while it ran; a/1 pending),
    a completed job `b` and a cancelled job `c`."""
    config = load_cluster_config(cluster_dir / "autoscaler.toml")
    storage = open_storage(config.storage.url)
    store = open_state(config, create=True)
    now = time.time()
    for name in ("a", "b", "c"):
        store.submit_job(job(name, (0, 1, 1), (0, 1, 1)), owner="ana", at=now)
    adopted_round(store, now, requests=[("test-1", "c7i.large", 0.1)], targets={"a/0": "test-1"})
    store.transition_instance("test-1", "running", now, cloud_id="local-gone")
    ran = storage.ref(checkpoint_key("a", "a/0", 2, 400))
    store.update_tasks(
        [TaskUpdate("a/0", status="running", instance_id="test-1", attempt=2, checkpoint=ran)],
        now,
    )
    store.job_finished("b", now)
    store.cancel_job("c", now)
    yield config, store, storage
    store.close()


def _keep(config, task_id: str, attempt: int, step: int | None, body: str = "{}") -> Path:
    """A checkpoint an agent of test-1 left on disk (as `executor.attempts` keeps one)."""
    work = config.path.parent / "local-cloud" / "instances" / "test-1" / "work"
    directory = attempt_directory(work, task_id, attempt)
    (directory / "checkpoint").mkdir(parents=True)
    (directory / "checkpoint" / "state.json").write_text(body)
    save_launch(directory, launch(task_id, attempt, "test-1", CONTEXT))
    if step is not None:
        (directory / KEPT_FILE).write_text(json.dumps({"step": step}))
    return directory


def test_a_kept_checkpoint_is_recorded_only_for_its_tasks_current_attempt_and_when_newer(
    cluster,
):
    config, store, storage = cluster
    newer = _keep(config, "a/0", 2, 650, '{"step": 650}')
    stale = _keep(config, "a/0", 1, 900)  # an attempt the task has moved on from
    finished = _keep(config, "b/0", 1, 30)  # a task of a completed job
    unknown = _keep(config, "a/1", 1, None)  # no step: not a kept checkpoint
    cloud = build_cloud(config)
    found = sorted(k.directory for k in cloud.kept_checkpoints())
    assert found == sorted([newer, stale, finished])

    recorded, failed = upload_kept(cloud.kept_checkpoints(), store, storage, time.time)
    assert list(recorded) == ["a/0"] and failed == []
    task = store.snapshot(with_throughput=False).tasks["a/0"]
    assert task.checkpoint == recorded["a/0"] and checkpoint_step(task.checkpoint) == 650
    assert storage.exists(checkpoint_key("a", "a/0", 2, 650))
    assert not storage.exists(checkpoint_key("a", "a/0", 1, 900))
    assert not newer.exists() and not stale.exists() and not finished.exists()
    assert unknown.exists()

    older = _keep(config, "a/0", 2, 500)  # older than what the task has now: not recorded
    recorded, _ = upload_kept(cloud.kept_checkpoints(), store, storage, time.time)
    assert recorded == {} and not older.exists()
    assert checkpoint_step(store.snapshot(with_throughput=False).tasks["a/0"].checkpoint) == 650


def test_down_leaves_jobs_queued_and_the_next_daemon_names_them_with_their_steps(cluster, capsys):
    config, store, _ = cluster
    before = resuming_event(store)
    assert before is not None and before["jobs"] == ["a"]
    _keep(config, "a/0", 2, 720)

    assert main(["down", "--yes", "--config", str(config.path)]) == 0
    out = capsys.readouterr().out
    # The table: the task, where it ran, the step it resumes from, and how it was saved.
    assert "resumes from step" in out
    [row] = [line for line in out.splitlines() if "a/0" in line]
    assert row.split()[:5] == ["a", "a/0", "test-1", "2", "720"] and "by down" in row
    assert "1 job(s) stay queued and resume at the next `autoscaler daemon`: a" in out

    snapshot = store.snapshot(with_throughput=False)
    assert [j.job_id for j in snapshot.jobs] == ["a"]
    assert [j.status for j in snapshot.jobs] == ["queued"]  # queued, not cancelled or failed
    assert {t.task_id: t.status for t in snapshot.tasks.values()} == {
        "a/0": "pending",
        "a/1": "pending",
    }
    event = resuming_event(store)
    assert event is not None
    assert event["jobs"] == ["a"]  # b finished and c was cancelled: neither comes back
    assert event["from_step"] == {"a/0": 720, "a/1": None}


def test_a_starting_daemon_with_nothing_unfinished_resumes_nothing(cluster):
    _, store, _ = cluster
    store.cancel_job("a", time.time())
    assert resuming_event(store) is None


def test_down_now_skips_the_grace_and_lists_first_without_yes(cluster, capsys):
    config, store, storage = cluster
    assert main(["down", "--json", "--config", str(config.path)]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["terminated"] == [] and listing["leftovers"]["containers"] == []
    report = graceful_down(store, build_cloud(config), storage, time.time, grace_s=0.0)
    assert report.grace_s == 0.0
    [task] = report.tasks
    # Nothing kept on disk: it resumes from what was uploaded while it ran.
    assert (task.task_id, task.checkpoint_step, task.saved) == ("a/0", 400, "while running")
