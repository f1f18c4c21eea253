"""Containers for the worker agent: the Docker Engine, behind a small interface.

The agent only needs a handful of operations — build an image from a
context, run a container with limits, wait for it, stop it, read its log —
so they are one small protocol (`ContainerRuntime`) with the Docker binding
here (the docker SDK). `executor.simulated` has a binding without Docker, so
a benchmark can run a hundred agents on one machine.

Every container runs unprivileged: as a non-root user (`job_user`: the
agent's own uid and gid, or `nobody` when the agent runs as root), all
capabilities dropped, `no-new-privileges`, a read-only root filesystem with a
writable scratch `/tmp` of bounded size (a tmpfs, charged to the container's
memory), an init process (so SIGTERM reaches the job and zombies are reaped),
no network unless the job asks for it, and cgroup limits for CPU, memory
(swap included), shared memory and processes. Only its checkpoint and report
directories are mounted, writable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

#: Container labels: how an agent finds its own containers (also after it restarted).
LABEL_INSTANCE = "autoscaler.instance"
LABEL_TASK = "autoscaler.task"
LABEL_JOB = "autoscaler.job"
LABEL_ATTEMPT = "autoscaler.attempt"

GIB = 1 << 30

#: How long a build may go without a word from the engine.
BUILD_TIMEOUT_S = 3600

#: The writable scratch of a job (`/tmp`, its HOME unless the job sets one).
SCRATCH_PATH = "/tmp"
SCRATCH_BYTES = GIB

#: The user a job runs as when the agent is root: `nobody`.
NOBODY = "65534:65534"


def job_user() -> str:
    """`uid:gid` a job's container runs as: the agent's own when it is not root (what it
    writes into the checkpoint directory, the agent reads and uploads, and the other way
    round), else `nobody`. Never root."""
    uid, gid = os.getuid(), os.getgid()
    return f"{uid}:{gid}" if uid != 0 else NOBODY


class RuntimeFailure(RuntimeError):
    """The container runtime refused or failed an operation; the message says why."""


class BuildFailed(RuntimeFailure):
    """The image did not build (the Dockerfile's error is in the message, the whole
    build output in `log`)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class ImageUnavailable(RuntimeFailure):
    """The image cannot be pulled or is not there: a retry would meet the same."""


class CommandNotFound(RuntimeFailure):
    """The runtime could not execute the job's command (not found, not executable)."""


#: How the engine says it could not execute a command (runc's and crun's words).
_NOT_EXECUTABLE = ("executable file not found", "permission denied", "no such file or directory")


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container to run: image, command, environment, limits, mounts."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    cpus: float = 1.0  # logical CPUs (the runtime's unit), not physical cores
    memory_bytes: int = GIB
    shm_bytes: int | None = None
    gpus: tuple[int, ...] = ()  # device indices; passed only where devices exist
    network: bool = False
    mounts: Mapping[str, str] = field(default_factory=dict)  # host path -> container path
    user: str = field(default_factory=job_user)  # uid:gid, never root
    scratch_bytes: int = SCRATCH_BYTES  # the writable /tmp (the root filesystem is read-only)


@dataclass(frozen=True, slots=True)
class ContainerExit:
    code: int
    oom_killed: bool = False
    error: str = ""  # the runtime's own error, if it could not run the process


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    container_id: str
    labels: Mapping[str, str]
    running: bool


