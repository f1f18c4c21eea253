"""Building the daemon's bindings from the configuration: state, storage, cloud, executor.

The one module that knows which binding serves which `[cloud] provider`; the
daemon and the commands get what they need from here — including how workers
prove their instance (the cloud's `IdentityVerifier`) and what the executor
may believe of them (`StateLedger`: the state, read for every worker call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import grpc

from app.config import ClusterConfig
from app.daemon import Bindings
from autoscaler.catalog import Catalog
from autoscaler.cloud import Cloud
from autoscaler.errors import InputError
from autoscaler.period import throughput_window_s
from autoscaler.store import InstanceStatus, Store


def open_state(config: ClusterConfig, *, create: bool = False) -> Any:
    """The state database of the cluster (`create`: make the schema of a new database)."""
    from state.database import create_state_engine
    from state.migrate import schema_status, upgrade
    from state.store import SqlStore

    if create:
        engine = create_state_engine(config.state.url)
        try:
            if schema_status(engine).current is None:
                upgrade(engine)
        finally:
            engine.dispose()
        _owner_only(config.state.sqlite_path)
    return SqlStore(config.state.url)


def _owner_only(database: Path | None) -> None:
    """A SQLite state database and its journal files readable by their owner alone (they
    hold every job's env values); SQLite gives new WAL files the database's mode."""
    if database is None:
        return
    for path in (database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))):
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
        except FileNotFoundError:
            continue


def offline_catalog(config: ClusterConfig) -> Catalog:
    """The catalog the cluster plans with, without calling any cloud (cached or bundled);
    with `[spot] enabled`, its spot offerings too (`with_spot`)."""
    from provisioners.catalog import cached_or_bundled_catalog

    return with_spot(config, cached_or_bundled_catalog(config.provisioner.ec2).catalog)


def with_spot(config: ClusterConfig, catalog: Catalog, live: Any = None) -> Catalog:
    """`catalog` and, with `[spot] enabled`, a spot offering beside each type the bundled
    spot snapshot prices and `[spot] types` admits (`provisioners.catalog.spot_offerings`,
    filtered by `EC2Config.spot_for`, as launches and the IAM policy are), so the round
    weighs both markets and never plans a spot offering its launch would refuse. `live`
    (a `provisioners.spot_prices.SpotPriceTable` by AZ ID, EC2's prices in force in the
    zones the cluster launches in) prices each (type, zone) it has in place of the
    snapshot's; a regional offering (no `[spot] zones`) of a type it prices is priced over
    its zones alone — where the instance is bought, at today's prices — not over the
    snapshot's other zones, whose dated prices would otherwise set the price the ledger
    bills."""
    from dataclasses import replace

    from provisioners.catalog import bundled_spot_snapshot, spot_offerings
    from provisioners.config import family_of

    if not config.spot.enabled:
        return catalog
    region = catalog.region or config.cluster.region
    snapshot = bundled_spot_snapshot(region)
    if snapshot is None:
        raise InputError(
            f"[spot]: field 'enabled': no spot prices are bundled for region {region!r}",
            source=str(config.path),
        )
    if live is not None:
        regional = not config.spot.zones
        prices = {
            ec2_type: dict(live.prices[ec2_type])
            if regional and live.prices.get(ec2_type)
            else {
                zone: live.prices.get(ec2_type, {}).get(zone, price)
                for zone, price in by_zone.items()
            }
            for ec2_type, by_zone in snapshot.prices.items()
        }
        snapshot = replace(snapshot, prices=prices, source=f"{live.source}, over {snapshot.source}")
    ec2 = config.provisioner.ec2
    priced = [t.name for t in catalog if t.name in snapshot.prices and ec2.spot_for(t.name)]
    for entry in config.spot.types:
        if not any(entry in (name, family_of(name)) for name in priced):
            raise InputError(
                f"entry {entry!r} names no type of the catalog with spot prices bundled "
                f"for region {region}: it would get no spot offering",
                source=str(config.path),
                where="[spot]",
                field="types",
            )
    return spot_offerings(
        catalog,
        snapshot,
        zones=list(config.spot.zones) or None,
        bands=dict(config.spot.bands),
        only=ec2.spot_for,  # the one spot setting: what launches as spot, what IAM allows
    )


def daemon_security(config: ClusterConfig) -> grpc.ServerCredentials:
    """The TLS credentials of the daemon's API port."""
    from executor.security import read_secret, server_credentials

    secrets = config.secrets
    try:
        cert = secrets.server_cert.read_bytes()
        key = read_secret(secrets.server_key)
    except OSError as exc:
        raise _missing_secrets(config, exc) from None
    return server_credentials(cert, key)


def first_admin(config: ClusterConfig, store: Any, at: float) -> Any:
    """Make `secrets/api.token` the admin `admin` unless its user is known (`app.users`):
    the token `init` wrote, or the shared token of a cluster made before users existed.
    Returns the user added, if one was."""
    from app.users import ensure_first_admin
    from executor.security import read_token
    from state.accounts import SqlAccounts

    try:
        read_token(config.secrets.api_token)  # refused when others may read it
    except OSError:
        return None
    return ensure_first_admin(SqlAccounts(store.engine), config.secrets.api_token, at)


def worker_security(config: ClusterConfig) -> grpc.ServerCredentials:
    """The TLS credentials of the workers' port: the daemon's certificate, and a client
    certificate from a worker CA required of every caller — the current one, and during
    a rotation the previous one too (`app.worker_ca`), read again at each handshake."""
    import time

    from app.worker_ca import WorkerTrustFiles
    from executor.security import read_secret, rotating_server_credentials

    secrets = config.secrets
    try:
        cert = secrets.server_cert.read_bytes()
        key = read_secret(secrets.server_key)
        trust = WorkerTrustFiles(secrets)
    except OSError as exc:
        raise _missing_secrets(config, exc) from None
    return rotating_server_credentials(cert, key, trust.bundle(time.time))


def _missing_secrets(config: ClusterConfig, exc: OSError) -> InputError:
    return InputError(
        f"cannot read the cluster's secrets ({exc}); run `autoscaler init --dir "
        f"{config.path.parent}` to create them",
        source=str(config.path),
    )


class StateLedger:
    """The daemon's state as the executor reads it (`executor.client.Ledger`): which
    attempt of a task is placed on which instance, and which launches may still work.
    Read for every worker call, so a report, a grant or a heartbeat is judged by what
    the state says now, whatever the executor's memory holds."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def placed(self, task_ids: Collection[str]) -> Mapping[str, Any]:
        from autoscaler.decide import ON_INSTANCE
        from executor.client import Placed

        found = {}
        for job_id in {t.split("/", 1)[0] for t in task_ids}:
            for task in self.store.tasks_of(job_id):
                if task.task_id in task_ids:
                    where = task.instance_id if task.status in ON_INSTANCE else None
                    found[task.task_id] = Placed(task.job_id, task.attempt, where, task.checkpoint)
        return found

    def launch(self, instance_id: str) -> Any:
        from executor.client import Launch

        record = self.store.instance(instance_id)
        if record is None:
            return None
        live = record.status in ("requested", "pending", "running", "draining")
        reason = record.reason if not live else ""
        if record.lost_at is not None:
            live, reason = False, f"its worker was lost: {record.reason}"
        return Launch(
            instance_id, record.cloud_id, record.private_address, live, reason or record.status
        )


def build_bindings(config: ClusterConfig) -> Bindings:
    """State, storage, executor and cloud for `autoscaler daemon`."""
    from app.worker_ca import WorkerTrustFiles
    from executor.client import WORKER_METHODS, GrpcExecutor, add_worker_services
    from executor.storage import open_storage

    store = open_state(config, create=True)
    storage = open_storage(config.storage.url)
    s3 = getattr(storage, "client", None)
    if s3 is not None:  # S3: a denied call names the action and object it needed
        from provisioners.aws import explain_denials

        explain_denials(s3)
    try:
        trust = WorkerTrustFiles(config.secrets)  # the worker CA, rotated without a restart
    except OSError as exc:
        raise _missing_secrets(config, exc) from None
    cloud = _cloud(config, publish=True)
    executor = GrpcExecutor(
        worker_ca=trust().current,
        trust=trust,
        storage=storage,
        cluster=config.cluster.name,
        registry_address=config.worker_address,
        verifier=_verifier(config, cloud),
        ledger=StateLedger(store),
        heartbeat_timeout_s=config.timeouts.heartbeat_s,
        heartbeat_interval_s=config.timeouts.heartbeat_interval_s,
    )
    return Bindings(
        store=store,
        cloud=cloud,
        executor=executor,
        storage=storage,
        catalog=cloud.catalog,
        add_worker_services=lambda server: add_worker_services(server, executor),
        worker_methods=tuple(WORKER_METHODS),
    )


def _verifier(config: ClusterConfig, cloud: Any) -> Any:
    """How a worker of this cloud proves its instance: the local cloud's one-time secrets,
    or EC2's signed instance identity document."""
    if config.cloud.provider == "local":
        return cloud
    from provisioners.identity import InstanceIdentityVerifier

    return InstanceIdentityVerifier.from_directory(config.provisioner.ec2.identity_certificates)


def bring_down(store: Store, cloud: Cloud, clock: Callable[[], float]) -> list[str]:
    """Terminate every instance of the cluster and record it; tasks go back to pending
    (not counted as failures: the operator stopped them), jobs stay queued. Recorded
    before the terminate call, and ended in the ledger after it (never billed short)."""
    from autoscaler.cloud import match_listing
    from autoscaler.store import TaskUpdate

    now = clock()
    snapshot = store.snapshot(with_throughput=False)
    leaving = [
        TaskUpdate(t.task_id, status="pending", instance_id=None, reason="cluster brought down")
        for t in snapshot.tasks.values()
        if t.instance_id is not None
    ]
    if leaving:
        store.update_tasks(leaving, now)
    listed = cloud.list()
    listing = match_listing(((i.instance_id, i.cloud_id) for i in snapshot.instances), listed)
    for inst in snapshot.instances:
        if inst.status in ("terminating", "terminated", "failed"):
            continue
        status: InstanceStatus = (
            "failed"
            if inst.cloud_id is None and inst.instance_id not in listing.by_instance
            else "terminating"
        )
        store.transition_instance(inst.instance_id, status, now, reason="autoscaler down")
    cloud.terminate([i.cloud_id for i in listed])
    remaining = {i.cloud_id for i in cloud.list()}
    done = clock()
    for inst in store.instances():
        if inst.status == "terminating" and inst.cloud_id not in remaining:
            store.transition_instance(
                inst.instance_id, "terminated", done, reason="autoscaler down"
            )
    return sorted(i.instance_id or i.cloud_id for i in listed)


def build_cloud(config: ClusterConfig) -> Any:
    """The cluster's Cloud binding."""
    return _cloud(config)


def _cloud(config: ClusterConfig, *, publish: bool = False) -> Any:
    if config.cloud.provider == "local":
        return local_cloud(config)
    from provisioners.ec2 import EC2Cloud

    if publish:  # the daemon: it spends money unattended
        missing = config.guardrails.unattended_problems()
        if missing:
            raise InputError(
                f"set {', '.join(missing)}: a daemon on EC2 spends money unattended, and "
                "nothing else bounds what a bug, a loop or a flood of jobs can spend "
                "(`autoscaler init` writes them, commented)",
                source=str(config.path),
                where="[guardrails]",
            )

    # EC2 lists on-demand types; the cluster plans with its spot offerings beside them,
    # at the spot prices EC2 gives where it gave them.
    def offerings(listed: Catalog, live: Any) -> Catalog:
        return with_spot(config, listed, live)

    if not publish:
        return EC2Cloud.from_config(config.provisioner, offerings=offerings)
    from provisioners.aws import make_client
    from provisioners.catalog import PRICING_API_REGION

    # The daemon prices its region itself when it has no prices or old ones.
    pricing = make_client("pricing", PRICING_API_REGION)
    return EC2Cloud.from_config(
        config.provisioner,
        bootstrap=worker_bootstrap(config),
        pricing=pricing,
        offerings=offerings,
    )


def worker_bootstrap(config: ClusterConfig) -> Any:
    """Publish what EC2 workers need (the wheelhouse, to the bucket) and the user data
    that boots them: run by the daemon at start-up, with its own identity. Workers get
    no secret: each proves its instance when it enrolls."""
    from provisioners.aws import make_client
    from provisioners.bootstrap import (
        BootReports,
        WorkerBootstrap,
        object_presigner,
        publish_wheelhouse,
    )

    source = str(config.path)
    _check_advertised(config)
    wheelhouse = config.cloud.wheelhouse
    if not wheelhouse:
        raise InputError(
            'is required for provider = "ec2": the directory of the workers\' wheelhouse the '
            "daemon publishes (build it with `autoscaler deploy wheelhouse --out DIR`)",
            source=source,
            where="[cloud]",
            field="wheelhouse",
        )
    directory = Path(wheelhouse).expanduser()
    if not directory.is_absolute():
        directory = config.path.parent / directory
    storage = config.storage.url
    if not storage.startswith("s3://") or "REPLACE-WITH-YOUR-BUCKET" in storage:
        raise InputError(
            'must be s3://BUCKET/PREFIX for provider = "ec2": workers fetch contexts, '
            "checkpoints and the agent from it",
            source=source,
            where="[storage]",
            field="url",
            value=storage,
            has_value=True,
        )
    region = config.cluster.region
    bucket, _, prefix = storage.removeprefix("s3://").partition("/")
    s3 = make_client("s3", region)
    url, sha256 = publish_wheelhouse(s3, bucket, prefix, directory)
    return WorkerBootstrap(
        config.api_address,
        config.secrets.ca_cert.read_text(),
        config.cluster.name,
        region,
        object_presigner(s3, url),
        sha256,
        throughput_window_s=throughput_window_s(config.cluster.interval_s),
        reports=BootReports(s3, bucket, prefix),
        orphan_timeout_s=config.timeouts.worker_orphan_timeout_s,
        orphan_max_s=config.timeouts.worker_orphan_max_s,
    )


def _check_advertised(config: ClusterConfig) -> None:
    """Workers dial the address rendered into their user data: a daemon listening on every
    interface (0.0.0.0, as in a container) must say which one they reach it at."""
    import ipaddress

    host = config.api_address.rpartition(":")[0].strip("[]")
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = False  # a host name
    if unspecified:
        raise InputError(
            "no worker can dial it: set [api] advertise to the address workers reach the "
            "daemon at (this host's private IP or DNS name, and the port)",
            source=str(config.path),
            where="[api]",
            field="advertise" if config.api.advertise else "listen",
            value=config.api_address,
            has_value=True,
        )


def local_cloud(config: ClusterConfig) -> Any:
    """The cluster's local cloud: agents on this host, registered under the state's directory."""
    from app.files import load_availability_trace, load_spot_price_trace
    from provisioners.catalog import cached_or_bundled_catalog
    from provisioners.local import LocalCloud
    from provisioners.local_reclaims import ReclaimPlan

    cloud = config.cloud
    root = config.path.parent / "local-cloud"
    traces = {
        offering: load_availability_trace(config.path.parent / path)  # relative: to the config
        for offering, path in cloud.reclaim_traces.items()
    }
    prices = None
    if cloud.spot_price_trace:
        if not config.spot.enabled:
            raise InputError(
                "prices spot offerings, and there are none: set [spot] enabled = true",
                source=str(config.path),
                where="[cloud]",
                field="spot_price_trace",
            )
        prices = load_spot_price_trace(config.path.parent / cloud.spot_price_trace)
    epoch = _epoch(root)

    def offerings(listed: Catalog, live: Any) -> Catalog:
        return with_spot(config, listed, _one_zone(live, listed.region or config.cluster.region))

    return LocalCloud(
        cached_or_bundled_catalog(config.provisioner.ec2).catalog,
        root,
        daemon_address=config.api_address,
        ca_path=config.secrets.ca_cert,
        emulate_delays=cloud.emulate_delays,
        throughput_window_s=throughput_window_s(config.cluster.interval_s),
        # Agents checkpoint and stop their tasks when told to stop (scale-in, `down`),
        # and stop themselves when the daemon is gone too long (the spend brake).
        stop_tasks=True,
        orphan_timeout_s=config.timeouts.worker_orphan_timeout_s,
        orphan_max_s=config.timeouts.worker_orphan_max_s,
        reclaims=ReclaimPlan(cloud.reclaim_rates, traces, seed=cloud.reclaim_seed, epoch_s=epoch),
        notice_window_s=cloud.notice_window_s,
        notice_poll_s=cloud.notice_poll_s,
        spot_prices=prices,
        spot_epoch_s=epoch,
        offerings=offerings,
    )


def _one_zone(live: Any, region: str) -> Any:
    """The local cloud's spot prices (`provisioners.local_spot_prices`: one zone, "local")
    as `with_spot` reads a live table: each type's price in every zone the spot snapshot
    names for it, since every spot offering of the local cloud, whatever zone it names,
    runs in its one zone (a regional offering's median over them is that price too)."""
    from dataclasses import replace

    from provisioners.catalog import bundled_spot_snapshot

    snapshot = bundled_spot_snapshot(region) if live is not None else None
    if snapshot is None:
        return live
    return replace(
        live,
        prices={
            ec2_type: dict.fromkeys(snapshot.prices.get(ec2_type, ()), price)
            for ec2_type, by_zone in live.prices.items()
            for price in by_zone.values()
        },
    )


def _epoch(root: Path) -> float:
    """When the local cloud's availability traces start: its first use, kept in its
    directory so a restarted daemon reads the same intervals."""
    path = root / "epoch"
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        root.mkdir(parents=True, exist_ok=True)
        now = time.time()
        path.write_text(f"{now!r}\n")
        return now
