"""Faults injected under a running job, and what the cluster did about each.

On the local cloud (the daemon a process, its instances worker agents, its
tasks real containers on Docker), one small checkpointing job per fault: the
training example (`examples/train`) for `TOTAL` iterations of `STEP_S`
seconds, checkpointing every `CHECKPOINT_EVERY_S` seconds (the reporter's
schedule, each checkpoint uploaded while the job runs). Once it has
checkpointed and run on half an interval, the fault is injected:

- `kill-daemon`: the daemon killed with SIGKILL and started again at once (as a
  supervisor would);
- `kill-agent`: the task's worker agent killed with SIGKILL (its container lives on);
- `kill-container`: `docker kill` of the task's container;
- `terminate-instance`: the task's instance terminated through the cloud's own API,
  not by the daemon (someone else's `terminate`);
- `pause-agent`: the agent stopped with SIGSTOP past the heartbeat timeout, then SIGCONT;
- `storage-outage`: the checkpoint store refuses writes for `OUTAGE_S` seconds (the
  task's directory in the cluster's `file://` store made immutable, `chattr +i`: every
  upload fails with EPERM, as a store that is down fails them);
- `restart-postgres`: the PostgreSQL server under the daemon stopped and started again
  (a throwaway server, `initdb` + `pg_ctl` in a temporary directory);
- `kill-leader`: the leading daemon killed with SIGKILL while a standby waits for the
  leader lock.

Measured with the clock (time of the fault from this process, times of what the daemon
recorded from its JSON log, container states sampled from Docker every 0.2 s):

- iterations lost: the task's progress when the fault hit (as last reported, at most a
  poll old) minus the step the next attempt resumed at (from its log); beside it the
  newest checkpoint the daemon knew at the fault (resumed ≥ it must hold) and the
  iterations of one checkpoint interval (the goal);
- detect: fault → the daemon records it (the attempt ended, the standby or restarted
  daemon leads, the first failed round or step); goal ≤ two heartbeats;
- recover: detection → the task running again (a new attempt's container seen running,
  or the daemon's record of the task updated again); goal ≤ one round;
- duplicates: the most containers of the task seen running at once, minus one (goal 0);
- leaks after `autoscaler down --yes` (the daemon stopped first): agent processes,
  containers of the cluster's instances, instances the local cloud still runs (goal 0).

`--cloud ec2` runs the same faults on EC2 and S3 served by `moto_server`, each running
instance booted as a worker agent by the end-to-end tests' `BootedInstances`; the storage
outage is skipped there (S3 on moto has no fault to toggle).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from app.table import format_table
from executor.runtime import LABEL_ATTEMPT, LABEL_INSTANCE, LABEL_JOB, LABEL_TASK
from tests.e2e.harness import (
    Daemon,
    cli,
    cli_json,
    containers_labelled,
    copy_example,
    free_port,
    local_cluster,
    processes_mentioning,
    state_of,
)

TOTAL = 1200  # iterations of the training example
STEP_S = 0.05  # seconds per iteration: 20 per second, a minute alone
CHECKPOINT_EVERY_S = 5.0
INTERVAL_S = 6.0  # the daemon's round
STEP_INTERVAL_S = 1.0  # the daemon's step
HEARTBEAT_S = 10.0  # `[timeouts] heartbeat_s` (the default)
HEARTBEAT_INTERVAL_S = 5.0  # `[timeouts] heartbeat_interval_s` (the default)
OUTAGE_S = 20.0  # the storage outage: four checkpoint intervals
PG_DOWN_S = 10.0  # how long PostgreSQL stays stopped
TAKEOVER_GOAL_S = 30.0
#: The deadline of anything waited for (builds, starts, the job's end) on a busy machine.
PATIENCE_S = 300.0
SAMPLE_S = 0.2


def _say(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """What one fault cost, measured; None where it does not apply or was not seen."""

    fault: str
    cloud: str = "local"
    checkpoint_step: int | None = None  # newest checkpoint the daemon knew at the fault
    progress_at_fault: float | None = None
    resumed_step: int | None = None  # None: the attempt ran on (nothing restarted)
    lost: float | None = None
    interval_iterations: float = CHECKPOINT_EVERY_S / STEP_S
    detect_s: float | None = None
    recover_s: float | None = None
    duplicates: int = 0
    overlap_s: float = 0.0  # seconds two or more copies of the task were seen running
    attempts: int = 0
    job_status: str = ""
    leaks: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def goals(self) -> dict[str, bool | None]:
        """Each goal met (True), missed (False) or not applicable (None)."""
        detect_goal = TAKEOVER_GOAL_S if self.fault == "kill-leader" else 2 * HEARTBEAT_INTERVAL_S
        return {
            "lost ≤ interval": None if self.lost is None else self.lost <= self.interval_iterations,
            "resumed ≥ checkpoint": (
                None
                if self.resumed_step is None or self.checkpoint_step is None
                else self.resumed_step >= self.checkpoint_step
            ),
            "detect": None if self.detect_s is None else self.detect_s <= detect_goal,
            "recover ≤ round": None if self.recover_s is None else self.recover_s <= INTERVAL_S,
            "no duplicates": self.duplicates == 0,
            "no leaks": not any(self.leaks.values()),
            "completed": self.job_status == "completed",
        }


# -- one run -------------------------------------------------------------------------------


class Sampler:
    """Docker's view of the job, every `SAMPLE_S`: which attempts run, since when, together."""

    def __init__(self, docker: Any, job: str) -> None:
        self.docker = docker
        self.job = job
        self.first_running: dict[tuple[str, int], float] = {}
        self.max_copies = 0
        self.overlap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.time()
            with contextlib.suppress(Exception):  # the engine busy: the next sample
                self.sample(started)
            self._stop.wait(max(0.0, SAMPLE_S - (time.time() - started)))

    def sample(self, now: float) -> None:
        running = self.docker.containers.list(
            filters={"label": f"{LABEL_JOB}={self.job}", "status": "running"}
        )
        copies: dict[str, int] = {}
        for container in running:
            key = (container.labels[LABEL_TASK], int(container.labels[LABEL_ATTEMPT]))
            self.first_running.setdefault(key, now)
            copies[key[0]] = copies.get(key[0], 0) + 1
        most = max(copies.values(), default=0)
        self.max_copies = max(self.max_copies, most)
        if most > 1:
            self.overlap_s += SAMPLE_S

    def running_since(self, task: str, after_attempt: int) -> float | None:
        seen = [t for (k, a), t in self.first_running.items() if k == task and a > after_attempt]
        return min(seen, default=None)


