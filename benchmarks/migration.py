"""Migration: each phase of a checkpoint-and-move cycle, and a report round over 100 agents.

Part 1 runs the production path end to end on this machine: a daemon's
`GrpcExecutor` (gRPC, mutual TLS on 127.0.0.1), two worker agents on a real
Docker engine (DOCKER_HOST), and the storage on `moto_server` (S3 over HTTP;
a directory when moto is not installed). A training job built from its
Dockerfile is started, checkpointed, moved to the other agent and resumed,
several times. "launch" is what the daemon sees from `start` to the job's
first reported iteration; "checkpoint" from `stop` to the checkpoint
referenced in a report. The first cycle builds the image, the others find it
built. Beside them: Eva's Table 1 (job checkpointing 2–30 s, average 8 s;
job launching 1–160 s, average 47 s), measured on EC2 with real models,
images pulled and data loaded — the yardstick, not a like-for-like figure.

Part 2 starts 100 agents with simulated containers (threads speaking the
real report-socket protocol) against one daemon and times enrollment, 200
starts, a `report()`, and 200 checkpoint-and-stops.

Part 0 (`--imports-only` runs it alone) is what a worker pays before it starts:
the import time of the worker's entry point (`executor.cli`, `executor.agent`)
beside the full command line's (`app.cli`), both measured in this run with
`python -X importtime` (the cumulative times of the top-level imports summed,
the median of several interleaved runs), and which of the planner's and the
daemon's heavy packages each one loads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from app.table import format_table
from autoscaler.execution import ResourceLimits, TaskLaunch
from autoscaler.jobs import TaskRun
from autoscaler.resources import Resources
from executor.agent import Agent, AgentConfig
from executor.client import (
    WORKER_METHODS,
    GrpcExecutor,
    Launch,
    MemoryLedger,
    add_worker_services,
)
from executor.enrollment import OneTimeSecrets
from executor.runtime import LABEL_INSTANCE, ContainerRuntime
from executor.security import (
    DAEMON_NAME,
    Authority,
    TokenAuth,
    server_credentials,
    server_options,
    write_secret,
)
from executor.storage import open_storage, upload_context

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "executor" / "jobs" / "train"
EVA_TABLE_1 = {"checkpoint": (8.0, "2–30"), "launch": (47.0, "1–160")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks migration", description=__doc__)
    parser.add_argument("--cycles", type=int, default=4, help="migrations in part 1")
    parser.add_argument("--agents", type=int, default=100, help="simulated agents in part 2")
    parser.add_argument("--tasks-per-agent", type=int, default=2)
    parser.add_argument("--imports-only", action="store_true", help="part 0 alone")
    parser.add_argument("--import-runs", type=int, default=7, help="runs of each in part 0")
    args = parser.parse_args(argv)
    import_times(args.import_runs)
    if args.imports_only:
        return
    with tempfile.TemporaryDirectory(prefix="bench-migration-") as scratch:
        migration_cycle(Path(scratch), args.cycles)
        report_round(Path(scratch), args.agents, args.tasks_per_agent)


# -- part 0 ----------------------------------------------------------------------------------

#: What `autoscaler-worker` imports before it parses its flags; what `autoscaler` does.
WORKER_IMPORTS = "import executor.cli, executor.agent"
FULL_IMPORTS = "import app.cli"
#: The planner's and the daemon's packages, which an instance should never load.
HEAVY = ("numpy", "highspy", "scipy", "sqlalchemy", "alembic", "pydantic", "rich", "matplotlib")


def import_times(runs: int) -> None:
    """Print the worker's import time beside the full command line's, and their ratio."""
    print("part 0: import time (python -X importtime)", flush=True)
    samples: dict[str, list[float]] = {WORKER_IMPORTS: [], FULL_IMPORTS: []}
    loaded: dict[str, set[str]] = {}
    for _ in range(max(runs, 1) + 1):  # the first round warms the caches and is dropped
        for code in samples:
            seconds, loaded[code] = _import_seconds(code)
            samples[code].append(seconds)
    worker, full = (statistics.median(samples[code][1:]) for code in samples)
    rows = [
        [
            f"worker: {WORKER_IMPORTS}",
            f"{worker:.3f}",
            ", ".join(sorted(loaded[WORKER_IMPORTS] & set(HEAVY))) or "none",
        ],
        [
            f"command line: {FULL_IMPORTS}",
            f"{full:.3f}",
            ", ".join(sorted(loaded[FULL_IMPORTS] & set(HEAVY))) or "none",
        ],
        ["worker ÷ command line", f"{worker / full:.2f}", ""],
    ]
    print(format_table(["imports", "seconds (median)", "heavy packages loaded"], rows,
                       [False, True, False]))  # fmt: skip
    print(f"  median of {max(runs, 1)} interleaved runs each, after one warm-up.\n")


def _import_seconds(code: str) -> tuple[float, set[str]]:
    """The summed cumulative time of a process's top-level imports, and the top-level
    packages it loaded (`python -X importtime` writes one line per import to stderr,
    children indented under their parent)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    total_us, packages = 0, set()
    for line in run.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        packages.add(name.strip().split(".")[0])
        if name.startswith(" ") and not name.startswith("  "):  # a top-level import
            total_us += int(cumulative)
    return total_us / 1e6, packages


