"""The cluster's IAM policies and S3 lifecycle rule, generated from its configuration.

`autoscaler deploy policy` (and `autoscaler init`) write them; deploy/*.json are
examples generated for a sample configuration (a test keeps them equal). Each
grant names what this cluster uses and nothing more:

- **the daemon** describes (catalog, instances, images, subnets: these EC2
  actions have no resource-level permissions) in the cluster's region only;
  launches only instances and volumes tagged with the cluster id, only from the
  configured images, subnets and security groups (and key pair); launches an
  instance as spot only when `[spot]` is enabled and only for the types its spot
  setting admits (`EC2Config.spot_type_patterns`, the test launches and the
  catalog follow), reading the region's spot prices and creating the spot
  service-linked role (for `spot.amazonaws.com` alone) then; tags only
  while launching; terminates and reads
  the console output of only the instances tagged with its cluster id; passes
  only the workers' role (when there is one) and only to EC2; reads and writes
  objects under the cluster's prefix of its bucket, lists only that prefix
  (without `s3:ListBucket`, S3 answers 403, not 404, for a missing key), and
  deletes only build contexts and jobs' objects there. The presigned URLs it
  hands workers are its own `s3:GetObject` and `s3:PutObject`, evaluated when a
  worker uses them;
- **the workers** need nothing: a worker proves its instance with the signed
  identity document and moves bytes through presigned URLs. The instance
  profile is optional; where one is given, its role gets a policy that denies
  every action, so nothing running on an instance can borrow it.

Statements that only some configurations need (spot, a customer-managed KMS
key, images named by SSM parameters, a key pair) appear only when configured.
Conditions use the literal cluster id and region of the configuration: the
roles need no tags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from autoscaler.errors import InputError
from provisioners.config import EC2Config
from provisioners.ec2 import MANAGED_BY, TAG_CLUSTER, TAG_MANAGED_BY
from provisioners.images import SSM_PREFIX

VERSION = "2012-10-17"

#: Default days after which S3 expires a job's objects (checkpoints, logs) and boot reports.
DEFAULT_EXPIRE_DAYS = 30


@dataclass(frozen=True, slots=True)
class Bucket:
    """Where the cluster keeps its objects: `s3://name/prefix`."""

    name: str
    prefix: str  # without slashes at either end; "" is the whole bucket

    @classmethod
    def from_url(cls, url: str) -> Bucket:
        scheme, name, path, _, _ = urlsplit(url)
        if scheme != "s3" or not name or "REPLACE-WITH-YOUR-BUCKET" in url:
            raise InputError(
                "must be s3://BUCKET[/PREFIX] for EC2: the daemon's policy is scoped to it",
                where="[storage]",
                field="url",
                value=url,
                has_value=True,
            )
        return cls(name, path.strip("/"))

    def objects(self, under: str = "") -> str:
        """The ARN of every object under `under` (relative to the prefix)."""
        parts = [p for p in (self.prefix, under.strip("/")) if p]
        return f"arn:aws:s3:::{self.name}/" + "/".join([*parts, "*"])

    @property
    def arn(self) -> str:
        return f"arn:aws:s3:::{self.name}"


def partition(region: str) -> str:
    """The ARN partition of a region: `aws`, `aws-cn`, `aws-us-gov`."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def worker_role_name(profile: str | None) -> str | None:
    """The workers' role, named like its instance profile (the console names both alike);
    from an ARN, the profile's last path segment."""
    if not profile:
        return None
    return profile.rsplit("/", 1)[-1] if profile.startswith("arn:") else profile


