"""The worker bootstrap: EC2 user data rendered per launch, and what the daemon publishes for it.

A worker needs two things the daemon has: the agent itself, and the cluster's
server CA certificate, to know the daemon by. It needs no secret: it proves its
instance when it enrolls, with the identity document AWS signs for that
instance (`--imds`; `provisioners.identity` checks it). User data is readable
by anything that reaches the instance metadata service and through
`DescribeInstanceAttribute`, so it carries only what is public or short-lived:

- the **wheelhouse** (`provisioners.wheelhouse`: the agent and every
  dependency, hash-pinned) the daemon publishes to the cluster's bucket under
  its sha256 (`publish_wheelhouse`); user data holds a presigned URL made for
  this launch and the hash, which the script checks before installing offline;
- a presigned PUT URL under the cluster's prefix where the script leaves its
  **failure report** (`BootReports`): the step that failed and why. The daemon
  reads it when the instance never registers, beside EC2's state reason and the
  console output (`EC2Cloud.diagnose`);
- the **server CA certificate** itself (public), and the daemon's address.

`WorkerBootstrap.render(instance_id)` fills `provisioners/data/worker-bootstrap.sh` for one
launch (our instance id is the launch token, so every instance's user data
differs); `EC2Cloud` calls it at each launch. Values are validated and
shell-quoted, and the result is checked against EC2's 16 KB limit.

What the daemon calls at start-up, with its own identity:

    url, sha256 = publish_wheelhouse(s3, bucket, prefix, wheelhouse_dir)
    bootstrap = WorkerBootstrap(daemon_address, ca_pem, cluster_id, region,
                                object_presigner(s3, url), sha256,
                                reports=BootReports(s3, bucket, prefix))
    cloud = EC2Cloud(config.ec2, config.guardrails, bootstrap=bootstrap)
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import inf
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from autoscaler.errors import InputError
from autoscaler.period import ROUND_INTERVAL_S
from provisioners.aws import AwsCaller
from provisioners.wheelhouse import check, pack

log = logging.getLogger(__name__)

#: EC2 accepts at most 16 KB of user data (before base64).
MAX_USER_DATA_BYTES = 16 * 1024

#: The template, in the repository's deploy/ folder (pass another with `template=`).
#: The template ships inside the package (deploy/worker-bootstrap.sh links to it), so an
#: installed daemon renders the same script a source checkout does.
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "data" / "worker-bootstrap.sh"

#: Placeholders of the template, each replaced by a shell-quoted value.
PLACEHOLDERS: tuple[str, ...] = (
    "DAEMON_ADDRESS",
    "CA_PEM",
    "CLUSTER_ID",
    "REGION",
    "INSTANCE_ID",
    "WHEELHOUSE_URL",
    "WHEELHOUSE_SHA256",
    "REPORT_URL",
    "ACCELERATOR",
    "THROUGHPUT_WINDOW",
    "ORPHAN_TIMEOUT",
    "ORPHAN_MAX",
)

#: How long a presigned wheelhouse URL stays valid: the instance fetches it within minutes.
WHEELHOUSE_URL_EXPIRES_S = 3600
#: How long a failure report URL stays valid: the boot and registration timeouts, and more.
REPORT_URL_EXPIRES_S = 3 * 3600
#: The most of a failure report the daemon reads (the script sends at most 4000 bytes).
MAX_REPORT_BYTES = 4096

_PLACEHOLDER = re.compile(r"\{\{[A-Z_]+\}\}")
_HOST_PORT = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?):(\d{1,5})$"
)
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ARCHIVE = re.compile(r"^[0-9a-f]{64}\.tar$")
_ACCELERATORS = ("", "nvidia")


@dataclass(frozen=True, slots=True)
class BootReports:
    """Where each instance's bootstrap leaves its failure report: one object per instance
    under the cluster's prefix, `instances/<instance id>/bootstrap-report.txt`. The
    script PUTs it through a URL the daemon presigned for that launch (the worker
    holds no credential); the daemon reads it with its own."""

    s3: Any
    bucket: str
    prefix: str
    expires_s: int = REPORT_URL_EXPIRES_S

    def key(self, instance_id: str) -> str:
        _check("instance_id", instance_id, _INSTANCE_ID, "an instance id (launch token)")
        parts = (self.prefix.strip("/"), "instances", instance_id, "bootstrap-report.txt")
        return "/".join(p for p in parts if p)

    def put_url(self, instance_id: str) -> str:
        return str(
            self.s3.generate_presigned_url(
                "put_object",
                Params={"Bucket": self.bucket, "Key": self.key(instance_id)},
                ExpiresIn=self.expires_s,
            )
        )

    def read(self, instance_id: str) -> str:
        """The instance's report on one line ("" when it left none)."""
        caller = AwsCaller(self.s3)
        try:
            got = caller.call(
                "get_object",
                passthrough=frozenset({"404", "NoSuchKey", "NotFound"}),
                Bucket=self.bucket,
                Key=self.key(instance_id),
                Range=f"bytes=0-{MAX_REPORT_BYTES - 1}",
            )
        except ClientError:
            return ""  # no report: the script never ran, or never reached the end
        text = got["Body"].read(MAX_REPORT_BYTES).decode("utf-8", "replace")
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())


