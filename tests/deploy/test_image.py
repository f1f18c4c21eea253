"""The daemon's image (deploy/Dockerfile), built on the real Docker engine by
deploy/build-image.sh from a base made on this host (no registry), then run.

Skipped only when no engine answers at DOCKER_HOST (or no `docker` command is there to
build with). Everything built here is removed afterwards: the image, the install stage's
intermediate images and the private base they descend from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
BUILD = ROOT / "deploy" / "build-image.sh"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEELHOUSE = "/opt/autoscaler/share/wheelhouse"

pytestmark = [pytest.mark.timeout(1200), pytest.mark.long]  # a busy 2-core machine builds slowly


def _built_on(client: Any, base_id: str) -> list[str]:
    """Ids of every image descending from `base_id` (the legacy builder records each step's
    parent), the farthest first, so each is removed before its parent."""
    parents = {i.id: i.attrs.get("Parent") or "" for i in client.images.list(all=True)}
    distance = {}
    for image_id in parents:
        steps, current = 0, image_id
        while current and current != base_id and steps <= len(parents):
            current, steps = parents.get(current, ""), steps + 1
        if current == base_id and steps:
            distance[image_id] = steps
    return sorted(distance, key=distance.__getitem__, reverse=True)


@pytest.fixture(scope="module")
def daemon_image(docker_client: Any) -> Iterator[str]:
    """deploy/build-image.sh with BASE a Python base made from this host's interpreter."""
    import docker.errors

    from executor.images import ensure_python_image

    if shutil.which("docker") is None:
        pytest.skip("no `docker` command to build with")
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the image is Python 3.11: its wheels are built by a 3.11 interpreter")
    run_id = uuid.uuid4().hex[:8]
    base = f"autoscaler/python-deploy-test:{run_id}"  # private: removed with what is built on it
    tag = f"autoscaler/daemon-test:{run_id}"
    base_id = ensure_python_image(docker_client, base)
    try:
        built = subprocess.run(
            [str(BUILD)],
            env={**os.environ, "BASE": base, "TAG": tag, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert built.returncode == 0, built.stderr[-4000:]
        yield tag
    finally:
        for image_id in [*_built_on(docker_client, base_id), base_id]:
            # Removing a child also prunes its untagged parents: some are gone already.
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.images.remove(image_id, force=True, noprune=False)


def run(client: Any, image: str, *command: str, entrypoint: str | None = None) -> str:
    """Run the image once with no network; its output (the container is removed)."""
    output = client.containers.run(
        image,
        list(command),
        entrypoint=entrypoint,
        remove=True,
        network_mode="none",
        stdout=True,
        stderr=True,
    )
    return output.decode()


def test_the_image_runs_the_cli_as_an_unprivileged_user(docker_client, daemon_image):
    config = docker_client.images.get(daemon_image).attrs["Config"]
    assert config["Entrypoint"] == ["autoscaler"]
    assert config["Cmd"] == ["daemon", "--config", "/etc/autoscaler/autoscaler.toml"]
    assert config["User"] == "10001:10001"

    shown = run(docker_client, daemon_image, "--help")
    assert shown.startswith("usage: autoscaler")
    for command in ("init", "daemon", "submit", "status", "cost-report", "worker"):
        assert f"    {command}" in shown, command
    daemon_help = run(docker_client, daemon_image, "daemon", "--help")
    assert "--config TOML" in daemon_help and "--dry-run" in daemon_help
    assert run(docker_client, daemon_image, "-u", entrypoint="id").strip() == "10001"


def test_init_writes_a_cluster_the_image_then_reads(docker_client, daemon_image):
    # init, then a command that loads its configuration and opens its (SQLite) state: the
    # config loader, SQLAlchemy, Alembic and rich all work inside the image, as user 10001.
    script = (
        "autoscaler init --dir /tmp/cluster --name deploy-test && "
        "ls -ln /tmp/cluster/secrets && "
        "autoscaler cost-report --config /tmp/cluster/autoscaler.toml"
    )
    output = run(docker_client, daemon_image, "-c", script, entrypoint="sh")
    assert "wrote /tmp/cluster/autoscaler.toml" in output
    secrets = ("server-ca", "worker-ca", "server")
    for secret in [f"{s}.{x}" for s in secrets for x in ("key", "pem")] + ["api.token"]:
        assert f"wrote /tmp/cluster/secrets/{secret}" in output
    # Each secret 0600 and owned by the image's user, who can then read it.
    modes = [line.split() for line in output.splitlines() if line.startswith("-")]
    assert len(modes) == 7 and {(m[0], m[2]) for m in modes} == {("-rw-------", "10001")}
    assert "next: autoscaler daemon --config /tmp/cluster/autoscaler.toml" in output
    assert "Traceback" not in output and "$0.00" in output


def test_the_workers_wheelhouse_ships_and_pip_does_not(docker_client, daemon_image):
    # `[cloud] wheelhouse` of deploy/compose/*.toml names it: the daemon publishes the
    # worker of its own version, with every dependency pinned by hash.
    probe = (
        f"test -f {WHEELHOUSE}/requirements.txt && echo requirements; "
        f"ls {WHEELHOUSE} | grep -q '^ec2_batch_autoscaler_worker-{VERSION}-' && echo worker; "
        "python -c 'import pip' 2>/dev/null && echo pip; "
        "test -e /wheels && echo context; echo done"
    )
    assert run(docker_client, daemon_image, "-c", probe, entrypoint="sh").split() == [
        "requirements",
        "worker",
        "done",
    ]
