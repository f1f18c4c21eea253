"""Command-line values, checked where they are read, and the files commands write.

Files' values are checked by their schemas (`provisioners.documents`); this
module holds the same rules for what is typed on a command line — numbers
without coercion (`1_000`, ` 3`, `0x10`, `nan` and `inf` are refused),
durations with units, times for `--since` — and the rules of outputs: an
output is never an input, the configuration, the state database or another
output of the same command, and is written whole (a temporary file in the same
directory, renamed) or not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from autoscaler.errors import InputError

# -- numbers and durations -------------------------------------------------------------------

_DECIMAL = re.compile(
    r"^[+-]?([0-9]{1,300}(\.[0-9]{0,300})?|\.[0-9]{1,300})([eE][+-]?[0-9]{1,4})?$"
)
_INTEGER = re.compile(r"^[+-]?[0-9]{1,19}$")


def strict_number(text: str, *, integer: bool = False) -> float | int | None:
    """The number `text` spells in plain decimal notation, or None (no `_`, spaces,
    hexadecimal, `nan` or `inf`: what a person types, read as they meant it)."""
    if integer:
        return int(text) if _INTEGER.match(text) else None
    if not _DECIMAL.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def number_arg(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    integer: bool = False,
) -> Callable[[str], float]:
    """An argparse `type=` for a finite number within [low, high] (or (low, high] when
    `low_open`): `nan`, `inf` and absurd values are refused where they are read."""

    def described() -> str:
        left = "(" if low_open else "["

        def show(x: float) -> str:
            return f"{int(x):,}" if integer else f"{x:g}"

        lo = "-inf" if low is None else show(low)
        hi = "inf" if high is None else show(high)
        kind = "a whole number" if integer else "a number"
        return f"{kind} in {left}{lo}, {hi}]"

    def parse(text: str) -> float:
        value = strict_number(text, integer=integer)
        if value is None or not _within(value, low, high, low_open):
            raise argparse.ArgumentTypeError(f"must be {described()}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def _within(value: float, low: float | None, high: float | None, low_open: bool) -> bool:
    if low is not None and (value <= low if low_open else value < low):
        return False
    return high is None or value <= high


#: Units a duration may carry on the command line, in seconds.
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def seconds_arg(low: float, high: float) -> Callable[[str], float]:
    """An argparse `type=` for a duration: seconds (`300`), or with a unit (`300s`, `5m`,
    `2h`, `1d`, `1w`), within [low, high] seconds."""

    def parse(text: str) -> float:
        unit = UNITS.get(text[-1:]) if text[-1:].isalpha() else 1.0
        number = strict_number(text[:-1] if text[-1:].isalpha() else text)
        if unit is None or number is None or not low <= number * unit <= high:
            raise argparse.ArgumentTypeError(
                f"must be a duration from {low:g} s to {high:g} s: seconds, or a number with "
                f"a unit s, m, h, d or w (such as 5m), got {text!r}"
            )
        return number * unit

    parse.__name__ = "duration"
    return parse


# -- --since ---------------------------------------------------------------------------------

_SPAN = re.compile(r"^([0-9]{1,30}(?:\.[0-9]{1,6})?)([smhdw])$")
_EPOCH = re.compile(r"^@([0-9]{1,12}(?:\.[0-9]{1,6})?)$")
SINCE_FORMS = (
    "an ISO 8601 date or time (2026-11-23, 20261123, 2026-11-23T10:00, 20261123T1000Z), "
    "a span back from now (12h, 7d, 2w), or epoch seconds marked with @ (@1700000000)"
)


def parse_since(text: str, now: float) -> float:
    """The start of a report in epoch seconds, from what `--since` was given.

    ISO 8601, basic or extended (UTC unless it says otherwise); a span back from
    now; epoch seconds only with an explicit `@` — a bare number is refused,
    since `20261123` (a basic date) must not be read as seconds in 1970. A start
    in the future is an error: a report of nothing is not what anyone asked for.
    """
    value = text.strip()
    span = _SPAN.match(value)
    epoch = _EPOCH.match(value)
    if span:
        # a span longer than the epoch's age means everything recorded
        return max(0.0, now - float(span.group(1)) * UNITS[span.group(2)])
    if epoch:
        when = float(epoch.group(1))
    elif value.isdigit() and len(value) != 8:
        raise _since_error(text, "a bare number is ambiguous: epoch seconds are written @N")
    else:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise _since_error(text, f"must be {SINCE_FORMS}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        when = moment.timestamp()
    if when > now:
        shown = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        raise _since_error(text, f"is in the future ({shown}): nothing was spent since then")
    return when


def _since_error(text: str, problem: str) -> InputError:
    return InputError(problem, field="--since", value=text, has_value=True)


# -- outputs ---------------------------------------------------------------------------------


def _can_create_in(directory: Path) -> bool:
    """True when a file can really be created in `directory`: an unnamed temporary
    file is made there and vanishes at once (os.access would say yes to root
    everywhere, /proc and read-only mounts included)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


