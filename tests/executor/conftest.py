"""Fixtures for the executor tests: real parts only.

- a Docker engine found through DOCKER_HOST (`.ci/run` starts one); the tests
  that need it are skipped only when no engine answers;
- S3 on `moto_server`, started here as a subprocess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from executor.runtime import ContainerRuntime

MOTO_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