class Run:
    """One cluster, one job, one fault: set up, watched, torn down."""

    def __init__(
        self,
        fault: str,
        directory: Path,
        docker: Any,
        side: CloudSide,
        state_url: str | None = None,
        total: int = TOTAL,
    ) -> None:
        self.fault = fault
        self.total = total
        self.directory = directory
        self.docker = docker
        self.side = side
        options = {
            "interval_s": f"{INTERVAL_S:g}",
            "step_s": f"{STEP_INTERVAL_S:g}",
            "heartbeat_s": f"{HEARTBEAT_S:g}",
            "heartbeat_interval_s": f"{HEARTBEAT_INTERVAL_S:g}",
        }
        path = side.cluster(directory / "cluster", options)
        if state_url is not None:
            _use_state(path, state_url)
        self.config = _reload(path)
        self.name = self.config.cluster.name
        self.at = ("--config", str(self.config.path))
        self.daemons: list[Daemon] = []
        self.outcome = Outcome(fault)
        self.job = ""
        self.task = ""
        self.sampler: Sampler | None = None

    # the daemon and the job

    def start_daemon(self, name: str = "daemon") -> Daemon:
        daemon = Daemon(self.config.path, env=self.side.env, name=name)
        self.daemons.append(daemon)
        return daemon

    def events(self, event: str) -> list[dict[str, Any]]:
        return [e for d in self.daemons for e in d.events(event)]

    def submit(self) -> None:
        job_file = copy_example(
            "train", self.directory / "jobs", {"TOTAL": str(self.total), "STEP_S": f"{STEP_S:g}"}
        )
        text = job_file.read_text().replace(
            "[tasks.trainer]\n", f"[tasks.trainer]\ncheckpoint_every_s = {CHECKPOINT_EVERY_S:g}\n"
        )
        job_file.write_text(text)
        [self.job] = cli_json("submit", str(job_file), *self.at)["jobs"]
        self.sampler = Sampler(self.docker, self.job).start()
        with state_of(self.config) as store:
            [task] = store.tasks_of(self.job)
        self.task = task.task_id

    def record(self) -> Any:
        with state_of(self.config) as store:
            [task] = store.tasks_of(self.job)
        return task

    def wait(self, what: str, check: Callable[[], Any], timeout: float = PATIENCE_S) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):  # the state briefly unreachable: poll again
                value = check()
                if value:
                    return value
            if time.monotonic() > deadline:
                tails = "\n".join(d.tail(15) for d in self.daemons)
                raise TimeoutError(f"{self.fault}: timed out waiting for {what}\n{tails}")
            time.sleep(0.2)

    def checkpointed_midway(self) -> Any:
        """The task once it has a checkpoint past the first interval and ran on half an
        interval since (the fault then costs about half an interval if all goes well)."""
        task = self.record()
        step = _step_of(task.checkpoint)
        half = self.outcome.interval_iterations / 2
        if task.status != "running" or step is None or step < 2 * half:
            return None
        return task if task.progress >= step + half else None

    def container_of(self, attempt: int) -> Any | None:
        found = self.docker.containers.list(
            all=True, filters={"label": [f"{LABEL_TASK}={self.task}", f"{LABEL_ATTEMPT}={attempt}"]}
        )
        return found[0] if found else None

    def resumed_at(self, attempt: int) -> int:
        """The step attempt `attempt` started from, from what it printed (docker's log, else
        the attempt's log in the store)."""
        from executor.storage import log_key

        stored = self.storage_root() / log_key(self.job, self.task, attempt)

        def printed() -> tuple[int] | None:
            texts = []
            container = self.container_of(attempt)
            if container is not None:
                with contextlib.suppress(Exception):  # removed meanwhile: the stored log
                    texts.append(container.logs().decode(errors="replace"))
            if stored.exists():
                texts.append(stored.read_text(errors="replace"))
            for text in texts:
                match = re.search(r"resumed at step (\d+)|starting from step 0", text)
                if match:
                    return (int(match.group(1) or 0),)
            return None

        [step] = self.wait(f"attempt {attempt}'s first line", printed, timeout=60)
        return step

    def storage_root(self) -> Path:
        return Path(self.config.storage.url.removeprefix("file://"))

    def finish(self) -> None:
        """Wait for the job's end, stop the daemons, `down --yes`, count what is left."""
        outcome = self.outcome

        def ended() -> str | None:
            status = self.record().status
            return status if status in ("completed", "failed", "cancelled") else None

        try:
            outcome.job_status = self.wait("the job to end", ended)
        except TimeoutError as exc:
            outcome.job_status = "unfinished"
            outcome.notes.append(str(exc).splitlines()[0])
        with contextlib.suppress(Exception):
            outcome.attempts = self.record().attempt
        self.teardown()

    def teardown(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.outcome.duplicates = max(0, self.sampler.max_copies - 1)
            self.outcome.overlap_s = round(self.sampler.overlap_s, 1)
            self.sampler = None
        for daemon in self.daemons:
            with contextlib.suppress(Exception):
                daemon.stop(timeout=60)
            daemon.kill()
        code, out = cli("down", "--yes", *self.at)
        if code != 0:
            self.outcome.notes.append(f"down exited {code}: {out.strip()[-200:]}")
        self.side.settle()
        tokens = self.side.tokens()
        left = containers_labelled(self.docker, LABEL_INSTANCE, tokens) if tokens else []
        running = [
            c.name
            for c in self.docker.containers.list(filters={"label": LABEL_INSTANCE})
            if c.labels.get(LABEL_INSTANCE) in tokens
        ]
        self.outcome.leaks = {
            "containers": len(left),  # in any state: `down` should remove them all
            "running": len(running),  # of those, still running
            "agents": len(processes_mentioning(f"--instance-id {self.name}-")),
            "instances": self.side.instances_left(),
        }
        if left:
            self.outcome.notes.append(f"left after down: {', '.join(left)}")


# -- the clouds -----------------------------------------------------------------------------


class CloudSide:
    """Where a run's instances live: how to make the cluster, find an instance's agent,
    terminate an instance behind the daemon's back, and count what is left."""

    name = ""
    env: dict[str, str] = {}  # noqa: RUF012 (the daemon's extra environment; read only)
    #: Faults that do not apply here, and why.
    skips: dict[str, str] = {}  # noqa: RUF012

    def cluster(self, directory: Path, options: dict[str, str]) -> Path:
        raise NotImplementedError

    def agent_pid(self, instance_id: str) -> int:
        raise NotImplementedError

    def terminate(self, instance_id: str) -> None:
        raise NotImplementedError

    def tokens(self) -> list[str]:
        """Every instance id (launch token) of the cluster, terminated ones included."""
        raise NotImplementedError

    def instances_left(self) -> int:
        raise NotImplementedError

    def settle(self) -> None:
        """Let the cloud finish what `down` asked before what is left is counted."""

    def close(self) -> None:
        """Stop whatever the run left (after it was counted)."""


class LocalSide(CloudSide):
    """The local cloud: instances are agent processes, registered under the cluster's
    `local-cloud/instances/` directory."""

    name = "local"

    def cluster(self, directory: Path, options: dict[str, str]) -> Path:
        self.config = local_cluster(directory, f"flt-{uuid.uuid4().hex[:6]}", **options)
        self.registry = directory / "local-cloud" / "instances"
        return self.config.path

    def _records(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in self.registry.glob("*/instance.json")]

    def _record(self, instance_id: str) -> dict[str, Any]:
        return json.loads((self.registry / instance_id / "instance.json").read_text())

    def agent_pid(self, instance_id: str) -> int:
        return int(self._record(instance_id)["pid"])

    def terminate(self, instance_id: str) -> None:
        """Through the local cloud's own API (as another user of the account would)."""
        from app.wiring import local_cloud

        local_cloud(self.config).terminate([self._record(instance_id)["cloud_id"]])

    def tokens(self) -> list[str]:
        return [r["token"] for r in self._records()]

    def instances_left(self) -> int:
        return sum(r["state"] != "terminated" for r in self._records())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            from app.wiring import local_cloud

            local_cloud(self.config).terminate_all()


class Ec2Side(CloudSide):
    """EC2 and S3 on `moto_server`, each running instance booted as a worker agent by the
    end-to-end tests' `BootedInstances` (from its own user data; killed, containers and
    all, when EC2 says it is shutting down)."""

    name = "ec2"
    skips = {  # noqa: RUF012
        "storage-outage": "the store is S3 on moto_server: no fault of its own to toggle yet",
    }

    def __init__(self, endpoint: str, docker: Any, directory: Path) -> None:
        from tests.e2e.ec2 import aws_env

        self.endpoint = endpoint
        self.docker = docker
        self.env = aws_env(endpoint, directory)
        self.booted: Any = None

    def cluster(self, directory: Path, options: dict[str, str]) -> Path:
        from app.wiring import offline_catalog
        from tests.e2e.ec2 import BootedInstances, ec2_cluster
        from tests.e2e.harness import set_options

        config = ec2_cluster(directory, self.endpoint)
        set_options(config.path, options)
        config = _reload(config.path)
        capacity = {t.name: ",".join(f"{v:g}" for v in t.capacity) for t in offline_catalog(config)}
        self.booted = BootedInstances(
            self.endpoint,
            config.cluster.name,
            capacity,
            directory.parent / "instances",
            self.docker,
            directory,
        ).start()
        return config.path

    def _ec2_id(self, instance_id: str) -> str:
        [ec2_id] = [e for e, token in self.booted.tokens.items() if token == instance_id]
        return ec2_id

    def agent_pid(self, instance_id: str) -> int:
        return int(self.booted.workers[self._ec2_id(instance_id)].pid)

    def terminate(self, instance_id: str) -> None:
        self.booted.ec2.terminate_instances(InstanceIds=[self._ec2_id(instance_id)])

    def tokens(self) -> list[str]:
        return list(self.booted.instance_ids())

    def instances_left(self) -> int:
        gone = ("shutting-down", "terminated")
        return sum(i["State"]["Name"] not in gone for i in self.booted.listing())

    def settle(self) -> None:
        """The machines' stand-in halts a terminated instance's worker at its next poll."""
        time.sleep(2.0)

    def close(self) -> None:
        if self.booted is not None:
            self.booted.close()


# -- the faults ----------------------------------------------------------------------------


def _ended_event(run: Run, attempt: int) -> float | None:
    """When the daemon recorded the attempt's end: its `attempt_ended` (a failure of any
    class), or the start of a later attempt (an end it did not log as one: a stop its
    worker made on its own, such as an agent checkpointing its tasks on SIGTERM)."""
    for event in run.events("attempt_ended"):
        if event.get("task") == run.task and int(event.get("attempt", 0)) == attempt:
            return _time(event)
    for event in run.events("decision"):
        later = re.match(r"attempt (\d+) on ", str(event.get("reason", "")))
        if (
            event.get("kind") == "start"
            and event.get("target") == run.task
            and later is not None
            and int(later.group(1)) > attempt
        ):
            return _time(event)
    return None


def _leading_after(run: Run, daemon: Daemon, after: float) -> float | None:
    for event in daemon.events("leading"):
        if _time(event) >= after:
            return _time(event)
    return None


def _updated_after(run: Run, after: float) -> float | None:
    task = run.record()
    if task.status == "running" and task.updated_at is not None and task.updated_at > after:
        return float(task.updated_at)
    return None


def _attempt_fault(run: Run, inject: Callable[[Any], None], hold: Callable[[Any], None]) -> None:
    """Faults that end the attempt: detection is the daemon's `attempt_ended` for it,
    recovery a later attempt's container running."""
    task = run.wait("a checkpoint and half an interval more", run.checkpointed_midway)
    outcome = run.outcome
    outcome.checkpoint_step = _step_of(task.checkpoint)
    outcome.progress_at_fault = task.progress
    fault_at = time.time()
    _say(
        f"{run.fault}: injecting at step ~{task.progress:.0f} "
        f"(checkpoint {outcome.checkpoint_step}, attempt {task.attempt})"
    )
    inject(task)
    detected = run.wait("the daemon to end the attempt", lambda: _ended_event(run, task.attempt))
    outcome.detect_s = round(detected - fault_at, 2)
    _say(f"{run.fault}: detected after {outcome.detect_s} s")
    hold(task)
    assert run.sampler is not None
    sampler = run.sampler
    running = run.wait(
        "a new attempt to run", lambda: sampler.running_since(run.task, task.attempt)
    )
    outcome.recover_s = round(running - detected, 2)
    resumed = run.resumed_at(task.attempt + 1)
    outcome.resumed_step = resumed
    outcome.lost = round(task.progress - resumed, 1)
    _say(f"{run.fault}: running again after {outcome.recover_s} s, resumed at step {resumed}")


def kill_agent(run: Run) -> None:
    def inject(task: Any) -> None:
        os.kill(run.side.agent_pid(task.instance_id), signal.SIGKILL)

    _attempt_fault(run, inject, lambda task: None)


def kill_container(run: Run) -> None:
    def inject(task: Any) -> None:
        container = run.container_of(task.attempt)
        if container is None:
            raise RuntimeError("no container of the running attempt")
        container.kill()

    _attempt_fault(run, inject, lambda task: None)


def terminate_instance(run: Run) -> None:
    _attempt_fault(run, lambda task: run.side.terminate(task.instance_id), lambda task: None)


def pause_agent(run: Run) -> None:
    paused: list[int] = []

    def inject(task: Any) -> None:
        pid = run.side.agent_pid(task.instance_id)
        os.kill(pid, signal.SIGSTOP)
        paused.append(pid)

    def resume(task: Any) -> None:
        time.sleep(2.0)  # past the timeout, not only up to it
        with contextlib.suppress(ProcessLookupError):
            os.kill(paused[0], signal.SIGCONT)
        _say(f"{run.fault}: agent resumed (SIGCONT)")

    try:
        _attempt_fault(run, inject, resume)
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def kill_daemon(run: Run) -> None:
    task = run.wait("a checkpoint and half an interval more", run.checkpointed_midway)
    outcome = run.outcome
    outcome.checkpoint_step = _step_of(task.checkpoint)
    outcome.progress_at_fault = task.progress
    fault_at = time.time()
    _say(f"{run.fault}: SIGKILL to the daemon at step ~{task.progress:.0f}; started again")
    run.daemons[-1].kill()
    restarted = run.start_daemon("daemon-restarted")
    leading = run.wait("the restarted daemon to lead", lambda: _leading_after(run, restarted, 0))
    outcome.detect_s = round(leading - fault_at, 2)
    updated = run.wait("the task updated again", lambda: _updated_after(run, leading))
    outcome.recover_s = round(updated - leading, 2)
    _ran_on_or_resumed(run, task)


def kill_leader(run: Run) -> None:
    standby = run.start_daemon("standby")
    run.wait("the standby to wait for the lock", lambda: standby.events("waiting"))
    task = run.wait("a checkpoint and half an interval more", run.checkpointed_midway)
    outcome = run.outcome
    outcome.checkpoint_step = _step_of(task.checkpoint)
    outcome.progress_at_fault = task.progress
    fault_at = time.time()
    _say(f"{run.fault}: SIGKILL to the leader at step ~{task.progress:.0f}; a standby waits")
    run.daemons[0].kill()
    leading = run.wait("the standby to lead", lambda: _leading_after(run, standby, fault_at))
    outcome.detect_s = round(leading - fault_at, 2)
    updated = run.wait("the task updated again", lambda: _updated_after(run, leading))
    outcome.recover_s = round(updated - leading, 2)
    _say(f"{run.fault}: the standby leads after {outcome.detect_s} s")
    _ran_on_or_resumed(run, task)


def storage_outage(run: Run) -> None:
    task = run.wait("a checkpoint and half an interval more", run.checkpointed_midway)
    outcome = run.outcome
    outcome.checkpoint_step = _step_of(task.checkpoint)
    outcome.progress_at_fault = task.progress
    root = run.storage_root()
    frozen = [root / "jobs" / run.job / run.task.removeprefix(f"{run.job}/")]
    frozen.append(frozen[0] / str(task.attempt))
    _say(f"{run.fault}: the store refuses writes for {OUTAGE_S:g} s (chattr +i)")
    fault_at = time.time()
    try:
        for path in frozen:
            subprocess.run(["chattr", "+i", str(path)], check=True)
        time.sleep(OUTAGE_S)
    finally:
        for path in reversed(frozen):
            subprocess.run(["chattr", "-i", str(path)], check=False)
    back_at = time.time()
    during = run.record()
    outcome.notes.append(
        f"after {OUTAGE_S:g} s down: newest checkpoint step {_step_of(during.checkpoint)} "
        f"at progress {during.progress:.0f} (a crash then would lose the difference)"
    )

    def newer() -> float | None:
        now = run.record()
        step = _step_of(now.checkpoint)
        if now.attempt != task.attempt:
            return time.time()
        known = _step_of(during.checkpoint) or 0
        return time.time() if step is not None and step > known else None

    uploaded = run.wait("a checkpoint uploaded after the outage", newer)
    outcome.recover_s = round(uploaded - back_at, 2)
    warned = _agent_warnings(run, "upload", fault_at)
    if warned:
        outcome.detect_s = round(min(warned) - fault_at, 2)
    outcome.notes.append(
        "detect: the worker's first failed upload in its log (the daemon records none); "
        "recover: from the store back to the next checkpoint uploaded"
    )
    _ran_on_or_resumed(run, task)


def restart_postgres(run: Run) -> None:
    server = run.postgres  # type: ignore[attr-defined]
    task = run.wait("a checkpoint and half an interval more", run.checkpointed_midway)
    outcome = run.outcome
    outcome.checkpoint_step = _step_of(task.checkpoint)
    outcome.progress_at_fault = task.progress
    _say(f"{run.fault}: PostgreSQL stopped for {PG_DOWN_S:g} s")
    fault_at = time.time()
    server.stop()
    time.sleep(PG_DOWN_S)
    server.start()
    back_at = time.time()
    failed = [
        _time(e)
        for d in run.daemons
        for e in d.events()
        if e.get("level") == "error" and _time(e) >= fault_at
    ]
    if failed:
        outcome.detect_s = round(min(failed) - fault_at, 2)
    updated = run.wait("the task updated again", lambda: _updated_after(run, back_at))
    outcome.recover_s = round(updated - back_at, 2)
    outcome.notes.append("recover: from PostgreSQL back, not from detection")
    alive = [d for d in run.daemons if d.process.poll() is None]
    if not alive:
        outcome.notes.append("the daemon exited")
    _ran_on_or_resumed(run, task)


def _agent_warnings(run: Run, needle: str, after: float) -> list[float]:
    """Times of the local agents' WARNING lines mentioning `needle`, from `after` on
    (the agent logs `%(asctime)s`: local time, to the millisecond)."""
    found = []
    registry = run.directory / "cluster" / "local-cloud" / "instances"
    for path in registry.glob("*/agent.log"):
        for line in path.read_text(errors="replace").splitlines():
            stamp, _, rest = line.partition(" WARNING ")
            if not rest or needle not in rest:
                continue
            with contextlib.suppress(ValueError):
                at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if at >= after:
                    found.append(at)
    return found


def _ran_on_or_resumed(run: Run, before: Any) -> None:
    """Lost iterations when the attempt should run on: 0 if it did, else from the step the
    next attempt resumed at."""
    outcome = run.outcome
    now = run.record()
    if now.attempt == before.attempt:
        outcome.lost = 0.0
        return
    resumed = run.resumed_at(before.attempt + 1)
    outcome.resumed_step = resumed
    outcome.lost = round(before.progress - resumed, 1)


FAULTS: dict[str, tuple[str, Callable[[Run], None]]] = {
    "kill-daemon": ("kill -9 the daemon (restarted at once)", kill_daemon),
    "kill-agent": ("kill -9 the task's worker agent", kill_agent),
    "kill-container": ("docker kill the task's container", kill_container),
    "terminate-instance": ("the task's instance terminated behind the daemon", terminate_instance),
    "pause-agent": ("SIGSTOP the agent past the heartbeat timeout, then SIGCONT", pause_agent),
    "storage-outage": (f"the checkpoint store refuses writes for {OUTAGE_S:g} s", storage_outage),
    "restart-postgres": (f"PostgreSQL stopped {PG_DOWN_S:g} s under the daemon", restart_postgres),
    "kill-leader": ("kill -9 the leader daemon, a standby waiting", kill_leader),
}


# -- a throwaway PostgreSQL ----------------------------------------------------------------


class Postgres:
    """A PostgreSQL server of its own in `directory` (initdb, pg_ctl): restarting it
    disturbs nothing else."""

    def __init__(self) -> None:
        # Not under the run's directory: the server's user must reach it.
        self.directory = directory = Path(tempfile.mkdtemp(prefix="autoscaler-faults-pg-"))
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres")
        self._as_postgres(
            f"initdb -D {directory}/data -A trust -U postgres --no-sync >{directory}/initdb.log"
        )
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, command: str) -> None:
        user = [] if os.geteuid() != 0 else ["su", "postgres", "-c"]
        run = [*user, command] if user else ["sh", "-c", command]
        subprocess.run(
            run, check=True, timeout=120, cwd=self.directory, stdout=subprocess.DEVNULL
        )  # pg_ctl's progress is not the benchmark's output

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off"
        self._as_postgres(
            f"pg_ctl -D {self.directory}/data -l {self.directory}/log -w -o '{options}' start"
        )

    def stop(self) -> None:
        self._as_postgres(f"pg_ctl -D {self.directory}/data -m fast -w stop")

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


