"""`autoscaler-worker` (also `autoscaler worker`): the worker agent of one instance.

    autoscaler-worker --daemon HOST:PORT --ca FILE (--imds [URL] | --enrollment-secret FILE)
        [--instance-id ID] [--docker URL] [--work-dir DIR] [--capacity GPU,CPU,RAM_GB]
        [--stop-tasks] [--orphan-timeout S] [--orphan-max S] [--shutdown-command CMD]
        [--imds-url URL] [--notice-poll S]

The instance id is ours (the launch token), from `--instance-id` or
`AUTOSCALER_INSTANCE_ID`, which the launcher writes (EC2 user data, or the
local cloud); it is never guessed. The agent proves it is that instance when it
enrolls: on EC2 with the signed identity document from the instance metadata
service (`--imds`), on the local cloud with the one-time secret the cloud left
in its directory (`--enrollment-secret`). It holds no token and no cloud
credentials, and listens on no port: it dials the daemon. It runs until SIGTERM
or SIGINT; its containers keep running and the next agent of the instance
adopts them — or, with `--stop-tasks` (what `down` and an instance's shutdown
want), are checkpointed and stopped first. Without a daemon for too long it
stops its instance (`--orphan-timeout`, `--orphan-max`, `--shutdown-command`).
It polls the metadata service for spot interruption notices (`--imds`, or the
local cloud's stand-in at `--imds-url`; every `--notice-poll` seconds): on one
it checkpoints and stops its tasks within the two-minute window and tells the
daemon.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.resources import Resources

INSTANCE_ENV = "AUTOSCALER_INSTANCE_ID"
#: Where IMDS answers on EC2, and the daemon certificate's fixed name (kept here as text:
#: the flags are parsed before the agent's modules are imported).
IMDS_ENDPOINT = "http://169.254.169.254"
DAEMON_NAME = "autoscaler-daemon"
DEFAULT_WORK_DIR = "/var/lib/autoscaler-worker"
#: How an EC2 instance stops itself (its shutdown behaviour decides: stop or terminate).
EC2_SHUTDOWN = "shutdown -h now"


DESCRIPTION = (
    "Run the worker agent: enroll with the daemon, heart-beat, and build, "
    "run, checkpoint and stop the task containers the daemon places on this instance."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `worker` command to the `autoscaler` command line."""
    worker = subparsers.add_parser(
        "worker",
        help="run the worker agent of this instance (enrolls with the daemon, runs tasks)",
        description=DESCRIPTION,
    )
    add_arguments(worker)


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line (exit 2), as everywhere else."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """`autoscaler-worker` (or `python -m executor`): the agent alone, without the
    planner's dependencies, which an instance does not install."""
    parser = _Parser(prog="autoscaler-worker", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("autoscaler-worker: interrupted", file=sys.stderr)
        return 130


def add_arguments(worker: argparse.ArgumentParser) -> None:
    """The worker's flags, on `autoscaler worker` and on `autoscaler-worker` alike."""
    worker.add_argument(
        "--daemon",
        required=True,
        metavar="HOST:PORT",
        type=_address,
        help="the daemon's API address, where the worker enrolls",
    )
    worker.add_argument(
        "--ca",
        required=True,
        type=Path,
        metavar="FILE",
        help="the cluster's server CA certificate (PEM): the daemon must present a "
        "certificate it signed",
    )
    proof = worker.add_mutually_exclusive_group(required=True)
    proof.add_argument(
        "--imds",
        nargs="?",
        const=IMDS_ENDPOINT,
        metavar="URL",
        help="prove the instance with its signed identity document from the instance "
        f"metadata service (EC2; default endpoint {IMDS_ENDPOINT})",
    )
    proof.add_argument(
        "--enrollment-secret",
        type=Path,
        metavar="FILE",
        help="prove the instance with the one-time secret in FILE (mode 0600; the local cloud)",
    )
    worker.add_argument(
        "--instance-id",
        default=None,
        metavar="ID",
        help=f"this instance's id in the cluster (default: ${INSTANCE_ENV})",
    )
    worker.add_argument(
        "--docker",
        default=None,
        metavar="URL",
        help="Docker engine URL, e.g. unix:///var/run/docker.sock "
        "(default: DOCKER_HOST, else the default socket)",
    )
    worker.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="checkpoints and contexts in transit "
        f"(default: {DEFAULT_WORK_DIR}/INSTANCE_ID, so agents sharing a host never mix)",
    )
    worker.add_argument(
        "--capacity",
        default=None,
        metavar="GPU,CPU,RAM_GB",
        type=_capacity,
        help="resources to advertise: GPUs, physical cores, GiB (default: what this machine has)",
    )
    worker.add_argument(
        "--daemon-name",
        default=DAEMON_NAME,
        metavar="NAME",
        help=f"the name the daemon's certificate must carry (default: {DAEMON_NAME})",
    )
    worker.add_argument(
        "--checkpoint-wait",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long a job may take to acknowledge a checkpoint request "
        "before SIGTERM (default: 10)",
    )
    worker.add_argument(
        "--stop-grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="after SIGTERM, before SIGKILL (default: 30)",
    )
    worker.add_argument(
        "--throughput-window",
        type=_seconds,
        default=ROUND_INTERVAL_S,
        metavar="SECONDS",
        help=f"jobs report throughput over this window (default: {ROUND_INTERVAL_S:g})",
    )
    worker.add_argument(
        "--stop-tasks",
        action="store_true",
        help="on SIGTERM, ask each task to checkpoint and stop (bounded by its grace) before "
        "the agent exits (for `down` and an instance's shutdown); without it, containers "
        "keep running for the next agent of the instance to adopt",
    )
    worker.add_argument(
        "--orphan-timeout",
        type=_seconds_or_zero,
        default=1800.0,
        metavar="SECONDS",
        help="with no task running and no word from the daemon this long, stop the "
        "instance (default: 1800; 0: never)",
    )
    worker.add_argument(
        "--orphan-max",
        type=_seconds_or_zero,
        default=7200.0,
        metavar="SECONDS",
        help="with tasks running and no word from the daemon this long, checkpoint them "
        "(kept on local disk if they cannot be uploaded) and stop the instance "
        "(default: 7200; 0: never)",
    )
    worker.add_argument(
        "--shutdown-command",
        default=None,
        metavar="CMD",
        help="what stops the instance (a command line, split like a shell would; default: "
        f"'{EC2_SHUTDOWN}' with --imds, else nothing: the agent ends its containers and "
        "itself)",
    )
    worker.add_argument(
        "--job-watchdog",
        type=_seconds_or_zero,
        default=None,
        metavar="SECONDS",
        help="a job its agent has not polled this long checkpoints and stops itself "
        "(default: twice the daemon's heartbeat timeout; 0: never)",
    )
    worker.add_argument(
        "--imds-url",
        default=None,
        metavar="URL",
        help="poll this instance metadata service for spot interruption notices and "
        "rebalance recommendations (default: the --imds endpoint; none with "
        "--enrollment-secret unless given: the local cloud passes its stand-in's)",
    )
    worker.add_argument(
        "--notice-poll",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="how often to ask for a notice (default: 5, as AWS recommends)",
    )
    worker.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config, runtime = _prepare(args)
    except WorkerSetupError as exc:
        print(f"autoscaler worker: error: {exc}", file=sys.stderr)
        return 2
    from executor.agent import Agent, AgentError

    agent = Agent(config, runtime)
    try:
        agent.serve()
    except AgentError as exc:
        print(f"autoscaler worker: error: {exc}", file=sys.stderr)
        return 1
    stop_tasks = bool(args.stop_tasks)

    def shut_down(signum: int, frame: Any) -> None:
        how = "stopping its tasks first" if stop_tasks else "containers keep running"
        logging.getLogger(__name__).info("signal %d: stopping (%s)", signum, how)
        # Not in the handler: stopping tasks takes their grace, and a handler returns at once.
        threading.Thread(target=agent.close, kwargs={"stop_tasks": stop_tasks}).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    agent.wait()
    agent.close()
    if agent.stopped_instance:
        logging.getLogger(__name__).warning("stopped the instance: %s", agent.stopped_instance)
    return 0


