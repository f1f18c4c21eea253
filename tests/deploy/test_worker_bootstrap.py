"""The worker bootstrap as the daemon renders it for a cluster `autoscaler init` made:
what `app.wiring.worker_bootstrap` publishes (the wheelhouse to S3, against moto) and
the user data of one launch — valid bash, carrying the daemon's advertised address and
the cluster's server CA, and no secret of the cluster (nor any name of one)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from app.config import load_cluster_config
from app.init import init_cluster
from app.wiring import worker_bootstrap
from autoscaler.errors import InputError
from provisioners.wheelhouse import pack, requirements_text

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
BUCKET = "research-batch-artifacts"
WHEEL = "ec2_batch_autoscaler_worker-0.1.0-py3-none-any.whl"


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield


def cluster(tmp_path: Path, *, advertise: str | None) -> Path:
    """`autoscaler init --bucket ...`, then what deploy/README.md says to set for EC2."""
    directory = tmp_path / "cluster"
    config = init_cluster(directory, name="research-batch", bucket=BUCKET).config
    (directory / "wheelhouse").mkdir()
    (directory / "wheelhouse" / WHEEL).write_bytes(b"PK\x03\x04 the worker agent")
    (directory / "wheelhouse" / "requirements.txt").write_text(
        requirements_text(directory / "wheelhouse")
    )
    text = config.read_text()
    text = text.replace("[cloud]\n", '[cloud]\nwheelhouse = "wheelhouse"\n', 1)
    # the API's port as init chose it (the next free one when another cluster holds 7443)
    text, listening = re.subn(
        r'listen = "127\.0\.0\.1:(\d+)"', r'listen = "0.0.0.0:\1"', text, count=1
    )
    assert listening == 1
    if advertise:
        text = text.replace("[api]\n", f'[api]\nadvertise = "{advertise}"\n', 1)
    config.write_text(text)
    return config


def test_user_data_carries_the_advertised_address_and_ca_and_no_secret(tmp_path):
    config = load_cluster_config(cluster(tmp_path, advertise="10.0.7.5:7443"))
    bootstrap = worker_bootstrap(config)
    user_data = bootstrap.render("research-batch-1")

    # Valid bash, whose variables hold exactly the daemon's address and the cluster's CA.
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    assert subprocess.run([bash, "-n"], input=user_data, text=True).returncode == 0
    header = user_data.split("# Tests run the script", 1)[0]
    shown = subprocess.run(
        [
            bash,
            "-c",
            header + 'printf "%s\\n%s" "$DAEMON_ADDRESS" "$CA_PEM"',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    address, ca = shown.split("\n", 1)
    secrets = config.secrets
    assert address == "10.0.7.5:7443"
    assert ca == secrets.ca_cert.read_text().strip()

    # The server CA only: the worker CA is the daemon's to sign with, not the worker's to trust.
    assert secrets.worker_ca_cert.read_text().strip() not in user_data

    # No secret of the cluster: not the API token, not a private key; nor a worker token
    # anywhere (the worker proves its instance with its identity document).
    for secret in (secrets.api_token, secrets.ca_key, secrets.server_key, secrets.worker_ca_key):
        value = secret.read_text().strip()
        assert value and value not in user_data, secret.name
    assert not boto3.client("ssm", region_name=REGION).describe_parameters()["Parameters"]

    # The agent: the wheelhouse the config names, published under its hash, fetched by a
    # URL made for this launch; the failure report goes under the cluster's prefix.
    _, digest = pack(config.path.parent / "wheelhouse")
    assert f"WHEELHOUSE_SHA256={digest}\n" in user_data
    key = f"research-batch/wheelhouse/{digest}.tar"
    assert boto3.client("s3", region_name=REGION).head_object(Bucket=BUCKET, Key=key)
    assert f"WHEELHOUSE_URL={shlex.quote(bootstrap.wheelhouse_url())}".split("?")[0] in user_data
    assert "research-batch/instances/research-batch-1/bootstrap-report.txt" in user_data


@pytest.mark.parametrize(("interval", "window"), [(None, "300"), ("60", "60"), ("900", "300")])
def test_workers_measure_throughput_over_one_round_of_the_cluster(tmp_path, interval, window):
    # As the local cloud's workers do: rounds every minute learn from one-minute windows;
    # long rounds still hear within the default period.
    path = cluster(tmp_path, advertise="10.0.7.5:7443")
    if interval is not None:
        text = path.read_text()
        assert "\ninterval_s = " in text
        path.write_text(
            "\n".join(
                f"interval_s = {interval}" if line.startswith("interval_s = ") else line
                for line in text.splitlines()
            )
        )
    user_data = worker_bootstrap(load_cluster_config(path)).render("research-batch-1")
    assert f"\nTHROUGHPUT_WINDOW={window}\n" in user_data
    assert "--throughput-window ${THROUGHPUT_WINDOW}" in user_data


def test_a_daemon_listening_everywhere_must_say_where_workers_reach_it(tmp_path):
    config = load_cluster_config(cluster(tmp_path, advertise=None))
    with pytest.raises(InputError, match=r"\[api\]: field 'listen' = '0\.0\.0\.0:\d+'.*advertise"):
        worker_bootstrap(config)
    # deploy/compose/autoscaler.toml leaves `advertise` for the operator: refused, not rendered.
    compose = load_cluster_config(ROOT / "deploy" / "compose" / "autoscaler.toml")
    with pytest.raises(InputError, match="set \\[api\\] advertise"):
        worker_bootstrap(compose)
    assert not boto3.client("ssm", region_name=REGION).describe_parameters()["Parameters"]
