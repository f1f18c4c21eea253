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

import builtins
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from autoscaler.catalog import MARKETS, ON_DEMAND, Catalog

InstanceState = Literal["pending", "running", "shutting-down", "terminated", "stopping", "stopped"]

#: States in which an instance is (or may soon be) billed.
LIVE_STATES: frozenset[str] = frozenset({"pending", "running", "stopping"})


@dataclass(frozen=True, slots=True)
class CloudInstance:
    """An instance as the cloud reports it: `cloud_id` is the cloud's name for it."""

    cloud_id: str
    instance_type: str
    state: InstanceState
    zone: str | None = None
    instance_id: str | None = None  # ours (the launch token), from its tag; None: not ours
    launched_at_s: float | None = None  # epoch seconds of the launch request
    spot: bool = False
    dry_run: bool = False  # a launch the cloud accepted in dry-run mode: nothing exists or bills
    # Its address in the cluster's network (EC2: the private IPv4 address), as the cloud
    # reports it; workers prove their instance with it (`provisioners.identity`).
    private_address: str | None = None
    # What the cloud bills it per hour where that is known only once it landed (EC2: a
    # spot instance at the spot price of the zone it landed in); None: its request's.
    hourly_price: float | None = None


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One instance to launch.

    `instance_id` is ours and the idempotency key (the launch token): the control
    loop records it before calling `launch`, so a retry after a crash finds the
    instance it started.
    `zones` is an order of preference (empty: any allowed zone).
    """

    instance_type: str
    instance_id: str
    zones: tuple[str, ...] = ()
    spot: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)


def offering_parts(offering: str) -> tuple[str, str, str | None]:
    """(EC2 type, market, zone or None) of an offering's catalog name, the inverse of
    `catalog.offering_name`; a bare type is on-demand in any zone."""
    name, _, zone = offering.partition("@")
    ec2_type, _, market = name.partition(":")
    market = market or ON_DEMAND
    if market not in MARKETS:
        raise ValueError(f"offering {offering!r}: market must be one of {MARKETS}")
    return ec2_type, market, zone or None


@dataclass(frozen=True, slots=True)
class UnavailableOffering:
    """A (type, zone) the cloud recently had no capacity for, avoided until `until_s`.

    `zone` None means every zone: the type cannot be launched anywhere right
    now, so planners leave it out until `until_s`.
    """

    instance_type: str
    zone: str | None
    until_s: float
    reason: str


#: How long an offering that failed with a capacity error is first avoided (Karpenter:
#: 3 minutes), and the most a run of failures doubles it to (`AvailabilityCache.mark`).
UNAVAILABLE_COOLDOWN_S = 180.0
MAX_UNAVAILABLE_COOLDOWN_S = 3600.0


class AvailabilityCache:
    """Offerings (type × zone) that recently failed for lack of capacity, Karpenter-style.

    One per Cloud binding: the binding marks an offering when a launch fails
    there, skips it while it cools down, and reports it through
    `Cloud.unavailable()`; the round reads only that. Times are the caller's
    clock (injected in tests).

    A failure soon after the previous cooldown ended (within that cooldown again)
    continues a run and doubles the cooldown, up to `max_cooldown_s`: a spot pool
    out of capacity for hours is then retried a handful of times, not every three
    minutes, and the jobs waiting on it are not moved between markets at each retry
    (capacity outages last minutes to hours; the cloud never says when one ends, so
    this is the most a client can know). A failure after a longer quiet spell starts
    a new run.
    """

    def __init__(
        self,
        cooldown_s: float = UNAVAILABLE_COOLDOWN_S,
        max_cooldown_s: float = MAX_UNAVAILABLE_COOLDOWN_S,
    ) -> None:
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max(cooldown_s, max_cooldown_s)
        self._marks: dict[tuple[str, str | None], UnavailableOffering] = {}
        # (until, cooldown) of each key's latest backed-off mark: kept after the mark
        # expires, so the next failure can tell whether it continues the run.
        self._runs: dict[tuple[str, str | None], tuple[float, float]] = {}

    def mark(
        self,
        instance_type: str,
        zone: str | None,
        now: float,
        reason: str,
        cooldown_s: float | None = None,
    ) -> UnavailableOffering:
        """Avoid this offering from `now`: for `cooldown_s` when given (a quota's fixed
        wait), else for the backed-off cooldown of its run of failures."""
        key = (instance_type, zone)
        if cooldown_s is None:
            run = self._runs.get(key)
            if run is not None and now < run[0] + run[1]:
                cooldown_s = min(self.max_cooldown_s, 2.0 * run[1])
            else:
                cooldown_s = self.cooldown_s
            self._runs[key] = (now + cooldown_s, cooldown_s)
        offering = UnavailableOffering(instance_type, zone, now + cooldown_s, reason)
        self._marks[key] = offering
        return offering

    def is_unavailable(self, instance_type: str, zone: str | None, now: float) -> bool:
        """True while this offering, or the whole type, cools down."""
        for key in ((instance_type, zone), (instance_type, None)):
            mark = self._marks.get(key)
            if mark is not None and mark.until_s > now:
                return True
        return False

    def offerings(self, now: float) -> list[UnavailableOffering]:
        """The offerings still cooling down at `now` (expired marks are dropped)."""
        for key in [k for k, v in self._marks.items() if v.until_s <= now]:
            del self._marks[key]
        return sorted(self._marks.values(), key=lambda o: (o.instance_type, o.zone or ""))


def unavailable_types(offerings: Iterable[UnavailableOffering], now: float) -> dict[str, str]:
    """Types that cannot be launched anywhere at `now` (from `Cloud.unavailable()`), and why."""
    return {
        o.instance_type: f"{o.reason}; retried after {o.until_s - now:.0f} s"
        for o in offerings
        if o.zone is None and o.until_s > now
    }


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
        """Start one instance (idempotent by `request.instance_id`)."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances; unknown or already terminated ids are not an error."""
        ...

    def list(self) -> list[CloudInstance]:
        """This cluster's instances that are not yet terminated."""
        ...

    def unavailable(self) -> builtins.list[UnavailableOffering]:
        """Offerings currently cooling down after capacity errors, from the binding's
        `AvailabilityCache`; a type none of whose zones can be tried has an entry
        with zone None."""
        ...


