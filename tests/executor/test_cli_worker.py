"""`autoscaler worker`: its flags, its one-line errors, and the token read from SSM (moto)."""

from __future__ import annotations

import subprocess
import sys

import boto3
import pytest
from moto import mock_aws

from app.cli import build_parser
from autoscaler.resources import Resources
from executor.cli import detect_machine, read_ssm_token
from executor.security import SecretError, write_secret


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
    token = tmp_path / "token"
    write_secret(token, "s3cret-token")
    return ca, token


def test_the_flags_the_bootstrap_and_the_local_cloud_use():
    args = build_parser().parse_args(
        [
            "worker", "--daemon", "10.0.0.1:7443", "--ca", "/etc/ca.pem",
            "--token-ssm", "/cluster/worker-token", "--instance-id", "inst-7",
            "--docker", "unix:///run/docker.sock", "--work-dir", "/srv/w",
            "--listen", "0.0.0.0:7444", "--advertise", "10.0.0.9", "--capacity", "1,4,15.5",
        ]
    )  # fmt: skip
    assert args.func.__name__ == "cmd_worker"
    assert (args.daemon, args.token_ssm, args.instance_id) == (
        "10.0.0.1:7443",
        "/cluster/worker-token",
        "inst-7",
    )
    assert args.capacity == Resources(1, 4, 15.5) and args.token_file is None


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
    args = ["--daemon", "127.0.0.1:1", "--ca", str(ca), "--token-file", str(token), *extra]
    result = worker(*args, env=env)
    assert result.returncode == 2
    # One line says what is wrong.
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoscaler") and message in lines[0], lines
    assert "Traceback" not in result.stderr


def test_a_token_file_others_may_read_is_refused_and_the_token_never_printed(files):
    ca, token = files
    token.chmod(0o644)
    result = worker(
        "--daemon", "127.0.0.1:1", "--ca", str(ca), "--token-file", str(token),
        "--instance-id", "inst-1",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"autoscaler worker: error: {token}: mode 644 lets others read a secret; chmod 600 it"
    )
    assert "s3cret-token" not in result.stderr + result.stdout


def test_no_docker_engine_is_a_clear_error(files):
    ca, token = files
    result = worker(
        "--daemon", "127.0.0.1:1", "--ca", str(ca), "--token-file", str(token),
        "--instance-id", "inst-1", "--docker", "unix:///nonexistent/docker.sock",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(
        "autoscaler worker: error: cannot reach the Docker engine at unix:///nonexistent"
    )


def test_the_token_from_an_ssm_secure_string():
    with mock_aws():
        ssm = boto3.client("ssm", region_name="us-east-1")
        ssm.put_parameter(Name="/c/worker-token", Value="tok-123\n", Type="SecureString")
        assert read_ssm_token("/c/worker-token", region="us-east-1") == "tok-123"
        with pytest.raises(SecretError, match=r"SSM parameter /c/missing: ParameterNotFound"):
            read_ssm_token("/c/missing", region="us-east-1")


def test_the_machine_is_measured_in_physical_cores():
    machine = detect_machine()
    assert machine.physical_cores >= 1 and machine.logical_cpus >= machine.physical_cores
    assert machine.threads_per_core == machine.logical_cpus / machine.physical_cores
    assert machine.capacity.cpu == machine.physical_cores and machine.capacity.ram_gb > 0
