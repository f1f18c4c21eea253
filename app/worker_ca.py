"""Rotating the worker CA without dropping a running worker (`autoscaler ca rotate --workers`).

The files, beside the cluster's other secrets (`app.config.Secrets`):

- `worker-ca.pem`, `worker-ca.key` — the current worker CA: it signs every worker
  certificate, renewals included;
- `worker-ca.previous.pem` — the CA it replaced, still accepted until
- `worker-ca.rotation.json` — `{"rotated_at": …, "previous_until": …}` (epoch seconds).

A rotation moves the current CA's certificate to `previous`, writes a new CA, and sets
the overlap. The daemon reads these files again whenever they change (`WorkerTrustFiles`),
for its TLS handshakes and for every worker call: from the rotation on it signs with the
new CA and accepts both; workers renew at half their certificate's lifetime, at
heartbeat, and get the new CA's; once the overlap is over the old CA is accepted no more.
The default overlap is twice a certificate's lifetime, so a worker that misses one
renewal still has time for the next.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from app.config import Secrets
from autoscaler.errors import InputError
from executor.client import CERTIFICATE_LIFETIME_S
from executor.security import Authority, WorkerTrust, read_secret, write_secret

#: The default overlap: two certificate lifetimes (four renewal chances).
DEFAULT_OVERLAP_S = 2 * CERTIFICATE_LIFETIME_S


def previous_cert(secrets: Secrets) -> Path:
    return secrets.dir / "worker-ca.previous.pem"


def rotation_file(secrets: Secrets) -> Path:
    return secrets.dir / "worker-ca.rotation.json"


def load_trust(secrets: Secrets) -> WorkerTrust:
    """The worker CAs as the files say now."""
    current = Authority(secrets.worker_ca_cert.read_bytes(), read_secret(secrets.worker_ca_key))
    try:
        rotation = json.loads(rotation_file(secrets).read_text())
        previous = previous_cert(secrets).read_bytes()
    except FileNotFoundError:
        return WorkerTrust(current)
    return WorkerTrust(current, previous, float(rotation["previous_until"]))


def rotate(
    secrets: Secrets,
    now: float,
    overlap_s: float = DEFAULT_OVERLAP_S,
    *,
    name: str = "cluster",
    force: bool = False,
) -> WorkerTrust:
    """Make a new worker CA current, the old one accepted for `overlap_s` more.

    Refused while the previous rotation's overlap runs (unless `force`): rotating again
    would drop the CA that workers not yet renewed still hold."""
    before = load_trust(secrets)
    if (
        not force
        and before.previous_until is not None
        and before.previous_until > now
        and before.previous is not None
    ):
        raise InputError(
            f"a worker CA rotation is under way: the previous CA is accepted for "
            f"{before.previous_until - now:.0f} s more, and workers not yet renewed hold "
            "it; rotate again after that (or --force, dropping them)"
        )
    fresh = Authority.create(f"{name} worker")
    # The old CA's certificate and the overlap first, then the new CA: a daemon reading in
    # between accepts the old CA twice, never too few.
    write_secret(previous_cert(secrets), before.current.cert_pem, overwrite=True)
    rotation = {"rotated_at": now, "previous_until": now + overlap_s}
    write_secret(rotation_file(secrets), json.dumps(rotation) + "\n", overwrite=True)
    _replace(secrets.worker_ca_key, fresh.key_pem)
    _replace(secrets.worker_ca_cert, fresh.cert_pem)
    return load_trust(secrets)


def _replace(path: Path, data: bytes) -> None:
    """`path` holding `data` (mode 0600), replaced at once (a reader sees old or new)."""
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    write_secret(tmp, data)
    os.replace(tmp, path)


def _pair(authority: Authority) -> bool:
    """Whether the CA's key is the one its certificate names (not caught mid-rotation)."""
    cert = x509.load_pem_x509_certificate(authority.cert_pem)
    key = serialization.load_pem_private_key(authority.key_pem, password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    return bool(
        cert.public_key().public_bytes(encoding, public)
        == key.public_key().public_bytes(encoding, public)
    )


class WorkerTrustFiles:
    """`load_trust`, read again only when a file changed; if the files are caught half
    written, the last trust read whole stays in use (and is read again next time)."""

    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets
        self._lock = threading.Lock()
        self._stamp: tuple[tuple[int, int] | None, ...] | None = None
        self._trust = load_trust(secrets)
        self._stamp = self._stamps()

    def _stamps(self) -> tuple[tuple[int, int] | None, ...]:
        paths = (
            self.secrets.worker_ca_cert,
            self.secrets.worker_ca_key,
            previous_cert(self.secrets),
            rotation_file(self.secrets),
        )
        stamps: list[tuple[int, int] | None] = []
        for path in paths:
            try:
                stat = path.stat()
            except FileNotFoundError:
                stamps.append(None)
            else:
                stamps.append((stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)

    def __call__(self) -> WorkerTrust:
        with self._lock:
            stamp = self._stamps()
            if stamp != self._stamp:
                try:
                    trust = load_trust(self.secrets)
                    if not _pair(trust.current):
                        raise ValueError("the worker CA's key is not its certificate's")
                except (OSError, ValueError, KeyError):
                    return self._trust
                self._trust, self._stamp = trust, stamp
            return self._trust

    def bundle(self, now: Callable[[], float]) -> Callable[[], bytes]:
        """The accepted CAs' PEM bundle at each call, for `rotating_server_credentials`."""
        return lambda: self().bundle(now())
