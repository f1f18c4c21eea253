"""A `ContainerRuntime` without Docker, for benchmarks of the agent and the protocol.

A "container" is a thread running a training loop with the real `Reporter`
on the real report socket in the attempt's directory, checkpointing into the
real checkpoint directory when asked: everything the agent and the daemon do
is the production code, only the process and its image are simulated. That is
how `python -m benchmarks migration` runs a hundred agents on one machine.

The loop reads the same environment as the test job: `STEP_S` (seconds per
iteration), `TOTAL` (iterations to the end), `EXIT_CODE` (exit with it after
`EXIT_AFTER` iterations); and the worker's: it checkpoints every
`AUTOSCALER_CHECKPOINT_EVERY_S`, and its watchdog (`AUTOSCALER_WATCHDOG_S`)
ends it with the reporter's exit status as it would end a process.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from executor.reporter import (
    CHECKPOINT_EVERY_ENV,
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_WATCHDOG_GRACE_S,
    WATCHDOG_ENV,
    WATCHDOG_GRACE_ENV,
    WINDOW_ENV,
    WORKER_PROTOCOL_ENV,
    Reporter,
)
from executor.runtime import ContainerExit, ContainerInfo, ContainerSpec, RuntimeFailure

_CHECKPOINT_MOUNT = "/checkpoint"
_REPORT_MOUNT = "/run/autoscaler"


@dataclass(eq=False)
class _Container:
    spec: ContainerSpec
    term: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    exited: bool = False  # the "process" chose its exit status (the reporter's watchdog)
    code: int = 0
    lines: list[str] = field(default_factory=list)


class SimulatedRuntime:
    """Containers as threads; images as names. `build_s` simulates a build's duration."""

    def __init__(self, *, build_s: float = 0.0) -> None:
        self.build_s = build_s
        self._images: set[str] = set()
        self._containers: dict[str, _Container] = {}
        self._lock = threading.Lock()

    def has_image(self, image: str) -> bool:
        return image in self._images

    def build(self, context_archive: Path, tag: str) -> None:
        if not Path(context_archive).is_file():
            raise RuntimeFailure(f"{context_archive}: no build context")
        time.sleep(self.build_s)
        self._images.add(tag)

    def pull(self, image: str) -> None:
        self._images.add(image)

    def run(self, spec: ContainerSpec) -> str:
        if spec.image not in self._images:
            raise RuntimeFailure(f"image not found: {spec.image}")
        container_id = uuid.uuid4().hex
        container = _Container(spec)
        with self._lock:
            self._containers[container_id] = container
        threading.Thread(target=_job, args=(container,), daemon=True).start()
        return container_id

    def _get(self, container_id: str) -> _Container:
        with self._lock:
            container = self._containers.get(container_id)
        if container is None:
            raise RuntimeFailure(f"no container {container_id}")
        return container

    def wait(self, container_id: str) -> ContainerExit:
        container = self._get(container_id)
        container.done.wait()
        return ContainerExit(container.code)

    def stop(self, container_id: str, grace_s: float) -> None:
        container = self._get(container_id)
        container.term.set()
        if not container.done.wait(grace_s):
            self.kill(container_id)
            container.done.wait()

    def kill(self, container_id: str) -> None:
        try:
            container = self._get(container_id)
        except RuntimeFailure:
            return
        container.killed.set()
        container.term.set()

    def logs(self, container_id: str) -> bytes:
        return "\n".join(self._get(container_id).lines).encode()

    def remove(self, container_id: str) -> None:
        with self._lock:
            container = self._containers.pop(container_id, None)
        if container is not None:
            container.killed.set()
            container.term.set()

    def containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        with self._lock:
            items = list(self._containers.items())
        return [
            ContainerInfo(cid, dict(c.spec.labels), not c.done.is_set())
            for cid, c in items
            if all(c.spec.labels.get(k) == v for k, v in labels.items())
        ]


def _job(container: _Container) -> None:
    """The training loop of the test job, in a thread."""
    try:
        _train(container)
    except Exception as exc:  # the "process" crashed: exit 1 with its error in the log
        container.lines.append(f"{type(exc).__name__}: {exc}")
        container.code = 1
    finally:
        container.done.set()


def _train(container: _Container) -> None:
    spec = container.spec
    host = {inside: Path(outside) for outside, inside in spec.mounts.items()}
    checkpoint = host[_CHECKPOINT_MOUNT] / "state.json"
    env = spec.env
    step = 0
    if checkpoint.exists():
        step = json.loads(checkpoint.read_text())["step"]
    container.lines.append(f"resumed at {step}" if step else "starting from 0")
    step_s = float(env.get("STEP_S", "0.01"))
    total = int(env.get("TOTAL", "1000000000"))
    exit_after = int(env.get("EXIT_AFTER", "0") or 0)
    window = float(env.get(WINDOW_ENV, "300"))

    def exit_process(code: int) -> None:
        container.code, container.exited = code, True
        container.term.set()

    reporter = Reporter(
        str(host[_REPORT_MOUNT] / "report.sock"),
        window_s=window,
        start=step,
        checkpoint_every_s=float(env.get(CHECKPOINT_EVERY_ENV) or DEFAULT_CHECKPOINT_EVERY_S),
        watchdog_s=float(env.get(WATCHDOG_ENV) or 0),
        watchdog_grace_s=float(env.get(WATCHDOG_GRACE_ENV) or DEFAULT_WATCHDOG_GRACE_S),
        worker_collects=int(env.get(WORKER_PROTOCOL_ENV) or 1) >= 2,
        exit=exit_process,
    )
    try:
        while step < total:
            if container.term.wait(step_s):
                if not container.exited:
                    container.code = 137 if container.killed.is_set() else 143
                return
            step += 1
            reporter.step()
            if exit_after and step >= exit_after:
                container.code = int(env.get("EXIT_CODE", "1"))
                container.lines.append(f"exiting with {container.code} at {step}")
                return
            if reporter.checkpoint_due():
                temporary = checkpoint.with_suffix(".tmp")
                temporary.write_text(json.dumps({"step": step}))
                os.replace(temporary, checkpoint)
                reporter.checkpoint_done(step)
                container.lines.append(f"checkpointed at {step}")
                if reporter.stop_requested:
                    return
        container.lines.append(f"done at {step}")
    finally:
        reporter.close()
