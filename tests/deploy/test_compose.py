"""deploy/compose.yaml, read as Compose reads it and checked against what it runs: the
configuration files it mounts (each one `autoscaler init` writes, changed only where it
says `compose:`, and loaded by the project's loader), the command line it calls, the
database it points to, the ports it publishes and the endpoint the demo's AWS calls go to.

Compose itself is not run here (no registry for postgres and moto images); the daemon's
image is built and run by test_image.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from app.cli import build_parser
from app.config import ClusterConfig, load_cluster_config
from app.init import config_template
from provisioners.aws import make_client
from tests.deploy.test_image import VERSION, WHEELHOUSE

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DAEMON_IMAGE_CMD = ["daemon", "--config", "/etc/autoscaler/autoscaler.toml"]  # the Dockerfile's

#: What each configuration file changes from `autoscaler init`'s, and nothing else.
COMPOSE_EDITS = {
    "autoscaler.toml": {
        "cloud.wheelhouse",
        "api.listen",
        "metrics.listen",
        "dashboard.listen",
        "state.path",
        "state.url",
    },
    "demo.toml": {
        "cloud.wheelhouse",
        "api.listen",
        "api.advertise",
        "metrics.listen",
        "dashboard.listen",
        "state.path",
        "state.url",
        "ec2.subnet_ids",
        "ec2.security_group_ids",
        "ec2.iam_instance_profile",
    },
}
#: The daemon service of each profile, and the file it runs with.
DAEMONS = {"daemon": ("aws", "autoscaler.toml"), "daemon-demo": ("demo", "demo.toml")}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only), from the short volume syntax."""
    found = {}
    for entry in service.get("volumes", []):
        source, target, *options = entry.split(":")
        found[target] = (source, "ro" in options)
    return found


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    leaves = {}
    for key, value in table.items():
        if isinstance(value, dict):
            leaves.update(flatten(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def init_arguments(text: str) -> tuple[str, str | None]:
    """The --name and --bucket the file's first line says `autoscaler init` ran with."""
    first = text.splitlines()[0]
    match = re.search(r"`autoscaler init --name (\S+)(?: --bucket (\S+))?`", first)
    assert match, first
    return match.group(1), match.group(2)


def mounted_config(compose: dict[str, Any], name: str) -> tuple[ClusterConfig, dict[str, Any]]:
    """The configuration the service `name` runs with, loaded by the project's loader."""
    service = compose["services"][name]
    source, read_only = mounts(service)["/etc/autoscaler/autoscaler.toml"]
    assert read_only
    path = (DEPLOY / source).resolve()
    return load_cluster_config(path), service


@pytest.mark.parametrize("file", sorted(COMPOSE_EDITS))
def test_each_configuration_is_inits_with_only_the_compose_edits(file, tmp_path):
    text = (DEPLOY / "compose" / file).read_text()
    name, bucket = init_arguments(text)
    written = config_template(name, tmp_path, local=False, region="us-east-1", bucket=bucket)
    ours, inits = flatten(tomllib.loads(text)), flatten(tomllib.loads(written))
    changed = {k for k in ours.keys() | inits.keys() if ours.get(k, ...) != inits.get(k, ...)}
    assert changed == COMPOSE_EDITS[file]
    # Each changed line says so (a reader finds every departure from init's file).
    for key in changed - {"state.path"}:
        table, _, field = key.partition(".")
        section = text.split(f"[{table}]", 1)[1].split("\n[", 1)[0]
        line = next(i for i, ln in enumerate(section.splitlines()) if ln.startswith(f"{field} ="))
        nearby = section.splitlines()[max(0, line - 2) : line + 1]
        assert any("compose:" in ln for ln in nearby), (file, key)


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_each_daemon_runs_a_loadable_config_with_its_secrets_read_only(compose, name):
    profile, file = DAEMONS[name]
    config, service = mounted_config(compose, name)
    assert service["profiles"] == [profile]
    assert mounts(service)["/etc/autoscaler/autoscaler.toml"][0] == f"./compose/{file}"
    # The command line is ours: its flags parse, and it names the mounted file.
    args = build_parser().parse_args(service["command"])
    assert args.command == "daemon" and str(args.config) == "/etc/autoscaler/autoscaler.toml"
    assert service["command"][:3] == DAEMON_IMAGE_CMD
    # The secrets directory the file names (relative to it) is the secrets volume, read-only,
    # the one the `secrets` service writes; likewise the database password file.
    in_container = PurePosixPath("/etc/autoscaler") / config.raw["secrets"]["dir"]
    volume, read_only = mounts(service)[str(in_container)]
    assert read_only and mounts(compose["services"]["secrets"])[str(in_container)][0] == volume
    passfile = make_url(config.state.url).query["passfile"]
    db_dir = str(PurePosixPath(passfile).parent)
    assert mounts(service)[db_dir] == ("db", True)
    assert mounts(compose["services"]["secrets"])[db_dir] == ("db", False)
    assert f"> {PurePosixPath(passfile).name}" in compose["services"]["secrets"]["command"][0]
    # Only the state volume is writable, and the image's own wheelhouse is published.
    writable = [t for t, (_, ro) in mounts(service).items() if not ro]
    assert writable == ["/var/lib/autoscaler"] and service["read_only"] is True
    assert config.cloud.wheelhouse == WHEELHOUSE
    assert service["image"] == f"${{AUTOSCALER_IMAGE:-autoscaler/daemon:{VERSION}}}"
    assert service["stop_signal"] == "SIGTERM"


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_the_database_url_is_the_postgres_service_with_no_password_in_it(compose, name):
    config, service = mounted_config(compose, name)
    url = make_url(config.state.url)
    postgres = compose["services"]["postgres"]
    env = postgres["environment"]
    assert url.drivername == "postgresql+psycopg"
    assert url.host == "postgres" and url.host in compose["services"]
    assert (url.port, url.username, url.database) == (
        5432,
        env["POSTGRES_USER"],
        env["POSTGRES_DB"],
    )
    assert url.password is None
    assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}
    health = " ".join(postgres["healthcheck"]["test"])
    assert f"--username={url.username}" in health and f"--dbname={url.database}" in health
    # Postgres reads its password from the same volume, whose pgpass line names this database.
    password_file = PurePosixPath(env["POSTGRES_PASSWORD_FILE"])
    assert mounts(postgres)[str(password_file.parent)] == ("db", True)
    pgpass = compose["services"]["secrets"]["command"][0]
    assert f"'{url.host}:{url.port}:{url.database}:{url.username}:%s\\n'" in pgpass
    assert f"> {password_file.name}" in pgpass or f"mv password.new {password_file.name}" in pgpass


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_published_ports_are_the_listen_addresses_and_the_healthcheck_reads_metrics(compose, name):
    config, service = mounted_config(compose, name)
    api_host, _, api_port = config.api.listen.rpartition(":")
    worker_host, _, worker_port = config.worker_listen.rpartition(":")
    metrics_host, _, metrics_port = config.metrics.listen.rpartition(":")
    # Published ports reach the container only on an address it listens on from outside.
    assert api_host == worker_host == metrics_host == "0.0.0.0"
    published = {p.rsplit(":", 1)[1]: p for p in service["ports"]}
    assert set(published) == {api_port, worker_port, metrics_port}
    assert published[metrics_port].startswith("127.0.0.1:")  # metrics: this host only
    health = service["healthcheck"]["test"]
    assert health[0] == "CMD" and f"http://127.0.0.1:{metrics_port}/metrics" in health[-1]


def test_the_demo_sends_aws_calls_to_moto_and_the_ec2_provider_reads_it(compose, monkeypatch):
    services = compose["services"]
    moto = services["moto"]
    assert moto["profiles"] == ["demo"] and "healthcheck" in moto
    demo_env = services["daemon-demo"]["environment"]
    endpoint = demo_env["AWS_ENDPOINT_URL"]
    host, port = endpoint.removeprefix("http://").split(":")
    assert host == "moto" and port in moto["expose"]
    assert f"127.0.0.1:{port}/" in moto["healthcheck"]["test"][-1]
    assert services["daemon-demo"]["depends_on"]["demo-bucket"] == {
        "condition": "service_completed_successfully"
    }
    # The demo launches nothing: --dry-run parses to the daemon's flag.
    assert build_parser().parse_args(services["daemon-demo"]["command"]).dry_run is True
    # The EC2, S3 and SSM clients the provider makes (provisioners.aws.make_client) go there.
    for key, value in demo_env.items():
        monkeypatch.setenv(key, str(value))
    config, _ = mounted_config(compose, "daemon-demo")
    for service in ("ec2", "s3", "ssm"):
        assert make_client(service, config.cluster.region).meta.endpoint_url == endpoint
    # The bucket the daemon publishes the agent to is the one the demo creates.
    bucket = config.storage.url.removeprefix("s3://").split("/", 1)[0]
    assert f'Bucket="{bucket}"' in services["demo-bucket"]["command"][0]
    assert services["demo-bucket"]["environment"] == demo_env
    # The AWS profile's daemon talks to AWS itself.
    assert "AWS_ENDPOINT_URL" not in (services["daemon"].get("environment") or {})


def test_nothing_starts_a_daemon_without_a_profile_and_long_runners_have_healthchecks(compose):
    services = compose["services"]
    unprofiled = {n for n, s in services.items() if "profiles" not in s}
    assert unprofiled == {"secrets", "postgres"}
    for name, service in services.items():
        if service.get("restart") == "unless-stopped":
            assert service["healthcheck"]["test"][0] == "CMD", name
    assert set(compose["volumes"]) == {
        source
        for service in services.values()
        for source, _ in mounts(service).values()
        if not source.startswith(".")
    }
