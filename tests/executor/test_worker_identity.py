"""A worker is only itself: every attack of a worker (or of anyone who took one over) on
the protocol is refused and leaves the cluster as it was.

Real gRPC with TLS on 127.0.0.2 (named by no certificate, so names are checked as on a
VPC address), the daemon's two ports, agents with simulated containers. An attacker is
given what a compromised worker has: its key and certificate, its enrollment proof, and
the protocol's stubs.
"""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from cryptography import x509

from executor.client import Launch, MemoryLedger
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc
from executor.security import (
    DAEMON_NAME,
    certificate_names,
    new_token,
    read_secret,
    secure_channel,
    server_credentials,
    server_options,
    signing_request,
    write_secret,
)
from executor.simulated import SimulatedRuntime
from executor.storage import checkpoint_key, is_checkpoint_of
from provisioners.identity import InstanceIdentityVerifier
from tests.executor.conftest import PATIENCE_S, job_context, launch, wait_for
from tests.imds import IdentitySigner, ImdsServer


@pytest.fixture
def daemon(daemon_on, tmp_path):
    return daemon_on(f"file://{tmp_path}/store", {}, SimulatedRuntime())


@pytest.fixture
def context(daemon, tmp_path):
    return job_context(daemon.storage, tmp_path)


def _eventually(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def _enroll(daemon, request: pb.EnrollRequest) -> pb.EnrollResponse:
    with secure_channel(daemon.address, daemon.server_ca.cert_pem, server_name=DAEMON_NAME) as ch:
        return pb_grpc.EnrollmentStub(ch).Enroll(request, timeout=10)


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def _registry(daemon, agent) -> grpc.Channel:
    """A channel to the workers' port with `agent`'s own key and certificate: what an
    attacker who took that worker over holds."""
    identity = agent.identity
    return secure_channel(
        daemon.worker_address,
        daemon.server_ca.cert_pem,
        server_name=DAEMON_NAME,
        client=(identity.cert, identity.key),
    )


def _state(daemon) -> tuple:
    """What the cluster is, as the executor reports it (to see that nothing changed)."""
    report = daemon.executor.report()
    return (
        dict(report.tasks),
        report.ready_instances,
        dict(report.lost_instances),
        sorted(w.instance_id for w in daemon.executor.workers()),
    )


# -- certificates ----------------------------------------------------------------------------


def test_a_worker_asking_for_the_daemons_name_gets_a_client_certificate_for_its_instance(daemon):
    secret = read_secret(daemon.launch("inst-1")).decode()
    csr, key = signing_request(DAEMON_NAME)  # it asks to be the daemon
    answer = _enroll(
        daemon, pb.EnrollRequest(instance_id="inst-1", local_secret=secret, csr_pem=csr)
    )
    cert = answer.certificate_pem
    assert certificate_names(cert) == ["spiffe://test/instance/inst-1"]
    usage = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    )
    assert list(usage.value) == [x509.ExtendedKeyUsageOID.CLIENT_AUTH]

    # It sets up as the daemon with that certificate; a client built like the CLI (the
    # server CA pinned, the daemon's name checked) refuses it and never sends its token.
    called = []
    fake = grpc.server(futures.ThreadPoolExecutor(2), options=server_options())
    fake.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "autoscaler.api.v1.Submission",
                {
                    "ListJobs": grpc.unary_unary_rpc_method_handler(
                        lambda request, context: called.append(context.invocation_metadata())
                    )
                },
            ),
        )
    )
    port = fake.add_secure_port("127.0.0.2:0", server_credentials(cert, key))
    fake.start()
    try:
        for roots in (daemon.server_ca.cert_pem, daemon.worker_ca.cert_pem):
            # Even a client trusting the worker CA refuses: the certificate is client-only.
            with secure_channel(
                f"127.0.0.2:{port}", roots, new_token(), server_name=DAEMON_NAME
            ) as channel:
                refused = _refused(
                    lambda ch=channel: ch.unary_unary("/autoscaler.api.v1.Submission/ListJobs")(
                        b"", timeout=5
                    )
                )
                assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert called == []
    finally:
        fake.stop(None)


