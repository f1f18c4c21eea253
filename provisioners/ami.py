"""Resolving `[ec2.ami]` images before a launch: `resolve:ssm:` parameters, then `DescribeImages`.

`ImageResolver` resolves a parameter (SSM `GetParameter`) and describes the
image (`DescribeImages`) — Karpenter resolves its AMI aliases the same way —
so the launch can check the image's architecture against the type's, size the
root volume on the image's root device, and send a literal image id (a retry
with the same `ClientToken` must send the same parameters; `RunInstances`
resolving the parameter itself would also need `ssm:GetParameters` for the
daemon and check nothing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from botocore.exceptions import ClientError

from autoscaler.cloud import CloudRequestError
from provisioners.aws import AwsCaller, error_code
from provisioners.images import SSM_PREFIX

_AMI_ID = re.compile(r"^ami-[0-9a-f]{8,17}$")
_NOT_FOUND = frozenset({"ParameterNotFound", "ParameterVersionNotFound"})


@dataclass(frozen=True, slots=True)
class Image:
    """An AMI as `DescribeImages` reports it: what a launch needs to know about it."""

    image_id: str
    architecture: str | None
    root_device_name: str
    root_snapshot_gb: int | None  # the root volume can be no smaller than this
    reference: str  # as configured: an id or resolve:ssm:<parameter>


#: A resolved image is looked up again after this long (AWS moves its public parameters
#: to a new image every few weeks; new instances should follow, running ones are kept).
IMAGE_MAX_AGE_S = 3600.0


class ImageResolver:
    """Resolves `[ec2.ami]` references to images, cached for `IMAGE_MAX_AGE_S`.

    `ssm` is called only for `resolve:ssm:` references, so a configuration of
    literal ids needs no SSM permission.
    """

    def __init__(
        self,
        ec2: AwsCaller,
        ssm: Callable[[], AwsCaller],
        clock: Callable[[], float],
        max_age_s: float = IMAGE_MAX_AGE_S,
    ) -> None:
        self._ec2 = ec2
        self._ssm = ssm
        self._clock = clock
        self._max_age_s = max_age_s
        self._cache: dict[str, tuple[float, Image]] = {}

    def image(self, reference: str) -> Image:
        now = self._clock()
        cached = self._cache.get(reference)
        if cached is not None and now - cached[0] < self._max_age_s:
            return cached[1]
        image_id = self._resolve(reference)
        image = self._describe(image_id, reference)
        self._cache[reference] = (now, image)
        return image

    def _resolve(self, reference: str) -> str:
        if not reference.startswith(SSM_PREFIX):
            return reference
        name = reference[len(SSM_PREFIX) :]
        try:
            value = self._ssm().call("get_parameter", passthrough=_NOT_FOUND, Name=name)
        except ClientError as exc:  # only the passthrough codes: not found
            raise CloudRequestError(
                f"SSM parameter {name} of image {reference} does not exist in this region "
                f"({error_code(exc)}); check [ec2.ami]"
            ) from None
        image_id = str(value["Parameter"]["Value"]).strip()
        if not _AMI_ID.match(image_id):
            raise CloudRequestError(
                f"SSM parameter {name} holds {image_id!r}, not an image id; check [ec2.ami]"
            )
        return image_id

    def _describe(self, image_id: str, reference: str) -> Image:
        found = self._ec2.call("describe_images", ImageIds=[image_id]).get("Images", [])
        if not found:
            raise CloudRequestError(f"image {image_id} ({reference}) not found; check [ec2.ami]")
        raw = found[0]
        root = raw.get("RootDeviceName") or "/dev/xvda"
        size = None
        for mapping in raw.get("BlockDeviceMappings", []):
            if mapping.get("DeviceName") == root and "VolumeSize" in mapping.get("Ebs", {}):
                size = int(mapping["Ebs"]["VolumeSize"])
        return Image(image_id, raw.get("Architecture"), root, size, reference)
