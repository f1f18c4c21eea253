"""The cluster configuration: one TOML file, written by `autoscaler init`, read by every command.

Each table belongs to one part: `[cluster]`, `[cloud]`, `[api]`, `[metrics]`,
`[storage]`, `[secrets]`, `[planner]`, `[timeouts]`, `[limits]`, `[teams.NAME]`,
`[[notify]]` (webhooks, `app.notify`), `[audit]`, `[dashboard]` and `[spot]` are read
here; `[ec2]` and `[guardrails]` by `provisioners.config`; `[state]` by `app.state_config`.
Relative paths are relative to the file. Every value is checked where it is read, and an
unknown key is an error (a typo never falls back to a default silently).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from app.files import CONFIG_LIMIT, Name, read_toml
from app.state_config import StateConfig, StateTable, state_config_from
from autoscaler.cloud import Guardrails, OrphanPolicy
from autoscaler.decide import BootBackoff, ControlOptions, Timeouts, WaitPolicy
from autoscaler.errors import InputError
from autoscaler.failures import Backoff
from autoscaler.fairshare import MAX_PRIORITY, TeamLimits, TeamPolicy
from autoscaler.period import ROUND_INTERVAL_S
from autoscaler.spot import RATE_HISTORY_S, RATE_PRIOR_HOURS, RATE_REFRESH_S, SpotPolicy
from provisioners.config import (
    MAX_HOURLY_SPEND,
    ClusterId,
    EC2Table,
    FamilyOrType,
    GuardrailsTable,
    ProvisionerConfig,
    Region,
    build_provisioner_config,
    family_of,
    parse_config,
)
from provisioners.documents import FieldError, Strict, convert, dotted, number, text, whole

if TYPE_CHECKING:
    from autoscaler.planner import EvaPlanner

#: Where commands look for the configuration when no --config is given.
CONFIG_ENV = "AUTOSCALER_CONFIG"
DEFAULT_CONFIG_NAME = "autoscaler.toml"

#: The round's own defaults (`autoscaler.decide`): the tables below default to them, so
#: each default lives once.
_DEFAULTS = ControlOptions()

#: A period or timeout longer than a month is a mistake (a unit slip), not a setting.
MAX_SECONDS = 30 * 86400.0


def seconds(*, ge: float | None = None, gt: float | None = None) -> msgspec.Meta:
    """The bounds of a period or timeout, `Annotated[float, seconds(...)]`."""
    return number(ge=ge, gt=gt, le=MAX_SECONDS)


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def parse_address(value: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` (an IPv6 host in brackets); ValueError naming the form.

    What the daemon binds and what workers dial: a host name of letters, digits,
    '-' and '.', an IPv4 address or a bracketed IPv6 one, and a port 1-65535.
    """
    form = "must be HOST:PORT, such as '127.0.0.1:7443' or '[::1]:7443'"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise ValueError(form)
    if not 0 < int(port) < 65536:
        raise ValueError(f"{form}: the port must be from 1 to 65535")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(form)
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{form}: {host} is not an IPv6 address") from None
        return host, int(port)
    try:
        ipaddress.IPv4Address(host)
        return host, int(port)
    except ValueError:
        pass
    if host[-1:].isdigit() and all(p.isdigit() for p in host.split(".")):
        raise ValueError(f"{form}: {host} is not an IPv4 address")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in host.split(".")):
        raise ValueError(f"{form}: {host!r} is not a host name")
    return host, int(port)


Address = Annotated[str, text(max_length=300, description="HOST:PORT, such as '127.0.0.1:7443'")]
#: A catalog offering's name (`autoscaler.catalog.offering_name`): 'c7i.large:spot@us-east-1a'.
Offering = Annotated[str, text(max_length=300, min_length=1)]


class ClusterTable(Strict, frozen=True):
    name: ClusterId
    region: Region = "us-east-1"
    # Between scheduling rounds, and between the steps that carry a round's plan
    # out; each reads the state, so faster than these only loads the database.
    interval_s: Annotated[float, seconds(ge=1.0)] = ROUND_INTERVAL_S
    step_s: Annotated[float, seconds(ge=0.5)] = 5.0