@dataclass(frozen=True, slots=True)
class WorkerBootstrap:
    """What every worker's user data says, and how to render it for one launch.

    `wheelhouse_url` is a URL, or a function returning one (a fresh presigned
    URL per launch: `object_presigner`). `reports`, when given, gets each launch a
    presigned URL for its failure report. `throughput_window_s` is the window jobs
    report throughput over: one round of the cluster
    (`autoscaler.period.throughput_window_s`), as the local cloud's workers get.
    Everything is validated when built, so a bad value stops the daemon at
    start-up rather than at its first launch.
    """

    daemon_address: str  # host:port
    ca_pem: str
    cluster_id: str
    region: str
    wheelhouse_url: str | Callable[[], str] = field(repr=False)
    wheelhouse_sha256: str
    template: Path = DEFAULT_TEMPLATE
    throughput_window_s: float = ROUND_INTERVAL_S
    reports: BootReports | None = field(default=None, repr=False)
    # The agent's spend brake (`autoscaler-worker --orphan-timeout/--orphan-max`, 0: never).
    orphan_timeout_s: float = 1800.0
    orphan_max_s: float = 7200.0

    def __post_init__(self) -> None:
        _check("daemon_address", self.daemon_address, _HOST_PORT, "host:port")
        port = int(self.daemon_address.rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise _invalid("daemon_address", self.daemon_address, "a port from 1 to 65535")
        if "-----BEGIN CERTIFICATE-----" not in self.ca_pem:
            raise _invalid("ca_pem", self.ca_pem[:40], "a PEM certificate")
        _check("cluster_id", self.cluster_id, _CLUSTER_ID, "a cluster id")
        _check("region", self.region, _REGION, "an AWS region")
        _check("wheelhouse_sha256", self.wheelhouse_sha256, _SHA256, "64 lowercase hex digits")
        window = self.throughput_window_s
        if isinstance(window, bool) or not isinstance(window, int | float) or not 0 < window < inf:
            raise _invalid("throughput_window_s", window, "a positive number of seconds")
        for name in ("orphan_timeout_s", "orphan_max_s"):
            value = getattr(self, name)
            number_ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not number_ok or not 0 <= value < inf:
                raise _invalid(name, value, "0 or a positive number of seconds")
        if not isinstance(self.wheelhouse_url, str) and not callable(self.wheelhouse_url):
            raise _invalid(
                "wheelhouse_url", self.wheelhouse_url, "a URL or a function returning one"
            )
        self.template_text()  # readable, with only known placeholders

    def template_text(self) -> str:
        try:
            text = self.template.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"cannot read the worker bootstrap template: {exc}", source=str(self.template)
            ) from None
        unknown = sorted(set(_PLACEHOLDER.findall(text)) - {f"{{{{{p}}}}}" for p in PLACEHOLDERS})
        if unknown:
            raise InputError(
                f"unknown placeholder {unknown[0]} (known: {', '.join(PLACEHOLDERS)})",
                source=str(self.template),
            )
        return text

    def render(self, instance_id: str, *, accelerator: str | None = None) -> str:
        """The user data of the instance `instance_id` (our id: its launch token).

        `accelerator` "nvidia" makes the script check the driver and container
        toolkit (a GPU type on an image without them would only fail later).
        """
        _check("instance_id", instance_id, _INSTANCE_ID, "an instance id (launch token)")
        if (accelerator or "") not in _ACCELERATORS:
            accelerator = ""  # other accelerators: no check the script knows how to make
        url = self.wheelhouse_url() if callable(self.wheelhouse_url) else self.wheelhouse_url
        scheme, _, path, _, _ = urlsplit(url)
        if scheme not in ("https", "http") or not _ARCHIVE.match(PurePosixPath(path).name):
            raise _invalid("wheelhouse_url", url.split("?", 1)[0], "an http(s) URL of <sha256>.tar")
        values = {
            "DAEMON_ADDRESS": self.daemon_address,
            "CA_PEM": self.ca_pem.strip(),
            "CLUSTER_ID": self.cluster_id,
            "REGION": self.region,
            "INSTANCE_ID": instance_id,
            "WHEELHOUSE_URL": url,
            "WHEELHOUSE_SHA256": self.wheelhouse_sha256,
            "REPORT_URL": self.reports.put_url(instance_id) if self.reports else "",
            "ACCELERATOR": accelerator or "",
            "THROUGHPUT_WINDOW": f"{self.throughput_window_s:g}",
            "ORPHAN_TIMEOUT": f"{self.orphan_timeout_s:g}",
            "ORPHAN_MAX": f"{self.orphan_max_s:g}",
        }
        text = fill_template(self.template_text(), values)
        size = len(text.encode("utf-8"))
        if size > MAX_USER_DATA_BYTES:
            raise InputError(
                f"worker user data is {size} bytes; EC2 accepts at most {MAX_USER_DATA_BYTES}",
                source=str(self.template),
            )
        return text


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """Replace each `{{NAME}}` with its shell-quoted value: no value can inject a command."""
    missing = [name for name in PLACEHOLDERS if name not in values]
    if missing:
        raise InputError(f"worker bootstrap needs a value for {', '.join(missing)}")
    text = template
    for name in PLACEHOLDERS:
        text = text.replace("{{" + name + "}}", shlex.quote(values[name]))
    return text