# -- wiring ----------------------------------------------------------------------------------


class Daemon:
    """The daemon's worker-facing side, wired as the daemon wires it."""

    def __init__(self, storage_url: str, storage_options: dict[str, Any], work: Path) -> None:
        self.server_ca = Authority.create("bench server")
        worker_ca = Authority.create("bench worker")
        self.ledger, self.secrets = MemoryLedger(), OneTimeSecrets()
        self.storage_url, self.storage_options, self.work = storage_url, storage_options, work
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=256),  # one thread per command stream
            interceptors=[TokenAuth({}, {}, open=WORKER_METHODS)],
            options=server_options(),
        )
        cert, key = self.server_ca.issue([DAEMON_NAME])
        self.port = self.server.add_secure_port("127.0.0.1:0", server_credentials(cert, key))
        workers = server_credentials(cert, key, client_ca=worker_ca.cert_pem)
        worker_port = self.server.add_secure_port("127.0.0.1:0", workers)
        self.executor = GrpcExecutor(
            worker_ca=worker_ca,
            storage=open_storage(storage_url, **storage_options),
            cluster="bench",
            registry_address=f"127.0.0.1:{worker_port}",
            verifier=self.secrets,
            ledger=self.ledger,
            heartbeat_timeout_s=60,
        )
        add_worker_services(self.server, self.executor)
        self.server.start()
        self.agents: list[Agent] = []

    def agent(self, instance_id: str, runtime: ContainerRuntime, **settings: Any) -> Agent:
        self.ledger.add_launch(Launch(instance_id))
        secret = self.work / "secrets" / instance_id
        write_secret(secret, self.secrets.issue(instance_id), overwrite=True)
        agent = Agent(
            AgentConfig(
                instance_id=instance_id,
                daemon=f"127.0.0.1:{self.port}",
                ca_pem=self.server_ca.cert_pem,
                work_dir=self.work / instance_id,
                capacity=Resources(0, 4, 8),
                enrollment_secret=secret,
                host_cpus=os.cpu_count() or 1,
                **settings,
            ),
            runtime,
        )
        agent.serve()
        self.agents.append(agent)
        return agent

    def until(self, predicate: Callable[..., bool], timeout: float = 600) -> float:
        """Seconds until the report satisfies `predicate`, called with the report (a lambda
        may bind a loop variable as a default, which `Callable[[ExecutorReport], bool]`
        would refuse)."""
        started = time.perf_counter()
        while not predicate(self.executor.report()):
            if time.perf_counter() - started > timeout:
                report = self.executor.report()
                states = Counter(t.state for t in report.tasks.values())
                odd = [t for t in report.tasks.values() if t.state != states.most_common(1)[0][0]]
                raise SystemExit(
                    f"benchmark stuck: tasks {dict(states)}, e.g. {odd[:3]}; "
                    f"{len(report.ready_instances)} ready, lost {report.lost_instances}"
                )
            time.sleep(0.01)
        return time.perf_counter() - started

    def close(self) -> None:
        self.executor.close()
        with futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda a: a.close(grace_s=0), self.agents))
        self.server.stop(None)