class CloudTable(Strict, frozen=True):
    provider: Literal["ec2", "local"] = "ec2"
    # local: emulate the catalog's launch delays (off: instances are ready at once)
    emulate_delays: bool = False
    # ec2: the workers' wheelhouse (`autoscaler deploy wheelhouse`: the agent and every
    # dependency, hash-pinned), which the daemon publishes to the cluster's bucket and every
    # worker installs offline.
    wheelhouse: Annotated[str, text(max_length=4096)] = ""
    # local: emulate spot reclaims (`provisioners.local_reclaims`), per spot offering
    # (`TYPE:spot`, `TYPE:spot@ZONE`): a rate in reclaims per instance-hour (each
    # instance's reclaim drawn at launch, seeded), or an availability trace file
    # ({"metadata": {"gap_seconds": 600}, "data": [0, 1, ...]}, 1 = no spot capacity).
    reclaim_rates: Annotated[
        dict[Offering, Annotated[float, number(ge=0.0, le=3600.0)]], msgspec.Meta(max_length=10_000)
    ] = msgspec.field(default_factory=dict)
    reclaim_traces: Annotated[
        dict[Offering, Annotated[str, text(max_length=4096)]], msgspec.Meta(max_length=10_000)
    ] = msgspec.field(default_factory=dict)
    reclaim_seed: Annotated[int, whole(ge=0, le=2**63 - 1)] = 0
    # local: spot prices that move, replayed from a `DescribeSpotPriceHistory` dump (the
    # AWS CLI's JSON) from the local cloud's epoch (`provisioners.local_spot_prices`);
    # relative to this file. "": the spot snapshot's prices, fixed.
    spot_price_trace: Annotated[str, text(max_length=4096)] = ""
    # local: the spot notice's window before the instance goes (EC2: 120 s), and how often
    # agents poll for it (AWS recommends 5 s)
    notice_window_s: Annotated[float, seconds(gt=0.0)] = 120.0
    notice_poll_s: Annotated[float, seconds(gt=0.0)] = 5.0


def _check_address(value: str, name: str, *, optional: bool = False) -> None:
    if optional and not value:
        return
    try:
        parse_address(value)
    except ValueError as exc:
        raise FieldError(str(exc), name) from None


class ApiTable(Strict, frozen=True):
    listen: Address = "127.0.0.1:7443"  # where the daemon serves users and worker enrollment
    advertise: Address = ""  # the address users and workers dial (default: listen)
    # The workers' port, mutual TLS only (default: listen's port + 1, on the same host).
    worker_listen: Address = ""

    def check(self) -> None:
        _check_address(self.listen, "listen")
        _check_address(self.advertise, "advertise", optional=True)
        _check_address(self.worker_listen, "worker_listen", optional=True)


class MetricsTable(Strict, frozen=True):
    listen: Address = "127.0.0.1:9464"  # Prometheus metrics; "" turns them off

    def check(self) -> None:
        _check_address(self.listen, "listen", optional=True)


class DashboardTable(Strict, frozen=True):
    """The web dashboard (`app.dashboard`): off unless enabled; HTTPS with the daemon's
    certificate, a user's token to log in."""

    enabled: bool = False
    listen: Address = "127.0.0.1:8443"  # where the daemon serves it

    def check(self) -> None:
        _check_address(self.listen, "listen")


#: S3's rules for a bucket name: 3-63 lowercase letters, digits, '.' and '-', starting
#: and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


#: The bucket `autoscaler init` writes when it is given none: accepted in the file (the
#: commands that read the state and the catalog need no bucket), refused at daemon start.
PLACEHOLDER_BUCKET = "REPLACE-WITH-YOUR-BUCKET"


def storage_problem(url: str) -> str | None:
    """Why `url` is not a storage URL the daemon and workers can open (None: it is)."""
    from urllib.parse import unquote, urlsplit

    form = "must be s3://BUCKET[/PREFIX] or file:///ABSOLUTE/DIR"
    if url.startswith("s3://"):
        bucket = urlsplit(url).netloc
        if not bucket:
            return f"{form}: it names no bucket"
        if bucket == PLACEHOLDER_BUCKET:
            return None
        if not _BUCKET.match(bucket) or ".." in bucket:
            return f"{form}: {bucket!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')"
        return None
    if url.startswith("file://"):
        parts = urlsplit(url)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            return f"{form}: a file URL needs an absolute path"
        if path.strip("/") == "":
            return f"{form}: it names the root directory, not a directory for the cluster"
        if "\x00" in path or parts.query or parts.fragment:
            return f"{form}: the path holds '?', '#' or a NUL byte (write them %-encoded)"
        return None
    return form


class StorageTable(Strict, frozen=True):
    #: Build contexts, checkpoints and logs: `s3://bucket/prefix` or `file:///dir`.
    url: Annotated[str, text(max_length=4096)] = "file:///var/lib/autoscaler/storage"
    #: Days a finished job's checkpoints are kept before the daemon deletes them (its
    #: logs stay until the bucket's lifecycle rule expires them).
    checkpoint_retention_days: Annotated[
        float, number(ge=0, le=36_500.0, description="a number of days >= 0")
    ] = 7.0

    def check(self) -> None:
        problem = storage_problem(self.url)
        if problem:
            raise FieldError(problem, "url")


