"""The workers' wheelhouse: the agent and every dependency, pinned by hash, installed offline.

A worker must not resolve its dependencies from a package index at boot: that
needs a route to the index from every subnet (a NAT gateway), downloads ~30 MB
per boot, and installs whatever versions the index has that day. So the
operator builds a wheelhouse once (`autoscaler deploy wheelhouse`):

- the worker agent's wheel (`executor.distribution`), and
- every dependency as a binary wheel, for each interpreter and platform the
  images run (Python 3.11 on Amazon Linux 2023 and Ubuntu 22.04, 3.12 on Ubuntu
  24.04; x86_64 and Graviton), fetched with `pip download --only-binary`
  from the package index or a local mirror (`--find-links`), and
- `requirements.txt`, naming every distribution at its version with the sha256
  of each of its files.

It is built where an index is reachable, at `init`/deploy time rather than by
the daemon at start-up: the daemon may run in the same private subnet as its
workers, and its start must not depend on an index either. The daemon packs
the directory into one reproducible archive (`pack`), publishes it under its
sha256 (`provisioners.bootstrap.publish_wheelhouse`), and each worker's user
data carries a presigned URL of it and the hash. The bootstrap checks the hash
and installs with `pip install --no-index --find-links DIR --require-hashes -r
requirements.txt`: only an S3 endpoint is needed, and a wheel that differs by a
byte is refused.
"""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autoscaler.errors import InputError

#: Interpreters of the images the bootstrap supports.
DEFAULT_PYTHONS: tuple[str, ...] = ("3.11", "3.12")
#: Platform tags for x86_64 and Graviton (glibc 2.34 on Amazon Linux 2023, 2.35 on Ubuntu 22.04).
DEFAULT_PLATFORMS: tuple[str, ...] = tuple(
    f"{tag}_{arch}"
    for arch in ("x86_64", "aarch64")
    for tag in ("manylinux_2_34", "manylinux_2_28", "manylinux_2_17", "manylinux2014")
)
REQUIREMENTS = "requirements.txt"
_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$"
)


class WheelhouseError(InputError):
    """The wheelhouse cannot be built or read; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Wheelhouse:
    """A built wheelhouse: its directory, wheels, requirements file and archive's sha256."""

    directory: Path
    files: tuple[str, ...]
    requirements: Path
    sha256: str


def build_wheelhouse(
    out: Path,
    worker_wheel: Path,
    *,
    pythons: Sequence[str] = DEFAULT_PYTHONS,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    find_links: Sequence[str] = (),
    index: bool = True,
) -> Wheelhouse:
    """Download the worker wheel's dependencies into `out` for each of `pythons` (binary
    wheels for `platforms`), then write `requirements.txt` over everything in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    by_python: dict[str, set[str]] = {}
    for python in pythons:
        before = {p.name for p in out.glob("*.whl")}
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            "--dest", str(out),
            *(a for platform in platforms for a in ("--platform", platform)),
            *(a for link in find_links for a in ("--find-links", link)),
            *(["--no-index"] if not index else []),
            str(worker_wheel),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-2:])
            raise WheelhouseError(
                f"pip download for Python {python} failed: {tail}; build the wheelhouse where "
                "a package index (or a --find-links mirror) is reachable"
            )
        # Files new to this run are this interpreter's; those it reused are shared ones
        # (pure Python), which need no marker.
        by_python[python] = {p.name for p in out.glob("*.whl")} - before
    requirements = out / REQUIREMENTS
    requirements.write_text(requirements_text(out, by_python), encoding="utf-8")
    files = tuple(sorted(p.name for p in out.glob("*.whl")))
    _, sha256 = pack(out)
    return Wheelhouse(out, files, requirements, sha256)


def requirements_text(directory: Path, by_python: dict[str, set[str]] | None = None) -> str:
    """`requirements.txt` for every wheel in `directory`: each distribution pinned
    (`name==version`) with the sha256 of each of its files. A distribution at different
    versions for different interpreters gets one line per version, with a marker."""
    files: dict[str, dict[str, list[Path]]] = {}
    for path in sorted(directory.glob("*.whl")):
        match = _WHEEL.match(path.name)
        if match is None:
            raise WheelhouseError(f"{path.name} is not a wheel file name", source=str(directory))
        name = _canonical(match.group("name"))
        files.setdefault(name, {}).setdefault(match.group("version"), []).append(path)
    if not files:
        raise WheelhouseError("no wheel in the wheelhouse", source=str(directory))
    lines = [
        "# Written by `autoscaler deploy wheelhouse`: every distribution a worker installs,",
        "# pinned, with the sha256 of each of its files (pip --require-hashes).",
    ]
    for name, versions in sorted(files.items()):
        for version, paths in sorted(versions.items()):
            marker = ""
            if len(versions) > 1 and by_python:
                pythons = sorted(
                    py for py, used in by_python.items() if any(p.name in used for p in paths)
                )
                marker = " ; " + " or ".join(f'python_version == "{py}"' for py in pythons)
            hashes = " ".join(f"--hash=sha256:{_sha256(p)}" for p in paths)
            lines.append(f"{name}=={version} {hashes}{marker}")
    return "\n".join(lines) + "\n"


def check(directory: Path) -> tuple[str, ...]:
    """The wheel files of a built wheelhouse, after checking each against
    `requirements.txt` (a wheel added or changed since it was built is refused)."""
    requirements = directory / REQUIREMENTS
    if not requirements.is_file():
        raise WheelhouseError(
            "no requirements.txt: not a wheelhouse (build one with `autoscaler deploy "
            "wheelhouse --out DIR`)",
            source=str(directory),
        )
    pinned = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", requirements.read_text()))
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        raise WheelhouseError("no wheel in the wheelhouse", source=str(directory))
    for path in wheels:
        if _sha256(path) not in pinned:
            raise WheelhouseError(
                f"{path.name} is not pinned by requirements.txt (changed since the wheelhouse "
                "was built?); build it again",
                source=str(directory),
            )
    return tuple(p.name for p in wheels)


def pack(directory: Path, names: Iterable[str] | None = None) -> tuple[bytes, str]:
    """The wheelhouse as one reproducible tar archive (sorted, dated 1980, owned by root)
    and its sha256: the same wheels always give the same bytes."""
    members = sorted(set(names) if names is not None else {p.name for p in directory.glob("*.whl")})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in [REQUIREMENTS, *members]:
            data = (directory / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 315532800, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m provisioners.wheelhouse --out DIR`: the worker wheel already in DIR
    (`python -m executor.distribution --out DIR`), its dependencies downloaded beside it
    and `requirements.txt` written. Needs only the standard library and pip, so
    deploy/build-image.sh runs it from a source tree."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m provisioners.wheelhouse")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--python", action="append", default=None)
    parser.add_argument("--platform", action="append", default=None)
    parser.add_argument("--find-links", action="append", default=[])
    args = parser.parse_args(argv)
    wheels = sorted(args.out.glob("ec2_batch_autoscaler_worker-*.whl"))
    if not wheels:
        parser.error(f"no worker wheel in {args.out}: run python -m executor.distribution first")
    house = build_wheelhouse(
        args.out,
        wheels[-1],
        pythons=tuple(args.python or DEFAULT_PYTHONS),
        platforms=tuple(args.platform or DEFAULT_PLATFORMS),
        find_links=tuple(args.find_links),
    )
    print(f"{house.requirements}: {len(house.files)} wheels, sha256 {house.sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
