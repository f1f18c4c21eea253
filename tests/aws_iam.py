"""IAM as AWS evaluates it, small enough to read: does a policy allow a call, and why.

moto does not enforce IAM, so the tests do. `Policy.evaluate` follows AWS's documented
evaluation logic for one identity-based policy ("Policy evaluation logic" in the IAM
User Guide): an explicit Deny in any matching statement wins; otherwise any matching
Allow allows; otherwise the request is implicitly denied. A statement matches when its
Action (or NotAction), its Resource (or NotResource) and every condition match:

- actions compare case-insensitively, resources case-sensitively, both with `*` and
  `?` wildcards;
- conditions: every operator block and every key in it must hold (AND); the values
  listed for one key are alternatives (OR). Operators: String(Not)Equals(IgnoreCase),
  String(Not)Like, Arn(Not)Equals/Like, Bool, Null, with `...IfExists`; a key absent
  from the request fails a positive operator and satisfies a negated one;
  `ForAnyValue:`/`ForAllValues:` for multivalued keys (`aws:TagKeys`). Condition
  key names compare case-insensitively up to the `/` of a tag key;
- policy variables (`${aws:PrincipalTag/team}`, `${*}`) in resources and condition
  values take the request's values; a statement whose variable has no value does
  not match.

`requests_for` maps one boto3 API call (service, operation, parameters) to the IAM
requests AWS authorizes for it (AWS's Service Authorization Reference): the action,
each concrete resource ARN, and the condition keys our policies use — including the
actions a call implies (`RunInstances` with tags authorizes `ec2:CreateTags`, with an
instance profile `iam:PassRole`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

Values = str | Sequence[str]


@dataclass(frozen=True, slots=True)
class Request:
    """One authorization AWS makes: an action on a resource, with the request's context."""

    action: str
    resource: str
    context: Mapping[str, Values] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    allowed_by: tuple[str, ...] = ()  # Sids (or positions) of the Allow statements that matched


class Policy:
    """One identity-based policy document."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        statements = document.get("Statement", [])
        if isinstance(statements, Mapping):
            statements = [statements]
        self.statements: list[Mapping[str, Any]] = list(statements)

    def sid(self, index: int) -> str:
        return str(self.statements[index].get("Sid") or f"#{index}")

    @property
    def sids(self) -> list[str]:
        return [self.sid(i) for i in range(len(self.statements))]

    def evaluate(self, request: Request) -> Decision:
        context = _normalize(request.context)
        allowed: list[str] = []
        for index, statement in enumerate(self.statements):
            if not _matches(statement, request, context):
                continue
            if statement.get("Effect") == "Deny":
                return Decision(False, f"explicitly denied by {self.sid(index)}")
            if statement.get("Effect") == "Allow":
                allowed.append(self.sid(index))
        if allowed:
            return Decision(True, f"allowed by {', '.join(allowed)}", tuple(allowed))
        return Decision(False, "no statement allows it (implicit deny)")


# -- matching ------------------------------------------------------------------------------


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


@cache
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("^" + "".join(parts) + "$", re.IGNORECASE if ignore_case else 0)


def glob_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's wildcards: `*` any run of characters (slashes and colons too), `?` one."""
    return bool(_glob(pattern, ignore_case).match(value))


_VARIABLE = re.compile(r"\$\{([^}]*)\}")


class _Unresolved(Exception):
    """A policy variable with no value in the request."""