# -- running them --------------------------------------------------------------------------


def run_fault(
    fault: str,
    directory: Path,
    docker: Any,
    side: CloudSide | None = None,
    total: int = TOTAL,
) -> Outcome:
    """One fault on a cluster of its own in `directory` (on the local cloud unless `side`
    says otherwise; a job of `total` iterations): the measured outcome."""
    side = side or LocalSide()
    _, inject = FAULTS[fault]
    if fault in side.skips:
        return Outcome(fault, side.name, job_status="skipped", notes=[side.skips[fault]])
    postgres = Postgres() if fault == "restart-postgres" else None
    try:
        run = Run(fault, directory, docker, side, postgres.url if postgres else None, total)
    except BaseException:
        side.close()
        if postgres is not None:
            postgres.remove()
        raise
    run.outcome.cloud = side.name
    run.postgres = postgres  # type: ignore[attr-defined]
    try:
        run.start_daemon().wait_serving()
        _say(f"{fault}: cluster {run.name} serving; submitting the training job")
        run.submit()
        try:
            inject(run)
        except Exception as exc:  # measured what it could: said, and the run goes on
            run.outcome.notes.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            _say(f"{fault}: {exc}")
        _say(f"{fault}: waiting for the job to end, then down")
        run.finish()
    finally:
        if run.sampler is not None or any(d.process.poll() is None for d in run.daemons):
            run.teardown()
        try:
            side.close()
        finally:
            if postgres is not None:
                postgres.remove()
    o = run.outcome
    _say(
        f"{fault}: done: {o.job_status}; lost {o.lost}, detect {o.detect_s} s, "
        f"recover {o.recover_s} s, duplicates {o.duplicates}, left {o.leaks}"
    )
    return run.outcome


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a table, each figure beside its goal."""

    def num(value: float | None, unit: str = "") -> str:
        return "—" if value is None else f"{value:g}{unit}"

    rows = []
    for o in outcomes:
        goals = o.goals()
        mark = ", ".join(k for k, v in goals.items() if v is False) or "none"
        rows.append(
            [
                o.cloud,
                o.fault,
                num(o.checkpoint_step),
                num(o.progress_at_fault),
                "ran on" if o.resumed_step is None and o.lost == 0 else num(o.resumed_step),
                num(o.lost),
                num(o.detect_s, " s"),
                num(o.recover_s, " s"),
                str(o.duplicates),
                "/".join(
                    str(o.leaks.get(k, "?"))
                    for k in ("containers", "running", "agents", "instances")
                ),
                o.job_status,
                mark,
            ]
        )
    headers = [
        "cloud",
        "fault",
        "ckpt",
        "at fault",
        "resumed",
        f"lost ≤{CHECKPOINT_EVERY_S / STEP_S:g}",
        f"detect ≤{2 * HEARTBEAT_INTERVAL_S:g}s",
        f"recover ≤{INTERVAL_S:g}s",
        "dup",
        "left c/r/a/i",
        "job",
        "goals missed",
    ]
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks faults", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(FAULTS), metavar="FAULT")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--json", action="store_true", help="the outcomes as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the clusters' directories")
    parser.add_argument(
        "--cloud",
        choices=("local", "ec2", "both"),
        default="local",
        help="the local cloud (default), EC2 on moto_server, or both",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, (what, _) in FAULTS.items():
            print(f"{name:20} {what}")
        return
    import docker

    client = docker.from_env()
    chosen = args.only or list(FAULTS)
    clouds = ["local", "ec2"] if args.cloud == "both" else [args.cloud]
    outcomes = []
    base = Path(tempfile.mkdtemp(prefix="autoscaler-faults-"))
    try:
        for cloud in clouds:
            with _cloud(cloud, client, base / cloud) as make_side:
                for number, fault in enumerate(chosen, 1):
                    _say(f"({number}/{len(chosen)}) {cloud} {fault}: {FAULTS[fault][0]}")
                    try:
                        outcome = run_fault(fault, base / cloud / fault, client, make_side())
                    except Exception as exc:  # the next fault still runs; this one says why
                        _say(f"{cloud} {fault}: could not run: {exc!r}")
                        outcome = Outcome(fault, cloud, job_status="not run", notes=[repr(exc)])
                    outcomes.append(outcome)
    finally:
        client.close()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            _say(f"kept {base}")
    if args.json:
        print(
            json.dumps(
                {
                    "goals": {
                        "lost_iterations_max": CHECKPOINT_EVERY_S / STEP_S,
                        "detect_s_max": 2 * HEARTBEAT_INTERVAL_S,
                        "recover_s_max": INTERVAL_S,
                        "takeover_s_max": TAKEOVER_GOAL_S,
                        "duplicates": 0,
                        "leaks": 0,
                    },
                    "outcomes": [{**asdict(o), "goals": o.goals()} for o in outcomes],
                },
                indent=2,
            )
        )
    else:
        print(table(outcomes))
        for o in outcomes:
            for note in o.notes:
                print(f"  {o.fault}: {note}")


@contextlib.contextmanager
def _cloud(cloud: str, docker: Any, directory: Path) -> Iterator[Callable[[], CloudSide]]:
    """A maker of each run's cloud side; for EC2, `moto_server` running meanwhile and this
    process speaking to it as the CLI's user would to AWS (`down` terminates there)."""
    if cloud == "local":
        yield LocalSide
        return
    from tests.e2e.ec2 import aws_env

    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    try:
        _wait_http(f"{endpoint}/moto-api/", server)
        os.environ.update(aws_env(endpoint, directory))
        yield lambda: Ec2Side(endpoint, docker, directory)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.terminate()
        server.wait(timeout=30)


def _wait_http(url: str, server: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)


# -- small helpers --------------------------------------------------------------------------


def _step_of(ref: str | None) -> int | None:
    match = re.search(r"checkpoint-(\d+)\.tar\.gz$", ref or "")
    return int(match.group(1)) if match else None


def _time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def _use_state(path: Path, url: str) -> None:
    """The cluster's `[state]` on the database at `url` instead of its SQLite file."""
    text = path.read_text()
    text, count = re.subn(r'^path = "state\.db"[^\n]*', f'url = "{url}"', text, flags=re.M)
    if count != 1:
        raise RuntimeError(f"no [state] path to replace in {path}")
    path.write_text(text)


def _reload(path: Path) -> Any:
    from app.config import load_cluster_config

    return load_cluster_config(path)