def test_enrolling_as_another_instance_or_twice_or_as_no_launch_is_refused(daemon):
    mine = read_secret(daemon.launch("inst-1")).decode()
    theirs = read_secret(daemon.launch("inst-2")).decode()
    before = _state(daemon)
    csr, _ = signing_request()
    cases = [
        (pb.EnrollRequest(instance_id="inst-2", local_secret=mine, csr_pem=csr), "wrong"),
        (pb.EnrollRequest(instance_id="inst-9", local_secret=mine, csr_pem=csr), "no launch"),
        (pb.EnrollRequest(instance_id="inst-2", csr_pem=csr), "one-time secret"),
    ]
    for request, why in cases:
        refused = _refused(lambda r=request: _enroll(daemon, r))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert why in refused.details()
    # Its own secret works once; a second use is refused (a stolen secret is worth nothing
    # once its instance enrolled, and an early thief locks the real worker out: seen).
    request = pb.EnrollRequest(instance_id="inst-2", local_secret=theirs, csr_pem=csr)
    assert _enroll(daemon, request).certificate_pem
    refused = _refused(lambda: _enroll(daemon, request))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "used already" in refused.details()
    # Refusals leave nothing behind: no worker, no task, no thread (enrollment keeps no
    # memory even when it succeeds; a worker exists from its first heartbeat).
    assert _state(daemon) == before


def test_refused_enrollments_are_rate_limited_per_address(daemon):
    for instance_id in ("inst-1", "inst-2", "inst-3", "inst-4", "inst-5", "inst-6"):
        daemon.agent(instance_id)  # rightful enrollments from one address spend nothing
    secret = read_secret(daemon.launch("inst-7")).decode()
    csr, _ = signing_request()
    guess = pb.EnrollRequest(instance_id="inst-x", local_secret="guess", csr_pem=csr)
    codes = [_refused(lambda: _enroll(daemon, guess)).code() for _ in range(8)]
    assert codes[:5] == [grpc.StatusCode.PERMISSION_DENIED] * 5
    assert set(codes[5:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    # Out of tokens, the address is refused before its proof is checked: even a right one
    # waits (and the secret is not consumed).
    right = pb.EnrollRequest(instance_id="inst-7", local_secret=secret, csr_pem=csr)
    assert _refused(lambda: _enroll(daemon, right)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_workers_port_admits_only_worker_certificates(daemon):
    agent = daemon.agent("inst-1")
    # A user's token over TLS does not pass the handshake of the workers' port.
    with secure_channel(
        daemon.worker_address, daemon.server_ca.cert_pem, new_token(), server_name=DAEMON_NAME
    ) as channel:
        refused = _refused(
            lambda: pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=5)
        )
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
    # On the API port the registry answers no one: there is no client certificate there.
    with secure_channel(
        daemon.address, daemon.server_ca.cert_pem, new_token(), server_name=DAEMON_NAME
    ) as channel:
        refused = _refused(
            lambda: pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=5)
        )
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    # The worker's own certificate does pass.
    with _registry(daemon, agent) as channel:
        answer = pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=10)
        assert answer.heartbeat_interval_s > 0


def test_a_worker_whose_launch_is_unknown_is_refused_and_remembered_nowhere(daemon):
    agent = daemon.agent("inst-1")
    # The state forgets the launch (a fresh database, an instance of another cluster).
    daemon.ledger = fresh = MemoryLedger()
    daemon.executor.ledger = fresh
    daemon.executor.release("inst-1")
    before = _state(daemon)
    with _registry(daemon, agent) as channel:
        refused = _refused(
            lambda: pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=10)
        )
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _state(daemon) == before


# -- reports ---------------------------------------------------------------------------------


