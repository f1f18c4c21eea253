"""The committed stubs are exactly what the .proto generates; the protocol is versioned."""

from __future__ import annotations

from pathlib import Path

from executor.agent import DAEMON_METHODS
from executor.client import WORKER_METHODS
from executor.protos import worker_pb2
from executor.protos.__main__ import PROTOS, ROOT, generate


def test_the_committed_stubs_are_regenerated_identically(tmp_path: Path):
    generate(tmp_path)
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            fresh = (tmp_path / f"{stem}{suffix}").read_bytes()
            committed = (ROOT / f"{stem}{suffix}").read_bytes()
            assert fresh == committed, f"{stem}{suffix} is stale: run `python -m executor.protos`"


def test_the_services_are_package_qualified_and_versioned():
    services = worker_pb2.DESCRIPTOR.services_by_name
    assert worker_pb2.DESCRIPTOR.package == "autoscaler.worker.v1"
    registry, worker = services["WorkerRegistry"], services["Worker"]
    assert (f"/{registry.full_name}/",) == WORKER_METHODS
    assert (f"/{worker.full_name}/",) == DAEMON_METHODS
    assert {m.name for m in registry.methods} == {"Register", "Heartbeat"}
    assert {m.name for m in worker.methods} == {"StartTask", "StopTask", "ListTasks"}