def _substitute(text: str, context: Mapping[str, list[str]]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in ("*", "?", "$"):
            return "\x00" + name  # a literal wildcard character, not a wildcard
        values = context.get(_key(name))
        if not values or len(values) != 1:
            raise _Unresolved(name)
        return values[0]

    return _VARIABLE.sub(value, text)


def _literal_glob(pattern: str, value: str, ignore_case: bool) -> bool:
    """Glob match where `\\x00*` (from `${*}`) is a literal character."""
    if "\x00" not in pattern:
        return glob_match(pattern, value, ignore_case=ignore_case)
    parts = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\x00":
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
        i += 1
    flags = re.IGNORECASE if ignore_case else 0
    return bool(re.match("^" + "".join(parts) + "$", value, flags))


def _matches(
    statement: Mapping[str, Any], request: Request, context: Mapping[str, list[str]]
) -> bool:
    if "Action" in statement:
        if not any(
            glob_match(a, request.action, ignore_case=True) for a in _listed(statement["Action"])
        ):
            return False
    elif "NotAction" in statement:
        if any(
            glob_match(a, request.action, ignore_case=True) for a in _listed(statement["NotAction"])
        ):
            return False
    else:
        return False
    try:
        if "Resource" in statement:
            patterns = [_substitute(r, context) for r in _listed(statement["Resource"])]
            if not any(_literal_glob(p, request.resource, False) for p in patterns):
                return False
        elif "NotResource" in statement:
            patterns = [_substitute(r, context) for r in _listed(statement["NotResource"])]
            if any(_literal_glob(p, request.resource, False) for p in patterns):
                return False
        conditions = statement.get("Condition", {})
        return all(
            _condition(operator, key, _listed(values), context)
            for operator, block in conditions.items()
            for key, values in block.items()
        )
    except _Unresolved:
        return False


_NEGATED = (
    "StringNotEquals",
    "StringNotEqualsIgnoreCase",
    "StringNotLike",
    "ArnNotEquals",
    "ArnNotLike",
)


def _compare(operator: str) -> Callable[[str, str], bool]:
    if operator in ("StringEquals", "StringNotEquals"):
        return lambda p, v: p == v
    if operator in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
        return lambda p, v: p.lower() == v.lower()
    if operator in (
        "StringLike",
        "StringNotLike",
        "ArnLike",
        "ArnNotLike",
        "ArnEquals",
        "ArnNotEquals",
    ):
        return lambda p, v: _literal_glob(p, v, False)
    if operator == "Bool":
        return lambda p, v: p.lower() == v.lower()
    raise NotImplementedError(f"condition operator {operator} (add it with a test)")


def _condition(
    operator: str, key: str, values: list[str], context: Mapping[str, list[str]]
) -> bool:
    qualifier = ""
    if ":" in operator:
        qualifier, operator = operator.split(":", 1)
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    present = context.get(_key(key))
    if operator == "Null":
        wanted = values[0].lower() == "true"
        return (present is None or present == []) == wanted
    if not present:
        if qualifier == "ForAllValues":
            return True
        if if_exists:
            return True
        return operator in _NEGATED and qualifier != "ForAnyValue"
    patterns = [_substitute(v, context) for v in values]
    compare = _compare(operator)
    negated = operator in _NEGATED

    def one(value: str) -> bool:
        hit = any(compare(p, value) for p in patterns)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in present)
    if qualifier == "ForAnyValue":
        return any(one(v) for v in present)
    return all(one(v) for v in present) if negated else any(one(v) for v in present)


def _key(name: str) -> str:
    """Condition keys compare case-insensitively, except a tag key after the `/`."""
    head, slash, tail = name.partition("/")
    return head.lower() + slash + tail


def _normalize(context: Mapping[str, Values]) -> dict[str, list[str]]:
    return {_key(k): _listed(v) for k, v in context.items()}


# -- from API calls to IAM requests --------------------------------------------------------------

#: IAM actions that are not named like their API operation.
ACTIONS: Mapping[str, str] = {
    "s3:HeadObject": "s3:GetObject",
    "s3:ListObjectsV2": "s3:ListBucket",
    "s3:ListObjects": "s3:ListBucket",
    "s3:HeadBucket": "s3:ListBucket",
    "s3:CreateMultipartUpload": "s3:PutObject",
    "s3:UploadPart": "s3:PutObject",
    "s3:CompleteMultipartUpload": "s3:PutObject",
}
#: boto3's service names -> IAM's service prefixes, where they differ.
PREFIXES: Mapping[str, str] = {}