@contextmanager
def s3_or_directory(work: Path) -> Iterator[tuple[str, dict[str, Any], str]]:
    """S3 on moto_server when moto is installed, else a directory."""
    try:
        import boto3
        import moto.server  # noqa: F401
    except ImportError:
        yield f"file://{work}/storage", {}, "a directory (moto not installed)"
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        options: dict[str, Any] = {
            "endpoint_url": url,
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "region_name": "us-east-1",
        }
        boto3.client("s3", **options).create_bucket(Bucket="bench")
        yield "s3://bench/cluster", options, "S3 on moto_server (HTTP on 127.0.0.1)"
    finally:
        server.terminate()
        server.wait(timeout=10)


# -- part 1 ------------------------------------------------------------------------------------


def migration_cycle(scratch: Path, cycles: int) -> None:
    try:
        import docker

        from executor.images import ensure_python_image
        from executor.runtime import DockerRuntime

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        print(f"part 1 skipped: no Docker engine answers ({exc})\n")
        return
    ensure_python_image(client)
    runtime = DockerRuntime()
    with s3_or_directory(scratch) as (url, options, where):
        print(f"part 1: migration cycles on Docker, storage {where}", flush=True)
        daemon = Daemon(url, options, scratch / "workers")
        try:
            rows = _cycles(daemon, runtime, scratch, cycles)
        finally:
            daemon.close()
            for instance in ("bench-a", "bench-b"):
                for info in runtime.containers({LABEL_INSTANCE: instance}):
                    runtime.remove(info.container_id)
    print(rows)


def _cycles(daemon: Daemon, runtime: ContainerRuntime, scratch: Path, cycles: int) -> str:
    storage = open_storage(daemon.storage_url, **daemon.storage_options)
    context_dir = scratch / "context"
    shutil.copytree(JOB, context_dir)
    shutil.copy(REPO / "executor" / "reporter.py", context_dir / "reporter.py")
    (context_dir / "nonce").write_text(str(time.time_ns()))  # built in cycle 1, not before
    context = upload_context(storage, context_dir)
    agents = ("bench-a", "bench-b")
    for name in agents:
        daemon.agent(name, runtime, throughput_window_s=1.0, stop_grace_s=5.0)
    daemon.until(lambda r: set(agents) <= r.ready_instances)
    task, checkpoint = "bench/trainer", None
    samples: dict[str, list[float]] = {}
    for cycle in range(1, cycles + 1):
        where = agents[(cycle - 1) % 2]
        launch = TaskLaunch(
            task, "bench", cycle, where, "bench_trainer",
            TaskRun(build_context=context, env=(("STEP_S", "0.01"),)),
            ResourceLimits(cpus=0.5, memory_gb=0.25), checkpoint,
        )  # fmt: skip
        daemon.executor.start(launch)
        launch_s = daemon.until(  # the job's first iteration is in a report
            lambda r, c=cycle: r.tasks[task].attempt == c and "init" in r.tasks[task].phases
        )
        base = daemon.executor.report().tasks[task].progress
        daemon.until(lambda r, base=base: r.tasks[task].progress > base + 20)  # it works
        started = time.perf_counter()
        daemon.executor.stop(task, cycle)
        daemon.until(lambda r: r.tasks[task].state in ("stopped", "failed"))
        checkpoint_s = time.perf_counter() - started
        stopped = daemon.executor.report().tasks[task]
        if stopped.state != "stopped":
            raise SystemExit(f"cycle {cycle}: {stopped.reason}")
        checkpoint = stopped.checkpoint
        daemon.executor.acknowledge(task, cycle)
        phases = stopped.phases
        agent_launch = sum(phases.get(p, 0.0) for p in ("fetch", "build", "start", "init"))
        measured = {
            **phases,
            "launch (agent)": agent_launch,
            "launch (daemon)": launch_s,
            "checkpoint (daemon)": checkpoint_s,
        }
        for phase, seconds in measured.items():
            samples.setdefault(phase, []).append(seconds)
        print(
            f"  cycle {cycle} on {where}: launch {launch_s:.2f} s, checkpoint {checkpoint_s:.2f} s",
            flush=True,
        )
    order = ["fetch", "build", "start", "init", "launch (agent)", "launch (daemon)",
             "checkpoint", "upload", "checkpoint (daemon)"]  # fmt: skip
    rows = []
    for phase in order:
        values = samples.get(phase, [])
        cold = values[0] if values else None
        warm = values[1:] if phase != "build" else []
        reference = EVA_TABLE_1.get(phase.split(" ")[0]) if "(" in phase else None
        rows.append(
            [
                phase,
                "-" if cold is None else f"{cold:.2f}",
                f"{statistics.median(warm):.2f}" if warm else "-",
                f"{reference[0]:.0f} ({reference[1]})" if reference else "",
            ]
        )
    note = (
        "\n  cycle 1 builds the image (Docker's layer cache may still help); later cycles\n"
        "  find it built (content-addressed) and"
        " fetch only the checkpoint. launch (agent) =\n"
        "  fetch + build + start + init (to the"
        " job's first iteration); launch (daemon) =\n"
        "  start() → that iteration in a report"
        " (jobs are polled every second). checkpoint =\n"
        "  the agent's stop → container exit;"
        " checkpoint (daemon) = stop() → the uploaded\n"
        "  checkpoint in a report.\n"
    )
    return (
        format_table(
            ["phase (s)", "cycle 1", "median after", "Eva Table 1 avg (range)"],
            rows,
            [False, True, True, True],
        )
        + note
    )


