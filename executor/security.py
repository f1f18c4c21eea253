"""TLS and bearer tokens for every gRPC call, in both directions.

A cluster has its own certificate authority, made by `autoscaler init`: it
signs the daemon's server certificate and, at registration, each worker's
(the worker sends a signing request; its private key never leaves the
instance). Every call also carries a bearer token: users present the API
token, workers the worker token, the daemon a per-worker token it hands out
at registration. Secrets are files of mode 0600, written once and never
overwritten, and never logged.
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
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: Metadata key of the bearer token (gRPC metadata keys are lower case).
AUTHORIZATION = "authorization"

#: Certificates are valid this long; a worker's for as long as an instance may live.
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
    """A certificate authority: its certificate (public) and key (secret), PEM."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def create(cls, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} cluster CA")])
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
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    @classmethod
    def load(cls, cert_path: str | Path, key_path: str | Path) -> Authority:
        return cls(Path(cert_path).read_bytes(), read_secret(key_path))

    def sign(self, csr_pem: bytes, names: Iterable[str]) -> bytes:
        """A server certificate for the key of `csr_pem`, valid for `names` (DNS names or
        IP addresses), signed by this authority. The request's own subject is ignored:
        the authority decides what the certificate is for."""
        csr = x509.load_pem_x509_csr(csr_pem)
        if not csr.is_signature_valid:
            raise ValueError("the certificate signing request is not signed by its key")
        return self._issue(csr.public_key(), names)

    def issue(self, names: Iterable[str]) -> tuple[bytes, bytes]:
        """A new key and a certificate for it: (certificate PEM, key PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        return self._issue(key.public_key(), names), _key_pem(key)

    def _issue(self, public_key: Any, names: Iterable[str]) -> bytes:
        names = list(dict.fromkeys(names))
        if not names:
            raise ValueError("a certificate needs at least one name")
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        return cert.public_bytes(serialization.Encoding.PEM)


def signing_request(name: str) -> tuple[bytes, bytes]:
    """A new private key and a certificate signing request for it: (CSR PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def certificate_names(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    ]


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


def server_credentials(cert_pem: bytes, key_pem: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def channel_credentials(ca_pem: bytes, token: str) -> grpc.ChannelCredentials:
    """TLS verified against the cluster's CA, with the bearer token on every call."""
    return grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=ca_pem),
        grpc.access_token_call_credentials(token),
    )


def secure_channel(
    target: str,
    ca_pem: bytes,
    token: str,
    *,
    server_name: str | None = None,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to `target` (host:port); `server_name` is the name the server's
    certificate must carry when it differs from the host in `target`; `options`
    are further channel arguments (reconnection backoff, keepalive)."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        *options,
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, channel_credentials(ca_pem, token), options=options)


def server_options() -> list[tuple[str, Any]]:
    """Size limits every server of ours enforces: an oversized request is refused
    (RESOURCE_EXHAUSTED) before it is read whole."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]


class TokenAuth(grpc.ServerInterceptor):
    """Refuses every call without a known bearer token (UNAUTHENTICATED), and calls a
    role may not make (PERMISSION_DENIED).

    `tokens` maps a token to its role; `allowed` maps a role to the full method
    names (`/package.Service/Method`) or service prefixes (`/package.Service/`)
    it may call. Health checks are open: a load balancer probes without a token.
    Tokens are compared in constant time and never logged.
    """

    OPEN = ("/grpc.health.v1.Health/",)

    def __init__(
        self,
        tokens: Mapping[str, str] | Callable[[], Mapping[str, str]],
        allowed: Mapping[str, Iterable[str]],
    ) -> None:
        self._tokens = tokens
        self._allowed = {role: tuple(methods) for role, methods in allowed.items()}

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
        if handler is None or method.startswith(self.OPEN):
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
