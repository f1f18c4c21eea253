"""Worker images: which AMI each instance type boots, and the checks before it is launched.

An instance type needs an image of its CPU architecture (an x86_64 image does
not boot on Graviton) and, for accelerators, one with their drivers (a p3 on a
plain Amazon Linux image has GPUs no container can use). So `[ec2.ami]` names
one image per *kind* — `x86_64`, `arm64`, `x86_64_nvidia`, ... — and every
allowed family must have its kind, checked when the configuration is loaded
(`image_kind` reads the kind from the family's name, as EC2 names families:
`c7g` is Graviton, `p3` has NVIDIA GPUs).

NVIDIA families split in two. AWS's suggested GPU image, the Deep Learning
Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023), ships NVIDIA's open kernel
modules, which drive Turing and later GPUs only; its release notes list G4dn,
G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200. P2, P3 and G3 (K80,
V100, M60) need the proprietary driver, and AWS's image with it (the Deep
Learning Base Proprietary Nvidia Driver AMI) is Amazon Linux 2 with Python
3.10, which the worker (3.11) does not run on. So those families need a kind of
their own, `x86_64_nvidia_proprietary`, with no suggested image: the operator
builds one, or leaves them out (they are not allowed by default).

An image is an id (`ami-...`) or `resolve:ssm:<parameter>`, the form AWS
publishes its current images under (`/aws/service/ami-amazon-linux-latest/...`).
`provisioners.ami` resolves and checks them before a launch.

Pure functions of names: the configuration checks them without AWS (and
without importing boto3, which `autoscaler plan` never needs).
"""

from __future__ import annotations

import re
from typing import Literal

Architecture = Literal["x86_64", "arm64"]
ARCHITECTURES: tuple[Architecture, ...] = ("x86_64", "arm64")
#: Accelerator kinds an image may be for (each needs its own drivers).
ACCELERATORS: tuple[str, ...] = ("nvidia", "amd", "neuron", "gaudi", "qualcomm", "fpga")
#: NVIDIA families whose GPUs (K80, V100, M60) only the proprietary driver drives.
PROPRIETARY_DRIVER_FAMILIES: frozenset[str] = frozenset({"p2", "p3", "p3dn", "g3", "g3s"})
PROPRIETARY = "proprietary"

SSM_PREFIX = "resolve:ssm:"

#: AWS's public images for each kind, suggested by `autoscaler init` and in errors:
#: Amazon Linux 2023, and the Deep Learning Base AMI with the NVIDIA driver and
#: container toolkit (its root snapshot is 75 GiB).
SUGGESTED_IMAGES: dict[str, str] = {
    "x86_64": "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
    "arm64": "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    "x86_64_nvidia": "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
    "arm64_nvidia": "resolve:ssm:/aws/service/deeplearning/ami/arm64/"
    "base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
}

_AMI_ID = re.compile(r"^ami-[0-9a-f]{8,17}$")
_SSM_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,2048}(:[A-Za-z0-9_.-]{1,100})?$")
_KIND = re.compile(r"^(x86_64|arm64)(?:_([a-z]+)(?:_(proprietary))?)?$")
# EC2 family names: class letters, a generation digit, attribute letters ("c7gn", "p4d").
_FAMILY = re.compile(r"^([a-z]+)(\d+)([a-z-]*)")


class UnsupportedFamily(ValueError):
    """A family whose instances the worker cannot run on (macOS hosts)."""


def architecture_of(family: str) -> Architecture:
    """The CPU architecture of an instance family, from its name.

    A `g` among the attribute letters after the generation digit marks
    Graviton (`c7g`, `m6gd`, `im4gn`, `g5g`, `p6e-gb200`); `a1` is the first
    Graviton; everything else is x86_64. `mac*` families are refused.
    """
    if family.startswith("mac"):
        raise UnsupportedFamily(f"{family} instances are macOS hosts; the worker needs Linux")
    if family == "a1":
        return "arm64"
    match = _FAMILY.match(family)
    return "arm64" if match and "g" in match.group(3) else "x86_64"


def accelerator_of(family: str) -> str | None:
    """The accelerator kind of an instance family, or None.

    P and G (and Gr) families have NVIDIA GPUs, except `g4ad` (AMD); Inf and
    Trn have AWS Neuron devices; `dl1` Habana Gaudi, `dl2q` Qualcomm; F and VT
    FPGAs.
    """
    match = _FAMILY.match(family)
    if match is None:
        return None
    cls, attributes = match.group(1), match.group(3)
    if cls == "g" and "a" in attributes:
        return "amd"
    if cls in ("p", "g", "gr"):
        return "nvidia"
    if cls in ("inf", "trn"):
        return "neuron"
    if cls == "dl":
        return "qualcomm" if "q" in attributes else "gaudi"
    if cls in ("f", "vt"):
        return "fpga"
    return None


def image_kind(family: str) -> str:
    """The `[ec2.ami]` key of the image an instance family needs: `x86_64`, `arm64_nvidia`,
    `x86_64_nvidia_proprietary` (P2, P3, G3: see above), ..."""
    accelerator = accelerator_of(family)
    arch = architecture_of(family)
    if accelerator == "nvidia" and family in PROPRIETARY_DRIVER_FAMILIES:
        return f"{arch}_nvidia_{PROPRIETARY}"
    return f"{arch}_{accelerator}" if accelerator else arch


def check_kind(kind: str) -> tuple[Architecture, str | None]:
    """(architecture, accelerator) of an `[ec2.ami]` key; ValueError if it is not one."""
    match = _KIND.match(kind)
    if (
        match is None
        or (match.group(2) is not None and match.group(2) not in ACCELERATORS)
        or (match.group(3) is not None and match.group(2) != "nvidia")
    ):
        raise ValueError(
            f"unknown image kind {kind!r} (an architecture, {' or '.join(ARCHITECTURES)}, "
            f"optionally followed by _ and an accelerator: {', '.join(ACCELERATORS)}; "
            "x86_64_nvidia_proprietary for P2, P3 and G3)"
        )
    return match.group(1), match.group(2)  # type: ignore[return-value]


def check_image_reference(reference: str) -> str:
    """`reference` if it is an AMI id or `resolve:ssm:<parameter>`; ValueError otherwise."""
    if _AMI_ID.match(reference):
        return reference
    if reference.startswith(SSM_PREFIX) and _SSM_NAME.match(reference[len(SSM_PREFIX) :]):
        return reference
    raise ValueError(
        "must be an image id ('ami-0123456789abcdef0') or 'resolve:ssm:<parameter name>' "
        f"(such as {SUGGESTED_IMAGES['x86_64']!r})"
    )
