"""Enrollment: how a worker proves which instance it is before it gets a certificate.

A worker's proof is checked by the daemon against a launch its state knows
(`executor.client.GrpcExecutor.enroll`); what counts as proof depends on the
cloud, so each cloud binding brings its `IdentityVerifier`:

- EC2 (`provisioners.identity`): the instance identity document and its
  signature, read from IMDSv2 (`imds_identity`), verified against AWS's
  published certificate of the region and matched to the launch's `cloud_id`
  and private address;
- the local cloud (`provisioners.local`): a one-time secret the cloud wrote,
  mode 0600, into that agent's directory only; the daemon keeps its digest and
  accepts it once (`check_secret`).

`OneTimeSecrets` is the same rule kept in memory, for clouds that live in one
process (tests, benchmarks). Nothing here needs the daemon's dependencies: the
agent imports it to build its proof.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from executor.protos import worker_pb2 as pb

if TYPE_CHECKING:
    from executor.client import Launch

#: Where IMDS answers on every EC2 instance.
IMDS_ENDPOINT = "http://169.254.169.254"
#: The identity document and the two PKCS#7 signatures the daemon can check.
IDENTITY_PATH = "/latest/dynamic/instance-identity"


class EnrollmentRefused(Exception):
    """A proof that does not show the caller is the instance it claims to be (the
    message says why, for the daemon's log and the worker's)."""


class IdentityVerifier(Protocol):
    """A cloud's check of an enrollment proof against the launch the state recorded."""

    def verify(self, request: pb.EnrollRequest, launch: Launch) -> None:
        """Return if `request` proves it comes from `launch`'s instance; else raise
        EnrollmentRefused. A one-time proof is consumed here."""
        ...


# -- one-time secrets --------------------------------------------------------------------------


def new_secret() -> str:
    """A one-time enrollment secret (256 bits)."""
    return secrets.token_urlsafe(32)


def secret_digest(secret: str) -> str:
    """What the daemon keeps of a secret: its SHA-256 (the secret itself is random, so a
    plain hash is enough; it is never stored where the daemon keeps its records)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def check_secret(presented: str, digest: str | None, used: bool) -> None:
    """The one rule for one-time secrets: the digest matches, and it was never used."""
    if not presented:
        raise EnrollmentRefused("no enrollment secret presented")
    if digest is None:
        raise EnrollmentRefused("no enrollment secret was issued for this instance")
    if not hmac.compare_digest(secret_digest(presented), digest):
        raise EnrollmentRefused("wrong enrollment secret")
    if used:
        raise EnrollmentRefused("the enrollment secret was used already")


class OneTimeSecrets:
    """One-time secrets in memory: `issue` one per instance, `verify` accepts it once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._digests: dict[str, str] = {}
        self._used: set[str] = set()

    def issue(self, instance_id: str) -> str:
        secret = new_secret()
        with self._lock:
            self._digests[instance_id] = secret_digest(secret)
            self._used.discard(instance_id)
        return secret

    def verify(self, request: pb.EnrollRequest, launch: Launch) -> None:
        if request.WhichOneof("proof") != "local_secret":
            raise EnrollmentRefused("this cluster enrolls workers with a one-time secret")
        with self._lock:
            digest = self._digests.get(launch.instance_id)
            check_secret(request.local_secret, digest, launch.instance_id in self._used)
            self._used.add(launch.instance_id)


def read_secret_file(path: Path) -> str:
    """The enrollment secret the local cloud left for this agent (mode 0600)."""
    from executor.security import read_secret

    secret = read_secret(path).decode().strip()
    if not secret:
        raise EnrollmentRefused(f"{path}: the enrollment secret file is empty")
    return secret


# -- EC2: the instance identity document from IMDSv2 --------------------------------------------


class ImdsError(OSError):
    """The instance metadata service did not answer as on EC2."""


def imds_identity(endpoint: str = IMDS_ENDPOINT, timeout_s: float = 5.0) -> pb.Ec2Identity:
    """The signed identity document of this instance, read with an IMDSv2 session token
    (a PUT that cannot be forwarded by a container's bridge with the hop limit of 1)."""
    base = endpoint.rstrip("/")
    token_request = urllib.request.Request(
        f"{base}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
    )
    try:
        with urllib.request.urlopen(token_request, timeout=timeout_s) as answer:
            token = answer.read().decode()

        def get(name: str) -> bytes:
            request = urllib.request.Request(
                f"{base}{IDENTITY_PATH}/{name}", headers={"X-aws-ec2-metadata-token": token}
            )
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return bytes(answer.read())

        document = get("document")
        signatures = {}
        for name in ("rsa2048", "pkcs7"):
            try:
                signatures[name] = get(name).decode().strip()
            except urllib.error.HTTPError:
                signatures[name] = ""  # not served here: the other one may be
    except (urllib.error.URLError, OSError) as exc:
        raise ImdsError(f"cannot read the instance identity document from {base}: {exc}") from None
    try:
        json.loads(document)
    except ValueError:
        raise ImdsError(f"{base}: the instance identity document is not JSON") from None
    return pb.Ec2Identity(document=document, **signatures)
