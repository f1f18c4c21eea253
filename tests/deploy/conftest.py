"""The deploy tests use the executor tests' Docker engine fixture (skipped only when no
engine answers)."""

from tests.executor.conftest import docker_client  # noqa: F401 (a fixture)