class WorkerSetupError(ValueError):
    """A flag, file or service the worker needs is wrong; one line says which and why."""


def _prepare(args: argparse.Namespace) -> tuple[Any, Any]:
    from executor.agent import AgentConfig
    from executor.enrollment import EnrollmentRefused, read_secret_file
    from executor.messages import INSTANCE_ID
    from executor.runtime import DockerRuntime, RuntimeFailure
    from executor.security import SecretError

    instance_id = args.instance_id or os.environ.get(INSTANCE_ENV, "")
    if not instance_id:
        raise WorkerSetupError(f"no instance id: pass --instance-id or set {INSTANCE_ENV}")
    if not INSTANCE_ID.fullmatch(instance_id):
        raise WorkerSetupError(
            f"instance id {instance_id!r}: letters, digits and . _ : - only (at most 128)"
        )
    try:
        ca_pem = args.ca.read_bytes()
    except OSError as exc:
        raise WorkerSetupError(
            f"{args.ca}: cannot read the CA certificate: {exc.strerror}"
        ) from None
    if b"BEGIN CERTIFICATE" not in ca_pem:
        raise WorkerSetupError(f"{args.ca}: not a PEM certificate")
    if args.enrollment_secret is not None:
        try:
            read_secret_file(args.enrollment_secret)  # readable, and only by its owner
        except (SecretError, EnrollmentRefused) as exc:
            raise WorkerSetupError(str(exc)) from None
    machine = detect_machine()
    capacity = args.capacity or machine.capacity
    try:
        runtime = DockerRuntime(args.docker, gpu_devices=machine.gpu_devices)
    except RuntimeFailure as exc:
        raise WorkerSetupError(str(exc)) from None
    config = AgentConfig(
        instance_id=instance_id,
        daemon=args.daemon,
        ca_pem=ca_pem,
        work_dir=args.work_dir or Path(DEFAULT_WORK_DIR) / instance_id,
        capacity=capacity,
        enrollment_secret=args.enrollment_secret,
        imds_endpoint=args.imds or IMDS_ENDPOINT,
        daemon_server_name=args.daemon_name,
        threads_per_core=machine.threads_per_core,
        host_cpus=machine.logical_cpus,
        gpu_devices=machine.gpu_devices,
        checkpoint_wait_s=args.checkpoint_wait,
        stop_grace_s=args.stop_grace,
        throughput_window_s=args.throughput_window,
        job_watchdog_s=args.job_watchdog,
        orphan_timeout_s=args.orphan_timeout,
        orphan_max_s=args.orphan_max,
        shutdown_command=_shutdown_command(args),
        notice_endpoint=args.imds_url or args.imds or "",
        notice_interval_s=args.notice_poll,
    )
    return config, runtime


