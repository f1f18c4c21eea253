"""`EC2Cloud`: the `autoscaler.cloud.Cloud` interface on AWS EC2, through boto3.

How it keeps money safe:

- **Idempotent launches.** Every instance carries three tags: the cluster id,
  the launch token and `managed-by`. Before `RunInstances`, the instance
  already tagged with the token is looked up and returned if there is one, so a
  crash between the call and recording its result never starts a second
  instance. `ClientToken` is passed too (real EC2 honours it for a few hours;
  moto ignores it), one per (token, zone) so a zone fallback is not mistaken
  for a changed request. `DescribeInstances` lags `RunInstances` by seconds, so
  a retry after an attempt whose answer was lost (`CloudUnavailable`) goes to
  that attempt's zone first, where the same `ClientToken` returns the same
  instance; `IdempotentParameterMismatch` (the token was used, with other
  parameters) is `CloudUnavailable` too: the round keeps the launch requested
  and adopts the instance by its tag once it is listed.
- **Capacity fallback.** `InsufficientInstanceCapacity`, `Unsupported`, a
  subnet out of addresses and the rest of `ZONE_FALLBACK_CODES` move on to the
  next allowed zone and mark the (type, zone) offering unavailable for three
  minutes (Karpenter's cool-down) in the binding's one `AvailabilityCache`;
  `unavailable()` reports it, with a whole-type entry once no allowed zone is
  left, and the round plans around it.
- **Quotas are not capacity.** `VcpuLimitExceeded` and its cousins are
  region-wide account quotas: the launch stops at once with `QuotaExceeded`
  (naming the quota and its Service Quotas page), and every type of the
  family is reported unavailable in every zone for half an hour.
- **Offerings.** A launch names a catalog offering (`autoscaler.catalog.
  offering_name`): its EC2 type, market and zone. A spot offering launches
  with `InstanceMarketOptions` (one-time, terminated on interruption) in its
  zone, through the subnet configured there; a bare type always launches
  on-demand. Spot is allowed where the cluster's one spot setting allows it
  (`[spot] enabled` and `types`, `EC2Config.spot_for`): the catalog offers spot
  for those types only and the generated policy grants spot launches for them
  only. Before the first spot launch the spot service-linked role
  (`AWSServiceRoleForEC2Spot`) is ensured, once: a new account has none, and
  AWS requires it before a spot request made through the API.
  An instance lands at the spot price in force in its zone (`_billed`, from
  `DescribeSpotPriceHistory` via `provisioners.spot_prices`); each hourly refresh
  carries the history since the previous one, from which the daemon bills a
  running instance's later price changes as ledger segments (`app.daemon.
  record_refresh`). Prices kept in the state seed a restarted binding
  (`seed_spot_prices`).
- **Guardrails** (instance cap, hourly budget) are the round's: `decide`
  checks every launch against the state before asking for it. This binding
  checks only the region, when it is built, and refuses types its `[ec2]`
  table does not allow.
- **Orphans** are the round's too: `list()` returns every instance tagged
  with the cluster, and the round's orphan policy decides. `terminate()` goes
  by id (an instance launched moments ago may not be listed yet), refusing
  ids EC2 lists with another cluster's tag.
- **No secret in user data.** Each instance's user data is rendered for it
  at its launch (`provisioners.bootstrap`): its id, a presigned URL and hash of
  the workers' wheelhouse, and a presigned URL for its failure report.
- **Boots that never register are diagnosed** (`diagnose`): EC2's state
  reason, the bootstrap's failure report and its console lines are recorded
  with the instance when the round gives it up, and its type backs off
  (`autoscaler.decide.boot_holds`).
- **Launch settings a real account needs, explicit.** Subnets and security
  groups (never a default VPC), a public IP only when asked, IMDSv2 with hop
  limit 1, an encrypted gp3 root volume sized on the image's root device,
  `InstanceInitiatedShutdownBehavior = terminate` (a worker whose bootstrap
  fails shuts down, and that ends the billing), the image for the type's
  architecture and accelerator (`provisioners.ami`), and a bounded retry
  while a new instance profile propagates. `EC2Cloud` refuses to start while
  any is missing (`EC2Config.launch_problems`).
- **Dry run** (`[ec2] dry_run`): EC2 is called with `DryRun=True`, so
  permissions and parameters are checked, and nothing is launched or
  terminated.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from autoscaler.catalog import SPOT, Catalog
from autoscaler.cloud import (
    UNAVAILABLE_COOLDOWN_S,
    AvailabilityCache,
    CloudError,
    CloudInstance,
    CloudRequestError,
    CloudUnavailable,
    Guardrails,
    InsufficientCapacity,
    LaunchRequest,
    UnavailableOffering,
    offering_parts,
)
from autoscaler.errors import InputError
from provisioners.ami import Image, ImageResolver
from provisioners.aws import (
    AwsCaller,
    error_code,
    error_message,
    make_client,
    translate_client_error,
)
from provisioners.bootstrap import WorkerBootstrap
from provisioners.catalog import DEFAULT_MAX_AGE_S, EC2Catalog, current_catalog
from provisioners.config import EC2Config, ProvisionerConfig, family_of
from provisioners.images import check_kind
from provisioners.quotas import Quota, quota_for
from provisioners.spot_prices import (
    SPOT_PRICES_STALE_AFTER_S,
    SpotPriceTable,
    refreshed_spot_prices,
)

log = logging.getLogger(__name__)

TAG_CLUSTER = "autoscaler:cluster"
TAG_LAUNCH_TOKEN = "autoscaler:launch-token"
TAG_MANAGED_BY = "autoscaler:managed-by"
MANAGED_BY = "ec2-batch-autoscaler"

#: Launch errors that mean "not in this zone, not now": try the next allowed zone and avoid
#: the offering for a few minutes (Karpenter's unfulfillable-capacity codes, and a subnet —
#: one per zone here — with no address left, which holds for every type in that zone).
ZONE_FALLBACK_CODES: frozenset[str] = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
        "Unsupported",
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
    }
)
#: Account quotas, region-wide (`provisioners.quotas`): no other zone helps, so the launch
#: stops at once and the whole family is avoided for `QUOTA_COOLDOWN_S`.
QUOTA_ERROR_CODES: frozenset[str] = frozenset(
    {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
)
#: A quota changes only when a person asks AWS for more: retry it after half an hour,
#: not after a capacity cool-down of three minutes.
QUOTA_COOLDOWN_S = 1800.0
_SUBNET_FULL = "InsufficientFreeAddressesInSubnet"
_INVALID_PARAMETER = "InvalidParameterValue"
_MISMATCH = "IdempotentParameterMismatch"
#: Waits between `RunInstances` attempts while a new instance profile propagates (~30 s).
PROFILE_PROPAGATION_DELAYS_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0)

__all__ = [
    "QUOTA_COOLDOWN_S",
    "UNAVAILABLE_COOLDOWN_S",
    "EC2Cloud",
    "QuotaExceeded",
    "client_token",
]

#: The longest diagnosis of a boot recorded with its instance.
MAX_DIAGNOSIS = 1200

#: After falling back to a stale cached catalog, ask AWS again after this long.
CATALOG_RETRY_AFTER_OUTAGE_S = 300.0

_NOT_TERMINATED = ("pending", "running", "shutting-down", "stopping", "stopped")
_DRY_RUN = "DryRunOperation"

#: The spot service-linked role, and the service it is linked to (`ensure_spot_role`).
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT_SERVICE = "spot.amazonaws.com"
#: After a failed attempt to create it, the role is asked for again no sooner than this.
SPOT_ROLE_RETRY_S = 3600.0
#: How IAM says the role exists: AWS, `InvalidInput` ("... has been taken in this account");
#: moto, `EntityAlreadyExists`.
_ROLE_EXISTS = frozenset({"InvalidInput", "EntityAlreadyExists"})


@dataclass(frozen=True, slots=True)
class SpotRole:
    """What came of ensuring the spot service-linked role: `note` is the event line."""

    note: str
    at_s: float
    ok: bool  # created, already there, or not needed (dry run): never asked again


class QuotaExceeded(InsufficientCapacity):
    """An account quota, not capacity, stopped the launch: no zone of the region can help.

    Carries the quota (name, Service Quotas code, region) and the page where
    an increase is requested; the family is avoided until `until_s`.
    """

    def __init__(
        self, instance_type: str, code: str, quota: Quota, until_s: float, detail: str = ""
    ) -> None:
        self.instance_type = instance_type
        self.zones = ()
        self.code = code
        self.quota = quota
        self.until_s = until_s
        family = family_of(instance_type)
        CloudError.__init__(
            self,
            f"{instance_type}: {code}: the account's {quota.describe()} allows no more "
            f"{'spot ' if 'Spot' in quota.name else ''}instances of family {family}"
            + (f" ({detail})" if detail else "")
            + f"; request an increase at {quota.url} — {family} is avoided until then, "
            f"retried every {QUOTA_COOLDOWN_S / 60:.0f} min",
        )


class EC2Cloud:
    """The EC2 binding of `autoscaler.cloud.Cloud` for one cluster in one region.

    `clock` (epoch seconds) and `sleep` are injectable: cool-downs, cache ages
    and backoff are tested without waiting. `bootstrap` renders each instance's
    user data at its launch (our instance id, the launch token, is in it); None
    launches without user data (an image that starts its worker by itself).
    """

    def __init__(
        self,
        config: EC2Config,
        guardrails: Guardrails | None = None,
        *,
        ec2: BaseClient | None = None,
        endpoint_url: str | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        bootstrap: WorkerBootstrap | None = None,
        catalog_max_age_s: float = DEFAULT_MAX_AGE_S,
        ssm: BaseClient | None = None,
        pricing: BaseClient | None = None,
        iam: BaseClient | None = None,
        offerings: Callable[[Catalog, SpotPriceTable | None], Catalog] | None = None,
    ) -> None:
        (guardrails or Guardrails()).check_region(config.region)
        problems = config.launch_problems()
        if problems:
            raise InputError(
                f"[ec2] cannot launch yet; set {', '.join(problems)} "
                "(`autoscaler init` writes them, commented)"
            )
        if bootstrap is not None:
            if bootstrap.cluster_id != config.cluster_id or bootstrap.region != config.region:
                raise InputError(
                    f"the worker bootstrap is for cluster {bootstrap.cluster_id} in "
                    f"{bootstrap.region}, not {config.cluster_id} in {config.region}"
                )
            bootstrap.render("size-check", accelerator="nvidia")  # fails now, not at a launch
        self.config = config
        self.clock = clock
        self.bootstrap = bootstrap
        # User data rendered for launches not yet answered: a retry with the same token must
        # send the same parameters, or EC2 refuses its ClientToken (IdempotentParameterMismatch).
        self._user_data: dict[str, str] = {}
        # Launch token -> the zone of an attempt that ended in CloudUnavailable (it may have
        # started the instance): the retry asks that zone first, with the same ClientToken.
        self._uncertain: dict[str, str] = {}
        self.catalog_max_age_s = catalog_max_age_s
        # The offerings the cluster plans with beside the listed types (the daemon's spot
        # offerings, `app.wiring.with_spot`), derived again only when the listing changes.
        self._offerings = offerings
        self._listed: Catalog | None = None
        self._live: SpotPriceTable | None = None
        self._offered: Catalog | None = None
        # The spot prices DescribeSpotPriceHistory gave (by AZ ID), and when last asked.
        self._spot_prices: SpotPriceTable | None = None
        self._spot_asked_s = -float("inf")
        client = ec2 or make_client("ec2", config.region, endpoint_url=endpoint_url)
        self._ec2 = AwsCaller(client, sleep=sleep)
        self._ssm: AwsCaller | None = AwsCaller(ssm, sleep=sleep) if ssm is not None else None
        # IAM, for the spot service-linked role only (made on first use).
        self._iam: AwsCaller | None = AwsCaller(iam, sleep=sleep) if iam is not None else None
        # When the spot role was last asked for and what came of it (`ensure_spot_role`).
        self.spot_role: SpotRole | None = None
        # The Pricing API (us-east-1), asked when the region's prices are missing or old.
        self._pricing = AwsCaller(pricing, sleep=sleep) if pricing is not None else None
        self._endpoint_url = endpoint_url
        self.images = ImageResolver(self._ec2, self._ssm_caller, clock)
        self._catalog: EC2Catalog | None = None
        self._catalog_loaded_at_s = 0.0
        self._subnet_by_zone: dict[str, str] | None = None
        self._zone_by_id: dict[str, str] = {}  # AZ ID (use1-az1) -> this account's zone name
        self.availability = AvailabilityCache(UNAVAILABLE_COOLDOWN_S)
        self._dry_run_launches: dict[str, CloudInstance] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, config: ProvisionerConfig, **kwargs: Any) -> EC2Cloud:
        return cls(config.ec2, config.guardrails, **kwargs)

    @property
    def cluster_id(self) -> str:
        assert self.config.cluster_id is not None  # launch_problems() checked it
        return self.config.cluster_id

    def _ssm_caller(self) -> AwsCaller:
        """SSM, for `resolve:ssm:` images only (made on first use)."""
        if self._ssm is None:
            client = make_client("ssm", self.config.region, endpoint_url=self._endpoint_url)
            self._ssm = AwsCaller(client, sleep=self._ec2.sleep)
        return self._ssm

    def _iam_caller(self) -> AwsCaller:
        """IAM, for the spot service-linked role only (made on first use)."""
        if self._iam is None:
            client = make_client("iam", self.config.region, endpoint_url=self._endpoint_url)
            self._iam = AwsCaller(client, sleep=self._ec2.sleep)
        return self._iam

    def ensure_spot_role(self) -> SpotRole:
        """Make sure the spot service-linked role exists before the first spot launch.

        AWS creates `AWSServiceRoleForEC2Spot` itself only for spot requests made in the
        console; through the API, a new account's first spot request fails without it
        ("Using service-linked roles for Spot Instances", EC2 User Guide). Asked once
        (`iam:CreateServiceLinkedRole`, `AWSServiceName=spot.amazonaws.com`, which the
        generated policy grants only for that service name): created, or already there
        ("has been taken in this account"), is settled for good; any other answer is
        recorded and asked again only after `SPOT_ROLE_RETRY_S` (the launch goes on: if
        the role is missing, EC2 says so). In dry run nothing is created."""
        now = self.clock()
        known = self.spot_role
        if known is not None and (known.ok or now - known.at_s < SPOT_ROLE_RETRY_S):
            return known
        if self.config.dry_run:
            outcome = SpotRole("dry run: the spot service-linked role is not created", now, True)
        else:
            try:
                self._iam_caller().call(
                    "create_service_linked_role",
                    passthrough=_ROLE_EXISTS,
                    AWSServiceName=SPOT_SERVICE,
                )
                outcome = SpotRole(f"created the spot service-linked role {SPOT_ROLE}", now, True)
            except ClientError as exc:
                code, message = error_code(exc), error_message(exc)
                if code == "EntityAlreadyExists" or "has been taken" in message:
                    outcome = SpotRole(
                        f"the spot service-linked role {SPOT_ROLE} exists", now, True
                    )
                else:
                    outcome = SpotRole(
                        f"could not create the spot service-linked role {SPOT_ROLE} "
                        f"({code}: {message}); asked again in {SPOT_ROLE_RETRY_S / 60:.0f} min",
                        now,
                        False,
                    )
            except CloudError as exc:
                outcome = SpotRole(
                    f"could not create the spot service-linked role {SPOT_ROLE} ({exc}); "
                    f"asked again in {SPOT_ROLE_RETRY_S / 60:.0f} min",
                    now,
                    False,
                )
        self.spot_role = outcome
        (log.info if outcome.ok else log.warning)("spot: %s", outcome.note)
        return outcome

    # --- catalog ------------------------------------------------------------------------------

    def ec2_catalog(self) -> EC2Catalog:
        """The catalog with zones and provenance, refreshed from AWS when older than its max age.

        After an outage forced a stale cache on us, AWS is asked again every few minutes.
        """
        now = self.clock()
        current = self._catalog
        held_s = now - self._catalog_loaded_at_s
        stale = current is not None and (current.age_s(now) or 0.0) > self.catalog_max_age_s
        if (
            current is None
            or held_s > self.catalog_max_age_s
            or (stale and held_s > CATALOG_RETRY_AFTER_OUTAGE_S)
        ):
            current = self._catalog = current_catalog(
                self._ec2,
                self.config,
                now_s=now,
                max_age_s=self.catalog_max_age_s,
                pricing=self._pricing,
            )
            self._catalog_loaded_at_s = now
        return current

    def catalog(self) -> Catalog:
        """Instance types this cluster may use, with on-demand prices, and the offerings
        `offerings` adds to them (spot: what this cloud launches as spot, planned with)."""
        listed = self.ec2_catalog().catalog
        if self._offerings is None:
            return listed
        live = self.spot_prices()
        if listed is not self._listed or live is not self._live or self._offered is None:
            self._offered = self._offerings(listed, live)
            self._listed, self._live = listed, live
        return self._offered

    def spot_prices(self) -> SpotPriceTable | None:
        """The spot prices in force of the types spot is allowed for, by type and AZ ID,
        in the zones this cluster launches in — those of its subnets, whose IDs it knows
        (`DescribeSpotPriceHistory`, cached and dated in the catalog's cache directory,
        asked again at most hourly; a failure keeps the last ones). A zone without a
        subnet is left out: no instance of the cluster is bought there, and the offerings
        name zones by AZ ID, which it could not be given. None with spot off or before
        any could be had: the bundled snapshot prices the offerings then."""
        config = self.config
        now = self.clock()
        if not config.spot_enabled or now - self._spot_asked_s < SPOT_PRICES_STALE_AFTER_S:
            return self._spot_prices
        self._spot_asked_s = now
        types = [t.name for t in self.ec2_catalog().catalog if config.spot_for(t.name)]
        if not types:
            return self._spot_prices
        known = self._spot_prices
        try:
            table, note = refreshed_spot_prices(
                config.cache_dir,
                config.region,
                self._ec2,
                types,
                now,
                since_s=known.retrieved_s if known is not None else None,
            )
            self._subnets()
        except CloudError as exc:  # the zones' IDs could not be read: the prices wait
            log.warning("spot prices not refreshed: %s", exc)
            return self._spot_prices
        if note:
            log.warning("spot: %s", note)
        if table is None or (known is not None and table.retrieved_s <= known.retrieved_s):
            return self._spot_prices  # none, or older than those held (kept in the state)
        zone_id = {name: zid for zid, name in self._zone_by_id.items()}
        self._spot_prices = SpotPriceTable(
            table.region,
            {
                ec2_type: {
                    zone_id[zone]: price for zone, price in by_zone.items() if zone in zone_id
                }
                for ec2_type, by_zone in table.prices.items()
            },
            table.retrieved_s,
            table.source,
            table.history,  # by zone name, as the instances report their zones
        )
        return self._spot_prices

    def seed_spot_prices(self, table: SpotPriceTable) -> bool:
        """Start from spot prices refreshed before (by AZ ID, as `spot_prices` gives them:
        those the daemon kept in its state), unless newer ones are held: until a refresh
        succeeds the offerings, quotes and `_billed` use them, and the first refresh asks
        for the history since they were retrieved. False when they were not taken."""
        with self._lock:
            known = self._spot_prices
            if table.region != self.config.region or (
                known is not None and known.retrieved_s >= table.retrieved_s
            ):
                return False
            self._spot_prices = table
            return True

    # --- launch -------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> CloudInstance:
        """Start one instance, or return the one this launch token already started.

        Raises `InsufficientCapacity` (no allowed zone had capacity; the
        offerings are marked unavailable), `QuotaExceeded` (an account quota;
        the family is marked unavailable), `CloudUnavailable` (unreachable,
        throttled past the backoff, or a launch EC2 may have carried out: ask
        again with the same token) or `CloudRequestError` (configuration,
        permissions, a type `[ec2]` does not allow). The guardrails were checked
        by the round before it asked.
        """
        if not 0 < len(request.instance_id) <= 256:
            raise CloudRequestError(
                f"launch token must be 1 to 256 characters (an EC2 tag value), "
                f"got {len(request.instance_id)}"
            )
        with self._lock:
            try:
                launched = self._launch(request)
            except CloudUnavailable:
                raise  # the same token comes back: keep its user data and its zone
            except BaseException:
                self._forget(request.instance_id)
                raise
            self._forget(request.instance_id)
            return self._billed(launched)

    def _billed(self, inst: CloudInstance) -> CloudInstance:
        """The instance with what EC2 bills it per hour when that depends on where it
        landed: a spot instance at the spot price in force in its zone (by AZ ID, from
        `spot_prices`). A regional offering is planned at the median of the cluster's
        zones, but EC2 bills the zone it chose; on-demand is the same in every zone."""
        if not inst.spot or inst.zone is None or inst.dry_run:
            return inst
        table = self.spot_prices()
        if table is None:
            return inst
        zone_id = {name: zid for zid, name in self._zone_by_id.items()}.get(inst.zone)
        price = table.price(inst.instance_type, zone_id) if zone_id is not None else None
        return inst if price is None else replace(inst, hourly_price=price)

    def _forget(self, instance_id: str) -> None:
        """Drop what a launch kept for its retries once it will not be retried."""
        self._user_data.pop(instance_id, None)
        self._uncertain.pop(instance_id, None)

    def _launch(self, request: LaunchRequest) -> CloudInstance:
        request = self._resolved(request)
        existing = self.find_by_token(request.instance_id)
        if existing is not None:
            log.info(
                "launch %s: found %s, not launching again",
                request.instance_id,
                existing.cloud_id,
            )
            return existing
        if request.instance_id in self._dry_run_launches:
            return self._dry_run_launches[request.instance_id]
        if not self.config.allows(request.instance_type):
            raise CloudRequestError(
                f"instance type {request.instance_type} is not allowed "
                f"([ec2] families: {', '.join(self.config.families) or 'none'}; "
                f"types: {', '.join(self.config.types) or 'none'})"
            )
        catalog = self.ec2_catalog()
        image = self._image_for(request.instance_type)

        # After an attempt whose answer was lost, its zone comes first, whatever has
        # cooled down since: the same ClientToken there returns the instance EC2 may
        # have started (DescribeInstances may not list it yet), a new zone would not.
        uncertain = self._uncertain.get(request.instance_id)
        try:
            zones = self._zones_to_try(request, catalog)
        except InsufficientCapacity:
            if uncertain is None:
                raise
            zones = []
        if uncertain is not None:
            zones = [uncertain, *(z for z in zones if z != uncertain)]
        spot = request.spot  # a bare type on-demand, a TYPE:spot offering spot (`_resolved`)
        if spot:
            self.ensure_spot_role()
        failures: list[str] = []
        for zone in zones:
            try:
                launched = self._run_instance(request, zone, spot, image)
            except CloudUnavailable:
                self._uncertain[request.instance_id] = zone
                raise
            except ClientError as exc:
                code = error_code(exc)
                if code == _MISMATCH:
                    raise CloudUnavailable(
                        f"launch {request.instance_id}: EC2 already ran this launch in "
                        f"{zone} with other parameters (a new image or user data since): "
                        "its instance is adopted once DescribeInstances lists it"
                    ) from None
                if code in QUOTA_ERROR_CODES:
                    raise self._quota_exceeded(request.instance_type, code, spot, exc) from None
                if code not in ZONE_FALLBACK_CODES:
                    raise translate_client_error(exc, "EC2 RunInstances") from exc
                self._mark_unavailable(request.instance_type, zone, code)
                failures.append(f"{zone}: {code}: {error_message(exc)}".rstrip(": "))
                log.warning("launch %s: %s in %s", request.instance_type, code, zone)
                continue
            return launched
        raise InsufficientCapacity(request.instance_type, zones, "; ".join(failures))

    def _resolved(self, request: LaunchRequest) -> LaunchRequest:
        """The request for an offering (`TYPE:spot@ZONE`) as EC2 launches it: the EC2 type,
        spot, in the offering's zone; a bare type is asked for as it is."""
        try:
            ec2_type, market, zone = offering_parts(request.instance_type)
        except ValueError as exc:
            raise CloudRequestError(str(exc)) from None
        spot = request.spot or market == SPOT
        if spot and not self.config.spot_for(ec2_type):
            config = self.config
            setting = (
                f"[spot] types: {', '.join(config.spot_types) or 'every allowed type'}"
                if config.spot_enabled
                else "[spot] enabled is false"
            )
            raise CloudRequestError(
                f"{request.instance_type}: spot is not allowed for {ec2_type} ({setting}; "
                "the catalog offers and the cluster's policy grants spot for those only)"
            )
        zones = (self._zone_name(zone),) if zone is not None else request.zones
        if (ec2_type, zones, spot) == (request.instance_type, request.zones, request.spot):
            return request
        return replace(request, instance_type=ec2_type, zones=zones, spot=spot)

    def find_by_token(self, instance_id: str) -> CloudInstance | None:
        """The not-yet-terminated instance this cluster launched with this token, if any."""
        found = self._describe(
            [
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_id]},
                {"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": [instance_id]},
                {"Name": "instance-state-name", "Values": list(_NOT_TERMINATED)},
            ]
        )
        if len(found) > 1:
            # Should not happen; if it does, the extras are orphans for `reconcile`.
            log.warning(
                "launch token %s has %d instances: %s",
                instance_id,
                len(found),
                ", ".join(i.cloud_id for i in found),
            )
        return _first_launched(found)

    def _zones_to_try(self, request: LaunchRequest, catalog: EC2Catalog) -> list[str]:
        itype = request.instance_type
        allowed, offered = self._allowed_zones(itype, catalog, self._subnets())
        if request.zones:
            wanted = [z for z in request.zones if z in allowed]
            if not wanted:
                raise CloudRequestError(
                    f"zones {', '.join(request.zones)} requested for {itype} are not allowed "
                    f"(allowed: {', '.join(allowed) or 'none'})"
                )
        else:
            wanted = list(allowed)
        if offered:
            wanted = [z for z in wanted if z in offered]
        if not wanted:
            raise CloudRequestError(
                f"{itype} is not offered in any allowed zone "
                f"(allowed: {', '.join(allowed) or 'none'}; offered in: "
                f"{', '.join(offered) or 'none'}); add a zone to [ec2] zones or a subnet "
                "in one to [ec2] subnet_ids"
            )
        now = self.clock()
        whole = self._whole_type_mark(itype, now)
        if whole is not None:
            raise InsufficientCapacity(itype, (), whole.reason)
        open_zones = [z for z in wanted if not self.availability.is_unavailable(itype, z, now)]
        if not open_zones:
            raise InsufficientCapacity(
                itype, wanted, "every allowed zone is cooling down after capacity errors"
            )
        return open_zones

    def _image_for(self, instance_type: str) -> Image:
        """The image this type boots: resolved, and checked against the type's architecture."""
        kind, reference = self.config.image_for(instance_type)
        if reference is None:
            raise CloudRequestError(
                f"no image for {instance_type} (kind {kind}); add {kind} to [ec2.ami]"
            )
        image = self.images.image(reference)
        wanted, _ = check_kind(kind)
        if image.architecture is not None and image.architecture != wanted:
            raise CloudRequestError(
                f"[ec2.ami] {kind} = {reference!r} is {image.image_id}, an {image.architecture} "
                f"image; {instance_type} needs {wanted}"
            )
        if image.root_snapshot_gb is not None and image.root_snapshot_gb > (
            self.config.root_volume_gb
        ):
            raise CloudRequestError(
                f"[ec2] root_volume_gb = {self.config.root_volume_gb} is smaller than the "
                f"{image.root_snapshot_gb} GiB root snapshot of {image.image_id} ({kind}); "
                "raise root_volume_gb"
            )
        return image

    def _run_instance(
        self, request: LaunchRequest, zone: str, spot: bool, image: Image
    ) -> CloudInstance:
        config = self.config
        cluster = self.cluster_id
        tags = {
            "Name": f"autoscaler-{cluster}",
            **request.tags,
            TAG_CLUSTER: cluster,
            TAG_LAUNCH_TOKEN: request.instance_id,
            TAG_MANAGED_BY: MANAGED_BY,
        }
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        root: dict[str, Any] = {
            "VolumeSize": config.root_volume_gb,
            "VolumeType": config.root_volume_type,
            "Encrypted": config.root_volume_encrypted,
            "DeleteOnTermination": True,
        }
        if config.root_volume_kms_key:
            root["KmsKeyId"] = config.root_volume_kms_key
        params: dict[str, Any] = {
            "ImageId": image.image_id,
            "InstanceType": request.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(request.instance_id, zone),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
            # Subnet, security groups and public IP in one place, explicit: the subnet's own
            # "auto-assign public IP" never decides.
            "NetworkInterfaces": [
                {
                    "DeviceIndex": 0,
                    "SubnetId": self._subnets()[zone],
                    "Groups": list(config.security_group_ids),
                    "AssociatePublicIpAddress": config.associate_public_ip,
                    "DeleteOnTermination": True,
                }
            ],
            # IMDSv2 only; hop limit 1 keeps containers away from the role's credentials.
            "MetadataOptions": {
                "HttpEndpoint": "enabled",
                "HttpTokens": "required",
                "HttpPutResponseHopLimit": config.metadata_hop_limit,
                "InstanceMetadataTags": "disabled",
            },
            "BlockDeviceMappings": [{"DeviceName": image.root_device_name, "Ebs": root}],
            # A worker whose bootstrap fails shuts itself down: that must end the billing.
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        profile = config.iam_instance_profile
        if profile:
            params["IamInstanceProfile"] = (
                {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
            )
        if config.key_name:
            params["KeyName"] = config.key_name
        user_data = self._user_data_for(request, image)
        if user_data:
            params["UserData"] = user_data
        if spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        if config.dry_run:
            params["DryRun"] = True
        try:
            response = self._run_instances(params)
        except ClientError as exc:
            if error_code(exc) != _DRY_RUN:
                raise
            planned = CloudInstance(
                cloud_id=f"dry-run-{request.instance_id}",
                instance_type=request.instance_type,
                state="pending",
                zone=zone,
                instance_id=request.instance_id,
                launched_at_s=self.clock(),
                spot=spot,
                dry_run=True,
            )
            self._dry_run_launches[request.instance_id] = planned
            log.info("dry run: would launch %s in %s", request.instance_type, zone)
            return planned
        return _cloud_instance(response["Instances"][0])

    def _user_data_for(self, request: LaunchRequest, image: Image) -> str:
        """The worker bootstrap for this launch, rendered once per launch token."""
        if self.bootstrap is None:
            return ""
        rendered = self._user_data.get(request.instance_id)
        if rendered is None:
            kind, _ = self.config.image_for(request.instance_type)
            _, accelerator = check_kind(kind)
            try:
                rendered = self.bootstrap.render(request.instance_id, accelerator=accelerator)
            except InputError as exc:
                raise CloudRequestError(f"worker bootstrap: {exc}") from None
            self._user_data[request.instance_id] = rendered
        return rendered

    def _run_instances(self, params: dict[str, Any]) -> dict[str, Any]:
        """`RunInstances`, retried (same parameters, same `ClientToken`) while a new
        instance profile propagates: for seconds after IAM creates it, EC2 answers
        `InvalidParameterValue` for it. Bounded by `PROFILE_PROPAGATION_DELAYS_S`."""
        passthrough = (
            ZONE_FALLBACK_CODES | QUOTA_ERROR_CODES | {_DRY_RUN, _INVALID_PARAMETER, _MISMATCH}
        )
        waited = 0.0
        for delay in (*PROFILE_PROPAGATION_DELAYS_S, None):
            try:
                return self._ec2.call("run_instances", passthrough=passthrough, **params)
            except ClientError as exc:
                if error_code(exc) != _INVALID_PARAMETER:
                    raise
                if "iaminstanceprofile" not in error_message(exc).lower():
                    raise translate_client_error(exc, "EC2 RunInstances") from exc
                if delay is None:
                    raise CloudRequestError(
                        f"EC2 RunInstances: instance profile {self.config.iam_instance_profile} "
                        f"is still not usable after {waited:g} s ({error_message(exc)}); check "
                        "[ec2] iam_instance_profile: it must exist and hold the worker role"
                    ) from exc
                log.info("instance profile not usable yet (propagating?); retry in %g s", delay)
                self._ec2.sleep(delay)
                waited += delay
        raise AssertionError("unreachable")  # pragma: no cover

    def _subnets(self) -> dict[str, str]:
        """Configured subnets by zone (a subnet lives in one zone), looked up once."""
        if self._subnet_by_zone is None:
            response = self._ec2.call("describe_subnets", SubnetIds=list(self.config.subnet_ids))
            by_zone: dict[str, str] = {}
            for subnet in response.get("Subnets", []):
                by_zone.setdefault(subnet["AvailabilityZone"], subnet["SubnetId"])
                if subnet.get("AvailabilityZoneId"):
                    self._zone_by_id[subnet["AvailabilityZoneId"]] = subnet["AvailabilityZone"]
            self._subnet_by_zone = by_zone
        return self._subnet_by_zone

    def _zone_name(self, zone: str) -> str:
        """The zone name this account launches in for `zone`, a name or an AZ ID: spot
        offerings name zones by AZ ID (the same physical zone in every account, as spot
        prices are published), while each account maps names to zones its own way."""
        self._subnets()
        return self._zone_by_id.get(zone, zone)

    # --- capacity errors ----------------------------------------------------------------------

    def _mark_unavailable(self, instance_type: str, zone: str, code: str) -> None:
        now = self.clock()
        if code == _SUBNET_FULL:
            # The zone's subnet has no address left: no type can launch there for now.
            subnet = self._subnets().get(zone, "?")
            reason = f"{code}: subnet {subnet} has no free IP address"
            for itype in self._catalog_types() | {instance_type}:
                self.availability.mark(itype, zone, now, reason)
            return
        self.availability.mark(instance_type, zone, now, code)

    def _quota_exceeded(
        self, instance_type: str, code: str, spot: bool, exc: ClientError
    ) -> QuotaExceeded:
        """The typed error for a quota, after marking every type of the family unavailable
        in every zone (zone None) for `QUOTA_COOLDOWN_S`: the round plans without them."""
        now = self.clock()
        family = family_of(instance_type)
        quota = quota_for(family, self.config.region, spot=spot)
        error = QuotaExceeded(
            instance_type, code, quota, now + QUOTA_COOLDOWN_S, error_message(exc)
        )
        reason = (
            f"{code}: {quota.describe()} allows no more {family} instances; "
            f"request an increase at {quota.url}"
        )
        for itype in {t for t in self._catalog_types() if family_of(t) == family} | {instance_type}:
            self.availability.mark(itype, None, now, reason, QUOTA_COOLDOWN_S)
        log.warning("launch %s: %s", instance_type, error)
        return error

    def _catalog_types(self) -> set[str]:
        return {t.name for t in self._catalog.catalog} if self._catalog is not None else set()

    def _whole_type_mark(self, instance_type: str, now: float) -> UnavailableOffering | None:
        for offering in self.availability.offerings(now):
            if offering.instance_type == instance_type and offering.zone is None:
                return offering
        return None

    def unavailable(self) -> list[UnavailableOffering]:
        """Offerings avoided after capacity errors, until their cool-down ends; a type
        with no allowed zone left gets an entry for every zone (zone None)."""
        now = self.clock()
        with self._lock:
            offerings = self.availability.offerings(now)
            catalog = self._catalog
            by_type: dict[str, list[UnavailableOffering]] = {}
            whole_already = {o.instance_type for o in offerings if o.zone is None}
            for o in offerings:
                if o.zone is not None and o.instance_type not in whole_already:
                    by_type.setdefault(o.instance_type, []).append(o)
            whole = []
            for itype, marks in by_type.items():
                zones: list[str] = []
                if catalog is not None:
                    allowed, offered = self._allowed_zones(itype, catalog, self._subnet_by_zone)
                    zones = [z for z in allowed if not offered or z in offered]
                cooling = {o.zone for o in marks}
                if zones and all(z in cooling for z in zones):
                    whole.append(
                        UnavailableOffering(
                            itype,
                            None,
                            min(o.until_s for o in marks),
                            "; ".join(sorted({f"{o.zone}: {o.reason}" for o in marks})),
                        )
                    )
            return sorted(offerings + whole, key=lambda o: (o.instance_type, o.zone or ""))

    def _allowed_zones(
        self, itype: str, catalog: EC2Catalog, subnets: Mapping[str, str] | None
    ) -> tuple[list[str], tuple[str, ...]]:
        """(zones this cluster may launch `itype` in, zones EC2 offers it in)."""
        offered = tuple(catalog.zones.get(itype, ()))
        allowed = list(self.config.zones or (sorted(subnets) if subnets else offered))
        if subnets:
            allowed = [z for z in allowed if z in subnets]
        return allowed, offered

    # --- a boot that never became a worker ----------------------------------------------

    def diagnose(self, cloud_id: str, instance_id: str) -> str:
        """Why an instance's worker never registered, as far as AWS and the instance say:
        EC2's state reason (a shutdown the bootstrap asked for, a spot reclaim, a
        volume limit...), the failure report the bootstrap left under the cluster's
        prefix (`provisioners.bootstrap.BootReports`: the step that failed and why), and
        the bootstrap's last lines in the console output. One line, at most
        `MAX_DIAGNOSIS` characters; never raises (`autoscaler.cloud.Diagnoses`)."""
        parts: list[str] = []
        try:
            found = self._ec2.call("describe_instances", InstanceIds=[cloud_id])
            raw = [i for r in found.get("Reservations", []) for i in r.get("Instances", [])]
            if raw:
                state = raw[0].get("StateReason", {}).get("Message") or raw[0].get(
                    "StateTransitionReason"
                )
                if state:
                    parts.append(f"EC2: {state}")
        except CloudError as exc:
            parts.append(f"EC2 state unknown ({exc})")
        reports = self.bootstrap.reports if self.bootstrap is not None else None
        if reports is not None:
            try:
                report = reports.read(instance_id)
            except CloudError as exc:
                report = f"unreadable ({exc})"
            parts.append(f"bootstrap: {report}" if report else "bootstrap: no report")
        try:
            console = self._ec2.call("get_console_output", InstanceId=cloud_id)
            # botocore decodes the base64 AWS sends (its `decode_console_output` handler).
            text = console.get("Output") or ""
            lines = [line.strip() for line in text.splitlines() if "autoscaler-bootstrap" in line]
            if lines:
                parts.append("console: " + " | ".join(lines[-3:]))
        except CloudError:
            pass  # no console output yet (it comes minutes after a boot), or none kept
        text = "; ".join(parts)
        return text if len(text) <= MAX_DIAGNOSIS else text[: MAX_DIAGNOSIS - 3] + "..."

    # --- list, terminate -----------------------------------------------------------

    def list(self) -> list[CloudInstance]:
        """This cluster's instances (by cluster tag) that are not terminated, by id, each
        with its zone's spot price if it is spot (`_billed`): one adopted by listing, its
        launch's answer lost, is billed as it would have been."""
        found = self._describe(
            [
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_id]},
                {"Name": "instance-state-name", "Values": list(_NOT_TERMINATED)},
            ]
        )
        return [self._billed(i) if i.spot else i for i in found]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances of this cluster, by id.

        `DescribeInstances` lags `RunInstances` by seconds, so an id EC2 does
        not list yet is still terminated by id (EC2 answering NotFound for it is
        not an error: the round asks again while the state says terminating).
        Ids EC2 lists with another cluster's tag, or none, are refused, and
        already terminated ones skipped: the binding only terminates what it
        owns (the IAM policy enforces the same by tag).
        """
        wanted = sorted(set(instance_ids))
        if not wanted:
            return
        refused: list[str] = []
        gone: list[str] = []
        for chunk in _chunks(wanted, 200):
            for page in self._ec2.pages(
                "describe_instances", Filters=[{"Name": "instance-id", "Values": chunk}]
            ):
                for reservation in page.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                        if tags.get(TAG_CLUSTER) != self.cluster_id:
                            refused.append(raw["InstanceId"])
                        elif raw["State"]["Name"] == "terminated":
                            gone.append(raw["InstanceId"])
        if refused:
            log.warning(
                "terminate: refusing ids not tagged for cluster %s: %s",
                self.cluster_id,
                ", ".join(sorted(refused)),
            )
        ours = sorted(set(wanted) - set(refused) - set(gone))
        for chunk in _chunks(ours, 500):
            self._terminate(chunk)

    def _terminate(self, ids: builtins.list[str]) -> None:
        """One `TerminateInstances` call; when EC2 does not know one of the ids, the whole
        call fails, so the ids are then terminated one by one (dry run stays dry)."""
        passthrough = frozenset({_DRY_RUN, "InvalidInstanceID.NotFound"})
        try:
            self._ec2.call(
                "terminate_instances",
                passthrough=passthrough,
                InstanceIds=ids,
                DryRun=self.config.dry_run,
            )
        except ClientError as exc:
            if error_code(exc) == _DRY_RUN:
                log.info("dry run: would terminate %s", ", ".join(ids))
                return
            if len(ids) == 1:
                log.info(
                    "terminate: EC2 does not know %s (already gone, or not listed yet)", ids[0]
                )
                return
            for instance_id in ids:
                self._terminate([instance_id])

    def _describe(self, filters: builtins.list[dict[str, Any]]) -> builtins.list[CloudInstance]:
        instances = [
            _cloud_instance(raw)
            for page in self._ec2.pages("describe_instances", Filters=filters)
            for reservation in page.get("Reservations", [])
            for raw in reservation.get("Instances", [])
        ]
        return sorted(instances, key=lambda i: i.cloud_id)


# --- helpers ----------------------------------------------------------------------------------


def client_token(instance_id: str, zone: str) -> str:
    """EC2's `ClientToken` (at most 64 ASCII characters) for one launch attempt in one zone."""
    return hashlib.sha256(f"{instance_id}|{zone}".encode()).hexdigest()


def _cloud_instance(raw: Mapping[str, Any]) -> CloudInstance:
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
    launched = raw.get("LaunchTime")
    return CloudInstance(
        cloud_id=raw["InstanceId"],
        instance_type=raw["InstanceType"],
        state=raw["State"]["Name"],
        zone=raw.get("Placement", {}).get("AvailabilityZone"),
        instance_id=tags.get(TAG_LAUNCH_TOKEN),
        launched_at_s=launched.timestamp() if launched is not None else None,
        spot=raw.get("InstanceLifecycle") == "spot",
        private_address=raw.get("PrivateIpAddress"),
    )


def _first_launched(instances: Iterable[CloudInstance]) -> CloudInstance | None:
    """The instance a launch token stands for when there are several: the first launched."""
    ordered = sorted(
        instances,
        key=lambda i: (
            i.launched_at_s if i.launched_at_s is not None else float("inf"),
            i.cloud_id,
        ),
    )
    return ordered[0] if ordered else None


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
