"""TLS, certificates and bearer tokens for every gRPC call.

A cluster has two certificate authorities, made by `autoscaler init`
(`Authority`): the server CA signs only the daemon's server certificate, which
names the fixed name `autoscaler-daemon` (every client verifies that name,
whatever address it dials: `DAEMON_NAME`) plus the advertised host; the worker
CA signs only short-lived client certificates, each naming one instance
(`instance_uri`), from a signing request the worker sends (its private key
never leaves the instance). Users present a bearer token on every call; workers
present their client certificate (mutual TLS, `instance_of`). Secrets are files
of mode 0600, written once and never overwritten, and never logged.
"""

from __future__ import annotations

import datetime as _dt
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

#: Metadata key of the bearer token (gRPC metadata keys are lower case).
AUTHORIZATION = "authorization"

#: The name the daemon's certificate carries whatever address it is reached at: every
#: client (CLI and worker) verifies it (ssl target name override), so the check is the
#: same on a VPC address, a DNS name or a loopback address.
DAEMON_NAME = "autoscaler-daemon"

#: The scheme of the name in a worker's client certificate.
SPIFFE = "spiffe://"

#: Authorities live ten years; the daemon's server certificate as long as a cluster may.
CA_DAYS = 3650
CERT_DAYS = 825

#: Requests larger than this are refused before they are read whole (gRPC's own limit).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class SecretError(OSError):
    """A secret file is missing, unreadable, or readable by others than its owner."""


