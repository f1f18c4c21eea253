"""Strict documents: every file a user (or this package) hands the autoscaler, read one way.

One library defines every format: msgspec, in strict mode. It was chosen over
pydantic v2 (strict) by measurement on a 300,000-job trace (95 MB of JSON, 2
shared cores, garbage collection held off while decoding): msgspec validates
the decoded document in 0.4–0.9 s and decodes-and-validates the raw bytes in
0.5 s, where pydantic takes 1.6–1.9 s and 2.1–4.1 s. Its strict mode is what
users mean: a boolean is never a number, a string never a number, an integer
field refuses 2.0, and `forbid_unknown_fields` refuses a misspelt key instead
of dropping it.

The rules every reader here follows, whatever the format:

- **Nothing read without a bound.** `read_regular_file` refuses what is not a
  regular file (a FIFO would block, `/dev/zero` never ends) before opening it,
  and reads at most the format's limit; a gzip stream is inflated up to the
  same limit (a bomb is refused, not inflated).
- **Duplicate keys are errors** in JSON (the standard library's C scanner with
  a pairs hook; JSON parsers keep the last, which loses a job) and in TOML
  (`tomllib` refuses them, as the TOML standard says).
- **Numbers are bounded**: `NaN` and `Infinity` literals are refused, every
  float of a schema has both bounds (so `1e400`, read as infinity, is out of
  range), and an integer over Python's 4,300-digit limit is one line.
- **Text is text**: UTF-8 (a leading byte-order mark is allowed and dropped),
  and no string holds a lone surrogate, which nothing could print.
- **Every error is one line** naming the file, the item, the field path and
  the value (`InputError`), for the command line to print with exit status 2.

It lives in the lowest layer that reads files (the core does no I/O) so that
the catalog binding reads its cache and price table by the same rules as the
application reads a user's trace.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import stat
import tomllib
import types
import typing
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

from autoscaler.errors import InputError

T = TypeVar("T")

KIB = 1024
MIB = 1024 * KIB

#: What `where_of` makes of a field path: (the item, e.g. "job 'a' task '0'"; the field).
Where = Callable[[Sequence[Any]], tuple[str | None, str | None]]


class FieldError(ValueError):
    """A cross-field rule broken: the message, and the field (and value) to name."""

    def __init__(
        self,
        message: str,
        field: str | tuple[str, ...] | None = None,
        value: Any = None,
        *,
        shown: bool = True,
    ) -> None:
        super().__init__(
            f"{dotted(field) if isinstance(field, tuple) else field}: {message}"
            if field
            else message
        )
        self.message, self.field, self.value, self.shown = message, field, value, shown


_UNCHECKED = contextvars.ContextVar("_UNCHECKED", default=False)


class Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, gc=False):
    """A schema that refuses unknown keys, in strict mode (no coercion). Subclasses
    inherit both. Cross-field rules go in `check` (raising `FieldError`), which runs on
    every decode, so they are the schema's too. Subclasses say `frozen=True` again:
    msgspec inherits it, but a type checker reading `dataclass_transform` (PEP 681)
    does not."""

    def __post_init__(self) -> None:
        if not _UNCHECKED.get():
            self.check()

    def check(self) -> None:
        """Rules between fields; raise `FieldError` naming the field at fault."""


# -- bounded values --------------------------------------------------------------------------


def number(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    description: str | None = None,
) -> msgspec.Meta:
    """The bounds of a float, `Annotated[float, number(...)]` (both sides bounded:
    infinity and NaN never pass)."""
    if (ge is None and gt is None) or (le is None and lt is None):
        raise TypeError("a number in a schema is bounded on both sides")
    # Bounds as floats always: `typing` caches `Annotated[float, Meta(ge=1)]` and
    # `Annotated[float, Meta(ge=1.0)]` as one (the Metas are equal), so an int bound would
    # publish as 1 or 1.0 depending on which module was imported first.
    ge, gt, le, lt = (None if b is None else float(b) for b in (ge, gt, le, lt))
    # msgspec's stub has one overload per pair of bounds, so it refuses `ge` beside `gt`
    # even as None; msgspec itself accepts None for an unused bound.
    return msgspec.Meta(ge=ge, gt=gt, le=le, lt=lt, description=description)  # type: ignore[call-overload, misc]


def whole(*, ge: int, le: int, description: str | None = None) -> msgspec.Meta:
    """The bounds of an integer, `Annotated[int, whole(...)]` (a boolean or 2.0 is
    refused)."""
    return msgspec.Meta(ge=ge, le=le, description=description)


def text(
    *,
    max_length: int = 4096,
    min_length: int = 0,
    pattern: str | None = None,
    description: str | None = None,
) -> msgspec.Meta:
    """The bounds of a string, `Annotated[str, text(...)]`: its length, and optionally
    `pattern` (described by `description` in errors, never by the regex)."""
    return msgspec.Meta(
        min_length=min_length, max_length=max_length, pattern=pattern, description=description
    )


# -- reading files ---------------------------------------------------------------------------


def read_regular_file(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or a one-line InputError.

    The type is checked before the file is opened (opening a FIFO blocks until
    someone writes to it) and again on the open descriptor (a path swapped in
    between), which is opened non-blocking.
    """
    p = str(path)
    try:
        info = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{what} file not found", source=p) from None
    except OSError as exc:
        raise InputError(f"cannot read {what} file: {exc.strerror or exc}", source=p) from None
    _check_regular(info.st_mode, what, p)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read {what} file: {exc.strerror or exc}", source=p) from None
    try:
        _check_regular(os.fstat(fd).st_mode, what, p)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 16 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {what} file: {exc.strerror or exc}", source=p) from None
    finally:
        os.close(fd)
    if size > limit:
        raise InputError(f"is larger than {_size(limit)}, the most a {what} file may be", source=p)
    return b"".join(chunks)


