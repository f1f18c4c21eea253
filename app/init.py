"""`autoscaler init`: a commented cluster configuration and the cluster's secrets.

It writes `autoscaler.toml` with safe defaults, and in `secrets/`, each a file
of mode 0600:

- the **server CA** (`server-ca.pem`, `server-ca.key`), which signs only the
  daemon's server certificate: the CLI and every worker trust it alone. Its key
  is used here and nowhere else (the daemon never needs it);
- the daemon's **server certificate** (`server.pem`, `server.key`), for the
  fixed name `autoscaler-daemon` that every client verifies, plus the host of
  `[api] advertise` (or `listen`);
- the **worker CA** (`worker-ca.pem`, `worker-ca.key`), with which the daemon
  signs the short-lived client certificates of enrolled workers — client
  authentication only, so nothing a worker obtains passes as the daemon;
- `api.token`, the token of the first user, the admin `admin` (the daemon keeps
  only its hash, from its first start on; more users: `autoscaler user add`).

Workers get no shared secret: each proves its own instance when it enrolls.
Running `init` again keeps everything that exists (a secret is never
overwritten), except the server certificate when it no longer matches the
server CA or the advertised host (move the daemon, run `init` again).

Its arguments are checked before anything is written, and the configuration
is parsed back before it is written: every string goes into the TOML escaped
(a `"` or a newline in `--dir` makes no broken file), and the API, worker and
metrics and dashboard ports are ones no other process on this host (another cluster's daemon)
listens on.
"""

from __future__ import annotations

import os
import secrets as _random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, unquote, urlsplit

from app.config import PLACEHOLDER_BUCKET, ClusterConfig, parse_cluster_config
from app.users import new_user_id, new_user_token
from autoscaler.decide import ControlOptions
from autoscaler.errors import InputError
from autoscaler.period import ROUND_INTERVAL_S
from executor.security import (
    DAEMON_NAME,
    Authority,
    certificate_names,
    issued_by,
    write_secret,
)
from provisioners.config import ClusterId, Region
from provisioners.documents import Strict, convert, parse_toml, text

__all__ = ["DAEMON_NAME", "InitResult", "config_template", "init_cluster", "new_cluster_name"]


#: The ports `init` offers first: the API's (gRPC, TLS), the metrics' (Prometheus) and
#: the dashboard's (HTTPS).
DEFAULT_API_PORT = 7443
DEFAULT_METRICS_PORT = 9464
DEFAULT_DASHBOARD_PORT = 8443


@dataclass(frozen=True, slots=True)
class InitResult:
    config: Path
    written: tuple[Path, ...]
    kept: tuple[Path, ...]


def new_cluster_name() -> str:
    """A cluster name no other deployment in the account has (tags, tokens, buckets use it)."""
    return f"cluster-{_random.token_hex(4)}"


Bucket = Annotated[
    str,
    text(
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="an S3 bucket name: 3-63 of a-z, 0-9, '.' and '-', starting and ending "
        "with a letter or digit",
    ),
]


class InitArguments(Strict, frozen=True):
    """What `autoscaler init` is given, checked before anything is written."""

    name: ClusterId | None = None
    region: Region = "us-east-1"
    bucket: Bucket | None = None


def check_arguments(
    directory: Path, name: str | None, region: str, bucket: str | None
) -> InitArguments:
    """The arguments, or a one-line InputError naming the flag and value."""
    arguments = convert(
        {"name": name, "region": region, "bucket": bucket},
        InitArguments,
        source=None,
        where_of=lambda path: (None, f"--{path[0]}" if path else None),
    )
    if arguments.bucket is not None and ".." in arguments.bucket:
        raise InputError("is not an S3 bucket name", field="--bucket", value=bucket, has_value=True)
    shown = str(directory)
    if not shown.strip() or "\x00" in shown:
        raise InputError("must name a directory", field="--dir", value=shown, has_value=True)
    if directory.exists() and not directory.is_dir():
        raise InputError(
            "exists and is not a directory", field="--dir", value=shown, has_value=True
        )
    parent = directory
    while not parent.exists():  # the nearest directory that exists must let us create in it
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(
            f"cannot be created or written ({parent} is not a writable directory)",
            field="--dir",
            value=shown,
            has_value=True,
        )
    return arguments


