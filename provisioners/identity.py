"""EC2 enrollment: a worker proves its instance with the signed instance identity document.

Every EC2 instance can read, from its instance metadata service, a JSON document
naming it (`instanceId`, `privateIp`, `region`, …) and PKCS#7 signatures of it
made by AWS: `/pkcs7` (DSA with SHA-1) and `/rsa2048` (RSA-2048 with SHA-256),
each checked with AWS's published certificate for the document's region
("Verify the instance identity document", EC2 User Guide). The daemon accepts a
worker's enrollment only if

1. a signature verifies with the certificate of the document's region
   (`IdentityCertificates`: the ones bundled in `data/instance-identity/`, with
   their source and date in its README, or an operator's directory
   `[ec2] identity_certificates`, tests' own);
2. the signed document is the one sent, and names the region it was checked for;
3. its `instanceId` is the `cloud_id` and its `privateIp` the private address
   the state recorded for the launch the worker claims to be (from RunInstances
   or DescribeInstances).

A document is not secret to its own instance, but no other instance can read it
(IMDSv2, hop limit 1), and it names one instance only: holding it proves being,
or having been given access to, that machine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import dsa, ec, padding, rsa

from executor.client import Launch
from executor.enrollment import EnrollmentRefused
from executor.protos import worker_pb2 as pb

#: AWS's certificates bundled with the autoscaler (see the README beside them).
BUNDLED = Path(__file__).resolve().parent / "data" / "instance-identity"
#: The signatures a worker may send, and the certificate file suffix each is checked with.
KINDS = {"rsa2048": ".rsa2048.pem", "pkcs7": ".dsa.pem"}
#: A document and its signature are a few kilobytes; anything larger is refused unread.
MAX_PROOF_BYTES = 16 * 1024

_HASHES: dict[str, hashes.HashAlgorithm] = {
    "sha1": hashes.SHA1(),
    "sha256": hashes.SHA256(),
    "sha384": hashes.SHA384(),
}


@dataclass(frozen=True, slots=True)
class IdentityCertificates:
    """AWS's public certificates by (region, signature kind)."""

    certificates: Mapping[tuple[str, str], x509.Certificate]

    @classmethod
    def load(cls, *directories: Path) -> IdentityCertificates:
        """Certificates named `<region>.rsa2048.pem` and `<region>.dsa.pem` in each directory;
        a later directory's replace an earlier one's."""
        found: dict[tuple[str, str], x509.Certificate] = {}
        for directory in directories:
            for kind, suffix in KINDS.items():
                for path in sorted(directory.glob(f"*{suffix}")):
                    region = path.name.removesuffix(suffix)
                    found[(region, kind)] = x509.load_pem_x509_certificate(path.read_bytes())
        return cls(found)

    def regions(self) -> list[str]:
        return sorted({region for region, _ in self.certificates})


