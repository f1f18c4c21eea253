"""Resource vectors `[gpu, cpu, ram_gb]`, the unit every demand and capacity is given in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

#: Names of the resource dimensions, in vector order. CPU is counted in
#: physical cores, as in Eva's data (an EC2 vCPU is half a core).
RESOURCE_NAMES: tuple[str, ...] = ("gpu", "cpu", "ram_gb")

#: The one tolerance of every capacity comparison, so that demands summing to exactly
#: the capacity in floating point still fit. `fits` is the comparison; the planner's
#: innermost loops (reconfiguration, the LP's columns, the fluid packing's arrays)
#: inline the same test with this same tolerance, for speed.
EPSILON = 1e-9


def fits(demand: Sequence[float], capacity: Sequence[float]) -> bool:
    """True when `demand` fits `capacity` in every dimension (`[gpu, cpu, ram_gb]`).

    The one fit test: a job's validation, the round's infeasible tasks, the
    step's room on an instance and the planner's patterns all ask it.
    """
    return (
        demand[0] <= capacity[0] + EPSILON
        and demand[1] <= capacity[1] + EPSILON
        and demand[2] <= capacity[2] + EPSILON
    )


class Resources(NamedTuple):
    """An amount of each resource; used for task demands and instance capacities.

    A tuple underneath, so hashing and comparing millions of demands stays
    cheap. Use `plus`/`minus` for arithmetic: `+` on tuples concatenates.
    """

    gpu: float = 0.0
    cpu: float = 0.0
    ram_gb: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Resources:
        """Build from a `[gpu, cpu, ram_gb]` sequence."""
        gpu, cpu, ram_gb = values
        return cls(float(gpu), float(cpu), float(ram_gb))

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.gpu, self.cpu, self.ram_gb)

    def fits_in(self, capacity: Resources) -> bool:
        """True when this demand fits `capacity` in every dimension (`fits`)."""
        return fits(self, capacity)

    def plus(self, other: Resources) -> Resources:
        return Resources(self.gpu + other.gpu, self.cpu + other.cpu, self.ram_gb + other.ram_gb)

    def minus(self, other: Resources) -> Resources:
        return Resources(self.gpu - other.gpu, self.cpu - other.cpu, self.ram_gb - other.ram_gb)

    def __str__(self) -> str:
        return f"[{self.gpu:g}, {self.cpu:g}, {self.ram_gb:g}]"


def total(vectors: Iterable[Resources]) -> Resources:
    """Sum of resource vectors."""
    gpu = cpu = ram = 0.0
    for v in vectors:
        gpu += v.gpu
        cpu += v.cpu
        ram += v.ram_gb
    return Resources(gpu, cpu, ram)