#: Image formats every matplotlib install writes (what `--plot` accepts).
PLOT_FORMATS = (".png", ".pdf", ".svg", ".eps", ".ps", ".jpg", ".jpeg")


def output_path(
    suffix: str | None = None, formats: tuple[str, ...] | None = None
) -> Callable[[str], Path]:
    """An argparse `type=` for a file to write: its directory must exist and be writable
    now, before the work starts, and the path must not be anything but a regular file (a
    FIFO or a device would block or swallow it). With `suffix`, a name without one gets it
    (so the message names the file really written); with `formats`, only those suffixes do."""

    def parse(text: str) -> Path:
        path = Path(text).expanduser()
        if not text.strip() or "\x00" in text or path.is_dir():
            raise argparse.ArgumentTypeError(f"must be a file to write, got {text!r}")
        if suffix and not path.suffix:
            path = path.with_suffix(suffix)
        if formats and path.suffix.lower() not in formats:
            raise argparse.ArgumentTypeError(
                f"cannot write a {path.suffix!r} file, got {text!r}; "
                f"use one of {', '.join(formats)}"
            )
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise argparse.ArgumentTypeError(
                f"{text!r} exists and is not a regular file (a FIFO, device or socket): name a file"
            )
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"directory {str(parent)!r} does not exist")
        if not _can_create_in(parent):
            raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
        return path

    parse.__name__ = "path"
    return parse


def same_file(a: Path, b: Path) -> bool:
    """True when two paths name one file: equal once resolved, or the same inode (a hard
    link, a bind mount), or an SQLite database and its journal or WAL."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_outputs(outputs: dict[str, Path | None], inputs: Iterable[tuple[str, Path]]) -> None:
    """Refuse, before any work, an output that is one of the command's inputs, its
    configuration, its state database or another of its outputs.

    `outputs` maps each output's flag to its path (None: not asked for); `inputs`
    are (what it is, path) pairs. Whatever a user owns is overwritten only when the
    user named it as this command's output.
    """
    named = [(flag, path) for flag, path in outputs.items() if path is not None]
    owned = list(inputs)
    for i, (flag, path) in enumerate(named):
        for what, other in owned:
            if same_file(path, other):
                raise InputError(
                    f"is {what} ({other}); writing there would destroy it: name another file",
                    field=flag,
                    value=str(path),
                    has_value=True,
                )
        for other_flag, other in named[:i]:
            if same_file(path, other):
                raise InputError(
                    f"is also the {other_flag} output: each output needs its own file",
                    field=flag,
                    value=str(path),
                    has_value=True,
                )


def state_files(database: Path | None) -> list[tuple[str, Path]]:
    """The files of an SQLite state database (with its WAL and journal), as inputs."""
    if database is None:
        return []
    return [
        ("the state database", database),
        *(("the state database's journal", Path(f"{database}{s}")) for s in ("-wal", "-shm")),
        ("the state database's journal", Path(f"{database}-journal")),
    ]


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix) to write to; renamed onto `path` when
    the block ends without an error, removed otherwise. A reader never sees half a file,
    and a failed write leaves the old one."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from None
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """`data` written to `path` whole, or not at all (see `atomic_output`)."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
