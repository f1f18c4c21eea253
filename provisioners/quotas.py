"""EC2's account quotas: which one an instance type counts against, and where to raise it.

EC2 limits running instances by *vCPU quotas*, one per group of families and
region, separately for on-demand and spot (Service Quotas, service code `ec2`).
A launch over one fails with `VcpuLimitExceeded` (or the older
`InstanceLimitExceeded`, `MaxSpotInstanceCountExceeded`) in every zone alike:
it is not capacity, and only a quota increase helps. New accounts often have
0 vCPUs for P, G, F, Inf, DL, Trn and X instances.

The groups and codes are those of the Service Quotas console ("Running
On-Demand P instances" = L-417A185B, ...); an instance family belongs to a
group by the letters its name starts with (`p3` → P, `g5` and `vt1` → G and
VT, `u-6tb1` → High Memory, everything else → Standard).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: group -> (label, on-demand quota code, spot quota code or None)
_GROUPS: dict[str, tuple[str, str, str | None]] = {
    "standard": ("Standard (A, C, D, H, I, M, R, T, Z)", "L-1216C47A", "L-34B43A08"),
    "dl": ("DL", "L-6E869C2A", "L-85EED4F7"),
    "f": ("F", "L-74FC7D96", "L-88CF9481"),
    "g": ("G and VT", "L-DB2E81BA", "L-3819A6DF"),
    "hpc": ("HPC", "L-F7808C92", None),
    "inf": ("Inf", "L-1945791B", "L-B5D1601B"),
    "p": ("P", "L-417A185B", "L-7212CCBC"),
    "trn": ("Trn", "L-2C3B7624", "L-6B0D517C"),
    "u": ("High Memory", "L-43DA4232", None),
    "x": ("X", "L-7295265B", "L-E3A00192"),
}
#: The class letters of a family name (`p` in `p4d`) -> its quota group.
_GROUP_OF_CLASS: dict[str, str] = {
    "dl": "dl",
    "f": "f",
    "g": "g",
    "gr": "g",
    "vt": "g",
    "hpc": "hpc",
    "inf": "inf",
    "p": "p",
    "trn": "trn",
    "u": "u",
    "x": "x",
}
_CLASS = re.compile(r"^[a-z]+")


@dataclass(frozen=True, slots=True)
class Quota:
    """One EC2 vCPU quota of a region, as the Service Quotas console names it."""

    name: str
    code: str | None  # None: the console lists it under its name only
    region: str

    @property
    def url(self) -> str:
        """The Service Quotas page where an increase is requested."""
        base = f"https://{self.region}.console.aws.amazon.com/servicequotas/home/services/ec2"
        return f"{base}/quotas/{self.code}" if self.code else f"{base}/quotas"

    def describe(self) -> str:
        code = f" ({self.code})" if self.code else ""
        return f"quota '{self.name}'{code} in {self.region}"


def quota_group(family: str) -> str:
    """The quota group of an instance family: `p` for `p3`, `standard` for `c7i`."""
    match = _CLASS.match(family)
    return _GROUP_OF_CLASS.get(match.group(0) if match else "", "standard")


def quota_for(family: str, region: str, *, spot: bool) -> Quota:
    """The vCPU quota an instance of `family` counts against, on-demand or spot."""
    label, on_demand, spot_code = _GROUPS[quota_group(family)]
    if spot:
        return Quota(f"All {label} Spot Instance Requests", spot_code, region)
    return Quota(f"Running On-Demand {label} instances", on_demand, region)
