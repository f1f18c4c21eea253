"""Building the daemon's bindings from the configuration: state, storage, cloud, executor.

The one module that knows which binding serves which `[cloud] provider`; the
daemon and the commands get what they need from here.
"""

from __future__ import annotations

from typing import Any

import grpc

from autoscaler.catalog import Catalog
from autoscaler.errors import InputError
from autoscaler.service.config import ClusterConfig
from autoscaler.service.daemon import Bindings


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
    return SqlStore(config.state.url)


def offline_catalog(config: ClusterConfig) -> Catalog:
    """The catalog the cluster plans with, without calling any cloud (cached or bundled)."""
    from provisioners.catalog import cached_or_bundled_catalog

    return cached_or_bundled_catalog(config.provisioner.ec2).catalog


def daemon_security(config: ClusterConfig) -> tuple[grpc.ServerCredentials, dict[str, str]]:
    """The daemon's TLS credentials and its tokens (token -> role)."""
    from executor.security import read_secret, read_token, server_credentials

    secrets = config.secrets
    try:
        cert = secrets.server_cert.read_bytes()
        key = read_secret(secrets.server_key)
        tokens = {read_token(secrets.api_token): "user", read_token(secrets.worker_token): "worker"}
    except OSError as exc:
        raise InputError(
            f"cannot read the cluster's secrets ({exc}); run `autoscaler init --dir "
            f"{config.path.parent}` to create them",
            source=str(config.path),
        ) from None
    return server_credentials(cert, key), tokens


def build_bindings(config: ClusterConfig) -> Bindings:
    """State, storage, executor and cloud for `autoscaler daemon`."""
    from executor.client import WORKER_METHODS, GrpcExecutor, add_registry
    from executor.storage import open_storage

    from executor.security import Authority

    store = open_state(config, create=True)
    storage = open_storage(config.storage.url)
    authority = Authority.load(config.secrets.ca_cert, config.secrets.ca_key)
    executor = GrpcExecutor(
        authority=authority,
        storage_url=config.storage.url,
        heartbeat_timeout_s=config.timeouts.heartbeat_s,
    )
    cloud = _cloud(config)
    return Bindings(
        store=store,
        cloud=cloud,
        executor=executor,
        storage=storage,
        catalog=cloud.catalog,
        add_worker_services=lambda server: add_registry(server, executor),
        worker_methods=tuple(WORKER_METHODS),
    )


def _cloud(config: ClusterConfig) -> Any:
    if config.cloud.provider == "local":
        return local_cloud(config)
    from provisioners.ec2 import EC2Cloud

    if not config.provisioner.ec2.ami:
        raise InputError(
            'is required for provider = "ec2": the image workers boot from',
            source=str(config.path),
            where="[ec2]",
            field="ami",
        )
    return EC2Cloud.from_config(config.provisioner)


def local_cloud(config: ClusterConfig) -> Any:
    """The cluster's local cloud: agents on this host, registered under the state's directory."""
    from provisioners.local import LocalCloud

    return LocalCloud(
        offline_catalog(config),
        config.path.parent / "local-cloud",
        daemon_address=config.api_address,
        ca_path=config.secrets.ca_cert,
        token_path=config.secrets.worker_token,
        emulate_delays=config.cloud.emulate_delays,
    )
