"""EC2's instance metadata service as a worker sees it, for tests: signed identity documents.

AWS signs each instance's identity document with a key per region; tests cannot, so
`IdentitySigner` plays AWS with a key and self-signed certificate of its own, written
where the daemon's `[ec2] identity_certificates` (or `InstanceIdentityVerifier.
from_directory`) reads them. `ImdsServer` serves one instance's document over
IMDSv2 (a PUT for a session token, then GETs carrying it), as the agent reads it,
and the spot notices a test publishes (`notify_reclaim`, `recommend_rebalance`):
404 until then, as on EC2.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID


class IdentitySigner:
    """A stand-in for AWS's signing key of one region (RSA-2048, like `/rsa2048`)."""

    def __init__(self, region: str = "us-east-1") -> None:
        self.region = region
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test Web Services")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .sign(self.key, hashes.SHA256())
        )

    def write(self, directory: Path) -> Path:
        """Its certificate where the daemon looks for AWS's: `<region>.rsa2048.pem`."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.region}.rsa2048.pem"
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path

    def document(self, instance_id: str, private_ip: str, **fields: object) -> bytes:
        """An identity document as IMDS serves it (AWS's layout: pretty JSON)."""
        body = {
            "accountId": "123456789012",
            "architecture": "x86_64",
            "availabilityZone": f"{self.region}a",
            "imageId": "ami-12345678",
            "instanceId": instance_id,
            "instanceType": "c7i.large",
            "pendingTime": "2026-12-01T00:00:00Z",
            "privateIp": private_ip,
            "region": self.region,
            "version": "2017-09-30",
            **fields,
        }
        return json.dumps(body, indent=2).encode()

    def rsa2048(self, document: bytes) -> str:
        """The `/rsa2048` signature of `document`: base64 PKCS#7 SignedData, content attached."""
        der = (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(document)
            .add_signer(self.cert, self.key, hashes.SHA256())
            .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])
        )
        return base64.encodebytes(der).decode()


INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


class ImdsServer:
    """IMDSv2 for one instance on 127.0.0.1: `/latest/api/token` (PUT), then the identity
    document and its `/rsa2048` signature, and the spot notices published so far, for
    requests carrying the token."""

    def __init__(self, document: bytes = b"{}", rsa2048: str = "") -> None:
        self.document, self.rsa2048 = document, rsa2048
        self.token = secrets.token_urlsafe(16)
        self.requests: list[str] = []
        self.notices: dict[str, bytes] = {}  # path -> body, once published
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                owner.requests.append(f"PUT {self.path}")
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if self.path != "/latest/api/token" or not ttl:
                    self._answer(400, b"")
                    return
                self._answer(200, owner.token.encode())

            def do_GET(self) -> None:
                owner.requests.append(f"GET {self.path}")
                if self.headers.get("X-aws-ec2-metadata-token") != owner.token:
                    self._answer(401, b"")
                    return
                answers = {
                    "/latest/dynamic/instance-identity/document": owner.document,
                    "/latest/dynamic/instance-identity/rsa2048": owner.rsa2048.encode(),
                    **owner.notices,
                }
                body = answers.get(self.path)
                self._answer(200 if body is not None else 404, body or b"")

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def notify_reclaim(self, time: str, action: str = "terminate") -> None:
        """Publish EC2's two-minute warning: the instance is reclaimed at `time`."""
        body = json.dumps({"action": action, "time": time}).encode()
        self.notices[INSTANCE_ACTION_PATH] = body

    def recommend_rebalance(self, time: str) -> None:
        """Publish a rebalance recommendation made at `time`."""
        self.notices[REBALANCE_PATH] = json.dumps({"noticeTime": time}).encode()

    def expire_token(self) -> None:
        """The session token expires: requests carrying it are refused (401)."""
        self.token = secrets.token_urlsafe(16)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
