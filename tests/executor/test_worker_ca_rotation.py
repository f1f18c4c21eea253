"""Rotating the worker CA drops no running worker (`executor.security.WorkerTrust`,
`app.worker_ca`): real gRPC with mutual TLS whose accepted CAs change under it, an agent
running a task throughout.

Certificates live 3 s here, so the agent renews every 1.5 s, at heartbeat.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest

from app.config import Secrets
from app.worker_ca import WorkerTrustFiles, load_trust, previous_cert, rotate
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.security import (
    DAEMON_NAME,
    Authority,
    WorkerTrust,
    instance_uri,
    issued_by,
    secure_channel,
    signing_request,
    write_secret,
)
from executor.simulated import SimulatedRuntime
from executor.storage import is_checkpoint_of
from tests.executor.conftest import CLUSTER, PATIENCE_S, job_context, launch, wait_for


def _until(condition, what: str, daemon) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        report = daemon.executor.report()
        assert report.ready_instances == {"inst-1"} and not report.lost_instances
        time.sleep(0.05)


def test_workers_move_to_a_new_worker_ca_during_the_overlap_and_none_is_dropped(
    daemon_on, tmp_path
):
    old = Authority.create("old worker")
    trust = [WorkerTrust(old)]
    daemon = daemon_on(
        f"file://{tmp_path}/store",
        {},
        SimulatedRuntime(),
        certificate_lifetime_s=3.0,
        worker_ca=old,
        trust=lambda: trust[0],
    )
    context = job_context(daemon.storage, tmp_path)
    agent = daemon.agent("inst-1")
    task = "rotate/t"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(wait_for(task, "running"), "it runs")
    assert issued_by(agent.identity.cert, old.cert_pem)

    # Rotate: the new CA signs, both are accepted.
    new = Authority.create("new worker")
    trust[0] = WorkerTrust(new, old.cert_pem, time.time() + 60.0)
    _until(
        lambda: issued_by(agent.identity.cert, new.cert_pem), "it renews onto the new CA", daemon
    )
    assert agent.lost_reason is None

    # The overlap ends: the old CA is accepted no more, the worker carries on.
    trust[0] = WorkerTrust(new)
    seen = {agent.identity.cert}

    def renewed_twice() -> bool:
        seen.add(agent.identity.cert)
        return len(seen) >= 3

    _until(renewed_twice, "two more renewals", daemon)
    assert agent.lost_reason is None
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "rotate", task, 1)

    # A certificate the old CA signs, naming the same instance, is refused now.
    csr, key = signing_request()
    forged = old.sign_client(csr, instance_uri(CLUSTER, "inst-1"), 60.0)
    with (
        secure_channel(
            daemon.worker_address,
            daemon.server_ca.cert_pem,
            server_name=DAEMON_NAME,
            client=(forged, key),
        ) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=5)
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


def test_the_trust_accepts_the_old_ca_only_until_the_overlap_ends() -> None:
    old, new = Authority.create("old"), Authority.create("new")
    csr, _ = signing_request()
    cert = old.sign_client(csr, instance_uri(CLUSTER, "inst-1"), 3600.0)
    now = time.time()
    during = WorkerTrust(new, old.cert_pem, now + 100.0)
    assert during.instance_of(cert, CLUSTER, now) == "inst-1"
    assert during.trusted(now) == [new.cert_pem, old.cert_pem]
    from executor.security import PeerRefused

    with pytest.raises(PeerRefused, match="worker CA"):
        during.instance_of(cert, CLUSTER, now + 101.0)


def test_ca_rotate_writes_the_new_ca_keeps_the_old_for_the_overlap_and_refuses_a_second(
    tmp_path,
) -> None:
    secrets = Secrets(tmp_path)
    first = Authority.create("c worker")
    write_secret(secrets.worker_ca_cert, first.cert_pem)
    write_secret(secrets.worker_ca_key, first.key_pem)
    files = WorkerTrustFiles(secrets)
    assert files().current == first and files().previous is None
    trust = rotate(secrets, 1000.0, 7200.0, name="c")
    assert trust.previous == first.cert_pem and trust.previous_until == 8200.0
    assert trust.current.cert_pem != first.cert_pem
    assert files().current == trust.current  # the daemon sees it without a restart
    assert previous_cert(secrets).stat().st_mode & 0o777 == 0o600
    assert secrets.worker_ca_key.stat().st_mode & 0o777 == 0o600
    from autoscaler.errors import InputError

    with pytest.raises(InputError, match="rotation is under way"):
        rotate(secrets, 2000.0, 7200.0)
    again = rotate(secrets, 9000.0, 7200.0)  # after the overlap
    assert again.previous == trust.current.cert_pem
    assert (
        json.loads((tmp_path / "worker-ca.rotation.json").read_text())["previous_until"] == 16200.0
    )
    assert load_trust(secrets).current == again.current