class SecretsTable(Strict, frozen=True):
    dir: Annotated[str, text(max_length=4096, pattern=r"\S", description="a directory")] = "secrets"


PlannerName = Literal["eva", "eva-plain", "eva-full-only", "eva-partial-only"]


class PlannerTable(Strict, frozen=True):
    name: PlannerName = "eva"
    default_throughput: Annotated[float, number(gt=0, le=1)] = _DEFAULTS.default_throughput
    # No task is co-located where it is expected below this share of its full speed.
    min_throughput: Annotated[float, number(ge=0, le=1)] = 0.0
    # A newly arrived job without a deadline may wait for room a departure frees, up to
    # (wait_jct_factor - 1) × its solo duration, rather than open an instance that saves
    # less than wait_min_saving of its reservation price (`decide.WaitPolicy`); 1.0: never.
    wait_jct_factor: Annotated[float, number(ge=1.0, le=10.0)] = 1.0
    wait_min_saving: Annotated[float, number(ge=0.0, le=1.0)] = 0.1

    def waiting(self) -> WaitPolicy | None:
        """The round's waiting rule (None: every job is placed at once)."""
        if self.wait_jct_factor <= 1.0:
            return None
        return WaitPolicy(self.wait_jct_factor, self.wait_min_saving)

    def planner(self) -> EvaPlanner:
        """The planner this table names, with its options."""
        from autoscaler.planner import planner_by_name  # numpy and HiGHS: only when planning

        return planner_by_name(self.name, min_throughput=self.min_throughput)


class TimeoutsTable(Strict, frozen=True):
    boot_s: Annotated[float, seconds(gt=0)] = _DEFAULTS.timeouts.boot_s
    register_s: Annotated[float, seconds(gt=0)] = _DEFAULTS.timeouts.register_s
    start_s: Annotated[float, seconds(gt=0)] = _DEFAULTS.timeouts.start_s
    checkpoint_s: Annotated[float, seconds(gt=0)] = _DEFAULTS.timeouts.checkpoint_s
    # A worker heart-beats every `heartbeat_interval_s`; silent for `heartbeat_s` (two
    # heartbeats by default) it is lost, and shown so at the next step: within seconds.
    heartbeat_s: Annotated[float, seconds(gt=0)] = 10.0
    heartbeat_interval_s: Annotated[float, seconds(gt=0)] = 5.0
    # A transient failure's task waits `retry_backoff_s` before its next attempt, doubling
    # with each counted failure up to `retry_backoff_max_s` (`autoscaler.failures.Backoff`).
    retry_backoff_s: Annotated[float, seconds(ge=0)] = _DEFAULTS.backoff.base_s
    retry_backoff_max_s: Annotated[float, seconds(ge=0)] = _DEFAULTS.backoff.max_s
    # Each worker agent's spend brake (`autoscaler-worker --orphan-timeout/--orphan-max`):
    # with no word from the daemon this long it stops its instance — with no task running,
    # or with tasks (checkpointed first); 0: never.
    worker_orphan_timeout_s: Annotated[float, seconds(ge=0)] = 1800.0
    worker_orphan_max_s: Annotated[float, seconds(ge=0)] = 7200.0

    def check(self) -> None:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise FieldError(
                f"must be at least retry_backoff_s ({self.retry_backoff_s:g} s): the back-off "
                "only grows",
                "retry_backoff_max_s",
                self.retry_backoff_max_s,
            )
        if not self.heartbeat_s > self.heartbeat_interval_s:
            raise FieldError(
                f"must be longer than heartbeat_interval_s ({self.heartbeat_interval_s:g} s): "
                "a worker would be lost between two heartbeats",
                "heartbeat_s",
                self.heartbeat_s,
            )


class LimitsTable(Strict, frozen=True):
    max_attempts: Annotated[int, whole(ge=1, le=100)] = _DEFAULTS.max_attempts
    max_context_mb: Annotated[float, number(gt=0, le=16_384.0)] = (
        256.0  # a build context, not a data set
    )
    orphan_grace_s: Annotated[float, seconds(gt=0)] = _DEFAULTS.orphans.grace_s


