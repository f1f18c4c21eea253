"""A cluster directory made by `autoscaler init`, and its API served in-process over TLS."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from app.api import SubmissionService, UserAuth, add_submission
from app.bundled import bundled
from app.config import ClusterConfig, load_cluster_config
from app.files import load_catalog
from app.init import init_cluster
from app.users import Authenticator
from app.wiring import daemon_security, first_admin, open_state
from executor.security import server_options
from tests.state.conftest import (  # noqa: F401 (fixtures: both database backends)
    backend,
    db_url,
    pg_admin,
    pg_databases,
    pg_template,
    sqlite_template,
)


class DirStorage:
    """The cluster storage in a directory (what `file:///dir` storage is)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_file(self, key: str, path: Path) -> str:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
        return self.ref(key)

    def get_file(self, ref_or_key: str, path: Path) -> None:
        shutil.copyfile(self._path(ref_or_key.removeprefix(f"file://{self.root}/")), path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        return sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file() and str(p.relative_to(self.root)).startswith(prefix)
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def ref(self, key: str) -> str:
        return f"file://{self.root}/{key}"

    def modified_at(self, key: str) -> float | None:
        path = self._path(key)
        return path.stat().st_mtime if path.exists() else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    """`autoscaler init --local` in a fresh directory, listening on a free port."""
    init_cluster(tmp_path, name="test", local=True)
    config = tmp_path / "autoscaler.toml"
    chosen = load_cluster_config(config)  # init takes the next free ports when ours are held
    text = config.read_text().replace(chosen.api.listen, f"127.0.0.1:{free_port()}")
    config.write_text(text.replace(f'listen = "{chosen.metrics.listen}"', 'listen = ""'))
    return tmp_path


@dataclass
class Api:
    config: ClusterConfig
    service: SubmissionService
    storage: DirStorage
    clock: list[float]

    @property
    def store(self):
        return self.service.store


@pytest.fixture
def api(cluster_dir: Path) -> Iterator[Api]:
    """The submission API of the cluster in `cluster_dir`, served over TLS with its tokens."""
    config = load_cluster_config(cluster_dir / "autoscaler.toml")
    store = open_state(config, create=True)
    storage = DirStorage(cluster_dir / "storage")
    catalog = load_catalog(bundled("ec2_config.json"))
    clock = [time.time()]
    service = SubmissionService(
        store,
        storage,
        lambda: catalog,
        now=lambda: clock[0],
        max_context_bytes=2 * 2**20,
        teams=config.teams,  # as the daemon serves it
    )
    credentials = daemon_security(config)
    first_admin(config, store, clock[0])
    authenticator = Authenticator(service.accounts, now=lambda: clock[0])
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[UserAuth(authenticator, service.accounts, now=lambda: clock[0])],
        options=server_options(),
    )
    add_submission(server, service)
    server.add_secure_port(config.api.listen, credentials)
    server.start()
    try:
        yield Api(config, service, storage, clock)
    finally:
        server.stop(None)
        store.close()