def _check_regular(mode: int, what: str, source: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    raise InputError(f"is {kind}, not a {what} file: give a regular file", source=source)


def _size(n: int) -> str:
    return f"{n // MIB:,} MiB" if n >= MIB else f"{n // KIB:,} KiB"


GZIP_MAGIC = b"\x1f\x8b"


def gunzip_bounded(data: bytes, source: str, limit: int) -> bytes:
    """`data` inflated when it is gzip (by its magic bytes), never past `limit` bytes."""
    if data[:2] != GZIP_MAGIC:
        return data
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)
            chunk = inflater.decompress(rest, limit + 1 - size)
            out.append(chunk)
            size += len(chunk)
            if size > limit or inflater.unconsumed_tail:
                raise InputError(
                    f"decompresses to more than {_size(limit)}, the most this file may hold",
                    source=source,
                )
            if not inflater.eof:
                raise InputError("cannot decompress gzip file: it is truncated", source=source)
            rest = inflater.unused_data
            if rest[:2] != GZIP_MAGIC:  # trailing bytes that are not another member
                break
    except zlib.error as exc:
        raise InputError(f"cannot decompress gzip file: {exc}", source=source) from None
    return b"".join(out)


BOM = "\ufeff"


def decode_utf8(data: bytes, what: str, source: str) -> str:
    """UTF-8 text without a leading byte-order mark, or an InputError saying where it is not."""
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"cannot read {what} file: not UTF-8 text (byte {exc.start}: {exc.reason})",
            source=source,
        ) from None
    return decoded.removeprefix(BOM)


# -- JSON and TOML ---------------------------------------------------------------------------


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


