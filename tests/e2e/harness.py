"""Running the real daemon as a user does: a subprocess on a cluster directory, its JSON log
read back, the CLI called as `autoscaler …` would be (in-process `main`, over the daemon's TLS
API), and the state database read directly to see what happened.

Nothing waits a fixed time: `until` polls a condition with a generous deadline, so a busy
machine makes these tests slower, not flaky.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any, TypeVar

from app.cli import main
from app.config import ClusterConfig, load_cluster_config
from app.wiring import open_state

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: Deadline for anything an end-to-end test waits for (builds, boots, jobs) on a busy machine.
PATIENCE_S = 420.0

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def until(
    what: str,
    check: Callable[[], T],
    *,
    timeout: float = PATIENCE_S,
    poll_s: float = 0.5,
    daemon: Daemon | None = None,
) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` (and the daemon's
    last log lines) at the deadline, or at once if the daemon died."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if daemon is not None and daemon.process.poll() is not None:
            raise AssertionError(
                f"the daemon exited ({daemon.process.returncode}) while waiting for {what}:\n"
                + daemon.tail()
            )
        if time.monotonic() > deadline:
            tail = f"\n{daemon.tail()}" if daemon is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
        time.sleep(poll_s)


def set_options(path: Path, changes: dict[str, str]) -> None:
    """Replace `key = value` lines of the configuration `init` wrote (first match of each)."""
    text = path.read_text()
    for key, value in changes.items():
        pattern = re.compile(rf"^(#\s*)?{re.escape(key)} = [^\n#]*", re.MULTILINE)
        text, count = pattern.subn(f"{key} = {value}", text, count=1)
        assert count == 1, f"no {key!r} line in {path}"
    path.write_text(text)


def cli(*args: str) -> tuple[int, str]:
    """`autoscaler ARGS`, in this process: (exit code, what it printed)."""
    out = StringIO()
    with redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def cli_json(*args: str) -> Any:
    code, out = cli(*args, "--json")
    assert code == 0, out
    return json.loads(out)


class Daemon:
    """`autoscaler daemon --config FILE` as a subprocess, its log in `log_path`."""

    def __init__(
        self, config_path: Path, env: dict[str, str] | None = None, name: str = "daemon"
    ) -> None:
        self.config_path = config_path
        self.log_path = config_path.parent / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "app", "daemon", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.config_path.parent,
            )

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON log records so far (of one `event` kind)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (event is None or record.get("event") == event):
                records.append(record)
        return records

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_serving(self) -> None:
        until("the daemon to serve its API", lambda: self.events("serving"), daemon=self)

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM: the daemon finishes its step and exits; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@contextmanager
def state_of(config: ClusterConfig) -> Iterator[Any]:
    """The cluster's state database, opened beside the running daemon (read only here)."""
    store = open_state(config)
    try:
        yield store
    finally:
        store.close()


def all_running(config: ClusterConfig, jobs: Sequence[str]) -> list[Any] | None:
    """The tasks of `jobs` once every one of them runs, else None (a condition for `until`)."""
    with state_of(config) as store:
        tasks = [t for j in jobs for t in store.tasks_of(j)]
    return tasks if all(t.status == "running" for t in tasks) else None


def running_past(config: ClusterConfig, job: str, iterations: float) -> Any | None:
    """The one task of `job` once it runs past `iterations`, else None (for `until`)."""
    with state_of(config) as store:
        [task] = store.tasks_of(job)
    return task if task.status == "running" and task.progress >= iterations else None


def local_cluster(directory: Path, name: str, **options: str) -> ClusterConfig:
    """`autoscaler init --local` on free ports, with `options` set in its configuration."""
    code, out = cli("init", "--dir", str(directory), "--local", "--name", name)
    assert code == 0, out
    path = directory / "autoscaler.toml"
    # init takes the first free port from its defaults (7443, 9464, 8443): the next
    # cluster on this machine may want the same ones before this one binds them, so each
    # listen address moves to a port the system hands out (whatever init chose).
    chosen = load_cluster_config(path)
    text = path.read_text()
    for listen in (chosen.api.listen, chosen.metrics.listen, chosen.dashboard.listen):
        if listen:
            text = text.replace(f'listen = "{listen}"', f'listen = "127.0.0.1:{free_port()}"')
    path.write_text(text)
    set_options(path, {"worker_listen": f'"127.0.0.1:{free_port()}"', **options})
    return load_cluster_config(path)


def copy_example(name: str, target: Path, env: dict[str, str]) -> Path:
    """An example job directory copied under `target`, its tasks' environment changed by
    `env` (e.g. fewer iterations); returns the job file."""
    source = EXAMPLES / name
    directory = target / name
    directory.mkdir(parents=True)
    for path in source.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    job = directory / "job.toml"
    text = job.read_text()
    for key, value in env.items():
        text, count = re.subn(rf'\b{key} = "[^"]*"', f'{key} = "{value}"', text)
        assert count >= 1, f"{name}: no {key} in its job file"
    job.write_text(text)
    return job


def processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes containing `needle` (agents left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if needle in command and status != "Z":
            found.append(command.strip())
    return found


def containers_labelled(client: Any, label: str, values: Sequence[str]) -> list[str]:
    """Names of containers (any state) whose `label` is one of `values`."""
    return [
        c.name
        for c in client.containers.list(all=True, filters={"label": label})
        if c.labels.get(label) in values
    ]
