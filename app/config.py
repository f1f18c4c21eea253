"""The cluster configuration: one TOML file, written by `autoscaler init`, read by every command.

Each table belongs to one part: `[cluster]`, `[cloud]`, `[api]`, `[metrics]`,
`[storage]`, `[secrets]`, `[planner]`, `[timeouts]` and `[limits]` are read
here; `[ec2]` and `[guardrails]` by `provisioners.config`; `[state]` by
`app.state_config`. Relative paths are relative to the file. Every value is
checked where it is read, and an unknown key is an error (a typo never falls
back to a default silently).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator

from app.files import read_config_file
from app.state_config import StateConfig, parse_state_config
from app.validation import Identifier, Positive, Seconds, Strict, parse_model
from autoscaler.cloud import Guardrails, OrphanPolicy
from autoscaler.decide import BootBackoff, ControlOptions, Timeouts
from autoscaler.errors import InputError
from autoscaler.period import ROUND_INTERVAL_S
from provisioners.config import ProvisionerConfig, parse_config

if TYPE_CHECKING:
    from autoscaler.planner import EvaPlanner

#: Where commands look for the configuration when no --config is given.
CONFIG_ENV = "AUTOSCALER_CONFIG"
DEFAULT_CONFIG_NAME = "autoscaler.toml"

_TABLES = frozenset(
    {
        "cluster",
        "cloud",
        "api",
        "metrics",
        "storage",
        "secrets",
        "planner",
        "timeouts",
        "limits",
        "ec2",
        "guardrails",
        "state",
    }
)


#: The round's own defaults (`autoscaler.decide`): the tables below default to them, so
#: each default lives once.
_DEFAULTS = ControlOptions()


class ClusterTable(Strict):
    name: Identifier
    region: str = "us-east-1"
    # Between scheduling rounds, and between the steps that carry a round's plan
    # out; each reads the state, so faster than these only loads the database.
    interval_s: Annotated[float, Field(ge=1.0, le=30 * 86400, allow_inf_nan=False)] = (
        ROUND_INTERVAL_S
    )
    step_s: Annotated[float, Field(ge=0.5, le=30 * 86400, allow_inf_nan=False)] = 5.0


class CloudTable(Strict):
    provider: Literal["ec2", "local"] = "ec2"
    # local: emulate the catalog's launch delays (off: instances are ready at once)
    emulate_delays: bool = False
    # ec2: the workers' wheelhouse (`autoscaler deploy wheelhouse`: the agent and every
    # dependency, hash-pinned), which the daemon publishes to the cluster's bucket and every
    # worker installs offline.
    wheelhouse: str = ""


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be HOST:PORT, such as '127.0.0.1:7443'")
    return value


class ApiTable(Strict):
    listen: str = "127.0.0.1:7443"  # where the daemon serves users and worker enrollment
    advertise: str = ""  # the address users and workers dial (default: listen)
    # The workers' port, mutual TLS only (default: listen's port + 1, on the same host).
    worker_listen: str = ""

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        return _address(value)

    @field_validator("worker_listen")
    @classmethod
    def _check_worker_listen(cls, value: str) -> str:
        return _address(value) if value else value

    @field_validator("advertise")
    @classmethod
    def _check_advertise(cls, value: str) -> str:
        return _address(value) if value else value


class MetricsTable(Strict):
    listen: str = "127.0.0.1:9464"  # Prometheus metrics; "" turns them off

    @field_validator("listen")
    @classmethod
    def _check(cls, value: str) -> str:
        return _address(value) if value else value


class StorageTable(Strict):
    #: Build contexts, checkpoints and logs: `s3://bucket/prefix` or `file:///dir`.
    url: str = "file:///var/lib/autoscaler/storage"
    #: Days a finished job's checkpoints are kept before the daemon deletes them (its
    #: logs stay until the bucket's lifecycle rule expires them).
    checkpoint_retention_days: float = Field(7.0, ge=0, allow_inf_nan=False)

    @field_validator("url")
    @classmethod
    def _check(cls, value: str) -> str:
        if value.startswith("s3://") and len(value) > 5:
            return value.rstrip("/")
        if value.startswith("file:///"):
            return value.rstrip("/") or value
        raise ValueError("must be s3://BUCKET[/PREFIX] or file:///ABSOLUTE/DIR")


class SecretsTable(Strict):
    dir: str = "secrets"  # CA, certificates and tokens, each a 0600 file


class PlannerTable(Strict):
    name: Literal["eva", "eva-plain", "eva-full-only", "eva-partial-only"] = "eva"
    default_throughput: float = Field(_DEFAULTS.default_throughput, gt=0, le=1, allow_inf_nan=False)
    # No task is co-located where it is expected below this share of its full speed.
    min_throughput: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)

    def planner(self) -> EvaPlanner:
        """The planner this table names, with its options."""
        from autoscaler.planner import planner_by_name  # numpy and HiGHS: only when planning

        return planner_by_name(self.name, min_throughput=self.min_throughput)


class TimeoutsTable(Strict):
    boot_s: Seconds = _DEFAULTS.timeouts.boot_s
    register_s: Seconds = _DEFAULTS.timeouts.register_s
    start_s: Seconds = _DEFAULTS.timeouts.start_s
    checkpoint_s: Seconds = _DEFAULTS.timeouts.checkpoint_s
    heartbeat_s: Seconds = 60.0  # a worker silent this long is lost


class LimitsTable(Strict):
    max_attempts: int = Field(_DEFAULTS.max_attempts, ge=1, le=100)
    max_context_mb: Positive = Field(256.0, le=16_384.0)  # a build context, not a data set
    orphan_grace_s: Seconds = _DEFAULTS.orphans.grace_s


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
            dry_run=dry_run,
            instance_prefix=f"{self.cluster.name}-",
            # A daemon's instances boot for real: a type whose workers never register
            # backs off, then is held (replays, whose workers always register, do not).
            boot_backoff=BootBackoff(),
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
    if not p.exists():
        raise InputError(
            "configuration file not found; create one with `autoscaler init` "
            f"or name it with --config or ${CONFIG_ENV}",
            source=str(p),
        )
    data = read_config_file(p)
    return parse_cluster_config(data, p)


def load_provisioner_config(path: str | Path | None) -> ProvisionerConfig:
    """The `[ec2]` and `[guardrails]` tables of a file alone (the defaults when `path` is None):
    what the catalog commands need, from a file that may hold only those tables."""
    if path is None:
        return ProvisionerConfig()
    p = Path(path)
    return parse_config(read_config_file(p), source=str(p), base_dir=p.parent)


def parse_cluster_config(data: Mapping[str, Any], path: Path) -> ClusterConfig:
    source = str(path)
    unknown = sorted(set(data) - _TABLES)
    if unknown:
        raise InputError(
            f"unknown table [{unknown[0]}] (known: {', '.join(sorted(_TABLES))})", source=source
        )
    if "cluster" not in data:
        raise InputError(
            "has no [cluster] table: every cluster needs a name (run `autoscaler init`)",
            source=source,
        )

    def table(name: str, model: type[Strict]) -> Any:
        return parse_model(model, data.get(name, {}), source=source, where=f"[{name}]")

    cluster = table("cluster", ClusterTable)
    # The cluster's name and region are said once, in [cluster]; [ec2] may not contradict them.
    ec2 = dict(data.get("ec2", {})) if isinstance(data.get("ec2", {}), Mapping) else data["ec2"]
    if isinstance(ec2, dict):
        for key, value in (("cluster_id", cluster.name), ("region", cluster.region)):
            if key in ec2 and ec2[key] != value:
                raise InputError(
                    f"contradicts [cluster] ({value!r}); say it once, in [cluster]",
                    source=source,
                    where="[ec2]",
                    field=key,
                    value=ec2[key],
                    has_value=True,
                )
            ec2[key] = value
    base = path.parent
    provisioner = parse_config({**data, "ec2": ec2}, source=source, base_dir=base)
    secrets_table = table("secrets", SecretsTable)
    secrets_dir = Path(secrets_table.dir).expanduser()
    if not secrets_dir.is_absolute():
        secrets_dir = base / secrets_dir
    storage = table("storage", StorageTable)
    return ClusterConfig(
        path=path,
        cluster=cluster,
        cloud=table("cloud", CloudTable),
        api=table("api", ApiTable),
        metrics=table("metrics", MetricsTable),
        storage=storage,
        secrets=Secrets(secrets_dir),
        planner=table("planner", PlannerTable),
        timeouts=table("timeouts", TimeoutsTable),
        limits=table("limits", LimitsTable),
        provisioner=provisioner,
        state=parse_state_config(data, source=source, base_dir=base),
        raw=data,
    )