class HugeInteger:
    """An integer literal longer than Python converts (4,300 digits), kept as its length
    so that the schema names the field that holds it."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits:,} digits>"


def _integer(text: str) -> int | HugeInteger:
    return int(text) if len(text) <= 4300 else HugeInteger(len(text.lstrip("-")))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parse_json(text: str, source: str) -> Any:
    """A JSON document: duplicate keys, NaN/Infinity, over-long integers, lone surrogates
    and absurd nesting are one-line errors naming the file.

    A key given twice in one object (a job id, a task, an instance type) is an
    error naming it: JSON parsers silently keep the last, which loses a job. The
    standard library's C scanner with a pairs hook checks that for about 0.4 s
    on a 300,000-job trace.
    """
    try:
        data = json.loads(
            text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_int=_integer
        )
    except _DuplicateKey as exc:
        raise InputError(
            f"key {_short(exc.key)} appears twice in one object (JSON would keep only the last)",
            source=source,
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=source
        ) from None
    except RecursionError:
        raise InputError("malformed JSON: nested too deeply", source=source) from None
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4,300 digits
        message = str(exc).split(";")[0]
        raise InputError(f"malformed JSON: {message}", source=source) from None
    if _SURROGATE_ESCAPE.search(text):
        check_text(data, source)
    return data


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """A TOML document (`tomllib` refuses a key given twice, as TOML says)."""
    try:
        return tomllib.loads(text.removeprefix(BOM))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"malformed TOML: {exc}", source=source) from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits
        raise InputError(f"malformed TOML: {str(exc).split(';')[0]}", source=source) from None


def check_text(data: Any, source: str, path: tuple[Any, ...] = ()) -> None:
    """Refuse a string (key or value) holding a lone surrogate: JSON's `\\udcff` escape
    makes one, and nothing can print or store it."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, path)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            _encodable(value, source, at)
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, source, (*at, key))
                stack.append((item, (*at, key)))
        elif isinstance(value, list):
            stack.extend((item, (*at, i)) for i, item in enumerate(value))


def _encodable(value: str, source: str, at: tuple[Any, ...]) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            "holds a lone surrogate (an unpaired \\ud800-\\udfff escape), not text",
            source=source,
            field=dotted(at) or None,
            value=value,
            has_value=True,
        ) from None


# -- schemas ---------------------------------------------------------------------------------


def convert(
    data: Any,
    schema: type[T],
    *,
    source: str | None,
    where_of: Where | None = None,
) -> T:
    """`data` (as decoded) validated against `schema`, or an InputError naming the
    first bad field by its real path (keys included) and value."""
    try:
        return msgspec.convert(data, schema, strict=True)  # type: ignore[no-any-return]
    except msgspec.ValidationError:
        raise locate_error(data, schema, source=source, where_of=where_of) from None


def locate_error(
    data: Any, schema: Any, *, source: str | None, where_of: Where | None = None
) -> InputError:
    """The one-line InputError for `data`, which does not fit `schema`.

    msgspec names mapping keys `[...]` in its paths; this walks the schema and
    the data together to the first item that fails, so the message names the
    job, the task and the field as the user wrote them, with the value.
    """
    path, value, has_value, problem = _locate(data, schema, [])
    where, field = (where_of or default_where)(path)
    return InputError(
        problem, source=source, where=where, field=field, value=value, has_value=has_value
    )


def default_where(path: Sequence[Any]) -> tuple[str | None, str | None]:
    return None, dotted(path) or None