class ContainerRuntime(Protocol):
    def has_image(self, image: str) -> bool: ...

    def build(self, context_archive: Path, tag: str) -> None:
        """Build `tag` from a gzipped tar holding a Dockerfile; raises BuildFailed."""
        ...

    def pull(self, image: str) -> None: ...

    def run(self, spec: ContainerSpec) -> str:
        """Create and start a container; returns its id."""
        ...

    def wait(self, container_id: str) -> ContainerExit:
        """Block until the container exits."""
        ...

    def stop(self, container_id: str, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after `grace_s` seconds; returns once it has exited."""
        ...

    def kill(self, container_id: str) -> None: ...

    def logs(self, container_id: str) -> bytes: ...

    def remove(self, container_id: str) -> None: ...

    def containers(self, labels: Mapping[str, str]) -> Sequence[ContainerInfo]:
        """Containers (running or not) carrying all of `labels`."""
        ...


class DockerRuntime:
    """`ContainerRuntime` over the Docker Engine API (the docker SDK)."""

    def __init__(self, base_url: str | None = None, *, gpu_devices: int = 0) -> None:
        import docker

        self._docker = docker
        try:
            if base_url:
                self.client = docker.DockerClient(base_url=base_url, max_pool_size=64)
            else:
                self.client = docker.from_env(max_pool_size=64)
            self.client.ping()
        except docker.errors.DockerException as exc:
            where = base_url or "DOCKER_HOST or the default socket"
            raise RuntimeFailure(f"cannot reach the Docker engine at {where}: {exc}") from None
        self.gpu_devices = gpu_devices

    def has_image(self, image: str) -> bool:
        try:
            self.client.images.get(image)
        except self._docker.errors.ImageNotFound:
            return False
        return True

    def build(self, context_archive: Path, tag: str) -> None:
        errors = self._docker.errors
        try:
            with open(context_archive, "rb") as context:
                self.client.images.build(
                    fileobj=context,
                    custom_context=True,
                    encoding="gzip",
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    # A RUN step may print nothing for minutes (a quiet pip install): wait.
                    timeout=BUILD_TIMEOUT_S,
                )
        except errors.BuildError as exc:
            chunks = list(exc.build_log or ())  # an iterator: read it once
            raise BuildFailed(_build_message(exc.msg, chunks), _build_output(chunks)) from None
        except errors.APIError as exc:
            raise BuildFailed(_api_message(exc)) from None
        except self._requests_error() as exc:
            raise BuildFailed(f"the Docker engine stopped answering: {exc}") from None

    def pull(self, image: str) -> None:
        if self.has_image(image):
            return
        try:
            self.client.images.pull(image)
        except self._docker.errors.APIError as exc:
            raise ImageUnavailable(f"cannot pull {image}: {_api_message(exc)}") from None

    def run(self, spec: ContainerSpec) -> str:
        if spec.user.split(":", 1)[0] in ("0", "root", ""):
            raise RuntimeFailure(f"{spec.name}: a job never runs as root (user {spec.user!r})")
        docker = self._docker
        device_requests = None
        if spec.gpus and self.gpu_devices:
            device_requests = [
                docker.types.DeviceRequest(
                    driver="nvidia",
                    device_ids=[str(g) for g in spec.gpus],
                    capabilities=[["gpu"]],
                )
            ]
        self._remove_stale(spec.name)
        try:
            container = self.client.containers.run(
                spec.image,
                list(spec.command) or None,
                name=spec.name,
                detach=True,
                environment={"HOME": SCRATCH_PATH, **spec.env},
                user=spec.user,
                read_only=True,
                tmpfs={
                    SCRATCH_PATH: f"rw,nosuid,nodev,size={spec.scratch_bytes},mode=1777",
                },
                labels=dict(spec.labels),
                nano_cpus=max(int(spec.cpus * 1e9), 10_000_000),
                mem_limit=spec.memory_bytes,
                memswap_limit=spec.memory_bytes,
                shm_size=spec.shm_bytes,
                device_requests=device_requests,
                network_mode=None if spec.network else "none",
                volumes={
                    host: {"bind": inside, "mode": "rw"} for host, inside in spec.mounts.items()
                },
                privileged=False,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                init=True,
                pids_limit=4096,
                log_config=docker.types.LogConfig(
                    type="json-file", config={"max-size": "64m", "max-file": "2"}
                ),
            )
        except docker.errors.ImageNotFound as exc:
            raise ImageUnavailable(f"image not found: {_api_message(exc)}") from None
        except docker.errors.APIError as exc:
            message = _api_message(exc)
            self._remove_stale(spec.name)  # created, but it could not start
            lowered = message.lower()
            if "exec" in lowered and any(words in lowered for words in _NOT_EXECUTABLE):
                raise CommandNotFound(message) from None
            raise RuntimeFailure(message) from None
        if container.id is None:  # the engine always sends one; docker-py's models allow none
            raise RuntimeFailure("the Docker engine created a container without an id")
        return container.id

    def _remove_stale(self, name: str) -> None:
        """A container of this name is left from an earlier agent process: remove it."""
        with contextlib.suppress(self._docker.errors.NotFound):
            self.client.containers.get(name).remove(force=True)

    def wait(self, container_id: str) -> ContainerExit:
        errors = self._docker.errors
        failures = 0
        while True:
            try:
                container = self.client.containers.get(container_id)
                result = container.wait()
                container.reload()
                break
            except errors.NotFound:
                return ContainerExit(-1, error="the container disappeared")
            except (errors.APIError, OSError, self._requests_error()) as exc:
                failures += 1
                if failures > 30:
                    return ContainerExit(-1, error=f"lost track of the container: {exc}")
                log.warning("waiting for %s: %s; trying again", container_id[:12], exc)
                time.sleep(1.0)
        state = container.attrs.get("State", {})
        failure = result.get("Error") if result else None
        error = failure.get("Message", "") if failure else ""
        return ContainerExit(
            int(result.get("StatusCode", state.get("ExitCode", -1))),
            bool(state.get("OOMKilled")),
            error or state.get("Error", ""),
        )

    def _requests_error(self) -> type[Exception]:
        import requests

        return requests.exceptions.RequestException

    def stop(self, container_id: str, grace_s: float) -> None:
        try:
            self.client.containers.get(container_id).stop(timeout=max(int(grace_s), 1))
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.APIError as exc:
            raise RuntimeFailure(f"cannot stop the container: {_api_message(exc)}") from None

    def kill(self, container_id: str) -> None:
        with contextlib.suppress(self._docker.errors.APIError):  # not running, or gone
            self.client.containers.get(container_id).kill()

    def logs(self, container_id: str) -> bytes:
        try:
            return self.client.containers.get(container_id).logs(stdout=True, stderr=True)
        except self._docker.errors.APIError as exc:
            raise RuntimeFailure(f"cannot read the container's log: {_api_message(exc)}") from None

    def remove(self, container_id: str) -> None:
        errors = self._docker.errors
        try:
            self.client.containers.get(container_id).remove(force=True)
        except errors.NotFound:
            pass
        except errors.APIError as exc:
            if exc.status_code != 409:  # 409: its removal is already in progress
                raise RuntimeFailure(f"cannot remove the container: {_api_message(exc)}") from None

    def containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        wanted = [f"{key}={value}" for key, value in labels.items()]
        # ignore_removed: one removed between the listing and its inspection is gone,
        # not an error (another cluster on this engine may be removing its own)
        found = self.client.containers.list(
            all=True, filters={"label": wanted}, ignore_removed=True
        )
        return [
            ContainerInfo(c.id, dict(c.labels), c.status in ("running", "restarting"))
            for c in found
            if c.id is not None  # always set on a listed container; docker-py's models allow none
        ]


def _api_message(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def _build_output(chunks: list[dict]) -> str:
    return "".join(chunk.get("stream") or chunk.get("error") or "" for chunk in chunks)


def _build_message(message: str, chunks: list[dict]) -> str:
    """The Dockerfile's error, with the last lines of output that led to it."""
    lines = []
    for chunk in chunks:
        text = chunk.get("stream") or chunk.get("error") or ""
        lines += [
            line
            for line in text.splitlines()
            if line.strip() and not line.startswith((" ---> ", "Removing intermediate container"))
        ]
    context = [line for line in lines[-4:] if line.strip() != message.strip()]
    return "; ".join([message.strip(), *context[-2:]]) if context else message.strip()
