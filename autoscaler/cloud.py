"""The `Cloud` interface: what the control loop needs from a cloud, and nothing more.

Bindings: `provisioners.ec2` (boto3) in production, `simulator` in replay.

The contract, which every binding honours:

- **Idempotent by launch token.** `launch` with a token that already produced
  an instance returns that instance instead of starting a second one, even
  after a crash between the call and recording its result.
- **Eventually consistent.** An instance just launched may be `pending` for a
  while; one just terminated may still be listed as `shutting-down`.
- **Typed failures, never swallowed.** A call that fails raises a `CloudError`
  subclass saying whether retrying can help and what to tell the user.
- **Owns only what it tagged.** `list` returns the instances of this cluster
  (by tag), never anything else in the account.

The rules that are the same for every binding — which instances are orphans,
whether a launch stays within the guardrails — are pure functions here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from autoscaler.catalog import Catalog

InstanceState = Literal["pending", "running", "shutting-down", "terminated", "stopping", "stopped"]

#: States in which an instance is (or may soon be) billed.
LIVE_STATES: frozenset[str] = frozenset({"pending", "running", "stopping"})


@dataclass(frozen=True, slots=True)
class CloudInstance:
    """An instance as the cloud reports it."""

    instance_id: str
    instance_type: str
    state: InstanceState
    zone: str | None = None
    launch_token: str | None = None
    launched_at_s: float | None = None  # epoch seconds of the launch request
    spot: bool = False
    dry_run: bool = False  # a launch the cloud accepted in dry-run mode: nothing exists or bills


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One instance to launch.

    `launch_token` is the idempotency key: the control loop records it before
    calling `launch`, so a retry after a crash finds the instance it started.
    `zones` is an order of preference (empty: any allowed zone).
    """

    instance_type: str
    launch_token: str
    zones: tuple[str, ...] = ()
    spot: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UnavailableOffering:
    """A (type, zone) the cloud recently had no capacity for, avoided until `until_s`."""

    instance_type: str
    zone: str
    until_s: float
    reason: str


class CloudError(Exception):
    """A cloud call failed. `retryable` says whether trying again later can help."""

    retryable: bool = False


class InsufficientCapacity(CloudError):
    """No allowed zone had capacity (or quota) for the type; it is marked unavailable."""

    retryable = True

    def __init__(self, instance_type: str, zones: Sequence[str], detail: str = "") -> None:
        self.instance_type = instance_type
        self.zones = tuple(zones)
        tried = ", ".join(self.zones) or "no zone"
        super().__init__(
            f"no capacity for {instance_type} in {tried}" + (f": {detail}" if detail else "")
        )


class LaunchRefused(CloudError):
    """A guardrail (budget, instance cap, allowed types) refused the launch."""

    retryable = False

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


class CloudUnavailable(CloudError):
    """The cloud could not be reached or kept throttling; retry later."""

    retryable = True


class CloudRequestError(CloudError):
    """The cloud rejected the request (bad configuration, permissions, ...)."""

    retryable = False


@runtime_checkable
class Cloud(Protocol):
    """Launch, terminate and list this cluster's instances."""

    def catalog(self) -> Catalog:
        """Instance types this cluster may use, with current prices."""
        ...

    def launch(self, request: LaunchRequest) -> CloudInstance:
        """Start one instance (idempotent by `request.launch_token`)."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances; unknown or already terminated ids are not an error."""
        ...

    def list(self) -> list[CloudInstance]:
        """This cluster's instances that are not yet terminated."""
        ...

    def unavailable(self) -> list[UnavailableOffering]:
        """Offerings currently marked unavailable after capacity errors."""
        ...


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Differences between what the state knows and what the cloud has."""

    orphans: tuple[CloudInstance, ...]  # tagged as ours, unknown to the state: money leaking
    gone: tuple[str, ...]  # known to the state, no longer (or never) in the cloud


def reconcile(known_ids: Iterable[str], listed: Iterable[CloudInstance]) -> Reconciliation:
    """Compare the state's live instance ids with the cloud's listing of our instances."""
    known = set(known_ids)
    live = [i for i in listed if i.state != "terminated"]
    listed_ids = {i.instance_id for i in live}
    orphans = tuple(
        sorted((i for i in live if i.instance_id not in known), key=lambda i: i.instance_id)
    )
    gone = tuple(sorted(known - listed_ids))
    return Reconciliation(orphans, gone)


@dataclass(frozen=True, slots=True)
class Guardrails:
    """Limits every launch is checked against before any money is spent.

    `max_hourly_spend` counts running plus requested instances at catalog
    prices. Empty `allowed_*` sets allow everything.
    """

    max_instances: int | None = None
    max_hourly_spend: float | None = None
    allowed_types: frozenset[str] = frozenset()
    allowed_families: frozenset[str] = frozenset()

    def check_launch(self, instance_type: str, catalog: Catalog, live_types: Sequence[str]) -> None:
        """Raise `LaunchRefused` (with the numbers) if launching one more would break a limit.

        `live_types` are the types of the instances already running or requested.
        """
        if instance_type not in catalog:
            raise LaunchRefused("catalog", f"instance type {instance_type} is not in the catalog")
        itype = catalog[instance_type]
        if self.allowed_types and instance_type not in self.allowed_types:
            raise LaunchRefused(
                "allowed_types",
                f"instance type {instance_type} is not allowed "
                f"(allowed: {', '.join(sorted(self.allowed_types))})",
            )
        if self.allowed_families and itype.family not in self.allowed_families:
            raise LaunchRefused(
                "allowed_families",
                f"instance family {itype.family} of {instance_type} is not allowed "
                f"(allowed: {', '.join(sorted(self.allowed_families))})",
            )
        if self.max_instances is not None and len(live_types) + 1 > self.max_instances:
            raise LaunchRefused(
                "max_instances",
                f"launching {instance_type} would make {len(live_types) + 1} instances, "
                f"over the limit of {self.max_instances}",
            )
        if self.max_hourly_spend is not None:
            spend = sum(catalog[t].hourly_cost for t in live_types if t in catalog)
            after = spend + itype.hourly_cost
            if after > self.max_hourly_spend + 1e-9:
                raise LaunchRefused(
                    "max_hourly_spend",
                    f"launching {instance_type} (${itype.hourly_cost:.4f}/h) would raise spend "
                    f"from ${spend:.2f}/h to ${after:.2f}/h, over the budget of "
                    f"${self.max_hourly_spend:.2f}/h",
                )
