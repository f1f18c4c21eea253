"""Instance types and the catalog the planner prices tasks against.

The on-disk format is Eva's `ec2_config.json`, read unchanged:
`{"region": ..., "instance_types": {name: {"family", "capacity": [gpu, cpu, ram_gb],
"cost", "instantiate_delay", "run_worker_delay", "worker_register_delay",
"terminate_delay", ...}}}`. Fields the planner does not use are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.errors import InputError, check_number
from autoscaler.limits import MAX_CAPACITY, MAX_DELAY_S, MAX_HOURLY_COST
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


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One EC2 instance type: what it offers and what it costs per hour."""

    name: str
    family: str
    capacity: Resources
    hourly_cost: float
    delays: LaunchDelays | None = None

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


def catalog_from_eva(data: object, source: str = "catalog") -> Catalog:
    """Build a catalog from the parsed Eva `ec2_config.json` structure, validating it."""
    if not isinstance(data, Mapping):
        raise InputError("must be a JSON object with an 'instance_types' object", source=source)
    raw_types = data.get("instance_types")
    if not isinstance(raw_types, Mapping) or not raw_types:
        raise InputError(
            "must be a non-empty object of instance types",
            source=source,
            field="instance_types",
            value=raw_types,
            has_value=raw_types is not None,
        )
    region = data.get("region")
    if region is not None and not isinstance(region, str):
        raise InputError(
            "must be a string", source=source, field="region", value=region, has_value=True
        )
    types = [_instance_type(name, spec, source) for name, spec in raw_types.items()]
    return Catalog(types, region)


def _instance_type(name: str, spec: Any, source: str) -> InstanceType:
    where = f"instance type {name!r}"
    if not name.strip() or name != name.strip():
        raise InputError(
            "an instance type's name must be non-empty, without surrounding spaces",
            source=source,
            where=where,
        )
    if not isinstance(spec, Mapping):
        raise InputError("must be an object", source=source, where=where)
    family = spec.get("family")
    if not isinstance(family, str) or not family or family == ANY_FAMILY:
        raise InputError(
            f"must be a non-empty string other than {ANY_FAMILY!r} (a demand for "
            f"{ANY_FAMILY!r} is one for every family)",
            source=source,
            where=where,
            field="family",
            value=family,
            has_value=True,
        )
    capacity = _vector(spec.get("capacity"), field="capacity", where=where, source=source)
    wrong = None
    if capacity.gpu != int(capacity.gpu):
        wrong = "GPUs are whole devices"
    elif capacity.as_tuple() == (0, 0, 0):
        wrong = "a type with no capacity hosts nothing"
    if wrong:
        raise InputError(
            wrong,
            source=source,
            where=where,
            field="capacity",
            value=list(capacity.as_tuple()),
            has_value=True,
        )
    cost = check_number(
        spec.get("cost"),
        field="cost",
        where=where,
        source=source,
        strictly_positive=True,
        maximum=MAX_HOURLY_COST,
    )
    delays = None
    if "instantiate_delay" in spec:

        def delay(key: str, default: float) -> float:
            return check_number(
                spec.get(key, default), field=key, where=where, source=source, maximum=MAX_DELAY_S
            )

        acquisition = delay("instantiate_delay", 0)
        setup = delay("run_worker_delay", 0) + delay("worker_register_delay", 0)
        terminate = delay("terminate_delay", 1)
        delays = LaunchDelays(acquisition, setup, terminate)
    return InstanceType(
        name=name, family=family, capacity=capacity, hourly_cost=cost, delays=delays
    )


def _vector(value: object, *, field: str, where: str, source: str | None) -> Resources:
    if not isinstance(value, list) or len(value) != 3:
        raise InputError(
            "must be a list [gpu, cpu, ram_gb]",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    numbers = [
        check_number(v, field=f"{field}[{i}]", where=where, source=source, maximum=MAX_CAPACITY[i])
        for i, v in enumerate(value)
    ]
    return Resources.of(numbers)
