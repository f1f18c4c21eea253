"""Fixtures for the executor tests: real parts only.

- a Docker engine found through DOCKER_HOST (`.ci/run` starts one); the tests
  that need it are skipped only when no engine answers;
- S3 on `moto_server`, started here as a subprocess;
- a daemon: a real gRPC server on 127.0.0.2 (a loopback address no
  certificate names, so name checks happen as on a VPC address) with its two
  ports: enrollment over TLS with the daemon's certificate from the server CA,
  and the workers' registry over mutual TLS with client certificates from the
  worker CA; `GrpcExecutor` behind both, with a manual clock for heartbeat
  timeouts, its state a `MemoryLedger` and one-time enrollment secrets;
- worker agents, in this process or as `autoscaler worker` subprocesses, each
  enrolling with the secret written for it.

Nothing waits a fixed time: `Daemon.until` polls the executor's report until
a condition holds, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import grpc
import pytest

from autoscaler.execution import ExecutorReport, ResourceLimits, TaskLaunch
from autoscaler.jobs import TaskRun
from autoscaler.resources import Resources
from executor.agent import Agent, AgentConfig
from executor.client import (
    WORKER_METHODS,
    GrpcExecutor,
    Launch,
    Ledger,
    MemoryLedger,
    add_worker_services,
)
from executor.enrollment import OneTimeSecrets
from executor.runtime import LABEL_INSTANCE, ContainerRuntime
from executor.security import (
    DAEMON_NAME,
    Authority,
    TokenAuth,
    WorkerTrust,
    rotating_server_credentials,
    server_credentials,
    server_options,
    write_secret,
)
from executor.storage import Storage, open_storage, upload_context

JOBS = Path(__file__).parent / "jobs"
REPORTER = Path(__file__).parents[2] / "executor" / "reporter.py"
MOTO_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}
#: What a test worker advertises unless told otherwise: 2 cores, 4 GiB.
SMALL = Resources(0, 2, 4)
#: Deadline for anything the tests wait for (builds, starts, stops on a busy machine).
PATIENCE_S = 120.0


#: The daemon's host in these tests: loopback, but named by no certificate.
HOST = "127.0.0.2"
#: The cluster name the worker certificates carry.
CLUSTER = "test"


def free_port(host: str = HOST) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ManualClock:
    """The daemon's clock: moves only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


# -- Docker ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        pytest.skip(
            f"no Docker engine answers at {os.environ.get('DOCKER_HOST', 'default')}: {exc}"
        )
    return client


@pytest.fixture(scope="session")
def python_image(docker_client: Any) -> str:
    from executor.images import PYTHON_IMAGE, ensure_python_image

    ensure_python_image(docker_client)
    return PYTHON_IMAGE


@pytest.fixture(scope="session")
def docker_runtime(docker_client: Any, python_image: str) -> ContainerRuntime:
    from executor.runtime import DockerRuntime

    return DockerRuntime()  # DOCKER_HOST, like `autoscaler worker` without --docker


# -- S3 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def s3_url(moto_endpoint: str) -> str:
    """A fresh bucket (with a prefix, as a real cluster would use) on moto_server."""
    bucket = f"cluster-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, **MOTO_CREDENTIALS).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/autoscaler"


