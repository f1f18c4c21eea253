"""A Python base image built from this host, for job images where no registry can be reached.

Job Dockerfiles need a `FROM` with a Python interpreter, and a worker (or a
CI machine) may have no access to a registry. This copies the host's
interpreter, its standard library (without tests, IDLE, tkinter, ensurepip,
lib2to3 and bytecode caches), the shared libraries the dynamic loader lists
for it and for its extension modules, and a static busybox (a shell for
`RUN` lines), into one layer imported with `docker import`: about 40 MB, a
couple of seconds, and nothing fetched from the network.

Extra packages go in with `pip install --target DIR` on the host, then
`COPY DIR` and `ENV PYTHONPATH` in the job's Dockerfile.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

#: The image job Dockerfiles start `FROM` when no registry is reachable.
PYTHON_IMAGE = "autoscaler/python:3.11"

#: Parts of the standard library a job never needs (and the heaviest ones).
_SKIP_TOP = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "site-packages",
        "dist-packages",
        "__pycache__",
    }
)
_SKIP_ANYWHERE = frozenset({"__pycache__", "idle_test"})
_SKIP_TEST_DIRS = frozenset({"test", "tests"})

_PROBE = (
    "import json, os, sys, sysconfig, _ssl; print(json.dumps({"
    "'executable': os.path.realpath(sys.executable), "
    "'stdlib': sysconfig.get_path('stdlib'), "
    "'dynload': os.path.dirname(_ssl.__file__), "
    "'version': '%d.%d' % sys.version_info[:2]}))"
)

_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class ImageError(RuntimeError):
    """The base image cannot be built on this host (no interpreter, no busybox)."""


def default_python() -> str:
    """The host interpreter to copy: Debian's when present, else the one running this."""
    for candidate in ("/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(sys.executable)


def ensure_python_image(
    client: docker.DockerClient,
    name: str = PYTHON_IMAGE,
    *,
    python: str | None = None,
    busybox: str = "/bin/busybox",
) -> str:
    """Build `name` from the host's interpreter unless it exists; returns the image id.

    Idempotent: an existing image of that name is kept as it is.
    """
    try:
        return _image_id(client, name)
    except docker.errors.ImageNotFound:
        pass
    python = python or default_python()
    if not os.access(busybox, os.X_OK):
        raise ImageError(
            f"{busybox} not found: install a static busybox "
            "(Debian: apt-get install busybox-static)"
        )
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = name, "latest"
    with tempfile.TemporaryDirectory(prefix="autoscaler-image-") as scratch:
        archive = Path(scratch) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            _write_rootfs(tar, python, busybox)
        client.api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=tag,
            changes=[
                "ENV PATH=/usr/local/bin:/usr/bin:/bin",
                "ENV PYTHONDONTWRITEBYTECODE=1",
                'CMD ["python3"]',
            ],
        )
    return _image_id(client, name)


def _image_id(client: docker.DockerClient, name: str) -> str:
    """The id of image `name` (the engine always sends one; docker-py's models allow none)."""
    image_id = client.images.get(name).id
    if image_id is None:
        raise ImageError(f"the Docker engine returned image {name} without an id")
    return image_id


def _write_rootfs(tar: tarfile.TarFile, python: str, busybox: str) -> None:
    try:
        probe = subprocess.run(
            [python, "-S", "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ImageError(f"cannot run {python}: {exc}") from None
    facts = json.loads(probe.stdout)
    executable, stdlib, dynload = facts["executable"], facts["stdlib"], facts["dynload"]
    for directory in ("tmp", "root", "etc", "bin", "usr/bin", "usr/local/bin"):
        _add_dir(tar, directory, 0o1777 if directory == "tmp" else 0o755)
    _add_bytes(
        tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
    )
    _add_bytes(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")

    _add_file(tar, executable)
    for alias in ("/usr/bin/python3", "/usr/bin/python", f"/usr/bin/python{facts['version']}"):
        if alias != executable:
            _add_symlink(tar, alias, executable)
    for path in _stdlib_files(Path(stdlib)):
        _add_file(tar, str(path))
    if not dynload.startswith(stdlib.rstrip("/") + "/"):
        for path in sorted(Path(dynload).glob("*.so")):
            _add_file(tar, str(path))
    extensions = [str(p) for p in Path(dynload).glob("*.so") if "_tkinter" not in p.name]
    for library in sorted(_shared_libraries([executable, *extensions]) | _extra_libraries()):
        _add_file(tar, library, dereference=True)

    _add_file(tar, busybox, arcname="bin/busybox", dereference=True)
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in sorted(set(applets.stdout.split())):
        if applet and "/" not in applet and applet != "busybox":
            _add_symlink(tar, f"/bin/{applet}", "/bin/busybox")


def _stdlib_files(stdlib: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(stdlib):
        here = Path(root)
        top = here == stdlib
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIP_ANYWHERE
            and not (top and (d in _SKIP_TOP or d.startswith("config-")))
            and not (not top and d in _SKIP_TEST_DIRS)
        )
        for name in sorted(files):
            if name.endswith((".pyc", ".a")) or "_tkinter" in name:
                continue
            yield here / name


def _shared_libraries(binaries: list[str]) -> set[str]:
    """Every library path the dynamic loader lists for these binaries (ldd)."""
    found: set[str] = set()
    for chunk in range(0, len(binaries), 64):
        result = subprocess.run(
            ["ldd", *binaries[chunk : chunk + 64]], capture_output=True, text=True, check=False
        )
        for line in result.stdout.splitlines():
            match = _LDD_LINE.search(line)
            if match and os.path.exists(match.group(1)):
                found.add(match.group(1))
    return found


#: Libraries no interpreter module links but wheels do: libstdc++ and libgcc_s for C++
#: extensions (grpcio), and glibc's libdl, libpthread, librt and libutil, empty since glibc
#: 2.34 yet still named by every manylinux wheel built against an older glibc (highspy's
#: extension does not load without libdl.so.2).
_EXTRA_LIBRARIES = frozenset(
    {
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libutil.so.1",
    }
)


def _extra_libraries() -> set[str]:
    """`_EXTRA_LIBRARIES`, for extensions an image `pip install`s (the daemon's, a job's)."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    except OSError:
        return set()
    found = set()
    for line in cache.stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        wanted = name.split(" ")[0] in _EXTRA_LIBRARIES
        if wanted and "x86-64" in name and os.path.exists(path):
            found.add(path)
    return found


def _add_dir(tar: tarfile.TarFile, name: str, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_symlink(tar: tarfile.TarFile, path: str, target: str) -> None:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def _add_file(
    tar: tarfile.TarFile, path: str, *, arcname: str | None = None, dereference: bool = False
) -> None:
    name = arcname or path.lstrip("/")
    if os.path.islink(path) and not dereference:
        _add_symlink(tar, "/" + name, os.readlink(path))
        return
    real = os.path.realpath(path)
    info = tar.gettarinfo(real, arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with open(real, "rb") as handle:
        tar.addfile(info, handle)


def remove_python_image(client: docker.DockerClient, name: str = PYTHON_IMAGE) -> None:
    """Remove the base image (tests of `ensure_python_image`)."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(name, force=True)


__all__ = ["PYTHON_IMAGE", "ImageError", "ensure_python_image", "remove_python_image"]