def new_token() -> str:
    """A random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def write_secret(path: Path, data: bytes | str, *, overwrite: bool = False) -> bool:
    """Create `path` with mode 0600 holding `data`. Returns False (and leaves the file
    alone) when it exists and `overwrite` is off: a secret is never silently replaced."""
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    return True


def read_secret(path: str | Path) -> bytes:
    """A secret's bytes; refused when others than the owner may read or write it."""
    p = Path(path)
    try:
        mode = p.stat().st_mode & 0o777
        data = p.read_bytes()
    except OSError as exc:
        raise SecretError(f"{p}: cannot read secret: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise SecretError(f"{p}: mode {mode:o} lets others read a secret; chmod 600 it")
    return data


def read_token(path: str | Path) -> str:
    token = read_secret(path).decode().strip()
    if not token:
        raise SecretError(f"{path}: the token file is empty")
    return token


# -- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authority:
    """A certificate authority: its certificate (public) and key (secret), PEM.

    A cluster has two, made by `autoscaler init`, and neither signs for the other's
    purpose: the *server* CA signs only the daemon's server certificate (every client,
    CLI and worker, pins it alone), the *worker* CA signs only short-lived client
    certificates naming one instance (extended key usage clientAuth, never
    serverAuth). So nothing a worker can obtain is accepted as the daemon.
    """

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def create(cls, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    @classmethod
    def load(cls, cert_path: str | Path, key_path: str | Path) -> Authority:
        return cls(Path(cert_path).read_bytes(), read_secret(key_path))

    def issue(self, names: Iterable[str]) -> tuple[bytes, bytes]:
        """A new key and a *server* certificate for `names` (DNS names or IP addresses):
        (certificate PEM, key PEM). Only the daemon gets one, from the server CA."""
        names = list(dict.fromkeys(names))
        if not names:
            raise ValueError("a certificate needs at least one name")
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        san = x509.SubjectAlternativeName([_general_name(n) for n in names])
        cert = self._build(
            key.public_key(),
            subject,
            san,
            x509.ExtendedKeyUsageOID.SERVER_AUTH,
            _dt.timedelta(days=CERT_DAYS),
        )
        return cert, _key_pem(key)

    def sign_client(self, csr_pem: bytes, uri: str, lifetime_s: float) -> bytes:
        """A *client* certificate for the key of `csr_pem`, naming only `uri` (a SPIFFE-style
        `spiffe://<cluster>/instance/<id>`), valid `lifetime_s`. The request's own subject
        and names are ignored: the authority decides what the certificate is for."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise ValueError(f"not a PEM certificate signing request: {exc}") from None
        if not csr.is_signature_valid:
            raise ValueError("the certificate signing request is not signed by its key")
        public_key = csr.public_key()
        if not isinstance(public_key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
            raise ValueError("the key must be an EC or RSA key")
        if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < 2048:
            raise ValueError("an RSA key must have at least 2048 bits")
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri.rsplit("/", 1)[-1])])
        san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)])
        return self._build(
            public_key,
            subject,
            san,
            x509.ExtendedKeyUsageOID.CLIENT_AUTH,
            _dt.timedelta(seconds=lifetime_s),
        )

    def _build(
        self,
        public_key: Any,
        subject: x509.Name,
        san: x509.SubjectAlternativeName,
        usage: x509.ObjectIdentifier,
        lifetime: _dt.timedelta,
    ) -> bytes:
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + lifetime)
            .add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=True)
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        return cert.public_bytes(serialization.Encoding.PEM)


def signing_request(name: str = "worker") -> tuple[bytes, bytes]:
    """A new private key and a certificate signing request for it: (CSR PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def certificate_names(cert_pem: bytes) -> list[str]:
    """The DNS names, IP addresses and URIs a certificate is valid for."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return (
        [str(v) for v in san.get_values_for_type(x509.DNSName)]
        + [str(v) for v in san.get_values_for_type(x509.IPAddress)]
        + [str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
    )


def certificate_window(cert_pem: bytes) -> tuple[float, float]:
    """(not valid before, not valid after) of a certificate, as Unix times."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether `ca_pem`'s key signed `cert_pem`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def instance_uri(cluster: str, instance_id: str) -> str:
    """The one name a worker's client certificate carries."""
    return f"{SPIFFE}{cluster}/instance/{instance_id}"


class PeerRefused(Exception):
    """A caller's certificate does not name an instance of this cluster."""


def instance_of(cert_pem: bytes, ca_pem: bytes, cluster: str, now: float) -> str:
    """The instance a worker's client certificate names, after checking it as gRPC did and
    more: issued by the worker CA `ca_pem`, valid at `now`, for client authentication
    only, naming one instance of `cluster`. PeerRefused says why not."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise PeerRefused("the peer certificate cannot be read") from None
    if not issued_by(cert_pem, ca_pem):
        raise PeerRefused("the peer certificate is not from the cluster's worker CA")
    if not cert.not_valid_before_utc.timestamp() <= now <= cert.not_valid_after_utc.timestamp():
        raise PeerRefused("the peer certificate is not valid now")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise PeerRefused("the peer certificate has no extended key usage") from None
    if list(usage) != [x509.ExtendedKeyUsageOID.CLIENT_AUTH]:
        raise PeerRefused("the peer certificate is not a client certificate")
    uris = [n for n in certificate_names(cert_pem) if n.startswith(SPIFFE)]
    prefix = f"{SPIFFE}{cluster}/instance/"
    if len(uris) != 1 or not uris[0].startswith(prefix):
        raise PeerRefused(f"the peer certificate names no instance of cluster {cluster}")
    return uris[0][len(prefix) :]


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


# -- gRPC --------------------------------------------------------------------------------------


def server_credentials(
    cert_pem: bytes, key_pem: bytes, *, client_ca: bytes | None = None
) -> grpc.ServerCredentials:
    """The daemon's TLS. With `client_ca`, a client must present a certificate that CA
    signed (mutual TLS: the workers' port); without, no client certificate is asked for
    (the users' port: a token on every call). gRPC cannot ask for a certificate and
    still accept clients without one, hence two ports."""
    if client_ca is None:
        return grpc.ssl_server_credentials([(key_pem, cert_pem)])
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=client_ca, require_client_auth=True
    )


def channel_credentials(
    ca_pem: bytes, token: str | None = None, client: tuple[bytes, bytes] | None = None
) -> grpc.ChannelCredentials:
    """TLS verified against the server CA `ca_pem` only; with `token`, the bearer token on
    every call; with `client` (certificate PEM, key PEM), mutual TLS."""
    cert, key = client if client is not None else (None, None)
    tls = grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key, certificate_chain=cert
    )
    if token is None:
        return tls
    return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(token))


def secure_channel(
    target: str,
    ca_pem: bytes,
    token: str | None = None,
    *,
    server_name: str | None = None,
    client: tuple[bytes, bytes] | None = None,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to `target` (host:port) whose server must present a certificate from the
    server CA `ca_pem` for `server_name` (the daemon's: `DAEMON_NAME`; None: the host in
    `target`); `token` and `client` as in `channel_credentials`; `options` are further
    channel arguments (reconnection backoff, keepalive)."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        *options,
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, channel_credentials(ca_pem, token, client), options=options)


def server_options() -> list[tuple[str, Any]]:
    """Size limits every server of ours enforces (an oversized request is refused,
    RESOURCE_EXHAUSTED, before it is read whole), and keepalive pings, so a worker whose
    machine vanished does not hold its command stream open for ever."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class TokenAuth(grpc.ServerInterceptor):
    """Refuses every call without a known bearer token (UNAUTHENTICATED), and calls a
    role may not make (PERMISSION_DENIED).

    `tokens` maps a token to its role; `allowed` maps a role to the full method
    names (`/package.Service/Method`) or service prefixes (`/package.Service/`)
    it may call. Health checks are open (a load balancer probes without a token),
    and so are the methods in `open` (the workers' services, which authenticate
    by certificate or enrollment proof themselves). Tokens are compared in
    constant time and never logged.
    """

    OPEN = ("/grpc.health.v1.Health/",)

    def __init__(
        self,
        tokens: Mapping[str, str] | Callable[[], Mapping[str, str]],
        allowed: Mapping[str, Iterable[str]],
        open: Iterable[str] = (),
    ) -> None:
        self._tokens = tokens
        self._allowed = {role: tuple(methods) for role, methods in allowed.items()}
        self._open = self.OPEN + tuple(open)

    def role_of(self, metadata: Iterable[tuple[str, Any]]) -> str | None:
        presented = None
        for key, value in metadata:
            if key == AUTHORIZATION and isinstance(value, str) and value.startswith("Bearer "):
                presented = value[len("Bearer ") :]
        if presented is None:
            return None
        tokens = self._tokens() if callable(self._tokens) else self._tokens
        role = None
        for token, name in tokens.items():
            if hmac.compare_digest(token.encode(), presented.encode()):
                role = name
        return role

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(self._open):
            return handler
        role = self.role_of(handler_call_details.invocation_metadata or ())
        if role is None:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, "a valid token is required")
        if not any(
            method == m or (m.endswith("/") and method.startswith(m))
            for m in self._allowed.get(role, ())
        ):
            return _refusing(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the {role} token may not call {method}",
            )
        return handler


def _refusing(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that refuses the call."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# -- rotating the worker CA ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerTrust:
    """Which worker CAs the daemon accepts, and which one signs.

    A rotation (`autoscaler ca rotate --workers`) makes a new worker CA `current` — every
    certificate issued from then on, renewals included, comes from it — and keeps the
    old one's certificate as `previous`, still accepted until `previous_until` (epoch
    seconds). Workers renew at half their certificate's lifetime, at heartbeat, so an
    overlap of at least one lifetime lets every live worker move to the new CA before
    the old is dropped: none is cut off (the overlap of Kubernetes' CA rotation, with
    both CAs in the trust bundle).
    """

    current: Authority
    previous: bytes | None = None  # the old worker CA's certificate (PEM)
    previous_until: float | None = None

    def trusted(self, now: float) -> list[bytes]:
        """The worker CA certificates accepted at `now`, the current one first."""
        accepted = [self.current.cert_pem]
        if self.previous is not None and (self.previous_until or 0.0) > now:
            accepted.append(self.previous)
        return accepted

    def bundle(self, now: float) -> bytes:
        """`trusted(now)` as one PEM bundle, for the TLS layer."""
        return b"".join(pem if pem.endswith(b"\n") else pem + b"\n" for pem in self.trusted(now))

    def instance_of(self, cert_pem: bytes, cluster: str, now: float) -> str:
        """`instance_of` against each CA accepted at `now`; PeerRefused when none issued it."""
        accepted = self.trusted(now)
        issuer = next((ca for ca in accepted if issued_by(cert_pem, ca)), accepted[0])
        return instance_of(cert_pem, issuer, cluster, now)


def rotating_server_credentials(
    cert_pem: bytes, key_pem: bytes, client_cas: Callable[[], bytes]
) -> grpc.ServerCredentials:
    """Mutual TLS whose accepted client CAs are `client_cas()` at each handshake (the
    workers' port during a worker CA rotation: the new and the old CA, then the new alone),
    without restarting the server. Connections already made keep going; every call is
    checked again against the same CAs (`WorkerTrust.instance_of`)."""
    last: list[bytes] = [client_cas()]

    def configuration(bundle: bytes) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(key_pem, cert_pem)], root_certificates=bundle
        )

    def fetch() -> Any:
        bundle = client_cas()
        if bundle == last[0]:
            return None  # unchanged: gRPC keeps the configuration it has
        last[0] = bundle
        return configuration(bundle)

    return grpc.dynamic_ssl_server_credentials(
        configuration(last[0]), fetch, require_client_authentication=True
    )