# --- what the daemon publishes at start-up ----------------------------------------------------


def publish_wheelhouse(s3: Any, bucket: str, prefix: str, directory: str | Path) -> tuple[str, str]:
    """Upload the workers' wheelhouse (`provisioners.wheelhouse`, checked against its
    requirements) as one archive to `s3://bucket/prefix/wheelhouse/<sha256>.tar`.

    Returns `(s3 URL, sha256)`. The key is content-addressed, so publishing the same
    wheelhouse again uploads nothing, and a new build never replaces the one a booting
    worker is fetching.
    """
    path = Path(directory)
    names = check(path)
    data, sha256 = pack(path, names)
    key = "/".join(p for p in (prefix.strip("/"), "wheelhouse", f"{sha256}.tar") if p)
    caller = AwsCaller(s3)
    try:
        caller.call(
            "head_object",
            passthrough=frozenset({"404", "NoSuchKey", "NotFound"}),
            Bucket=bucket,
            Key=key,
        )
        return f"s3://{bucket}/{key}", sha256
    except ClientError:
        pass  # not there yet
    caller.call(
        "put_object",
        Bucket=bucket,
        Key=key,
        Body=data,
        ContentType="application/x-tar",
        Metadata={"sha256": sha256},
    )
    log.info("worker wheelhouse (%d wheels) published to s3://%s/%s", len(names), bucket, key)
    return f"s3://{bucket}/{key}", sha256


def object_presigner(
    s3: Any, url: str, expires_s: int = WHEELHOUSE_URL_EXPIRES_S
) -> Callable[[], str]:
    """A function returning a fresh presigned HTTPS GET URL of the object at `url`
    (s3://...), for `WorkerBootstrap.wheelhouse_url`: each launch gets one valid for
    `expires_s`."""
    scheme, bucket, key, _, _ = urlsplit(url)
    if scheme != "s3" or not bucket or not key.strip("/"):
        raise _invalid("url", url, "an s3://bucket/key URL")

    def presign() -> str:
        return str(
            s3.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key.lstrip("/")}, ExpiresIn=expires_s
            )
        )

    return presign


def _check(name: str, value: Any, pattern: re.Pattern[str], what: str) -> None:
    if not isinstance(value, str) or not pattern.match(value):
        raise _invalid(name, value, what)


def _invalid(name: str, value: Any, what: str) -> InputError:
    return InputError(
        f"must be {what}", where="worker bootstrap", field=name, value=value, has_value=True
    )