class InstanceIdentityVerifier:
    """The EC2 binding's `executor.enrollment.IdentityVerifier`."""

    def __init__(self, certificates: IdentityCertificates) -> None:
        self.certificates = certificates

    @classmethod
    def from_directory(cls, directory: Path | None = None) -> InstanceIdentityVerifier:
        """The bundled certificates, and those of `directory` (an operator's, or a test's)."""
        return cls(IdentityCertificates.load(BUNDLED, *([directory] if directory else [])))

    def verify(self, request: pb.EnrollRequest, launch: Launch) -> None:
        if request.WhichOneof("proof") != "ec2":
            raise EnrollmentRefused("an EC2 worker enrolls with its instance identity document")
        document = self.signed_document(request.ec2)
        if launch.cloud_id is None or launch.private_address is None:
            raise EnrollmentRefused(
                f"the launch of {launch.instance_id} has no recorded EC2 instance and private "
                "address yet; try again shortly"
            )
        if document.get("instanceId") != launch.cloud_id:
            raise EnrollmentRefused(
                f"the identity document is of {document.get('instanceId')!r}, not of "
                f"{launch.cloud_id} (the instance launched as {launch.instance_id})"
            )
        if document.get("privateIp") != launch.private_address:
            raise EnrollmentRefused(
                f"the identity document's private address {document.get('privateIp')!r} is "
                f"not {launch.private_address}, the one {launch.cloud_id} was launched with"
            )

    def signed_document(self, identity: pb.Ec2Identity) -> dict[str, Any]:
        """The document, once a signature by AWS's certificate of its region verifies."""
        raw = bytes(identity.document)
        if len(raw) > MAX_PROOF_BYTES:
            raise EnrollmentRefused("the identity document is too large")
        try:
            region = json.loads(raw).get("region")
        except (ValueError, AttributeError):
            raise EnrollmentRefused("the identity document is not a JSON object") from None
        reasons = []
        for kind in KINDS:
            signature = getattr(identity, kind)
            if not signature:
                continue
            certificate = self.certificates.certificates.get((region, kind))
            if certificate is None:
                reasons.append(f"no AWS {kind} certificate for region {region!r}")
                continue
            try:
                content = verify_pkcs7(signature, certificate)
            except EnrollmentRefused as exc:
                reasons.append(f"{kind}: {exc}")
                continue
            if content != raw:
                raise EnrollmentRefused("the document sent is not the document signed")
            document = json.loads(content)
            if document.get("region") != region:
                raise EnrollmentRefused("the signed document names another region")
            return dict(document)
        raise EnrollmentRefused(
            "no signature of the identity document verifies ("
            + ("; ".join(reasons) or "none sent")
            + ")"
        )


def verify_pkcs7(signature: str | bytes, certificate: x509.Certificate) -> bytes:
    """The content of a PKCS#7 SignedData (base64 DER or BER, as IMDS serves it) once its
    one signature verifies with `certificate`'s key; EnrollmentRefused otherwise.

    RFC 5652 §5.4: with signed attributes, the signature covers their DER encoding as a
    SET, and their message digest must be the content's; without, the content itself.
    """
    from asn1crypto import cms  # the daemon's dependency only: CMS parsing

    text = signature.decode() if isinstance(signature, bytes) else signature
    if len(text) > 2 * MAX_PROOF_BYTES:
        raise EnrollmentRefused("the signature is too large")
    body = "".join(
        line for line in text.strip().splitlines() if line and not line.startswith("-----")
    )
    try:
        der = base64.b64decode(body, validate=True)
        info = cms.ContentInfo.load(der)
        if info["content_type"].native != "signed_data":
            raise EnrollmentRefused("the signature is not PKCS#7 SignedData")
        signed = info["content"]
        content = signed["encap_content_info"]["content"].native
        signers = signed["signer_infos"]
        if not isinstance(content, bytes) or len(signers) != 1:
            raise EnrollmentRefused("the signature carries no document, or several signers")
        signer = signers[0]
        digest_name = signer["digest_algorithm"]["algorithm"].native
        algorithm = _HASHES.get(digest_name)
        if algorithm is None:
            raise EnrollmentRefused(f"unsupported digest {digest_name}")
        attributes = signer["signed_attrs"]
        if len(attributes):
            digests = [
                a["values"][0].native for a in attributes if a["type"].native == "message_digest"
            ]
            actual = hashlib.new(digest_name, content).digest()
            if digests != [actual]:
                raise EnrollmentRefused("the signed digest is not the document's")
            signed_bytes = b"\x31" + attributes.dump()[1:]  # [0] IMPLICIT -> SET OF
        else:
            signed_bytes = content
        value = signer["signature"].native
    except (ValueError, binascii.Error, KeyError, TypeError, IndexError) as exc:
        raise EnrollmentRefused(f"the signature cannot be read: {exc}") from None
    key = certificate.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(value, signed_bytes, padding.PKCS1v15(), algorithm)
        elif isinstance(key, dsa.DSAPublicKey):
            key.verify(value, signed_bytes, algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(value, signed_bytes, ec.ECDSA(algorithm))
        else:
            raise EnrollmentRefused("unsupported certificate key")
    except (InvalidSignature, UnsupportedAlgorithm, ValueError):
        raise EnrollmentRefused("the signature does not verify with AWS's certificate") from None
    return content