def init_cluster(
    directory: Path,
    *,
    name: str | None = None,
    local: bool = False,
    region: str = "us-east-1",
    bucket: str | None = None,
) -> InitResult:
    """Write the configuration and the secrets into `directory`, keeping what exists."""
    arguments = check_arguments(directory, name, region, bucket)
    config = directory / "autoscaler.toml"
    text_ = None
    if not config.exists():
        text_ = config_template(
            arguments.name or new_cluster_name(),
            directory,
            local=local,
            region=arguments.region,
            bucket=arguments.bucket,
        )
        _reads_back(text_, config, directory, local)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise InputError(
            f"cannot be created: {exc.strerror or exc}",
            field="--dir",
            value=str(directory),
            has_value=True,
        ) from None
    written: list[Path] = []
    kept: list[Path] = []
    if text_ is None:
        kept.append(config)
    else:
        try:
            # Never over one made meanwhile; only its owner reads it (it names the secrets).
            fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w", encoding="utf-8") as handle:
                handle.write(text_)
        except FileExistsError:
            kept.append(config)
        except OSError as exc:
            raise InputError(f"cannot write: {exc.strerror or exc}", source=str(config)) from None
        else:
            written.append(config)
    secrets_dir = directory / "secrets"
    label = name or "autoscaler"
    authorities: dict[str, Authority | None] = {}
    for purpose in ("server", "worker"):
        ca_cert, ca_key = secrets_dir / f"{purpose}-ca.pem", secrets_dir / f"{purpose}-ca.key"
        if ca_cert.exists() and (ca_key.exists() or purpose == "server"):
            # The server CA's key may be kept offline: its certificate is what clients pin.
            loaded = Authority.load(ca_cert, ca_key) if ca_key.exists() else None
            authorities[purpose] = loaded
            kept += [ca_cert, ca_key] if loaded else [ca_cert]
        else:
            created = authorities[purpose] = Authority.create(f"{label} {purpose}")
            for path, data in ((ca_key, created.key_pem), (ca_cert, created.cert_pem)):
                write_secret(path, data, overwrite=True)
                written.append(path)
    server_ca_pem = (secrets_dir / "server-ca.pem").read_bytes()
    names = [DAEMON_NAME, *_advertised_host(config)]
    server_cert, server_key = secrets_dir / "server.pem", secrets_dir / "server.key"
    if (
        server_cert.exists()
        and server_key.exists()
        and issued_by(server_cert.read_bytes(), server_ca_pem)
        and set(names) <= set(certificate_names(server_cert.read_bytes()))
    ):
        kept += [server_cert, server_key]
    else:
        server_ca = authorities["server"]
        if server_ca is None:
            raise InputError(
                "the daemon's certificate must be issued again (for "
                f"{', '.join(names)}), which needs the server CA's key: put it back as "
                f"{secrets_dir / 'server-ca.key'} and run `autoscaler init` again",
                source=str(config),
            )
        cert, key = server_ca.issue(names)
        write_secret(server_key, key, overwrite=True)
        write_secret(server_cert, cert, overwrite=True)
        written += [server_cert, server_key]
    api_token = secrets_dir / "api.token"
    admin_token = new_user_token(new_user_id())
    (written if write_secret(api_token, admin_token + "\n") else kept).append(api_token)
    return InitResult(config, tuple(written), tuple(kept))


def _advertised_host(config: Path) -> list[str]:
    """The host users and workers dial, from the configuration (none if it is unreadable:
    the daemon's fixed name is enough for every client of ours)."""
    try:
        from app.config import load_cluster_config

        address = load_cluster_config(config).api_address
    except Exception:  # a broken file is reported by the command that loads it
        return []
    host = address.rpartition(":")[0].strip("[]")
    return [host] if host and host != DAEMON_NAME else []