#: The role each service links, by its service name (others: `AWSServiceRoleFor<name>`).
SERVICE_LINKED_ROLES = {"spot.amazonaws.com": "AWSServiceRoleForEC2Spot"}


def requests_for(
    service: str,
    operation: str,
    params: Mapping[str, Any],
    *,
    region: str,
    account: str,
    principal: Mapping[str, Values] | None = None,
    tags_of: Callable[[str], Mapping[str, str]] = lambda instance_id: {},
    owner_of: Callable[[str], str] = lambda image_id: "",
) -> list[Request]:
    """The IAM requests AWS authorizes for one API call. `tags_of` gives an instance's
    tags (for `ec2:ResourceTag/*`), `owner_of` an image's owner (`ec2:Owner`: "amazon"
    or an account); `principal` the caller's own context keys (`aws:PrincipalTag/*`)."""
    prefix = PREFIXES.get(service, service)
    action = ACTIONS.get(f"{prefix}:{operation}", f"{prefix}:{operation}")
    base: dict[str, Values] = {"aws:RequestedRegion": region, **(principal or {})}
    ec2 = f"arn:aws:ec2:{region}:{account}"
    if prefix == "s3":
        return _s3_requests(action, params, base)
    if prefix == "ec2" and operation == "RunInstances":
        return _run_instances(params, base, ec2, region, account, owner_of)
    if prefix == "ec2" and operation in ("TerminateInstances", "GetConsoleOutput", "StopInstances"):
        ids = _listed(params.get("InstanceIds") or params.get("InstanceId"))
        requests = []
        for instance_id in ids:
            tags = tags_of(instance_id)
            context = dict(base)
            for key, value in tags.items():
                context[f"ec2:ResourceTag/{key}"] = value
                context[f"aws:ResourceTag/{key}"] = value
            requests.append(Request(action, f"{ec2}:instance/{instance_id}", context))
        return requests
    if prefix == "iam" and operation == "CreateServiceLinkedRole":
        service = str(params["AWSServiceName"])
        name = SERVICE_LINKED_ROLES.get(service, f"AWSServiceRoleFor{service.split('.')[0]}")
        return [
            Request(
                action,
                f"arn:aws:iam::{account}:role/aws-service-role/{service}/{name}",
                {**base, "iam:AWSServiceName": service},
            )
        ]
    if prefix == "ssm" and operation in ("GetParameter", "GetParameters"):
        names = _listed(params.get("Name") or params.get("Names"))
        owner = lambda name: "" if name.startswith("/aws/service/") else account  # noqa: E731
        return [
            Request(
                action,
                f"arn:aws:ssm:{region}:{owner(n)}:parameter/{n.split(':')[0].lstrip('/')}",
                base,
            )
            for n in names
        ]
    return [Request(action, "*", base)]


def _s3_requests(
    action: str, params: Mapping[str, Any], base: Mapping[str, Values]
) -> list[Request]:
    bucket = params.get("Bucket", "")
    context = dict(base)
    context.pop("aws:RequestedRegion", None)  # S3 is global in our policies
    if action == "s3:ListBucket":
        if params.get("Prefix") is not None:
            context["s3:prefix"] = str(params["Prefix"])
        return [Request(action, f"arn:aws:s3:::{bucket}", context)]
    if "Key" in params:
        return [Request(action, f"arn:aws:s3:::{bucket}/{params['Key']}", context)]
    return [Request(action, f"arn:aws:s3:::{bucket}", context)]