def dotted(path: Sequence[Any]) -> str:
    """`tasks.node0.demand.any[1]`: keys joined by dots, list indices in brackets."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _fails(data: Any, schema: Any) -> msgspec.ValidationError | None:
    try:
        msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as exc:
        return exc
    return None


def _unwrap(schema: Any) -> tuple[Any, list[msgspec.Meta]]:
    metas: list[msgspec.Meta] = []
    while get_origin(schema) is Annotated:
        schema, *extra = get_args(schema)
        metas += [m for m in extra if isinstance(m, msgspec.Meta)]
    return schema, metas


def _is_struct(schema: Any) -> bool:
    return isinstance(schema, type) and issubclass(schema, msgspec.Struct)


def _locate(data: Any, schema: Any, path: list[Any]) -> tuple[list[Any], Any, bool, str]:
    """(path, value, whether the value is shown, problem) of the first failure."""
    inner, metas = _unwrap(schema)
    origin = get_origin(inner)
    if _is_struct(inner) and isinstance(data, dict):
        hints = typing.get_type_hints(inner, include_extras=True)
        fields = msgspec.structs.fields(inner)
        known = {f.encode_name for f in fields}
        for key in data:
            if key not in known:
                return (
                    [*path, key],
                    None,
                    False,
                    f"unknown field (known: {', '.join(sorted(known))})",
                )
        for f in fields:
            if f.encode_name not in data and f.required:
                return [*path, f.encode_name], None, False, "is required"
            if f.encode_name in data and _fails(data[f.encode_name], hints[f.name]) is not None:
                return _locate(data[f.encode_name], hints[f.name], [*path, f.encode_name])
    elif origin is dict and isinstance(data, dict):
        key_type, value_type = get_args(inner)
        for key, item in data.items():
            if _fails(key, key_type) is not None:
                _, _, _, problem = _locate(key, key_type, [])
                return [*path, key], key, True, f"is not a valid key: {problem}"
            if _fails(item, value_type) is not None:
                return _locate(item, value_type, [*path, key])
    elif origin in (list, tuple) and isinstance(data, list):
        args = get_args(inner)
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        if not fixed or len(args) == len(data):
            for i, item in enumerate(data):
                item_type = args[i] if fixed else args[0]
                if _fails(item, item_type) is not None:
                    return _locate(item, item_type, [*path, i])
    elif origin in (Union, types.UnionType) and data is not None:
        options = [a for a in get_args(inner) if a is not type(None)]
        if len(options) == 1:
            return _locate(data, options[0], path)
    if _is_struct(inner) and isinstance(data, dict) and issubclass(inner, Strict):
        token = _UNCHECKED.set(True)
        try:
            unchecked = msgspec.convert(data, inner, strict=True)
        except msgspec.ValidationError:
            unchecked = None
        finally:
            _UNCHECKED.reset(token)
        if unchecked is not None:
            try:
                unchecked.check()
            except FieldError as exc:
                if exc.field is None:
                    return path, None, False, exc.message
                at = list(exc.field) if isinstance(exc.field, tuple) else [exc.field]
                # the value as written (a list, not the tuple it became), else the rule's
                given = len(at) == 1 and at[0] in data
                value = data[at[0]] if given else exc.value
                shown = exc.shown and (given or exc.value is not None)
                return [*path, *at], value, shown, exc.message
    error = _fails(data, schema)
    problem = _problem(error, inner, metas, data)
    return path, data, not (_is_struct(inner) and isinstance(data, dict)), problem


_KINDS = {
    "float": "a number",
    "int": "a whole number",
    "str": "a string",
    "bool": "true or false",
    "object": "an object (a table of fields)",
    "array": "a list",
    "null": "nothing (null)",
}


def _problem(
    error: msgspec.ValidationError | None, inner: Any, metas: list[msgspec.Meta], data: Any
) -> str:
    message = str(error or "is invalid").split(" - at `")[0]
    if isinstance(data, HugeInteger):
        return "has more digits than any value here may (and than Python reads: 4,300)"
    if get_origin(inner) is Literal:
        choices = ", ".join(repr(c) for c in get_args(inner))
        return f"must be one of {choices}"
    described = next((m.description for m in metas if m.description), None)
    expected = re.match(r"Expected `([a-z |]+)`(.*)", message)
    if expected:
        names = [k.strip() for k in expected.group(1).split("|")]
        if data is not None and len(names) > 1:
            names = [k for k in names if k != "null"]  # null is allowed, but not what was meant
        kinds = " or ".join(_KINDS.get(k, k) for k in names)
        detail = expected.group(2).strip()
        got = re.match(r", got `(\w+)`", detail)
        if got and got.group(1) == "float" and names == ["int"]:
            return "must be a whole number (no decimal point)"
        if got:
            return f"must be {kinds}, not {_KINDS.get(got.group(1), got.group(1))}"
        if described:  # the schema's own words say the form and the bounds
            return f"must be {described}"
        if detail.startswith("matching regex"):
            return "is not in the expected form"
        length = re.match(r"of length (>=|<=)? ?(\d+)$", detail)
        if length:
            bound, count = length.group(1), int(length.group(2))
            unit = "characters" if names == ["str"] else "entries"
            if bound == ">=" and count == 1:
                return "must not be empty"
            how = {">=": "at least", "<=": "at most", None: "exactly"}[bound]
            return f"must be {kinds} of {how} {count:,} {unit}"
        detail = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", lambda m: f"{float(m.group()):,g}", detail)
        return f"must be {kinds} {detail}".rstrip()
    if message == "Number out of range":
        return f"must be {described}" if described else "is out of range"
    if message.startswith("Invalid enum value"):
        return "is not one of the allowed values"
    return message[:1].lower() + message[1:]


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "…"
