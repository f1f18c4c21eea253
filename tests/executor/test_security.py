"""TLS and tokens on real gRPC over 127.0.0.1: who may call what, and how secrets are kept."""

from __future__ import annotations

import os
import stat
import time
from concurrent import futures

import grpc
import pytest
from cryptography import x509

from executor.security import (
    Authority,
    PeerRefused,
    SecretError,
    TokenAuth,
    certificate_names,
    certificate_window,
    instance_of,
    instance_uri,
    new_token,
    read_secret,
    secure_channel,
    server_credentials,
    server_options,
    signing_request,
    write_secret,
)

ECHO = "/test.Echo/Say"
ADMIN = "/test.Admin/Reset"


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.create("test")


@pytest.fixture
def server(authority):
    """An echo service and an admin one behind TLS and tokens: users may echo, only
    the operator may reset."""
    user, operator = new_token(), new_token()
    echo = grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )
    admin = grpc.method_handlers_generic_handler(
        "test.Admin", {"Reset": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"reset")}
    )
    auth = TokenAuth(
        {user: "user", operator: "operator"},
        {"user": [ECHO], "operator": ["/test.Echo/", "/test.Admin/"]},
    )
    srv = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), interceptors=[auth], options=server_options()
    )
    srv.add_generic_rpc_handlers((echo, admin))
    cert, key = authority.issue(["localhost", "127.0.0.1"])
    port = srv.add_secure_port("127.0.0.1:0", server_credentials(cert, key))
    srv.start()
    yield f"127.0.0.1:{port}", user, operator
    srv.stop(None)


def call(target: str, ca: bytes, token: str, method: str, payload: bytes = b"hi") -> bytes:
    with secure_channel(target, ca, token) as channel:
        return channel.unary_unary(method)(payload, timeout=10)


def test_a_known_token_over_tls_is_served(server, authority):
    target, user, operator = server
    assert call(target, authority.cert_pem, user, ECHO) == b"hi"
    assert call(target, authority.cert_pem, operator, ADMIN) == b"reset"


@pytest.mark.parametrize("token", ["", "not-a-token"])
def test_a_call_without_a_known_token_is_refused(server, authority, token):
    target, _, _ = server
    with pytest.raises(grpc.RpcError) as refused:
        call(target, authority.cert_pem, token, ECHO)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_role_may_call_only_what_it_is_allowed(server, authority):
    target, user, _ = server
    with pytest.raises(grpc.RpcError) as refused:
        call(target, authority.cert_pem, user, ADMIN)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "user token may not call /test.Admin/Reset" in refused.value.details()


def test_a_server_whose_certificate_another_authority_signed_is_not_trusted(server):
    target, user, _ = server
    stranger = Authority.create("stranger")
    with pytest.raises(grpc.RpcError) as refused:
        call(target, stranger.cert_pem, user, ECHO)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_an_oversized_request_is_refused(server, authority):
    target, user, _ = server
    with pytest.raises(grpc.RpcError) as refused:
        call(target, authority.cert_pem, user, ECHO, b"x" * (17 * 1024 * 1024))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_worker_certificate_names_only_the_instance_the_authority_chose_for_clients_only(
    authority,
):
    csr, key = signing_request("autoscaler-daemon")  # whatever the worker asks for
    uri = instance_uri("c1", "inst-7")
    cert = authority.sign_client(csr, uri, 3600)
    assert certificate_names(cert) == ["spiffe://c1/instance/inst-7"]
    assert b"PRIVATE KEY" in key and b"PRIVATE KEY" not in cert
    parsed = x509.load_pem_x509_certificate(cert)
    usage = parsed.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.ExtendedKeyUsageOID.CLIENT_AUTH]
    begin, end = certificate_window(cert)
    assert end - begin == pytest.approx(3600 + 300)  # valid from 5 minutes back (clock skew)
    now = time.time()
    assert instance_of(cert, authority.cert_pem, "c1", now) == "inst-7"
    with pytest.raises(PeerRefused, match="no instance of cluster c2"):
        instance_of(cert, authority.cert_pem, "c2", now)
    with pytest.raises(PeerRefused, match="not valid now"):
        instance_of(cert, authority.cert_pem, "c1", now + 7200)
    with pytest.raises(PeerRefused, match="not from the cluster's worker CA"):
        instance_of(cert, Authority.create("other").cert_pem, "c1", now)
    server_cert, _ = authority.issue(["autoscaler-daemon"])  # a server certificate
    with pytest.raises(PeerRefused, match="not a client certificate"):
        instance_of(server_cert, authority.cert_pem, "c1", now)


def test_secrets_are_created_0600_and_never_overwritten(tmp_path):
    path = tmp_path / "secrets" / "api.token"
    assert write_secret(path, "first")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not write_secret(path, "second")
    assert read_secret(path) == b"first"
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="lets others read a secret"):
        read_secret(path)
