"""The committed stubs are exactly what the .proto generates; the protocol is versioned."""

from __future__ import annotations

from pathlib import Path

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
    assert worker_pb2.DESCRIPTOR.package == "autoscaler.worker.v2"
    # Both are the daemon's: workers dial out, nothing dials a worker.
    assert set(services) == {"Enrollment", "Registry"}
    enrollment, registry = services["Enrollment"], services["Registry"]
    assert (f"/{enrollment.full_name}/", f"/{registry.full_name}/") == WORKER_METHODS
    assert {m.name for m in enrollment.methods} == {"Enroll"}
    assert {m.name for m in registry.methods} == {"Renew", "Heartbeat", "Commands", "GrantUpload"}
    assert registry.methods_by_name["Commands"].server_streaming