@runtime_checkable
class Diagnoses(Protocol):
    """A binding that can say why an instance never became a worker (EC2: its state
    reason, its console output and the report its bootstrap left). Optional: the round
    asks when it gives up a boot, so the cause is recorded with it."""

    def diagnose(self, cloud_id: str, instance_id: str) -> str:
        """One line on what became of the instance's boot ("" when nothing is known).
        Never raises: a diagnosis that cannot be had is not a reason to stop."""
        ...


@dataclass(frozen=True, slots=True)
class Listing:
    """The cloud's listing of our instances, matched against the state's instances.

    `by_instance` maps our id (launch token) to what the cloud lists for it:
    by cloud id when the state knows it, else by launch token (a launch whose
    answer was never recorded: the state adopts it). `orphans` are ours by tag
    but unknown to the state: money leaking, handled by the `OrphanPolicy`.
    """

    by_instance: Mapping[str, CloudInstance]
    orphans: tuple[CloudInstance, ...]


def match_listing(
    known: Iterable[tuple[str, str | None]], listed: Iterable[CloudInstance]
) -> Listing:
    """Match the state's `(our id, cloud id or None)` pairs with the cloud's listing.

    A token listed twice (a retried launch that started a second instance)
    stands for its first-launched instance; the other is an orphan.
    """
    live = [i for i in listed if i.state != "terminated"]
    by_cloud_id = {i.cloud_id: i for i in live}
    matched: dict[str, CloudInstance] = {}
    claimed: set[str] = set()
    pending: list[str] = []
    for our_id, cloud_id in known:
        if cloud_id is not None:
            claimed.add(cloud_id)
            if cloud_id in by_cloud_id:
                matched[our_id] = by_cloud_id[cloud_id]
        else:
            pending.append(our_id)
    # By launch token, for the launches whose answer the state lacks (most listings
    # have none: the sort is skipped).
    by_token: dict[str, CloudInstance] = {}
    if pending:
        for inst in sorted(
            live,
            key=lambda i: (
                i.launched_at_s if i.launched_at_s is not None else float("inf"),
                i.cloud_id,
            ),
        ):
            if inst.instance_id:
                by_token.setdefault(inst.instance_id, inst)
    for our_id in pending:
        found = by_token.get(our_id)
        if found is not None and found.cloud_id not in claimed:
            matched[our_id] = found
            claimed.add(found.cloud_id)
    orphans = tuple(sorted((i for i in live if i.cloud_id not in claimed), key=_by_id))
    return Listing(matched, orphans)


def _by_id(instance: CloudInstance) -> str:
    return instance.cloud_id


OrphanAction = Literal["report", "terminate"]

#: An unknown instance younger than this is reported but never terminated as an orphan:
#: it may be a launch whose result another process is about to record.
DEFAULT_ORPHAN_GRACE_S = 300.0