def _run_instances(
    params: Mapping[str, Any],
    base: Mapping[str, Values],
    ec2: str,
    region: str,
    account: str,
    owner_of: Callable[[str], str],
) -> list[Request]:
    tags: dict[str, str] = {}
    tagged_types: list[str] = []
    for spec in params.get("TagSpecifications", []):
        tagged_types.append(spec["ResourceType"])
        for tag in spec.get("Tags", []):
            tags[tag["Key"]] = tag["Value"]
    context: dict[str, Values] = dict(base)
    for key, value in tags.items():
        context[f"aws:RequestTag/{key}"] = value
    if tags:
        context["aws:TagKeys"] = sorted(tags)
    resources = [f"{ec2}:instance/*", f"{ec2}:volume/*", f"{ec2}:network-interface/*"]
    for interface in params.get("NetworkInterfaces", []):
        if "SubnetId" in interface:
            resources.append(f"{ec2}:subnet/{interface['SubnetId']}")
        resources += [f"{ec2}:security-group/{g}" for g in interface.get("Groups", [])]
    if "SubnetId" in params:
        resources.append(f"{ec2}:subnet/{params['SubnetId']}")
    resources += [f"{ec2}:security-group/{g}" for g in params.get("SecurityGroupIds", [])]
    if params.get("KeyName"):
        resources.append(f"{ec2}:key-pair/{params['KeyName']}")
    if params.get("InstanceMarketOptions", {}).get("MarketType") == "spot":
        resources.append(f"{ec2}:spot-instances-request/*")
    requests = [Request("ec2:RunInstances", r, context) for r in resources]
    # The instance carries its type and market (on-demand unless InstanceMarketOptions).
    market = params.get("InstanceMarketOptions", {}).get("MarketType") or "on-demand"
    instance: dict[str, Values] = {**context, "ec2:InstanceMarketType": market}
    if params.get("InstanceType"):
        instance["ec2:InstanceType"] = params["InstanceType"]
    requests[0] = Request("ec2:RunInstances", resources[0], instance)
    image = params["ImageId"]
    owner = owner_of(image)
    requests.append(
        Request(
            "ec2:RunInstances",
            f"arn:aws:ec2:{region}::image/{image}",
            {**context, **({"ec2:Owner": owner} if owner else {})},
        )
    )
    if params.get("InstanceMarketOptions", {}).get("MarketType") == "spot":
        # At an account's first spot launch EC2 creates its service-linked role, as the caller.
        requests.append(
            Request(
                "iam:CreateServiceLinkedRole",
                f"arn:aws:iam::{account}:role/aws-service-role/spot.amazonaws.com/"
                "AWSServiceRoleForEC2Spot",
                {**base, "iam:AWSServiceName": "spot.amazonaws.com"},
            )
        )
    for mapping in params.get("BlockDeviceMappings", []):
        key = mapping.get("Ebs", {}).get("KmsKeyId")
        if key:
            # EC2 uses the key on the caller's behalf (kms:ViaService) to make the volume.
            key_arn = key if key.startswith("arn:") else f"arn:aws:kms:{region}:{account}:key/{key}"
            via = {**base, "kms:ViaService": f"ec2.{region}.amazonaws.com"}
            for kms in (
                "Decrypt",
                "DescribeKey",
                "GenerateDataKeyWithoutPlaintext",
                "ReEncryptFrom",
                "ReEncryptTo",
            ):
                requests.append(Request(f"kms:{kms}", key_arn, via))
            requests.append(
                Request("kms:CreateGrant", key_arn, {**via, "kms:GrantIsForAWSResource": "true"})
            )
    tag_context = {**context, "ec2:CreateAction": "RunInstances"}
    for resource_type in tagged_types:
        requests.append(Request("ec2:CreateTags", f"{ec2}:{resource_type}/*", tag_context))
    profile = params.get("IamInstanceProfile") or {}
    name = profile.get("Name") or str(profile.get("Arn", "")).rsplit("/", 1)[-1]
    if name:
        requests.append(
            Request(
                "iam:PassRole",
                f"arn:aws:iam::{account}:role/{name}",
                {**base, "iam:PassedToService": "ec2.amazonaws.com"},
            )
        )
    return requests


def unused_statements(policy: Policy, used: Iterable[str]) -> list[str]:
    """Statements no recorded request was allowed by."""
    seen = set(used)
    return [sid for sid in policy.sids if sid not in seen]