def daemon_policy(
    ec2: EC2Config, storage_url: str, *, worker_role: str | None = None
) -> dict[str, Any]:
    """The daemon's IAM policy for this configuration (see the module's docstring)."""
    if ec2.cluster_id is None:
        raise InputError("missing: the policy is scoped to it", where="[ec2]", field="cluster_id")
    region, cluster = ec2.region, ec2.cluster_id
    arn = f"arn:{partition(region)}"
    ec2_arn = f"{arn}:ec2:{region}"
    bucket = Bucket.from_url(storage_url)
    in_region = {"StringEquals": {"aws:RequestedRegion": region}}
    ours = {
        f"aws:RequestTag/{TAG_CLUSTER}": cluster,
        f"aws:RequestTag/{TAG_MANAGED_BY}": MANAGED_BY,
    }
    tagged_ours = {
        f"ec2:ResourceTag/{TAG_CLUSTER}": cluster,
        f"ec2:ResourceTag/{TAG_MANAGED_BY}": MANAGED_BY,
    }
    statements: list[dict[str, Any]] = [
        {
            "Sid": "DescribeTypesInstancesImagesAndSubnetsInTheRegion",
            "Effect": "Allow",
            "Action": [
                "ec2:DescribeImages",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeInstances",
                "ec2:DescribeSubnets",
            ],
            "Resource": "*",
            "Condition": in_region,
        },
        {
            # Instances on-demand: a spot instance needs the statement below.
            "Sid": "LaunchOnlyInstancesAndVolumesTaggedForThisCluster",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": [f"{ec2_arn}:*:instance/*", f"{ec2_arn}:*:volume/*"],
            "Condition": {
                "StringEquals": ours,
                "StringEqualsIfExists": {"ec2:InstanceMarketType": "on-demand"},
            },
        },
    ]
    if ec2.spot_enabled:
        statements.append(
            {
                "Sid": "LaunchSpotInstancesOnlyOfTheSpotTypes",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": f"{ec2_arn}:*:instance/*",
                "Condition": {
                    "StringEquals": {**ours, "ec2:InstanceMarketType": "spot"},
                    "StringLike": {"ec2:InstanceType": list(ec2.spot_type_patterns())},
                },
            }
        )
    literal_images = sorted({ref for _, ref in ec2.ami if not ref.startswith(SSM_PREFIX)})
    launch_with = [f"{ec2_arn}::image/{image}" for image in literal_images]
    launch_with += [f"{ec2_arn}:*:subnet/{subnet}" for subnet in sorted(ec2.subnet_ids)]
    launch_with += [f"{ec2_arn}:*:security-group/{sg}" for sg in sorted(ec2.security_group_ids)]
    launch_with.append(f"{ec2_arn}:*:network-interface/*")
    if ec2.key_name:
        launch_with.append(f"{ec2_arn}:*:key-pair/{ec2.key_name}")
    if ec2.spot_enabled:
        launch_with.append(f"{ec2_arn}:*:spot-instances-request/*")
        statements.append(
            {
                "Sid": "ReadSpotPricesInTheRegion",
                "Effect": "Allow",
                "Action": "ec2:DescribeSpotPriceHistory",
                "Resource": "*",
                "Condition": in_region,
            }
        )
    statements.append(
        {
            "Sid": "LaunchFromTheConfiguredImagesSubnetsAndSecurityGroups",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": launch_with,
        }
    )
    named = {ref[len(SSM_PREFIX) :] for _, ref in ec2.ami if ref.startswith(SSM_PREFIX)}
    parameters = sorted(named)
    public = [name for name in parameters if name.startswith("/aws/service/")]
    if public:
        # AWS moves its public parameters to new images: pin the owner, not the id.
        statements.append(
            {
                "Sid": "LaunchAmazonsImagesItsPublicParametersName",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": f"{ec2_arn}::image/*",
                "Condition": {"StringEquals": {"ec2:Owner": "amazon"}},
            }
        )
    if len(public) < len(parameters):
        # A parameter of the account's own names whatever image it is set to: any image.
        statements.append(
            {
                "Sid": "LaunchTheImagesTheAccountsOwnParametersName",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": f"{ec2_arn}::image/*",
            }
        )
    if parameters:
        statements.append(
            {
                "Sid": "ResolveTheConfiguredImageParameters",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": [_parameter_arn(arn, region, name) for name in parameters],
            }
        )
    statements += [
        {
            "Sid": "TagOnlyWhileLaunching",
            "Effect": "Allow",
            "Action": "ec2:CreateTags",
            "Resource": [f"{ec2_arn}:*:instance/*", f"{ec2_arn}:*:volume/*"],
            "Condition": {
                "StringEquals": {"ec2:CreateAction": "RunInstances", **ours},
            },
        },
        {
            "Sid": "TerminateAndDiagnoseOnlyThisClustersInstances",
            "Effect": "Allow",
            "Action": ["ec2:GetConsoleOutput", "ec2:TerminateInstances"],
            "Resource": f"{ec2_arn}:*:instance/*",
            "Condition": {"StringEquals": tagged_ours},
        },
    ]
    role = worker_role or worker_role_name(ec2.iam_instance_profile)
    if ec2.iam_instance_profile and role:
        statements.append(
            {
                "Sid": "PassOnlyTheWorkersRoleAndOnlyToEC2",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": f"{arn}:iam::*:role/{role}",
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            }
        )
    if ec2.spot_enabled:
        statements.append(
            {
                "Sid": "CreateTheSpotServiceLinkedRoleOnTheFirstSpotLaunch",
                "Effect": "Allow",
                "Action": "iam:CreateServiceLinkedRole",
                "Resource": f"{arn}:iam::*:role/aws-service-role/spot.amazonaws.com/"
                "AWSServiceRoleForEC2Spot",
                "Condition": {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}},
            }
        )
    if ec2.root_volume_kms_key:
        key = ec2.root_volume_kms_key
        key_arn = key if key.startswith("arn:") else f"{arn}:kms:{region}:*:key/*"
        via_ec2 = {"StringEquals": {"kms:ViaService": f"ec2.{region}.amazonaws.com"}}
        statements += [
            {
                "Sid": "EncryptRootVolumesWithTheConfiguredKeyThroughEC2",
                "Effect": "Allow",
                "Action": [
                    "kms:Decrypt",
                    "kms:DescribeKey",
                    "kms:GenerateDataKeyWithoutPlaintext",
                    "kms:ReEncryptFrom",
                    "kms:ReEncryptTo",
                ],
                "Resource": key_arn,
                "Condition": via_ec2,
            },
            {
                "Sid": "LetEC2HoldAGrantOnThatKeyForTheVolume",
                "Effect": "Allow",
                "Action": "kms:CreateGrant",
                "Resource": key_arn,
                "Condition": {
                    **via_ec2,
                    "Bool": {"kms:GrantIsForAWSResource": "true"},
                },
            },
        ]
    statements += [
        {
            # The Pricing API answers from us-east-1 for every region: no region condition.
            "Sid": "ReadOnDemandPrices",
            "Effect": "Allow",
            "Action": "pricing:GetProducts",
            "Resource": "*",
        },
        {
            "Sid": "ReadAndWriteThisClustersObjects",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject"],
            "Resource": bucket.objects(),
        },
        {
            "Sid": "ListOnlyThisClustersPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket.arn,
            **(
                {"Condition": {"StringLike": {"s3:prefix": [f"{bucket.prefix}/*"]}}}
                if bucket.prefix
                else {}
            ),
        },
        {
            "Sid": "DeleteUnusedBuildContextsAndFinishedJobsCheckpoints",
            "Effect": "Allow",
            "Action": "s3:DeleteObject",
            "Resource": [bucket.objects("contexts"), bucket.objects("jobs")],
        },
    ]
    return {"Version": VERSION, "Statement": statements}


def worker_policy() -> dict[str, Any]:
    """The workers' role, if they have one: it may do nothing."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "WorkersCallNoAwsApiSoNothingOnAnInstanceMayUseThisRole",
                "Effect": "Deny",
                "Action": "*",
                "Resource": "*",
            }
        ],
    }


def s3_lifecycle(storage_url: str, expire_days: int = DEFAULT_EXPIRE_DAYS) -> dict[str, Any]:
    """The bucket's lifecycle rules for the cluster's prefix (`aws s3api
    put-bucket-lifecycle-configuration`): a job's checkpoints and logs, and the reports
    of failed boots, expire after `expire_days`; an upload left half done is aborted
    after a day. The daemon deletes a finished job's checkpoints sooner
    (`[storage] checkpoint_retention_days`); this rule is the backstop that also holds
    while no daemon runs."""
    bucket = Bucket.from_url(storage_url)
    base = f"{bucket.prefix}/" if bucket.prefix else ""
    return {
        "Rules": [
            {
                "ID": f"expire-{under}-after-{expire_days}-days",
                "Filter": {"Prefix": f"{base}{under}/"},
                "Status": "Enabled",
                "Expiration": {"Days": expire_days},
            }
            for under in ("jobs", "instances")
        ]
        + [
            {
                "ID": "abort-incomplete-uploads-after-1-day",
                "Filter": {"Prefix": base},
                "Status": "Enabled",
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
            }
        ]
    }


def _parameter_arn(arn: str, region: str, name: str) -> str:
    name = name.split(":", 1)[0]  # a version or label selector is not part of the ARN
    # Any account: AWS's public parameters (/aws/service/...) belong to none of ours.
    return f"{arn}:ssm:{region}:*:parameter/{name.lstrip('/')}"


#: The files `write_policies` writes, by what they hold.
FILES: Mapping[str, str] = {
    "daemon": "daemon-iam-policy.json",
    "worker": "worker-iam-policy.json",
    "lifecycle": "s3-lifecycle.json",
}


def render(document: Mapping[str, Any]) -> str:
    """A policy as written to a file: indented, keys in the order built, a final newline."""
    return json.dumps(document, indent=2) + "\n"


def write_policies(
    directory: Path,
    ec2: EC2Config,
    storage_url: str,
    *,
    worker_role: str | None = None,
    expire_days: int = DEFAULT_EXPIRE_DAYS,
) -> list[Path]:
    """Write the daemon's and the workers' policies and the lifecycle rule into `directory`."""
    documents = {
        "daemon": daemon_policy(ec2, storage_url, worker_role=worker_role),
        "worker": worker_policy(),
        "lifecycle": s3_lifecycle(storage_url, expire_days),
    }
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for what, document in documents.items():
        path = directory / FILES[what]
        path.write_text(render(document), encoding="utf-8")
        written.append(path)
    return written