class TeamTable(Strict, frozen=True):
    """A team's weight in the fair share of a binding `max_hourly_spend`, and its own
    limits (`autoscaler.fairshare`): `[teams.NAME]`, NAME the team users are added to."""

    weight: Annotated[float, number(gt=0, le=1e6, description="a positive number")] = 1.0
    max_hourly_spend: (
        Annotated[
            float,
            number(ge=0, le=MAX_HOURLY_SPEND, description="a number of US dollars per hour, >= 0"),
        ]
        | None
    ) = None
    max_share: (
        Annotated[
            float,
            number(
                gt=0,
                le=1,
                description="a share of [guardrails] max_hourly_spend, above 0 and at most 1",
            ),
        ]
        | None
    ) = None
    # The priority of the team's jobs that state none, and the most one may ask for.
    priority: Annotated[int, whole(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    max_priority: Annotated[int, whole(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] | None = None
    # Dollars the team's jobs may be charged per UTC day; reached, they wait for the next.
    daily_budget: (
        Annotated[
            float,
            number(ge=0, le=24 * MAX_HOURLY_SPEND, description="a number of US dollars, >= 0"),
        ]
        | None
    ) = None

    def limits(self) -> TeamLimits:
        return TeamLimits(
            self.weight,
            self.max_hourly_spend,
            self.max_share,
            self.priority,
            self.max_priority,
            self.daily_budget,
        )


class AuditTable(Strict, frozen=True):
    """How long the audit log keeps an API call (`[audit]`)."""

    # Entries older than this many days are deleted by the daemon, hourly (None: kept).
    keep_days: Annotated[float, number(gt=0, le=36_500.0, description="days, > 0")] | None = None


#: The events a webhook may subscribe to (`state.outbox.EVENT_KINDS`, spelt out here so
#: reading the configuration loads no SQLAlchemy).
NotifyEventName = Literal[
    "job.completed",
    "job.failed",
    "job.cancelled",
    "budget.80",
    "budget.100",
    "offering.held",
    "leader.changed",
    "test",
]
ALL_NOTIFY_EVENTS: tuple[NotifyEventName, ...] = NotifyEventName.__args__  # type: ignore[attr-defined]


class NotifyTable(Strict, frozen=True):
    """A webhook the daemon posts events to (`[[notify]]`, one table per webhook): a JSON
    body Slack and Teams incoming webhooks accept, signed with HMAC-SHA256 when a
    `secret_file` is given (`app.notify`)."""

    url: Annotated[
        str,
        text(max_length=2048, pattern=r"^https://[^\s/]+", description="an https:// URL"),
    ]
    # What deliveries are recorded and logged under (never the URL: a webhook URL is a
    # secret); default: the URL's host and a hash of the whole URL.
    name: Name | None = None
    events: tuple[NotifyEventName, ...] = ALL_NOTIFY_EVENTS
    # A file only its owner reads, holding the HMAC key (relative to this file).
    secret_file: Annotated[str, text(max_length=4096)] = ""
    # CA certificates (PEM) to verify the receiver with, beside the system's.
    ca_file: Annotated[str, text(max_length=4096)] = ""
    timeout_s: Annotated[float, number(gt=0, le=120.0)] = 10.0
    max_attempts: Annotated[int, whole(ge=1, le=50)] = 8
    backoff_s: Annotated[float, seconds(gt=0)] = 10.0  # first retry; doubling each time
    max_backoff_s: Annotated[float, seconds(gt=0)] = 3600.0

    @property
    def sink(self) -> str:
        """The webhook's name in records and logs."""
        if self.name:
            return self.name
        import hashlib
        from urllib.parse import urlsplit

        digest = hashlib.sha256(self.url.encode()).hexdigest()[:8]
        return f"{urlsplit(self.url).hostname}-{digest}"


Band = Literal["<5%", "5-10%", "10-15%", "15-20%", ">20%"]


class SpotTable(Strict, frozen=True):
    """`[spot]`: spot offerings beside on-demand ones, priced by their interruption risk
    (`autoscaler.spot`). `zones`: one offering per listed zone (AZ IDs, e.g. use1-az1;
    empty: one regional offering per type); `bands`: the Spot Instance Advisor band of
    a type where the bundled default does not fit (`provisioners/data/README.md`);
    `types`: the types or families that get spot offerings (empty: every allowed type
    the spot prices cover). `enabled` and `types` are the cluster's one spot setting:
    the catalog's spot offerings, which launches EC2 makes as spot, and the spot
    launches the generated IAM policy allows all follow them (`provisioners.config.
    EC2Config.spot_for`)."""

    enabled: bool = False
    zones: Annotated[
        tuple[Annotated[str, text(min_length=1, max_length=64)], ...], msgspec.Meta(max_length=64)
    ] = ()
    bands: Annotated[
        dict[Annotated[str, text(min_length=1, max_length=64)], Band], msgspec.Meta(max_length=1024)
    ] = msgspec.field(default_factory=dict)
    # The checkpoint interval reclaims are priced at, the slack a deadline job keeps,
    # and how many reclaims move a job to on-demand for good whatever their rate (the
    # hard ceiling; 0: none). Before it, a job moves once its own reclaims are more than
    # its planned rate explains at significance `reclaim_alpha` (`spot.reclaims_pin`).
    checkpoint_every_s: Annotated[float, seconds(gt=0)] = 900.0
    deadline_margin_s: Annotated[float, seconds(ge=0)] = 900.0
    max_reclaims: Annotated[int, whole(ge=0, le=1000)] = 10
    # A job of known length may be delayed by this share of its run by reclaims (each
    # its restart and the checkpoint taken on the notice: `spot.reclaim_loss_s`), and
    # lose this share of its work to them (the interval one takes back when the job's
    # checkpoint cannot fit the notice window), before that ceiling moves it, when that
    # is more reclaims (0: the count alone; `spot.reclaim_ceiling`).
    max_delay_share: Annotated[float, number(ge=0.0, lt=1.0)] = 0.05
    max_lost_share: Annotated[float, number(ge=0.0, lt=1.0)] = 0.015
    # The cluster's own interruption history refines each offering's band (`app.spot_rates`):
    # over the last `history_days`, (band rate · prior_hours + reclaims) / (prior_hours +
    # spot instance-hours), recomputed at most every `refresh_minutes`; a rebalance
    # recommendation prices its instance's offering at rebalance_rate_per_hour at least.
    prior_hours: Annotated[float, number(ge=0.0, le=1e6)] = RATE_PRIOR_HOURS
    history_days: Annotated[float, number(gt=0.0, le=3650.0)] = RATE_HISTORY_S / 86400.0
    refresh_minutes: Annotated[float, number(ge=0.0, le=1440.0)] = RATE_REFRESH_S / 60.0
    rebalance_rate_per_hour: Annotated[float, number(ge=0.0, le=3600.0)] = 1.0
    types: Annotated[tuple[FamilyOrType, ...], msgspec.Meta(max_length=1024)] = ()
    reclaim_alpha: Annotated[float, number(gt=0.0, lt=1.0)] = 0.01

    def check(self) -> None:
        if len(set(self.types)) != len(self.types):
            raise FieldError("must not repeat an entry", "types", self.types)

    def policy(self) -> SpotPolicy | None:
        """The planner's spot policy (None: spot disabled)."""
        if not self.enabled:
            return None
        return SpotPolicy(
            checkpoint_every_s=self.checkpoint_every_s,
            deadline_margin_s=self.deadline_margin_s,
            max_reclaims=self.max_reclaims or None,
            max_delay_share=self.max_delay_share,
            max_lost_share=self.max_lost_share,
            reclaim_alpha=self.reclaim_alpha,
        )


class ClusterConfigFile(Strict, frozen=True):
    """The cluster's TOML file, every table (`autoscaler init` writes it, commented)."""

    cluster: ClusterTable
    cloud: CloudTable = msgspec.field(default_factory=CloudTable)
    api: ApiTable = msgspec.field(default_factory=ApiTable)
    metrics: MetricsTable = msgspec.field(default_factory=MetricsTable)
    storage: StorageTable = msgspec.field(default_factory=StorageTable)
    secrets: SecretsTable = msgspec.field(default_factory=SecretsTable)
    state: StateTable = msgspec.field(default_factory=StateTable)
    planner: PlannerTable = msgspec.field(default_factory=PlannerTable)
    timeouts: TimeoutsTable = msgspec.field(default_factory=TimeoutsTable)
    limits: LimitsTable = msgspec.field(default_factory=LimitsTable)
    ec2: EC2Table = msgspec.field(default_factory=EC2Table)
    guardrails: GuardrailsTable = msgspec.field(default_factory=GuardrailsTable)
    teams: dict[Name, TeamTable] = msgspec.field(default_factory=dict)
    audit: AuditTable = msgspec.field(default_factory=AuditTable)
    notify: tuple[NotifyTable, ...] = ()
    dashboard: DashboardTable = msgspec.field(default_factory=DashboardTable)
    spot: SpotTable = msgspec.field(default_factory=SpotTable)

    def check(self) -> None:
        # The cluster's name and region are said once, in [cluster]; [ec2] may not
        # contradict them.
        for key, value in (("cluster_id", self.cluster.name), ("region", self.cluster.region)):
            given = getattr(self.ec2, key)
            if given is not None and given != value:
                raise FieldError(
                    f"contradicts [cluster] ({value!r}); say it once, in [cluster]",
                    f"ec2.{key}",
                    given,
                )
        try:
            self.ec2.check_zones(self.cluster.region)
        except FieldError as exc:
            raise FieldError(exc.message, "ec2.zones", exc.value) from None
        for entry in self.spot.types:
            types = self.ec2.types if "." in entry else {family_of(t) for t in self.ec2.types}
            if entry not in types and family_of(entry) not in self.ec2.families:
                raise FieldError(
                    f"entry {entry!r} is not a type or family [ec2] allows (families: "
                    f"{', '.join(self.ec2.families) or 'none'}; types: "
                    f"{', '.join(self.ec2.types) or 'none'})",
                    "spot.types",
                    entry,
                )
        sinks = [n.sink for n in self.notify]
        for i, sink in enumerate(sinks):
            if sink in sinks[:i]:
                raise FieldError(
                    "names a webhook twice: give each [[notify]] its own name",
                    f"notify.{i}.name",
                    sink,
                )
        api = self.api.advertise or self.api.listen
        if self.metrics.listen and self.metrics.listen in (self.api.listen, api):
            raise FieldError(
                "is the API's address: give the metrics their own port",
                "metrics.listen",
                self.metrics.listen,
            )
        taken = {self.api.listen, api, self.metrics.listen}
        if self.dashboard.enabled and self.dashboard.listen in taken:
            raise FieldError(
                "is the API's or the metrics' address: give the dashboard its own port",
                "dashboard.listen",
                self.dashboard.listen,
            )


def config_where(path: Sequence[Any]) -> tuple[str | None, str | None]:
    """`[table]` and the field within it, for errors in the cluster's TOML file."""
    table, _, rest = dotted(path).partition(".")
    if not table:
        return None, None
    return f"[{table}]", rest or None


@dataclass(frozen=True, slots=True)
class Secrets:
    """Paths of the cluster's secrets (see `autoscaler init`): the server CA (clients pin its
    certificate; its key is needed only by `init`), the daemon's certificate, the worker
    CA (the daemon signs worker client certificates with it) and the API token."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        """The server CA's certificate: what the CLI and the workers trust, alone."""
        return self.dir / "server-ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "server-ca.key"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def api_token(self) -> Path:
        return self.dir / "api.token"

    @property
    def worker_ca_cert(self) -> Path:
        return self.dir / "worker-ca.pem"

    @property
    def worker_ca_key(self) -> Path:
        return self.dir / "worker-ca.key"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything the daemon and the commands need, from one file."""

    path: Path
    cluster: ClusterTable
    cloud: CloudTable
    api: ApiTable
    metrics: MetricsTable
    storage: StorageTable
    secrets: Secrets
    planner: PlannerTable
    timeouts: TimeoutsTable
    limits: LimitsTable
    provisioner: ProvisionerConfig
    state: StateConfig
    raw: Mapping[str, Any] = field(default_factory=dict)
    teams: Mapping[str, TeamTable] = field(default_factory=dict)
    audit: AuditTable = field(default_factory=AuditTable)
    notify: tuple[NotifyTable, ...] = ()
    dashboard: DashboardTable = field(default_factory=DashboardTable)
    spot: SpotTable = field(default_factory=SpotTable)

    @property
    def api_address(self) -> str:
        """The address clients and workers dial."""
        return self.api.advertise or self.api.listen

    @property
    def worker_listen(self) -> str:
        """Where the daemon serves its workers (mutual TLS)."""
        if self.api.worker_listen:
            return self.api.worker_listen
        host, _, port = self.api.listen.rpartition(":")
        return f"{host}:{int(port) + 1}"

    @property
    def worker_address(self) -> str:
        """The address workers dial for everything after enrollment: the advertised host,
        the workers' port."""
        host = self.api_address.rpartition(":")[0]
        return f"{host}:{self.worker_listen.rpartition(':')[2]}"

    def control_options(self, *, dry_run: bool = False) -> ControlOptions:
        """What the round decides by, from this file."""
        t = self.timeouts
        return ControlOptions(
            default_throughput=self.planner.default_throughput,
            guardrails=self.provisioner.guardrails,
            orphans=OrphanPolicy(self.provisioner.ec2.orphan_policy, self.limits.orphan_grace_s),
            timeouts=Timeouts(t.boot_s, t.register_s, t.start_s, t.checkpoint_s),
            max_attempts=self.limits.max_attempts,
            backoff=Backoff(t.retry_backoff_s, t.retry_backoff_max_s),
            dry_run=dry_run,
            progress_at_steps=True,  # what `job` shows is one step old
            instance_prefix=f"{self.cluster.name}-",
            # A daemon's instances boot for real: a type whose workers never register
            # backs off, then is held (replays, whose workers always register, do not).
            boot_backoff=BootBackoff(),
            # With [teams.NAME] tables, teams share a binding max_hourly_spend by weight.
            teams=TeamPolicy({n: t.limits() for n, t in self.teams.items()})
            if self.teams
            else None,
            spot=self.spot.policy(),
            waiting=self.planner.waiting(),
        )

    @property
    def guardrails(self) -> Guardrails:
        return self.provisioner.guardrails


def config_path(explicit: str | Path | None) -> Path:
    """The configuration file to use: --config, else $AUTOSCALER_CONFIG, else ./autoscaler.toml."""
    if explicit is not None:
        return Path(explicit)
    from_env = os.environ.get(CONFIG_ENV)
    if from_env:
        return Path(from_env)
    return Path(DEFAULT_CONFIG_NAME)


def load_cluster_config(path: str | Path | None) -> ClusterConfig:
    """Read and check the whole configuration file (one-line InputError on any problem)."""
    p = config_path(path)
    if not p.exists() and not p.is_symlink():
        raise InputError(
            "configuration file not found; create one with `autoscaler init` "
            f"or name it with --config or ${CONFIG_ENV}",
            source=str(p),
        )
    return parse_cluster_config(read_toml(p, "configuration", CONFIG_LIMIT), p)


def load_provisioner_config(path: str | Path | None) -> ProvisionerConfig:
    """The `[ec2]` and `[guardrails]` tables of a file (the defaults when `path` is None):
    what the catalog commands need. A file with a `[cluster]` table is a cluster's and is
    read whole (its name and region are said there); one with only these tables is read
    for them alone."""
    if path is None:
        return ProvisionerConfig()
    p = Path(path)
    data = read_toml(p, "configuration", CONFIG_LIMIT)
    if "cluster" in data:
        return parse_cluster_config(data, p).provisioner
    return parse_config(data, source=str(p), base_dir=p.parent)


def parse_cluster_config(data: Mapping[str, Any], path: Path) -> ClusterConfig:
    source = str(path)
    if "cluster" not in data:
        raise InputError(
            "has no [cluster] table: every cluster needs a name (run `autoscaler init`)",
            source=source,
        )
    document = convert(data, ClusterConfigFile, source=source, where_of=config_where)
    base = path.parent
    ec2 = msgspec.structs.replace(
        document.ec2, cluster_id=document.cluster.name, region=document.cluster.region
    )
    provisioner = build_provisioner_config(ec2, document.guardrails, source=source, base_dir=base)
    if document.spot.enabled:  # the one spot setting, where launches and the policy read it
        provisioner = replace(
            provisioner,
            ec2=replace(provisioner.ec2, spot_enabled=True, spot_types=tuple(document.spot.types)),
        )
    secrets_dir = Path(document.secrets.dir).expanduser()
    if not secrets_dir.is_absolute():
        secrets_dir = base / secrets_dir
    storage = document.storage
    url = storage.url.rstrip("/") if storage.url.startswith("s3://") else storage.url
    if url.startswith("file:///"):
        url = url.rstrip("/") or url
    return ClusterConfig(
        path=path,
        cluster=document.cluster,
        cloud=document.cloud,
        api=document.api,
        metrics=document.metrics,
        storage=StorageTable(url=url),
        secrets=Secrets(secrets_dir),
        planner=document.planner,
        timeouts=document.timeouts,
        limits=document.limits,
        provisioner=provisioner,
        state=state_config_from(document.state, source=source, base_dir=base),
        raw=data,
        teams=document.teams,
        audit=document.audit,
        notify=document.notify,
        dashboard=document.dashboard,
        spot=document.spot,
    )


def check_daemon_config(config: ClusterConfig) -> list[str]:
    """Check what `autoscaler daemon` needs before it starts, as its start reads it, and
    say what was found; the first problem is an `InputError` naming the field and value.

    The same checks run at every daemon start (before anything is opened) and for
    `autoscaler daemon --check`, so a configuration the check accepts does not
    stop the daemon at start: the addresses parse, the secrets exist as regular
    files only their owner reads (keys and tokens), the CA and the certificate
    load, the storage URL names a bucket or a directory, the database URL parses
    by the database layer's own parser (a SQLite file's directory exists), the
    catalog the cluster plans with is not empty, and an EC2 cluster has what it
    launches with (its guardrails allow its region, a wheel for its workers, an
    S3 bucket).
    """
    from executor.security import Authority, read_secret, read_token

    source = str(config.path)
    found: list[str] = []

    def refuse(problem: str, where: str, field: str, value: Any = None) -> InputError:
        return InputError(
            problem,
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=value is not None,
        )

    for where, field_name, value in (
        ("[api]", "listen", config.api.listen),
        ("[api]", "advertise", config.api.advertise),
        ("[api]", "worker_listen", config.api.worker_listen),
        ("[metrics]", "listen", config.metrics.listen),
        ("[dashboard]", "listen", config.dashboard.listen if config.dashboard.enabled else ""),
    ):
        if value:
            try:
                parse_address(value)
            except ValueError as exc:
                raise refuse(str(exc), where, field_name, value) from None
    found.append(f"API on {config.api.listen}, dialled at {config.api_address}")

    secrets = config.secrets
    if not secrets.dir.is_dir():
        raise refuse(
            "is not a directory: create the secrets with `autoscaler init --dir "
            f"{config.path.parent}`",
            "[secrets]",
            "dir",
            str(secrets.dir),
        )
    try:
        # The server CA's key may be kept offline: the daemon needs only its certificate.
        for path in (secrets.ca_cert, secrets.server_cert):
            if not path.is_file():
                raise OSError(f"{path}: missing (or not a regular file)")
        read_secret(secrets.server_key)
        Authority.load(secrets.worker_ca_cert, secrets.worker_ca_key)
        read_token(secrets.api_token)
    except (OSError, ValueError) as exc:  # missing, unsafe mode, not PEM, not UTF-8 text
        raise refuse(
            f"{_one_line(exc)}; `autoscaler init --dir {config.path.parent}` creates what "
            "is missing",
            "[secrets]",
            "dir",
            str(secrets.dir),
        ) from None
    found.append(f"secrets in {secrets.dir} (owner-only)")

    problem = storage_problem(config.storage.url)
    if problem:
        raise refuse(problem, "[storage]", "url", config.storage.url)
    found.append(f"storage {config.storage.url}")

    if config.notify:
        from app.notify import webhook

        for table in config.notify:
            secret = "secret_file" if table.secret_file else "ca_file"
            try:
                webhook(table, config.path.parent)
            except (OSError, ValueError) as exc:  # unreadable, unsafe mode, not PEM
                raise refuse(_one_line(exc), f"[[notify]] {table.sink}", secret) from None
        found.append(f"webhooks {', '.join(t.sink for t in config.notify)}")

    from app.state_config import database_url_problem

    problem = database_url_problem(config.state.url)
    if problem:
        raise refuse(problem, "[state]", "url", config.state.url)
    database = config.state.sqlite_path
    if database is not None and not database.parent.is_dir():
        raise refuse(
            f"its directory {database.parent} does not exist", "[state]", "path", str(database)
        )
    found.append(f"state {config.state.url.split('@')[-1]}")

    from provisioners.catalog import cached_or_bundled_catalog

    ec2 = config.provisioner.ec2
    catalog = cached_or_bundled_catalog(ec2)
    if config.cloud.provider == "local" and not len(catalog.catalog):
        notes = "; ".join(catalog.notes) or "no instance type is allowed"
        raise refuse(f"leaves the local cloud no instance type: {notes}", "[ec2]", "families")
    found.append(f"catalog of {len(catalog.catalog)} types ({catalog.origin})")

    if config.cloud.provider == "ec2":
        from autoscaler.cloud import CloudError

        try:
            config.provisioner.guardrails.check_region(ec2.region)
        except CloudError as exc:
            raise refuse(_one_line(exc), "[guardrails]", "allowed_regions") from None
        problems = ec2.launch_problems()
        if problems:
            raise refuse(
                f"cannot launch yet; set {', '.join(problems)}", "[ec2]", problems[0].split()[0]
            )
        missing = config.provisioner.guardrails.unattended_problems()
        if missing:
            raise refuse(
                f"set {', '.join(missing)}: a daemon on EC2 spends money unattended",
                "[guardrails]",
                missing[0],
            )
        house = Path(config.cloud.wheelhouse).expanduser()
        if not config.cloud.wheelhouse:
            raise refuse(
                'is required for provider = "ec2": the directory of the workers\' wheelhouse '
                "the daemon publishes (build it with `autoscaler deploy wheelhouse --out DIR`)",
                "[cloud]",
                "wheelhouse",
            )
        if not house.is_absolute():
            house = config.path.parent / house
        if not (house / "requirements.txt").is_file():
            raise refuse(
                "holds no requirements.txt: not a wheelhouse `autoscaler deploy wheelhouse` built",
                "[cloud]",
                "wheelhouse",
                config.cloud.wheelhouse,
            )
        url = config.storage.url
        if not url.startswith("s3://") or PLACEHOLDER_BUCKET in url:
            raise refuse(
                'must be s3://BUCKET/PREFIX for provider = "ec2": workers fetch contexts, '
                "checkpoints and the agent from it",
                "[storage]",
                "url",
                url,
            )
        found.append(f"EC2 in {ec2.region}, cluster {ec2.cluster_id}")
    else:
        found.append("local cloud (agents on this host)")
    return found


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
