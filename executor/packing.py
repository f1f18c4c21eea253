"""The one archive format of the cluster's storage: a directory as a reproducible `.tar.gz`.

Build contexts (packed by `autoscaler submit` on the user's machine, or by
`storage.upload_context`) and checkpoints (packed by the worker agent) are
written by this one packer, so a directory has one digest whoever packs it.
A context's digest is its storage address (`contexts/<sha256>.tar.gz`): the
same files are uploaded once and built once per worker.

Reproducible bytes: entries sorted by path; every entry's time 0, owner 0:0
with no user or group name, and its mode normalized (directories and
executable files 0755, other files 0644, symlinks 0777); a hard link is packed
as the file it names; the gzip header holds no name and time 0. Touching a
file, or packing it as another user on another machine, keeps the digest.
Symlinks are stored as symlinks, never followed; sockets, FIFOs and devices
are left out.

A build context honours its `.dockerignore` as Docker documents it
(https://docs.docker.com/build/concepts/context/#dockerignore-files): a line
starting with `#` in column 1 is a comment; patterns are Go `filepath.Match`
globs on the path from the context's root (`*`, `?`, `[...]`) plus `**` for
any number of directories; a leading `!` makes an exception, and the last
line that matches a path decides. The matching is the docker SDK's own (a
port of moby's `patternmatcher`). `Dockerfile` and `.dockerignore` are always
packed, as the Docker CLI always sends them; the engine itself keeps them out
of `COPY` when the file excludes them. Checkpoints pack everything.

A build context's size limit is on its uncompressed bytes (a gigabyte of
zeros is a gigabyte, however well it compresses): the client adds up its
files' sizes before it reads one (`pack_context_file`), and the daemon
counts what an uploaded archive inflates to, streaming, stopping at the
limit (`inflated_size`). Packing streams to a file: never a whole context
in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

#: Light compression: checkpoints (model weights) are large and barely compress.
COMPRESS_LEVEL = 1

#: What Docker sends even when `.dockerignore` excludes it.
ALWAYS_SENT = ("Dockerfile", ".dockerignore")

_BOM = "\ufeff"


class PackingError(OSError):
    """A directory cannot be packed, or an archive may not be unpacked."""


def pack_context(directory: str | Path) -> tuple[bytes, str]:
    """A build context as reproducible `.tar.gz` bytes honouring `.dockerignore`, and
    their sha256 (the context's storage address)."""
    root = Path(directory)
    sink = io.BytesIO()
    _pack(root, _members(root, dockerignore_patterns(root)), sink)
    data = sink.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class ContextTooLarge(PackingError):
    """A build context is over the size limit (uncompressed bytes)."""


def pack_context_file(directory: str | Path, out: str | Path, *, max_bytes: int | None) -> str:
    """A build context packed as `pack_context` does, streamed to the file `out`; returns
    its sha256. Refused (ContextTooLarge) before anything is read when its files add up
    to more than `max_bytes` (sizes as the archive will hold them: a sparse file counts
    whole)."""
    root = Path(directory)
    names = _members(root, dockerignore_patterns(root))
    if max_bytes is not None:
        size = _content_bytes(root, names)
        if size > max_bytes:
            raise ContextTooLarge(
                f"{root}: build context of {size / 2**20:.1f} MiB (uncompressed) is over "
                f"the limit of {max_bytes / 2**20:.0f} MiB ([limits] max_context_mb); "
                "shrink it with a .dockerignore"
            )
    with open(out, "wb") as sink:
        _pack(root, names, sink)
    return file_digest(out)


def inflated_size(archive: str | Path, limit: int) -> int:
    """How many bytes a `.tar.gz` inflates to, read in blocks; counting stops past `limit`
    (so a compression bomb costs `limit` bytes of reading at most, and no memory)."""
    total = 0
    with gzip.open(archive, "rb") as inflated:
        while total <= limit:
            block = inflated.read(1 << 20)
            if not block:
                break
            total += len(block)
    return total


def _content_bytes(root: Path, names: Iterable[str]) -> int:
    total = 0
    for name in names:
        status = (root / name).lstat()
        if stat.S_ISREG(status.st_mode):
            total += status.st_size
    return total


def pack_directory(directory: str | Path, out: str | Path) -> str:
    """Everything under `directory` (a checkpoint) as a reproducible `.tar.gz` at `out`;
    returns its sha256."""
    root = Path(directory)
    with open(out, "wb") as sink:
        _pack(root, _members(root, ()), sink)
    return file_digest(out)


def file_digest(path: str | Path) -> str:
    """The sha256 of a file's bytes (read in blocks: archives may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dockerignore_patterns(directory: str | Path) -> list[str]:
    """The patterns of `directory/.dockerignore`, read as the Docker CLI reads them
    (moby `ignorefile.ReadAll`): a byte-order mark dropped, `#` in column 1 a comment,
    blanks trimmed, empty lines skipped; a leading `!` kept. Empty without the file."""
    path = Path(directory) / ".dockerignore"
    if not path.is_file():
        return []
    patterns = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if number == 0:
            line = line.removeprefix(_BOM)
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if pattern.startswith("!"):
            pattern = "!" + pattern[1:].strip()
        if pattern not in ("", "!"):
            patterns.append(pattern)
    return patterns


def unpack_checkpoint(archive: str | Path, target: str | Path) -> None:
    """Unpack a checkpoint into `target`: regular files and directories only, nothing
    outside `target`, every entry open to the job (which may run as any user)."""
    target = Path(target)
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if (
                member.name.startswith("/")
                or ".." in parts
                or not (member.isfile() or member.isdir())
            ):
                raise tarfile.TarError(f"checkpoint member {member.name!r} is not allowed")
            members.append(member)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python before 3.11.4
            tar.extractall(target, members=members)
    for root, dirs, files in os.walk(target):
        for name in dirs + files:
            os.chmod(Path(root) / name, 0o777 if name in dirs else 0o666)


def _members(root: Path, patterns: Iterable[str]) -> list[str]:
    """The paths to pack (relative, '/'-separated, sorted): all of them, or those the
    `.dockerignore` patterns leave (Docker's walk: an excluded directory is entered only
    when an exception could re-include something below it)."""
    if not root.is_dir():
        raise PackingError(f"{root}: not a directory")
    patterns = list(patterns)
    if patterns:
        from docker.utils.build import PatternMatcher

        names: Iterable[str] = PatternMatcher(
            [*patterns, *(f"!{name}" for name in ALWAYS_SENT)]
        ).walk(str(root))
    else:
        names = (
            os.path.relpath(os.path.join(here, name), root)
            for here, dirs, files in os.walk(root)  # symlinked directories are not entered
            for name in dirs + files
        )
    return sorted(Path(name).as_posix() for name in names)


def _pack(root: Path, names: Iterable[str], sink: BinaryIO) -> None:
    with (
        gzip.GzipFile(
            filename="", fileobj=sink, mode="wb", compresslevel=COMPRESS_LEVEL, mtime=0
        ) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in names:
            path = root / name
            info = _entry(path, name)
            if info is None:
                continue
            if info.isreg():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)


def _entry(path: Path, name: str) -> tarfile.TarInfo | None:
    """The normalized tar header of one path (None for what an archive does not hold)."""
    status = path.lstat()
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(status.st_mode):
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
    elif stat.S_ISDIR(status.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif stat.S_ISREG(status.st_mode):
        info.type, info.size = tarfile.REGTYPE, status.st_size
        info.mode = 0o755 if status.st_mode & 0o111 else 0o644
    else:
        return None
    return info
