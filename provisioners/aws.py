"""Calling AWS: clients with adaptive retries, a bounded throttling backoff, typed errors.

Every boto3 call of the provisioner goes through `AwsCaller.call`, so every
failure leaves here as a `CloudError` subclass that says whether retrying can
help and what the user should change — never as a raw botocore exception, and
never swallowed.

Two layers of retry, on purpose:

- botocore's *adaptive* mode retries throttled and 5xx responses inside one
  call and slows the client down (a token bucket) when AWS pushes back;
- on top of it, a bounded exponential backoff (`AwsCaller`) for throttling
  that outlasts botocore's attempts. After its bound the call raises
  `CloudUnavailable`: the control loop retries next round instead of blocking.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from autoscaler.cloud import CloudError, CloudRequestError, CloudUnavailable

#: Error codes AWS uses when a client sends requests too fast.
THROTTLING_CODES: frozenset[str] = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "EC2ThrottledException",
        "SlowDown",
        "PriorRequestNotComplete",
    }
)

#: Server-side failures that later attempts may not see (botocore already retried them).
_TRANSIENT_CODES: frozenset[str] = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"}
)

_PERMISSION_CODES: frozenset[str] = frozenset(
    {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired", "Blocked"}
)
_CREDENTIAL_CODES: frozenset[str] = frozenset(
    {
        "AuthFailure",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
    }
)

#: Which configuration field to check for an EC2 error code (by prefix).
_CONFIG_HINTS: tuple[tuple[str, str], ...] = (
    ("InvalidAMIID", "check [ec2] ami"),
    ("InvalidSubnet", "check [ec2] subnet_ids"),
    ("InvalidGroup", "check [ec2] security_group_ids"),
    ("InvalidSecurityGroup", "check [ec2] security_group_ids"),
    ("InvalidKeyPair", "check [ec2] key_name"),
    ("NoSuchEntity", "check [ec2] iam_instance_profile"),
    ("InvalidInstanceType", "check [ec2] families and types"),
)

#: botocore attempts per call (first try included) in adaptive retry mode.
DEFAULT_MAX_ATTEMPTS = 4


def make_client(
    service: str,
    region: str,
    *,
    endpoint_url: str | None = None,
    max_attempts: int | None = None,
    session: boto3.session.Session | None = None,
) -> BaseClient:
    """A boto3 client with adaptive retries and short connect timeouts.

    `endpoint_url` points the client elsewhere (moto_server in tests, a VPC
    endpoint in production); boto3 also honours `AWS_ENDPOINT_URL`.
    `max_attempts` defaults to the standard `AWS_MAX_ATTEMPTS` variable, else 4.
    """
    if max_attempts is None:
        max_attempts = _attempts_from_environment()
    config = Config(
        retries={"mode": "adaptive", "max_attempts": max_attempts},
        connect_timeout=5,
        read_timeout=60,
        user_agent_extra="ec2-batch-autoscaler",
        # Presigned S3 URLs (the worker wheel) signed with SigV4: SigV2 is refused by
        # buckets created since 2020 and cannot carry a session token's expiry.
        signature_version="s3v4" if service == "s3" else None,
    )
    # Not boto3's default session, which is not thread-safe; pass one to share its caches.
    session = session or boto3.session.Session()
    client = session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)
    return explain_denials(client)


#: IAM actions whose names are not the API operation's (AWS's Service Authorization
#: Reference): what a denied call needed.
IAM_ACTION_OF: dict[str, str] = {
    "s3:HeadObject": "s3:GetObject",
    "s3:ListObjectsV2": "s3:ListBucket",
    "s3:ListObjects": "s3:ListBucket",
    "s3:HeadBucket": "s3:ListBucket",
    "s3:CreateMultipartUpload": "s3:PutObject",
    "s3:UploadPart": "s3:PutObject",
    "s3:CompleteMultipartUpload": "s3:PutObject",
}
#: Where a denied call's missing permission is granted.
POLICY_HINT = "`autoscaler deploy policy` writes the daemon's policy for this configuration"


def iam_action(client: BaseClient, operation: str) -> str:
    """The IAM action an API operation of `client` needs (`s3:GetObject` for HeadObject)."""
    prefix = client.meta.service_model.signing_name
    name = f"{prefix}:{operation}"
    return IAM_ACTION_OF.get(name, name)


def explain_denials(client: BaseClient, who: str = "the daemon's AWS identity") -> BaseClient:
    """Make every denied call of `client` say, in its one-line error, which IAM action (and,
    for S3, which object or bucket) it needed: AWS answers `AccessDenied`,
    `UnauthorizedOperation` or a bare `403 Forbidden` (a HEAD has no body) without naming
    it. Registered as botocore event handlers, before the error is raised; returns `client`."""
    events = client.meta.events
    service = client.meta.service_model.service_id.hyphenize()

    def remember(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["autoscaler_params"] = dict(params)

    def explain(
        http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        error = parsed.get("Error") or {}
        code = str(error.get("Code", ""))
        status = getattr(http_response, "status_code", 0)
        if code not in _PERMISSION_CODES and not (status == 403 and code in ("403", "")):
            return
        action = iam_action(client, model.name)
        params = context.get("autoscaler_params", {})
        target = ""
        if "Bucket" in params:
            key = params.get("Key")
            target = f" on arn:aws:s3:::{params['Bucket']}" + (f"/{key}" if key else "")
            if model.name in ("HeadObject", "GetObject"):
                target += (
                    f" (or s3:ListBucket on arn:aws:s3:::{params['Bucket']} for that prefix, "
                    "when the object does not exist: S3 then answers 403, not 404)"
                )
        message = " ".join(str(error.get("Message", "") or "Forbidden").split())
        # The action first: an EC2 denial carries a long encoded message, cut when shown.
        error["Message"] = f"{who} is not allowed {action}{target} ({POLICY_HINT}); {message}"
        if not code:
            error["Code"] = "AccessDenied"
        parsed["Error"] = error

    events.register(f"before-parameter-build.{service}", remember)
    events.register(f"after-call.{service}", explain)
    return client


def _attempts_from_environment() -> int:
    text = os.environ.get("AWS_MAX_ATTEMPTS", "")
    try:
        return max(1, int(text)) if text else DEFAULT_MAX_ATTEMPTS
    except ValueError:
        return DEFAULT_MAX_ATTEMPTS


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_message(exc: ClientError) -> str:
    """The error's message on one line; an HTML error page becomes its HTTP status."""
    message = " ".join(str(exc.response.get("Error", {}).get("Message", "")).split())
    if message.startswith("<"):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"HTTP {status} with an HTML page instead of an AWS response"
    return message if len(message) <= 300 else message[:297] + "..."