def s3_options(moto_endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": moto_endpoint, **MOTO_CREDENTIALS}


# -- the daemon and its workers ----------------------------------------------------------------


@dataclass
class Daemon:
    """The daemon's side of the executor, as the daemon wires it: two ports, TLS, mTLS."""

    storage_url: str
    storage_options: dict[str, Any]
    work: Path
    runtime: ContainerRuntime | None = None
    clock: ManualClock = field(default_factory=ManualClock)
    server_ca: Authority = field(default_factory=lambda: Authority.create("test server"))
    worker_ca: Authority = field(default_factory=lambda: Authority.create("test worker"))
    ledger: Ledger = field(default_factory=MemoryLedger)
    secrets: OneTimeSecrets = field(default_factory=OneTimeSecrets)
    verifier: Any = None  # how workers prove their instance (default: `secrets`)
    certificate_lifetime_s: float = 3600.0
    # The worker CAs accepted and the one signing, read at each use (a rotation); None:
    # `worker_ca` alone, as a daemon that never rotated.
    trust: Callable[[], WorkerTrust] | None = None
    enroll_burst: int = 5
    heartbeat_timeout_s: float = 45.0
    heartbeat_interval_s: float = 0.3
    port: int = 0
    worker_port: int = 0
    agents: list[Agent] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    instances: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.port, self.worker_port = free_port(), free_port()
        self.storage: Storage = open_storage(self.storage_url, **self.storage_options)
        self.server_cert = self.server_ca.issue([DAEMON_NAME])
        self._serve()

    def _serve(self, executor: GrpcExecutor | None = None) -> None:
        self.executor = executor or GrpcExecutor(
            worker_ca=self.worker_ca,
            storage=self.storage,
            cluster=CLUSTER,
            registry_address=self.worker_address,
            verifier=self.verifier or self.secrets,
            ledger=self.ledger,
            now=self.clock,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            certificate_lifetime_s=self.certificate_lifetime_s,
            enroll_burst=self.enroll_burst,
            trust=self.trust,
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=64),
            interceptors=[TokenAuth({}, {}, open=WORKER_METHODS)],
            options=server_options(),
        )
        add_worker_services(self.server, self.executor)
        cert, key = self.server_cert
        bound = self.server.add_secure_port(self.address, server_credentials(cert, key))
        assert bound == self.port
        if self.trust is None:
            mtls = server_credentials(cert, key, client_ca=self.worker_ca.cert_pem)
        else:
            trust = self.trust
            mtls = rotating_server_credentials(cert, key, lambda: trust().bundle(time.time()))
        assert self.server.add_secure_port(self.worker_address, mtls) == self.worker_port
        self.server.start()

    @property
    def address(self) -> str:
        """Where workers enroll (the daemon's API port)."""
        return f"{HOST}:{self.port}"

    @property
    def worker_address(self) -> str:
        """The workers' port: mutual TLS."""
        return f"{HOST}:{self.worker_port}"

    def partition(self) -> None:
        """The workers cannot reach the daemon any more (its server stops; it keeps its
        memory); `heal` lets them through again."""
        self.server.stop(None).wait()

    def heal(self) -> None:
        self._serve(self.executor)

    def restart(self) -> None:
        """The daemon process dies and a new one starts: nothing of the executor survives
        but the cluster's CAs, its state (the ledger), and the addresses."""
        self.server.stop(None).wait()
        self.executor.close()
        self._serve()

    def launch(self, instance_id: str) -> Path:
        """Record a launch of `instance_id` and leave its one-time enrollment secret in a
        0600 file, as the local cloud does; returns the file."""
        self.instances.add(instance_id)
        if isinstance(self.ledger, MemoryLedger):
            self.ledger.add_launch(Launch(instance_id))
        path = self.work / "secrets" / instance_id
        write_secret(path, self.secrets.issue(instance_id), overwrite=True)
        return path

    def agent(
        self,
        instance_id: str,
        *,
        capacity: Resources = SMALL,
        runtime: ContainerRuntime | None = None,
        clock: Callable[[], float] | None = None,
        shutdown: Callable[[str], None] | None = None,
        **overrides: Any,
    ) -> Agent:
        secret = self.launch(instance_id) if instance_id not in self.instances else None
        settings: dict[str, Any] = {
            "threads_per_core": 1.0,
            "host_cpus": os.cpu_count() or 1,
            "checkpoint_wait_s": 10.0,
            "stop_grace_s": 2.0,
            "throughput_window_s": 0.5,
            "enrollment_secret": secret or self.work / "secrets" / instance_id,
        }
        settings.update(overrides)
        settings.setdefault("work_dir", self.work / instance_id)
        agent = Agent(
            AgentConfig(
                instance_id=instance_id,
                daemon=self.address,
                ca_pem=self.server_ca.cert_pem,
                capacity=capacity,
                **settings,
            ),
            runtime or self.runtime,  # type: ignore[arg-type]
            clock=clock or time.monotonic,
            shutdown=shutdown,
        )
        agent.serve()
        self.agents.append(agent)
        self.until(lambda r: instance_id in r.ready_instances, f"{instance_id} connects")
        return agent

    def until(
        self, predicate: Callable[[ExecutorReport], bool], what: str, timeout: float = PATIENCE_S
    ) -> ExecutorReport:
        """Poll the executor's report until `predicate` holds (fails after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.executor.report()
            if predicate(report):
                return report
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting until {what}; last report: {report}")
            time.sleep(0.05)

    def state(self, task_id: str) -> Callable[[ExecutorReport], bool]:
        return lambda report: task_id in report.tasks

    def close(self) -> None:
        for agent in self.agents:
            agent.close(grace_s=0)
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
        self.server.stop(None).wait()
        self.executor.close()


def worker_process(
    daemon: Daemon, instance_id: str, tmp_path: Path, *flags: str
) -> subprocess.Popen:
    """`autoscaler worker` as the local cloud runs it: a one-time enrollment secret, and no
    credentials of any kind (no AWS keys: its storage is granted URL by URL). Started again
    for an instance, it runs on the same work directory (a restart)."""
    secret = daemon.launch(instance_id)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(daemon.server_ca.cert_pem)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AUTOSCALER_INSTANCE_ID"] = instance_id
    process = subprocess.Popen(
        [
            sys.executable, "-m", "executor",
            "--daemon", daemon.address,
            "--ca", str(ca),
            "--enrollment-secret", str(secret),
            "--work-dir", str(daemon.work / instance_id),
            "--capacity", "0,2,4",
            "--stop-grace", "2",
            "--throughput-window", "0.5",
            *flags,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    daemon.processes.append(process)
    daemon.instances.add(instance_id)
    return process


def wait_for(task_id: str, *states: str) -> Callable[[ExecutorReport], bool]:
    """A report in which `task_id` is in one of `states`."""
    return lambda report: task_id in report.tasks and report.tasks[task_id].state in states


@pytest.fixture
def daemon_on(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """`daemon_on(storage_url, storage_options, runtime)`: a daemon; agents, their containers
    and worker processes are cleaned up after the test."""
    made: list[Daemon] = []

    def make(
        storage_url: str,
        storage_options: dict[str, Any] | None = None,
        runtime: Any = None,
        **settings: Any,
    ) -> Daemon:
        daemon = Daemon(
            storage_url, storage_options or {}, tmp_path / "workers", runtime, **settings
        )
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.close()
        if daemon.runtime is not None:
            for instance_id in daemon.instances:
                for info in daemon.runtime.containers({LABEL_INSTANCE: instance_id}):
                    daemon.runtime.remove(info.container_id)
    shutil.rmtree(tmp_path / "workers", ignore_errors=True)


@pytest.fixture
def docker_daemon(
    daemon_on: Callable[..., Daemon],
    docker_runtime: ContainerRuntime,
    s3_url: str,
    moto_endpoint: str,
) -> Daemon:
    """A daemon whose workers run Docker and keep their files in S3 (moto_server)."""
    return daemon_on(s3_url, s3_options(moto_endpoint), docker_runtime)


def job_context(
    storage: Storage, tmp_path: Path, name: str = "train", *, unique: bool = False
) -> str:
    """Upload a test job's build context (with the reporter copied in, as a user would).
    `unique`: add a file no other context has, so its image is built here."""
    directory = tmp_path / f"context-{name}-{uuid.uuid4().hex[:8]}"
    shutil.copytree(JOBS / name, directory)
    if name == "train":
        shutil.copy(REPORTER, directory / "reporter.py")
    if unique:
        (directory / "nonce").write_text(uuid.uuid4().hex)
    return upload_context(storage, directory)


def launch(
    task_id: str,
    attempt: int,
    instance_id: str,
    context: str,
    *,
    env: dict[str, str] | None = None,
    checkpoint: str | None = None,
    cpus: float = 0.5,
    memory_gb: float = 0.25,
    shm_size_gb: float | None = None,
) -> TaskLaunch:
    job_id = task_id.split("/")[0]
    return TaskLaunch(
        task_id=task_id,
        job_id=job_id,
        attempt=attempt,
        instance_id=instance_id,
        workload=f"{job_id}_train",
        run=TaskRun(build_context=context, env=tuple(sorted((env or {}).items()))),
        limits=ResourceLimits(cpus=cpus, memory_gb=memory_gb, shm_size_gb=shm_size_gb),
        checkpoint=checkpoint,
    )


def checkpointed_step(storage: Storage, ref: str, tmp_path: Path) -> int:
    """The step the test job saved in a checkpoint (its `state.json`)."""
    archive = tmp_path / f"checkpoint-{uuid.uuid4().hex[:8]}.tar.gz"
    storage.get_file(ref, archive)
    with tarfile.open(archive) as tar:
        member = tar.extractfile("state.json")
        assert member is not None
        return json.load(member)["step"]