# -- part 2 ------------------------------------------------------------------------------------


def report_round(scratch: Path, count: int, per_agent: int) -> None:
    from executor.simulated import SimulatedRuntime

    print(f"part 2: {count} agents (simulated containers), {count * per_agent} tasks", flush=True)
    storage_dir = scratch / "sim-storage"
    daemon = Daemon(f"file://{storage_dir}", {}, scratch / "sim-workers")
    try:
        context_dir = scratch / "sim-context"
        context_dir.mkdir()
        (context_dir / "Dockerfile").write_text("FROM scratch\n")
        context = upload_context(open_storage(f"file://{storage_dir}"), context_dir)
        names = [f"sim-{i:03d}" for i in range(count)]
        started = time.perf_counter()
        with futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: daemon.agent(n, SimulatedRuntime(), throughput_window_s=1),
                          names))  # fmt: skip
        daemon.until(lambda r: len(r.ready_instances) == count)
        register_s = time.perf_counter() - started
        tasks = [(f"sim{i}/t{k}", name) for i, name in enumerate(names) for k in range(per_agent)]
        started = time.perf_counter()
        for task, name in tasks:
            daemon.executor.start(
                TaskLaunch(task, task.split("/")[0], 1, name, "sim",
                           TaskRun(build_context=context, env=(("STEP_S", "0.01"),)),
                           ResourceLimits(cpus=1, memory_gb=1))
            )  # fmt: skip
        start_calls_s = time.perf_counter() - started
        daemon.until(lambda r: all(r.tasks[t].state == "running" for t, _ in tasks))
        running_s = time.perf_counter() - started
        reports = []
        for _ in range(50):
            began = time.perf_counter()
            report = daemon.executor.report()
            reports.append(time.perf_counter() - began)
        assert len(report.tasks) == len(tasks)
        throughput_s = daemon.until(
            lambda r: all(r.tasks[t].throughput is not None for t, _ in tasks)
        )
        started = time.perf_counter()
        for task, _ in tasks:
            daemon.executor.stop(task, 1)
        daemon.until(lambda r: all(r.tasks[t].state == "stopped" for t, _ in tasks))
        stopped_s = time.perf_counter() - started
        stops = daemon.executor.report()
        assert all(stops.tasks[t].checkpoint for t, _ in tasks)
    finally:
        daemon.close()
    n = len(tasks)
    rows = [
        [f"{count} agents enroll (secret checked, CSR signed, mutual TLS)", f"{register_s:.2f}"],
        [f"{n} start() calls return", f"{start_calls_s:.3f}"],
        [f"{n} tasks running in report()", f"{running_s:.2f}"],
        [f"report() over {count} agents, {n} tasks (median)", f"{statistics.median(reports):.4f}"],
        ["… and its slowest of 50", f"{max(reports):.4f}"],
        [f"all {n} throughputs known (1 s window)", f"{throughput_s:.2f}"],
        [f"{n} stops → all checkpointed and stopped", f"{stopped_s:.2f}"],
    ]
    print(format_table(["report round", "seconds"], rows, [False, True]))
    print(
        "  report() reads the last heartbeat of every worker (pushed, event-driven): it never\n"
        "  waits on the network, however many agents there are.\n"
    )