def toml_string(value: str) -> str:
    """`value` as a TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def file_url(path: Path) -> str:
    """`file:///...` for an absolute path, %-encoded so every character survives."""
    return "file://" + quote(str(path), safe="/")


def free_port(preferred: int, avoid: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """The first port from `preferred` on that nothing on this host listens on (another
    cluster's daemon, say) and that is not in `avoid`; InputError if none of 100 is free."""
    for port in range(preferred, preferred + 100):
        if port in avoid:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise InputError(
        f"ports {preferred} to {preferred + 99} are all in use on 127.0.0.1: "
        "set [api] listen and [metrics] listen by hand"
    )


def _reads_back(text_: str, path: Path, directory: Path, local: bool) -> ClusterConfig:
    """The configuration `text_` as the commands will read it, or an InputError naming
    --dir when what it says is not what was meant (a path that does not survive)."""
    config = parse_cluster_config(parse_toml(text_, str(path)), path)
    if local:
        meant = directory.resolve() / "storage"
        read = Path(unquote(urlsplit(config.storage.url).path))
        if read != meant:
            raise InputError(
                "cannot be written into a storage URL that reads back the same",
                field="--dir",
                value=str(directory),
                has_value=True,
            )
    return config


def config_template(
    name: str, directory: Path, *, local: bool, region: str, bucket: str | None
) -> str:
    """The commented configuration `init` writes."""
    provider = "local" if local else "ec2"
    ec2 = _LOCAL_EC2 if local else _ec2_tables(name, region)
    # On one machine jobs are short demos: rounds every 30 s show packing and moves soon.
    interval, step = (30.0, 2.0) if local else (ROUND_INTERVAL_S, 5.0)
    # The defaults of the round itself, so the file says what leaving a key out means.
    defaults = ControlOptions()
    timeouts = defaults.timeouts
    eva_interval = f"Eva uses {ROUND_INTERVAL_S:g}"
    throughput = f"default_throughput = {defaults.default_throughput:g}"
    grace = f"orphan_grace_s = {defaults.orphans.grace_s:g}"
    # Ports no other process here listens on: two clusters on one host do not collide.
    api_port = free_port(DEFAULT_API_PORT)
    while free_port(api_port + 1) != api_port + 1:  # the workers' port: listen's + 1
        api_port = free_port(api_port + 2)
    metrics_port = free_port(DEFAULT_METRICS_PORT, {api_port, api_port + 1})
    dashboard_port = free_port(DEFAULT_DASHBOARD_PORT, {api_port, api_port + 1, metrics_port})
    # On one machine the dashboard is on (loopback only); on EC2 it is opened by choice.
    dashboard = "true" if local else "false"
    if local:
        storage = f"url = {toml_string(file_url(directory.resolve() / 'storage'))}"
        state = 'path = "state.db"                  # a SQLite file beside this one'
    else:
        storage = f"url = {toml_string(f's3://{bucket or PLACEHOLDER_BUCKET}/{name}')}"
        state = (
            'path = "state.db"                  # a SQLite file; for production use PostgreSQL:\n'
            '# url = "postgresql+psycopg://autoscaler@db.internal:5432/autoscaler"'
        )
    lifecycle = (
        ""
        if local
        else "\n# S3 expires jobs/ and instances/ under the prefix after 30 days with the lifecycle"
        "\n# rule `autoscaler deploy policy` writes (s3-lifecycle.json); apply it once with"
        f"\n#   aws s3api put-bucket-lifecycle-configuration --bucket {bucket or 'BUCKET'} \\"
        "\n#     --lifecycle-configuration file://s3-lifecycle.json"
    )
    return f"""# Cluster configuration, written by `autoscaler init`. Every key is optional unless
# marked; an unknown key is an error. Relative paths are relative to this file.

[cluster]
{f"name = {toml_string(name)}":<34} # required, unique per account: tags, tokens, keys use it
{f"region = {toml_string(region)}":<34} # EC2 region (the catalog's prices are per region)
{f"interval_s = {interval:g}":<34} # seconds between scheduling rounds ({eva_interval})
{f"step_s = {step:g}":<34} # seconds between the steps that carry a round's plan out

[cloud]
{f'provider = "{provider}"':<34} # "ec2", or "local": instances are agents on this host
emulate_delays = false             # local only: wait the catalog's launch delays, as EC2 would
# ec2: the workers' wheelhouse (the agent and every dependency, hash-pinned), which the
# daemon publishes to [storage] for workers to install offline at boot (required for
# "ec2"; build it with `autoscaler deploy wheelhouse --out wheelhouse`)
# wheelhouse = "wheelhouse"

[api]
{f'listen = "127.0.0.1:{api_port}"':<34} # users (TLS, a token on every call) and worker enrollment
# advertise = "10.0.0.5:7443"      # the address users and workers dial, if not `listen`
# worker_listen = "127.0.0.1:7444" # the workers' port, mutual TLS (default: listen's port + 1)

[metrics]
{f'listen = "127.0.0.1:{metrics_port}"':<34} # Prometheus metrics over HTTP; "" turns them off

[dashboard]
{f"enabled = {dashboard}":<34} # the web dashboard: HTTPS with the daemon's certificate,
{f'listen = "127.0.0.1:{dashboard_port}"':<34} # log in with a user's token (read, submit, admin)

[storage]
# build contexts, checkpoints and logs: s3://BUCKET/PREFIX, or file:///DIR on one machine
{storage}
checkpoint_retention_days = 7      # a finished job's checkpoints are deleted after this{lifecycle}

[secrets]
dir = "secrets"                    # the two CAs, certificates, the API token (0600, never logged)

[state]
{state}

[planner]
name = "eva"                       # eva, eva-plain, eva-full-only, eva-partial-only
{throughput:<34} # assumed for a pair of workloads never seen together
min_throughput = 0.0               # never co-locate a task expected below this share of its speed
wait_jct_factor = 1.0              # > 1: a new job may wait (F - 1) x its solo run for freed room
wait_min_saving = 0.1              # ... when a new instance for it would save less than this share

[timeouts]
{f"boot_s = {timeouts.boot_s:g}":<34} # launch request -> running, else the instance is given up
{f"register_s = {timeouts.register_s:g}":<34} # running -> its worker registered
{f"start_s = {timeouts.start_s:g}":<34} # a task's fetch, build and start
{f"checkpoint_s = {timeouts.checkpoint_s:g}":<34} # a task's checkpoint and upload
heartbeat_s = 10                   # a worker silent this long is lost: its tasks move
heartbeat_interval_s = 5           # how often workers heart-beat
retry_backoff_s = 10               # a transient failure's first wait before its retry
retry_backoff_max_s = 300          # ... doubling with each failure, at most this
worker_orphan_timeout_s = 1800     # a worker with no daemon this long and no task stops
worker_orphan_max_s = 7200         # ... and with tasks (checkpointed first); 0: never

[limits]
{f"max_attempts = {defaults.max_attempts}":<34} # a task failing this often fails its job
max_context_mb = 256               # the largest build context a submission may upload
{grace:<34} # an unknown instance of ours is left alone this long

{ec2}"""


_LOCAL_EC2 = """[guardrails]
max_instances = 8                  # never more instances than this (requested ones count)
max_hourly_spend = 20.0            # USD per hour at catalog prices, every live instance

[ec2]
# The local cloud plans with the same catalog as EC2 (its instances are agents here).
families = ["c7i", "r7i"]          # instance families the planner may use
"""


def _ec2_tables(name: str, region: str) -> str:
    """The provisioner's commented [ec2] and [guardrails] tables, without the cluster's
    name and region (said once, in [cluster])."""
    from provisioners.config import ec2_config_template

    text = ec2_config_template(name, region)
    kept = []
    for paragraph in text.split("\n\n"):
        lines = [line for line in paragraph.splitlines() if not line.startswith("region = ")]
        if not any(line.startswith("cluster_id = ") for line in lines):
            kept.append("\n".join(lines))
    return "\n\n".join(kept).rstrip() + "\n"
