"""EC2 enrollment's check of the signed instance identity document (`provisioners.identity`).

AWS's keys are not ours to sign with: each test plays AWS with a key and certificate of
its own (RSA-2048 for `/rsa2048`, DSA with SHA-1 for `/pkcs7`), placed where the daemon
reads AWS's certificates. The certificate bundled for us-east-1 is checked as data.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json

import pytest
from asn1crypto import cms
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa
from cryptography.x509.oid import NameOID

from executor.client import Launch
from executor.enrollment import EnrollmentRefused
from executor.protos import worker_pb2 as pb
from provisioners.identity import (
    BUNDLED,
    IdentityCertificates,
    InstanceIdentityVerifier,
    verify_pkcs7,
)
from tests.imds import IdentitySigner

LAUNCH = Launch("c1-7", "i-0123456789abcdef0", "10.0.1.242")


@pytest.fixture
def signer(tmp_path):
    signer = IdentitySigner("eu-west-1")
    signer.write(tmp_path / "certs")
    return signer


@pytest.fixture
def verifier(tmp_path, signer):
    return InstanceIdentityVerifier.from_directory(tmp_path / "certs")


def request(document: bytes, **signatures: str) -> pb.EnrollRequest:
    return pb.EnrollRequest(
        instance_id=LAUNCH.instance_id, ec2=pb.Ec2Identity(document=document, **signatures)
    )


def test_the_document_of_the_launched_instance_signed_for_its_region_is_accepted(signer, verifier):
    document = signer.document(LAUNCH.cloud_id, LAUNCH.private_address)
    verifier.verify(request(document, rsa2048=signer.rsa2048(document)), LAUNCH)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"instanceId": "i-0fffffffffffffff0"}, "not of i-0123456789abcdef0"),
        ({"privateIp": "10.0.1.243"}, "private address '10.0.1.243' is not 10.0.1.242"),
    ],
)
def test_a_document_of_another_instance_is_refused(signer, verifier, change, why):
    fields = {"instanceId": LAUNCH.cloud_id, "privateIp": LAUNCH.private_address, **change}
    document = signer.document(fields.pop("instanceId"), fields.pop("privateIp"))
    with pytest.raises(EnrollmentRefused, match=why):
        verifier.verify(request(document, rsa2048=signer.rsa2048(document)), LAUNCH)


def test_a_document_changed_after_signing_or_signed_by_another_key_is_refused(signer, verifier):
    document = signer.document(LAUNCH.cloud_id, "10.0.9.9")
    signature = signer.rsa2048(document)
    forged = document.replace(b"10.0.9.9", LAUNCH.private_address.encode())
    with pytest.raises(EnrollmentRefused, match="not the document signed"):
        verifier.verify(request(forged, rsa2048=signature), LAUNCH)
    honest = signer.document(LAUNCH.cloud_id, LAUNCH.private_address)
    impostor = IdentitySigner("eu-west-1")
    with pytest.raises(EnrollmentRefused, match="does not verify with AWS's certificate"):
        verifier.verify(request(honest, rsa2048=impostor.rsa2048(honest)), LAUNCH)
    with pytest.raises(EnrollmentRefused, match="none sent"):
        verifier.verify(request(honest), LAUNCH)
    with pytest.raises(EnrollmentRefused, match="cannot be read"):
        verifier.verify(request(honest, rsa2048="bm90IGEgc2lnbmF0dXJl"), LAUNCH)


def test_a_region_without_a_certificate_or_a_launch_not_yet_recorded_is_refused(signer, verifier):
    elsewhere = IdentitySigner("ap-south-1")  # a region the daemon has no certificate for
    document = elsewhere.document(LAUNCH.cloud_id, LAUNCH.private_address)
    with pytest.raises(EnrollmentRefused, match="no AWS rsa2048 certificate for region"):
        verifier.verify(request(document, rsa2048=elsewhere.rsa2048(document)), LAUNCH)
    document = signer.document(LAUNCH.cloud_id, LAUNCH.private_address)
    proof = request(document, rsa2048=signer.rsa2048(document))
    with pytest.raises(EnrollmentRefused, match="no recorded EC2 instance"):
        verifier.verify(proof, Launch(LAUNCH.instance_id))
    with pytest.raises(EnrollmentRefused, match="identity document"):
        verifier.verify(pb.EnrollRequest(instance_id="c1-7", local_secret="x"), LAUNCH)


def test_the_pkcs7_signature_made_with_dsa_and_sha1_is_verified_too(tmp_path):
    key = dsa.generate_private_key(key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test Web Services")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "eu-west-1.dsa.pem").write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
    )
    document = IdentitySigner("eu-west-1").document(LAUNCH.cloud_id, LAUNCH.private_address)
    signature = _dsa_signed_data(document, key, cert)
    verifier = InstanceIdentityVerifier.from_directory(tmp_path / "certs")
    verifier.verify(request(document, pkcs7=signature), LAUNCH)
    other = json.loads(document)
    other["privateIp"] = "10.0.0.1"
    tampered = _dsa_signed_data(document, key, cert, content=json.dumps(other).encode())
    with pytest.raises(EnrollmentRefused, match="signed digest is not the document's"):
        verify_pkcs7(tampered, cert)


def test_the_bundled_aws_certificate_is_the_one_aws_signed_itself():
    certificates = IdentityCertificates.load(BUNDLED)
    assert ("us-east-1", "pkcs7") in certificates.certificates
    cert = certificates.certificates[("us-east-1", "pkcs7")]
    assert cert.subject.rfc4514_string() == (
        "O=Amazon Web Services LLC,L=Seattle,ST=Washington State,C=US"
    )
    assert cert.not_valid_after_utc.year == 2038
    # Self-signed: the copy is byte-exact, or its own signature would not verify.
    cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes, hashes.SHA1())
    readme = (BUNDLED / "README.md").read_text()
    digest = hashlib.sha256((BUNDLED / "us-east-1.dsa.pem").read_bytes()).hexdigest()
    assert digest in readme and "regions-certs" in readme


def test_an_operators_directory_replaces_a_bundled_certificate_of_the_same_name(tmp_path):
    signer = IdentitySigner("us-east-1")
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "us-east-1.dsa.pem").write_bytes(
        signer.cert.public_bytes(serialization.Encoding.PEM)
    )
    loaded = IdentityCertificates.load(BUNDLED, tmp_path / "certs")
    assert loaded.certificates[("us-east-1", "pkcs7")] == signer.cert


def _dsa_signed_data(
    document: bytes, key: dsa.DSAPrivateKey, cert: x509.Certificate, content: bytes | None = None
) -> str:
    """A PKCS#7 SignedData as IMDS's `/pkcs7` is: DSA with SHA-1 over signed attributes whose
    message digest is the document's; `content` replaces what is carried (a forgery)."""
    attributes = cms.CMSAttributes(
        [
            cms.CMSAttribute({"type": "content_type", "values": ["data"]}),
            cms.CMSAttribute(
                {"type": "message_digest", "values": [hashlib.sha1(document).digest()]}
            ),
        ]
    )
    signature = key.sign(attributes.dump(), hashes.SHA1())
    parsed = asn1_x509.Certificate.load(cert.public_bytes(serialization.Encoding.DER))
    signer_info = cms.SignerInfo(
        {
            "version": "v1",
            "sid": cms.SignerIdentifier(
                {
                    "issuer_and_serial_number": cms.IssuerAndSerialNumber(
                        {"issuer": parsed.issuer, "serial_number": parsed.serial_number}
                    )
                }
            ),
            "digest_algorithm": {"algorithm": "sha1"},
            "signed_attrs": attributes,
            "signature_algorithm": {"algorithm": "dsa"},
            "signature": signature,
        }
    )
    signed = cms.SignedData(
        {
            "version": "v1",
            "digest_algorithms": [{"algorithm": "sha1"}],
            "encap_content_info": {"content_type": "data", "content": content or document},
            "signer_infos": [signer_info],
        }
    )
    info = cms.ContentInfo({"content_type": "signed_data", "content": signed})
    return base64.b64encode(info.dump()).decode()