def _shutdown_command(args: argparse.Namespace) -> tuple[str, ...]:
    if args.shutdown_command is None:
        return tuple(shlex.split(EC2_SHUTDOWN)) if args.imds else ()
    try:
        return tuple(shlex.split(args.shutdown_command))
    except ValueError as exc:
        raise WorkerSetupError(f"--shutdown-command: {exc}") from None


class Machine:
    """What this machine has: GPUs, physical cores, RAM; and how Docker counts CPUs."""

    def __init__(
        self, gpu_devices: int, physical_cores: int, logical_cpus: int, memory_gb: float
    ) -> None:
        self.gpu_devices = gpu_devices
        self.physical_cores = max(physical_cores, 1)
        self.logical_cpus = max(logical_cpus, 1)
        self.memory_gb = memory_gb

    @property
    def threads_per_core(self) -> float:
        return self.logical_cpus / self.physical_cores

    @property
    def capacity(self) -> Resources:
        return Resources(float(self.gpu_devices), float(self.physical_cores), self.memory_gb)


def detect_machine() -> Machine:
    logical = sorted(os.sched_getaffinity(0))
    cores = set()
    for cpu in logical:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            package, core = "0", str(cpu)
        cores.add((package, core))
    memory_gb = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    gpus = len(list(Path("/dev").glob("nvidia[0-9]*")))
    return Machine(gpus, len(cores), len(logical), round(memory_gb, 2))


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    return text


def _capacity(text: str) -> Resources:
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or any(not v >= 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(
            f"must be GPU,CPU,RAM_GB (three non-negative numbers), got {text!r}"
        )
    return Resources.of(values)


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value