def test_reporting_another_instances_task_changes_nothing_and_is_told_to_stop(daemon, context):
    daemon.agent("inst-1")
    attacker = daemon.agent("inst-2")
    daemon.executor.start(launch("victim/t", 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(wait_for("victim/t", "running"), "the victim's task runs")
    forged = pb.TaskStatus(
        task_id="victim/t",
        attempt=1,
        job_id="victim",
        state=pb.TASK_STATE_COMPLETED,
        iterations=1e9,
        checkpoint=daemon.storage.ref(checkpoint_key("victim", "victim/t", 1, 5)),
    )
    with _registry(daemon, attacker) as channel:
        answer = pb_grpc.RegistryStub(channel).Heartbeat(
            pb.HeartbeatRequest(tasks=[forged]), timeout=10
        )
    # It is told to forget the attempt (it claims it ended), and the victim's task is as
    # its own worker says: running on inst-1, its progress its own.
    assert [(r.task_id, r.attempt) for r in answer.acknowledged] == [("victim/t", 1)]
    seen = daemon.executor.report().tasks["victim/t"]
    assert (seen.state, seen.instance_id) == ("running", "inst-1")
    assert seen.progress < 1e9 and seen.checkpoint is None
    # A forged *running* report gets a stop: a live copy the daemon did not place is fenced.
    forged.state = pb.TASK_STATE_RUNNING
    with _registry(daemon, attacker) as channel:
        answer = pb_grpc.RegistryStub(channel).Heartbeat(
            pb.HeartbeatRequest(tasks=[forged]), timeout=10
        )
    assert [(r.task_id, r.attempt) for r in answer.stop] == [("victim/t", 1)]
    assert daemon.executor.report().tasks["victim/t"].instance_id == "inst-1"


def test_pointing_a_task_at_a_foreign_checkpoint_is_dropped(daemon, context):
    attacker = daemon.agent("inst-1")
    daemon.executor.start(launch("mine/t", 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(wait_for("mine/t", "running"), "its own task runs")
    for foreign in (
        daemon.storage.ref(checkpoint_key("other", "other/t", 1, 100)),  # another job's
        daemon.storage.ref(checkpoint_key("mine", "mine/t", 7, 100)),  # another attempt's
        "s3://elsewhere/crafted.tar.gz",
    ):
        stopped = pb.TaskStatus(
            task_id="mine/t",
            attempt=1,
            job_id="mine",
            state=pb.TASK_STATE_STOPPED,
            checkpoint=foreign,
        )
        with _registry(daemon, attacker) as channel:
            pb_grpc.RegistryStub(channel).Heartbeat(
                pb.HeartbeatRequest(tasks=[stopped]), timeout=10
            )
        seen = daemon.executor.report().tasks["mine/t"]
        assert seen.state == "stopped" and seen.checkpoint is None, foreign
    # Its own attempt's prefix is accepted.
    own = daemon.storage.ref(checkpoint_key("mine", "mine/t", 1, 100))
    stopped.checkpoint = own
    with _registry(daemon, attacker) as channel:
        pb_grpc.RegistryStub(channel).Heartbeat(pb.HeartbeatRequest(tasks=[stopped]), timeout=10)
    assert daemon.executor.report().tasks["mine/t"].checkpoint == own


# -- fencing ---------------------------------------------------------------------------------


def test_an_abandoned_attempt_can_neither_upload_nor_keep_running(daemon, context):
    old = daemon.agent("inst-1")
    daemon.agent("inst-2")
    task = "fence/t"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(lambda r: r.tasks[task].progress > 3, "attempt 1 runs")
    with _registry(daemon, old) as channel:
        registry = pb_grpc.RegistryStub(channel)
        request = pb.GrantUploadRequest(
            task_id=task, attempt=1, kind=pb.OBJECT_KIND_CHECKPOINT, step=3
        )
        grant = registry.GrantUpload(request, timeout=10)  # its own, while placed: granted
        assert is_checkpoint_of(daemon.storage, grant.ref, "fence", task, 1)
        # The daemon gives attempt 1 up and places attempt 2 elsewhere.
        daemon.executor.start(launch(task, 2, "inst-2", context, env={"STEP_S": "0.01"}))
        refused = _refused(lambda: registry.GrantUpload(request, timeout=10))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "fenced" in refused.details()
        # Another worker cannot upload for attempt 2 either.
        request.attempt = 2
        assert (
            _refused(lambda: registry.GrantUpload(request, timeout=10)).code()
            == grpc.StatusCode.FAILED_PRECONDITION
        )
    daemon.until(
        lambda r: r.tasks[task].attempt == 2 and r.tasks[task].state == "running",
        "attempt 2 runs",
    )
    # At its next heartbeat the old worker is told to stop attempt 1: it kills it, with
    # nothing uploaded under attempt 1's prefix, and the report stays attempt 2's.
    _eventually(
        lambda: (
            not any(c.running for c in old.runtime.containers({"autoscaler.task": task}))
            or all(s.state == pb.TASK_STATE_FAILED for s in old.statuses())
        ),
        "the old worker kills attempt 1",
    )
    _eventually(lambda: old.statuses() == [], "the old worker forgets attempt 1")
    assert not daemon.storage.list("jobs/fence/t/1/")
    assert daemon.executor.report().tasks[task].instance_id == "inst-2"


def test_a_restarted_agent_learns_at_enrollment_which_of_its_attempts_to_stop(
    daemon, context, tmp_path
):
    agent = daemon.agent("inst-1")
    task = "held/t"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(lambda r: r.tasks[task].progress > 3, "it runs")
    agent.close(grace_s=0)  # the agent goes; its container keeps running
    daemon.agents.remove(agent)
    # Meanwhile the daemon gave the attempt up.
    daemon.ledger.give_up("inst-1", "test")
    daemon.ledger.add_launch(Launch("inst-1"))  # the instance itself may go on working
    (agent.identity.directory / "cert.pem").unlink()  # it must enroll again
    write_secret(daemon.work / "secrets" / "inst-1", daemon.secrets.issue("inst-1"), overwrite=True)
    again = daemon.agent("inst-1")
    _eventually(
        lambda: [s.state for s in again.statuses()] in ([pb.TASK_STATE_FAILED], []),
        "the attempt it adopted is killed",
    )
    assert not daemon.storage.list("jobs/held/t/1/checkpoint-")


def test_a_certificate_near_expiry_is_renewed_at_heartbeat_without_dropping_anything(
    daemon_on, tmp_path
):
    daemon = daemon_on(
        f"file://{tmp_path}/store", {}, SimulatedRuntime(), certificate_lifetime_s=3.0
    )
    context = job_context(daemon.storage, tmp_path)
    agent = daemon.agent("inst-1")
    task = "renew/t"
    daemon.executor.start(launch(task, 1, "inst-1", context, env={"STEP_S": "0.01"}))
    daemon.until(wait_for(task, "running"), "it runs")
    seen = {agent.identity.cert}
    deadline = time.monotonic() + PATIENCE_S
    while len(seen) < 4:  # three renewals, each before its predecessor expired
        assert time.monotonic() < deadline, "the certificate is not renewed"
        report = daemon.executor.report()
        assert report.ready_instances == {"inst-1"} and not report.lost_instances
        assert agent.lost_reason is None
        seen.add(agent.identity.cert)
        time.sleep(0.05)
    # The command stream moved to the new certificate: a stop still arrives and is done.
    daemon.executor.stop(task, 1)
    stopped = daemon.until(wait_for(task, "stopped", "failed"), "it stops").tasks[task]
    assert stopped.state == "stopped", stopped.reason
    assert is_checkpoint_of(daemon.storage, stopped.checkpoint, "renew", task, 1)


# -- EC2: the instance identity document -------------------------------------------------------


def test_an_ec2_worker_enrolls_with_its_signed_identity_document_and_no_other(daemon_on, tmp_path):
    signer = IdentitySigner("us-east-1")
    signer.write(tmp_path / "aws-certificates")
    verifier = InstanceIdentityVerifier.from_directory(tmp_path / "aws-certificates")
    daemon = daemon_on(
        f"file://{tmp_path}/store", {}, SimulatedRuntime(), verifier=verifier, enroll_burst=10
    )
    for ours, ec2_id, ip in (("inst-1", "i-0aaa", "10.0.0.5"), ("inst-2", "i-0bbb", "10.0.0.6")):
        daemon.ledger.add_launch(Launch(ours, ec2_id, ip))
        daemon.instances.add(ours)
    mine = signer.document("i-0aaa", "10.0.0.5")
    imds = ImdsServer(mine, signer.rsa2048(mine))
    try:
        agent = daemon.agent("inst-1", enrollment_secret=None, imds_endpoint=imds.url)
        assert agent.identity.cert is not None
        assert "PUT /latest/api/token" in imds.requests  # IMDSv2, a session first
    finally:
        imds.close()
    before = _state(daemon)
    csr, _ = signing_request()
    impostor = IdentitySigner("us-east-1")  # a key that is not AWS's
    theirs = signer.document("i-0bbb", "10.0.0.6")
    cases = [
        # Its own document, to be another instance.
        ("inst-2", mine, signer.rsa2048(mine), "is of 'i-0aaa', not of i-0bbb"),
        # Another instance's document with its private address changed: no longer signed.
        (
            "inst-2",
            theirs.replace(b"10.0.0.6", b"10.0.0.5"),
            signer.rsa2048(theirs),
            "not the document signed",
        ),
        # A document signed by someone else.
        ("inst-2", theirs, impostor.rsa2048(theirs), "does not verify"),
        # A well-signed document of the right instance but another private address.
        (
            "inst-2",
            signer.document("i-0bbb", "10.9.9.9"),
            signer.rsa2048(signer.document("i-0bbb", "10.9.9.9")),
            "private address",
        ),
        # No launch at all.
        ("inst-7", theirs, signer.rsa2048(theirs), "no launch"),
    ]
    for instance_id, document, signature, why in cases:
        request = pb.EnrollRequest(
            instance_id=instance_id,
            ec2=pb.Ec2Identity(document=document, rsa2048=signature),
            csr_pem=csr,
        )
        refused = _refused(lambda r=request: _enroll(daemon, r))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, why
        assert why in refused.details(), refused.details()
    assert _state(daemon) == before