class AwsCaller:
    """Calls one boto3 client, backing off on throttling and translating errors.

    `sleep` is injectable so tests run the backoff without waiting. The delays
    are deterministic (`base_delay_s * 2**k`, capped): botocore's adaptive mode
    already spreads and rate-limits requests, this layer only has to be bounded.
    """

    def __init__(
        self,
        client: BaseClient,
        *,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 20.0,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.client = client
        self.sleep = sleep
        self.attempts = attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s

    def delay_s(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        return min(self.max_delay_s, self.base_delay_s * 2 ** (retry - 1))

    def api_name(self, operation: str) -> str:
        """`RunInstances` for `run_instances`."""
        return self.client.meta.method_to_api_mapping.get(operation, operation)

    def call(
        self, operation: str, *, passthrough: frozenset[str] = frozenset(), **params: Any
    ) -> dict[str, Any]:
        """Call `client.<operation>(**params)`.

        Error codes in `passthrough` are re-raised as the original `ClientError`
        for the caller to handle (capacity errors, `DryRunOperation`); every
        other failure becomes a `CloudError`.
        """
        method = getattr(self.client, operation)
        service = self.client.meta.service_model.service_id
        name = f"{service} {self.api_name(operation)}"
        waited = 0.0
        for attempt in range(1, self.attempts + 1):
            try:
                return method(**params)
            except ClientError as exc:
                code = error_code(exc)
                if code in passthrough:
                    raise
                if code in THROTTLING_CODES:
                    if attempt < self.attempts:
                        delay = self.delay_s(attempt)
                        self.sleep(delay)
                        waited += delay
                        continue
                    raise CloudUnavailable(
                        f"{name} kept throttling ({code}) after {self.attempts} attempts "
                        f"and {waited:g} s of backoff; retry later or launch less often"
                    ) from exc
                raise translate_client_error(exc, name) from exc
            except BotoCoreError as exc:
                raise translate_botocore_error(exc, name) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def pages(self, operation: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every page of a `NextToken`-paginated call, each page with the same backoff."""
        token: str | None = None
        while True:
            page = self.call(operation, **params, **({"NextToken": token} if token else {}))
            yield page
            token = page.get("NextToken") or None
            if token is None:
                return


def translate_client_error(exc: ClientError, name: str) -> CloudError:
    """The typed error for an AWS error response, with what to do about it."""
    code, message = error_code(exc), error_message(exc)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    detail = f"{name} failed: {code}: {message}" if message else f"{name} failed: {code}"
    if code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500):
        return CloudUnavailable(f"{detail}; AWS is having trouble, retry later")
    if code in _PERMISSION_CODES:
        if POLICY_HINT in message:  # `explain_denials` named the action already
            return CloudRequestError(detail)
        return CloudRequestError(f"{detail}; {POLICY_HINT}")
    if code in _CREDENTIAL_CODES:
        return CloudRequestError(
            f"{detail}; check the AWS credentials (aws configure, AWS_PROFILE, or an instance role)"
        )
    for prefix, hint in _CONFIG_HINTS:
        if code.startswith(prefix):
            return CloudRequestError(f"{detail}; {hint}")
    return CloudRequestError(detail)


def translate_botocore_error(exc: BotoCoreError, name: str) -> CloudError:
    """The typed error for a failure before or around the HTTP exchange."""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return CloudRequestError(
            f"{name}: no usable AWS credentials ({exc}); configure them with `aws configure`, "
            "AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or an instance role"
        )
    if isinstance(exc, NoRegionError | ParamValidationError):
        return CloudRequestError(f"{name}: {exc}")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return CloudUnavailable(f"{name}: cannot reach AWS ({exc}); retry later")
    return CloudUnavailable(f"{name}: {exc}; retry later")
