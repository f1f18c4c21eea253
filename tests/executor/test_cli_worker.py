"""`autoscaler worker`: its flags and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli import build_parser
from autoscaler.resources import Resources
from executor.cli import detect_machine
from executor.security import write_secret


def worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "executor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture
def files(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    secret = tmp_path / "secret"
    write_secret(secret, "s3cret-one-time")
    return ca, secret


def test_the_flags_the_bootstrap_and_the_local_cloud_use():
    args = build_parser().parse_args(
        [
            "worker", "--daemon", "10.0.0.1:7443", "--ca", "/etc/ca.pem",
            "--imds", "--instance-id", "inst-7",
            "--docker", "unix:///run/docker.sock", "--work-dir", "/srv/w",
            "--capacity", "1,4,15.5",
        ]
    )  # fmt: skip
    assert args.func.__name__ == "cmd_worker"
    assert (args.daemon, args.imds, args.instance_id) == (
        "10.0.0.1:7443",
        "http://169.254.169.254",
        "inst-7",
    )
    assert args.capacity == Resources(1, 4, 15.5) and args.enrollment_secret is None
    assert args.daemon_name == "autoscaler-daemon"  # what the daemon's certificate names
    local = build_parser().parse_args(
        ["worker", "--daemon", "127.0.0.1:7443", "--ca", "ca.pem", "--enrollment-secret", "s"]
    )
    assert str(local.enrollment_secret) == "s" and local.imds is None


@pytest.mark.parametrize(
    ("extra", "env_instance", "message"),
    [
        ([], None, "no instance id: pass --instance-id or set AUTOSCALER_INSTANCE_ID"),
        (["--instance-id", "../etc"], None, "instance id '../etc': letters, digits and"),
        (["--capacity", "1,2"], "inst-1", "must be GPU,CPU,RAM_GB (three non-negative numbers)"),
        (["--daemon", "nohost"], "inst-1", "must be HOST:PORT, got 'nohost'"),
    ],
)
def test_bad_input_gets_a_one_line_error(files, tmp_path, extra, env_instance, message):
    ca, token = files
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"}
    if env_instance:
        env["AUTOSCALER_INSTANCE_ID"] = env_instance
    args = ["--daemon", "127.0.0.1:1", "--ca", str(ca), "--enrollment-secret", str(token), *extra]
    result = worker(*args, env=env)
    assert result.returncode == 2
    # One line says what is wrong.
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoscaler") and message in lines[0], lines
    assert "Traceback" not in result.stderr


def test_a_secret_file_others_may_read_is_refused_and_the_secret_never_printed(files):
    ca, secret = files
    secret.chmod(0o644)
    result = worker(
        "--daemon", "127.0.0.1:1", "--ca", str(ca), "--enrollment-secret", str(secret),
        "--instance-id", "inst-1",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"autoscaler worker: error: {secret}: mode 644 lets others read a secret; chmod 600 it"
    )
    assert "s3cret-one-time" not in result.stderr + result.stdout


def test_a_proof_of_the_instance_is_required():
    result = worker("--daemon", "127.0.0.1:1", "--ca", "ca.pem", "--instance-id", "inst-1")
    assert result.returncode == 2
    assert "one of the arguments --imds --enrollment-secret is required" in result.stderr


def test_no_docker_engine_is_a_clear_error(files):
    ca, token = files
    result = worker(
        "--daemon", "127.0.0.1:1", "--ca", str(ca), "--enrollment-secret", str(token),
        "--instance-id", "inst-1", "--docker", "unix:///nonexistent/docker.sock",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(
        "autoscaler worker: error: cannot reach the Docker engine at unix:///nonexistent"
    )


def test_the_machine_is_measured_in_physical_cores():
    machine = detect_machine()
    assert machine.physical_cores >= 1 and machine.logical_cpus >= machine.physical_cores
    assert machine.threads_per_core == machine.logical_cpus / machine.physical_cores
    assert machine.capacity.cpu == machine.physical_cores and machine.capacity.ram_gb > 0


def test_the_spend_brake_watchdog_and_stop_flags():
    from executor.cli import _shutdown_command

    base = ["worker", "--daemon", "10.0.0.1:7443", "--ca", "ca.pem"]
    ec2 = build_parser().parse_args([*base, "--imds"])
    assert (ec2.orphan_timeout, ec2.orphan_max, ec2.job_watchdog) == (1800.0, 7200.0, None)
    assert not ec2.stop_tasks
    assert _shutdown_command(ec2) == ("shutdown", "-h", "now")  # EC2: the instance goes
    local = build_parser().parse_args([*base, "--enrollment-secret", "s"])
    assert _shutdown_command(local) == ()  # the local cloud: the agent ends its containers
    told = build_parser().parse_args(
        [
            *base, "--imds", "--orphan-timeout", "0", "--orphan-max", "600",
            "--job-watchdog", "90", "--stop-tasks",
            "--shutdown-command", "systemctl poweroff --message 'no daemon'",
        ]
    )  # fmt: skip
    assert (told.orphan_timeout, told.orphan_max, told.job_watchdog) == (0.0, 600.0, 90.0)
    assert told.stop_tasks
    assert _shutdown_command(told) == ("systemctl", "poweroff", "--message", "no daemon")
