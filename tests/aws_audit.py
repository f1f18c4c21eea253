"""Every AWS call a process makes, checked against the policy shipped for its principal, as
AWS would: moto enforces no IAM, so this does (with `tests/aws_iam.py`).

`Audit.attach(client)` hooks one boto3 client through botocore's event system — nothing
in the production code knows of it:

- each call (`before-call`) is mapped to the IAM requests AWS authorizes for it and
  evaluated; a denied call is answered as AWS answers (403 `AccessDenied`, or
  `UnauthorizedOperation` for EC2) without reaching moto, and recorded;
- a presigned URL (`generate_presigned_url`) is the presigner's `s3:GetObject` or
  `s3:PutObject` on that object, evaluated when it is made (AWS evaluates it when it is
  used, with the presigner's permissions: the same answer);
- S3 answers like S3 where moto does not: reading a missing key is `403`, not `404`,
  unless the caller may `s3:ListBucket` that prefix (with the key as `s3:prefix`, as S3
  decides it).

`install(...)` hooks every client a process makes (the daemon's, started by the
end-to-end harness) and appends one JSON line per call to a log the test reads back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.aws_iam import Decision, Policy, Request, requests_for

#: moto's account.
ACCOUNT = "123456789012"


@dataclass
class Record:
    """One call (or presign) and how each of its IAM requests was decided."""

    principal: str
    service: str
    operation: str
    requests: list[tuple[Request, Decision]]
    presigned: bool = False
    note: str = ""

    @property
    def denied(self) -> list[tuple[Request, Decision]]:
        return [(r, d) for r, d in self.requests if not d.allowed]

    def to_json(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "service": self.service,
            "operation": self.operation,
            "presigned": self.presigned,
            "note": self.note,
            "requests": [
                {
                    "action": r.action,
                    "resource": r.resource,
                    "allowed": d.allowed,
                    "reason": d.reason,
                    "by": list(d.allowed_by),
                    # What the call asked of EC2 (its market, its type), as AWS sees it.
                    "context": {k: v for k, v in r.context.items() if k.startswith("ec2:")},
                }
                for r, d in self.requests
            ],
        }


@dataclass
class Audit:
    """Checks the calls of the clients attached to it against one principal's policy."""

    policy: Policy
    principal: str = "daemon"
    region: str = "us-east-1"
    account: str = ACCOUNT
    tags_of: Callable[[str], Mapping[str, str]] = lambda instance_id: {}
    owner_of: Callable[[str], str] = lambda image_id: ""
    on_record: Callable[[Record], None] | None = None
    records: list[Record] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, client: Any) -> Any:
        events = client.meta.events
        service = client.meta.service_model.service_id.hyphenize()
        # First: the audit sees every call before anything answers it (a Stubber included).
        events.register_first(f"before-parameter-build.{service}", self._parameters)
        events.register_first(f"before-call.{service}", self._before_call)
        if service == "s3":
            events.register("after-call.s3.HeadObject", self._missing_key)
            events.register("after-call.s3.GetObject", self._missing_key)
        client._autoscaler_audit = self  # marks the client as audited
        return client

    # -- hooks ---------------------------------------------------------------------------

    def _parameters(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        # Judged here, the first event of every call: a Stubber answers at `before-call`
        # before later handlers run, and a presigned URL never reaches it.
        context["audit_params"] = dict(params)
        context["audit_record"] = self._record(
            model, params, presigned=bool(context.get("is_presign_request"))
        )

    def _before_call(self, context: dict[str, Any], **_: Any) -> Any:
        record = context.get("audit_record")
        if record is None or not record.denied:
            return None
        request, decision = record.denied[0]
        code = "UnauthorizedOperation" if record.service == "ec2" else "AccessDenied"
        return _denial(
            code,
            f"{self.principal} may not {request.action} on {request.resource} ({decision.reason})",
        )

    def _missing_key(
        self,
        http_response: Any,
        parsed: dict[str, Any],
        model: Any,
        context: dict[str, Any],
        **_: Any,
    ) -> None:
        if getattr(http_response, "status_code", 0) != 404:
            return
        params = context.get("audit_params", {})
        listing = Request(
            "s3:ListBucket",
            f"arn:aws:s3:::{params.get('Bucket', '')}",
            {"s3:prefix": params.get("Key", "")},
        )
        decision = self.policy.evaluate(listing)
        note = (
            "missing key: 404, the caller may list its prefix"
            if decision.allowed
            else ("missing key: 403, the caller may not list its prefix")
        )
        self._store(
            Record(
                self.principal,
                "s3",
                f"{model.name} (missing key)",
                [(listing, decision)],
                note=note,
            )
        )
        if not decision.allowed:
            parsed["Error"] = {"Code": "403", "Message": "Forbidden"}
            parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403
            http_response.status_code = 403

    # -- records ---------------------------------------------------------------------------

    def _record(self, model: Any, params: Mapping[str, Any], *, presigned: bool = False) -> Record:
        service = model.service_model.signing_name
        requests = requests_for(
            service,
            model.name,
            params,
            region=self.region,
            account=self.account,
            tags_of=self.tags_of,
            owner_of=self.owner_of,
        )
        record = Record(
            self.principal,
            service,
            model.name,
            [(r, self.policy.evaluate(r)) for r in requests],
            presigned=presigned,
        )
        self._store(record)
        return record

    def _store(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def denied(self) -> list[Record]:
        return [r for r in self.records if r.denied and "missing key" not in r.operation]

    def used(self) -> set[str]:
        return {
            sid for r in self.records for _, d in r.requests if d.allowed for sid in d.allowed_by
        }


def _denial(code: str, message: str) -> tuple[Any, dict[str, Any]]:
    """What AWS answers a denied call: a 403 with the code, as botocore parses it."""
    from botocore.awsrequest import AWSResponse

    class _Raw:
        def stream(self, **_: Any) -> Any:
            yield b""

    http = AWSResponse("https://audit.invalid/", 403, {}, _Raw())
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 403, "HTTPHeaders": {}},
    }
    return http, parsed


# -- a whole process ---------------------------------------------------------------------------


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records `install` wrote."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def install(log_path: str, policy_path: str, principal: str, region: str, endpoint: str) -> None:
    """Audit every boto3 client this process makes against the policy at `policy_path`,
    one JSON line per call appended to `log_path`. Instances' tags (for the conditions on
    terminations) are read from `endpoint` by a client of the audit's own."""
    import boto3
    from botocore.client import ClientCreator

    policy = Policy(json.loads(Path(policy_path).read_text()))
    lock = threading.Lock()
    original = ClientCreator.create_client
    describer = boto3.session.Session().client(
        "ec2", region_name=region, endpoint_url=endpoint,
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip

    def tags_of(instance_id: str) -> dict[str, str]:
        found = describer.describe_instances(InstanceIds=[instance_id])
        for reservation in found.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        return {}

    def write(record: Record) -> None:
        with lock, open(log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(record.to_json()) + "\n")

    def owner_of(image_id: str) -> str:
        found = describer.describe_images(ImageIds=[image_id]).get("Images", [])
        return str(found[0].get("ImageOwnerAlias") or found[0].get("OwnerId", "")) if found else ""

    audit = Audit(policy, principal, region, ACCOUNT, tags_of, owner_of, on_record=write)

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        return audit.attach(original(self, *args, **kwargs))

    ClientCreator.create_client = create_client  # type: ignore[method-assign]