@dataclass(frozen=True, slots=True)
class OrphanPolicy:
    """What to do with instances tagged as ours that the state does not know."""

    action: OrphanAction = "report"
    grace_s: float = DEFAULT_ORPHAN_GRACE_S

    def judge(self, orphan: CloudInstance, now: float) -> tuple[OrphanAction, str]:
        """Report or terminate this orphan now, and why."""
        age = None if orphan.launched_at_s is None else now - orphan.launched_at_s
        seen = (
            f"{orphan.cloud_id} ({orphan.instance_type}) is tagged for this cluster "
            "but unknown to the state"
        )
        if self.action == "report":
            return (
                "report",
                f"{seen}; orphan_policy = report: terminate it or set orphan_policy = terminate",
            )
        if age is not None and age < self.grace_s:
            return (
                "report",
                f"{seen}; launched {age:.0f} s ago, within the {self.grace_s:.0f} s grace period",
            )
        return "terminate", f"{seen} (orphan_policy = terminate)"


@dataclass(frozen=True, slots=True)
class Guardrails:
    """Limits every launch is checked against before any money is spent.

    One type, read from the `[guardrails]` table, checked in one place: the
    round's `decide`, against the state's instances (so the limits hold across
    processes and restarts). `max_instances` and `max_hourly_spend` count every
    live instance (requested, launching, running, draining) and every orphan (an
    instance tagged as ours that the state does not know bills all the same), at
    catalog prices. `max_daily_spend` bounds the ledger's last 24 hours plus one
    more hour at the rate the launch would bring: a rolling day, so no midnight
    lets a burst through. `max_launches_per_type_hour` bounds launches of one type
    within any hour, whatever happens (instances whose workers never register are
    relaunched no faster than this). Empty `allowed_*` sets allow everything;
    `allowed_regions` is checked by the cloud binding when it is built.
    """

    max_instances: int | None = None
    max_hourly_spend: float | None = None
    allowed_types: frozenset[str] = frozenset()
    allowed_families: frozenset[str] = frozenset()
    allowed_regions: tuple[str, ...] = ()
    max_daily_spend: float | None = None
    max_launches_per_type_hour: int | None = None

    def unattended_problems(self) -> list[str]:
        """The limits a daemon spending real money must have, missing here (empty: all set).

        Without them nothing bounds what a bug, a loop or a flood of jobs can spend."""
        missing = []
        if self.max_instances is None:
            missing.append("max_instances")
        if self.max_hourly_spend is None:
            missing.append("max_hourly_spend")
        if self.max_daily_spend is None:
            missing.append("max_daily_spend")
        return missing

    def check_region(self, region: str) -> None:
        """Raise `LaunchRefused` if this cluster may not launch in `region`."""
        if self.allowed_regions and region not in self.allowed_regions:
            raise LaunchRefused(
                "allowed_regions",
                f"region {region} is not allowed (allowed: {', '.join(self.allowed_regions)}); "
                "change the region or [guardrails] allowed_regions",
            )

    def check_launch(
        self,
        instance_type: str,
        catalog: Catalog,
        live_types: Sequence[str],
        *,
        launched_last_hour: int = 0,
        spent_last_day: float = 0.0,
        live_spend: float | None = None,
    ) -> None:
        """Raise `LaunchRefused` (with the numbers) if launching one more would break a limit.

        `live_types` are the types of the instances already running or requested
        (orphans included); `launched_last_hour` how many of `instance_type` were
        requested in the last hour; `spent_last_day` the ledger's last 24 hours.
        `live_spend` is `live_spend_of(live_types, catalog)` when the caller keeps it
        as it appends (a round checking thousands of launches would otherwise re-sum
        a growing list for each, quadratic in the launches).
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
        if (
            self.max_launches_per_type_hour is not None
            and launched_last_hour + 1 > self.max_launches_per_type_hour
        ):
            raise LaunchRefused(
                "max_launches_per_type_hour",
                f"{launched_last_hour} instance(s) of {instance_type} were launched in the last "
                f"hour, the limit is {self.max_launches_per_type_hour}",
            )
        spend = live_spend_of(live_types, catalog) if live_spend is None else live_spend
        after = spend + itype.hourly_cost
        if self.max_hourly_spend is not None and after > self.max_hourly_spend + 1e-9:
            raise LaunchRefused(
                "max_hourly_spend",
                f"launching {instance_type} (${itype.hourly_cost:.4f}/h) would raise spend "
                f"from ${spend:.2f}/h to ${after:.2f}/h, over the budget of "
                f"${self.max_hourly_spend:.2f}/h",
            )
        daily = self.max_daily_spend
        if daily is not None and spent_last_day + after > daily + 1e-9:
            raise LaunchRefused(
                "max_daily_spend",
                f"${spent_last_day:.2f} spent in the last 24 h; one more hour at "
                f"${after:.2f}/h with {instance_type} would pass the daily budget of "
                f"${self.max_daily_spend:.2f}",
            )


def live_spend_of(live_types: Sequence[str], catalog: Catalog) -> float:
    """The hourly price of these instance types (those in the catalog), summed in order:
    a running total that adds each appended type's price equals it exactly."""
    return sum(catalog[t].hourly_cost for t in live_types if t in catalog)
