"""Instance types and the catalog the planner prices tasks against.

The on-disk format is Eva's `ec2_config.json`:
`{"region": ..., "instance_types": {name: {"family", "capacity": [gpu, cpu, ram_gb],
"cost", "instantiate_delay", "run_worker_delay", "worker_register_delay",
"terminate_delay", ...}}}`; its strict schema and reader are the catalog binding's
(`provisioners.catalog.EvaCatalogFile`), since the core reads no files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from autoscaler.resources import Resources

#: The demand key for a task that runs on every family (never a family's name).
ANY_FAMILY = "any"


@dataclass(frozen=True, slots=True)
class LaunchDelays:
    """How long an instance takes to become usable, and to go away (seconds).

    `acquisition_s` runs from the launch request until the cloud reports the
    instance running; `setup_s` from then until its worker can accept tasks.
    """

    acquisition_s: float
    setup_s: float
    terminate_s: float = 1.0

    @property
    def startup_s(self) -> float:
        return self.acquisition_s + self.setup_s


#: Table 1 of the Eva paper: average instance acquisition 19 s, setup 190 s.
#: Used for instance types whose catalog entry gives no measured delays.
TABLE1_LAUNCH_DELAYS = LaunchDelays(acquisition_s=19.0, setup_s=190.0, terminate_s=1.0)

#: Capacity types (markets) an offering is bought on.
ON_DEMAND = "on-demand"
SPOT = "spot"
MARKETS = (ON_DEMAND, SPOT)


def offering_name(ec2_type: str, market: str = ON_DEMAND, zone: str | None = None) -> str:
    """The catalog name of an offering: the EC2 type alone for on-demand in any zone
    (so every existing name, record and trace keeps its meaning), else
    `TYPE:spot`, `TYPE@ZONE` or `TYPE:spot@ZONE`."""
    if market not in MARKETS:
        raise ValueError(f"market must be one of {MARKETS}, not {market!r}")
    name = ec2_type if market == ON_DEMAND else f"{ec2_type}:{market}"
    return name if zone is None else f"{name}@{zone}"


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One offering the planner may buy: an EC2 type on a market (on-demand or spot),
    optionally in one zone, with what it offers and what it costs per hour.

    `name` is the offering's catalog name (`offering_name`); `ec2_type` is what the
    cloud launches (the name itself when empty). `interruption_per_hour` is the
    expected rate at which the provider reclaims it (0 for on-demand).
    """

    name: str
    family: str
    capacity: Resources
    hourly_cost: float
    delays: LaunchDelays | None = None
    market: str = ON_DEMAND
    zone: str | None = None
    ec2_type: str = ""
    interruption_per_hour: float = 0.0

    @property
    def launch_type(self) -> str:
        """The EC2 instance type to launch for this offering."""
        return self.ec2_type or self.name

    @property
    def is_spot(self) -> bool:
        return self.market == SPOT

    @property
    def launch_delays(self) -> LaunchDelays:
        """Measured delays when known, else the paper's averages."""
        return self.delays if self.delays is not None else TABLE1_LAUNCH_DELAYS


class Catalog:
    """The instance types a planner may use, immutable once built.

    Types are kept in a fixed order — descending hourly cost, then name — which
    is the order Algorithm 1 visits them in.
    """

    __slots__ = ("_by_name", "_families", "_types", "region")

    def __init__(
        self, types: tuple[InstanceType, ...] | list[InstanceType], region: str | None = None
    ) -> None:
        ordered = tuple(sorted(types, key=lambda t: (-t.hourly_cost, t.name)))
        by_name = {t.name: t for t in ordered}
        if len(by_name) != len(ordered):
            raise ValueError("instance type names must be unique")
        self._types = ordered
        self._by_name = by_name
        self._families = frozenset(t.family for t in ordered)
        self.region = region

    def __iter__(self) -> Iterator[InstanceType]:
        return iter(self._types)

    def __repr__(self) -> str:
        return f"Catalog({list(self._types)!r}, region={self.region!r})"

    def __len__(self) -> int:
        return len(self._types)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> InstanceType:
        return self._by_name[name]

    @property
    def types(self) -> tuple[InstanceType, ...]:
        """All types, descending hourly cost."""
        return self._types

    @property
    def families(self) -> frozenset[str]:
        return self._families

    def restricted_to(self, names: set[str] | frozenset[str]) -> Catalog:
        """The same catalog with only the named types (itself when all are named:
        planners recognise a catalog by identity, to reuse what they derived from it)."""
        kept = tuple(t for t in self._types if t.name in names)
        return self if len(kept) == len(self._types) else Catalog(kept, self.region)
