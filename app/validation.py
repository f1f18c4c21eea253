"""User-supplied values, checked in one place: strict schemas with one-line errors.

pydantic (v2) does the checking (types, ranges, finiteness, unknown keys); this
module turns its first complaint into an `InputError` that names the file, the
table or item, the field and the value, so every command prints bad input the
same way: one line, exit status 2, nothing changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from autoscaler.errors import InputError
from autoscaler.limits import MAX_DELAY_S

Model = TypeVar("Model", bound=BaseModel)


class Strict(BaseModel):
    """A schema that refuses unknown keys (a typo never falls back to a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Finite = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_finite)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Delay = Annotated[float, Field(ge=0, le=MAX_DELAY_S, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False)]
#: Ids of jobs, tasks and clusters: safe in file names, S3 keys, tags and task ids.
Identifier = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


def parse_model(
    model: type[Model], data: Any, *, source: str | None, where: str | None = None
) -> Model:
    """`data` validated against `model`, or an InputError naming the first bad field."""
    if not isinstance(data, Mapping):
        raise InputError(
            "must be a table of fields", source=source, where=where, value=data, has_value=True
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, model, source=source, where=where) from None


def input_error(
    exc: ValidationError, model: type[BaseModel], *, source: str | None, where: str | None
) -> InputError:
    """The first error of a pydantic validation, as a one-line InputError."""
    error = exc.errors(include_url=False)[0]
    location = [str(part) for part in error["loc"]]
    field = ".".join(location) if location else None
    kind = error["type"]
    if kind == "extra_forbidden":
        known = ", ".join(_fields_at(model, location))
        return InputError(
            "unknown field" + (f" (known: {known})" if known else ""),
            source=source,
            where=where,
            field=field,
        )
    if kind == "missing":
        return InputError("is required", source=source, where=where, field=field)
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return InputError(
        message[:1].lower() + message[1:],
        source=source,
        where=where,
        field=field,
        value=error.get("input"),
        has_value="input" in error,
    )


def _fields_at(model: type[BaseModel], location: list[str]) -> list[str]:
    """The fields of the (nested) model that holds the last part of `location`."""
    current: type[BaseModel] = model
    for part in location[:-1]:
        field = current.model_fields.get(part)
        if field is None:
            continue  # a mapping key or a list index: the item's model stays current
        inner = _model_in(field.annotation)
        if inner is None:
            return []
        current = inner
    return sorted(current.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# -- command-line values ---------------------------------------------------------------------


def number_arg(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    integer: bool = False,
):
    """An argparse `type=` for a finite number within [low, high] (or (low, high] when
    `low_open`): `nan`, `inf` and absurd values are refused where they are read."""
    import argparse

    def described() -> str:
        left = "(" if low_open else "["

        def show(x: float) -> str:
            return f"{int(x):,}" if integer else f"{x:g}"

        lo = "-inf" if low is None else show(low)
        hi = "inf" if high is None else show(high)
        kind = "a whole number" if integer else "a number"
        return f"{kind} in {left}{lo}, {hi}]"

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {described()}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {described()}, got {text!r}")
        if (low is not None and (value <= low if low_open else value < low)) or (
            high is not None and value > high
        ):
            raise argparse.ArgumentTypeError(f"must be {described()}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def _can_create_in(directory) -> bool:
    """True when a file can really be created in `directory`: an unnamed temporary
    file is made there and vanishes at once (os.access would say yes to root
    everywhere, /proc and read-only mounts included)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


#: Image formats every matplotlib install writes (what `--plot` accepts).
PLOT_FORMATS = (".png", ".pdf", ".svg", ".eps", ".ps", ".jpg", ".jpeg")


def output_path(suffix: str | None = None, formats: tuple[str, ...] | None = None):
    """An argparse `type=` for a file to write: its directory must exist and be writable
    now, before the work starts. With `suffix`, a name without one gets it (so the
    message names the file really written); with `formats`, only those suffixes do."""
    import argparse
    from pathlib import Path

    def parse(text: str) -> Path:
        path = Path(text).expanduser()
        if not text.strip() or path.is_dir():
            raise argparse.ArgumentTypeError(f"must be a file to write, got {text!r}")
        if suffix and not path.suffix:
            path = path.with_suffix(suffix)
        if formats and path.suffix.lower() not in formats:
            raise argparse.ArgumentTypeError(
                f"cannot write a {path.suffix!r} file, got {text!r}; "
                f"use one of {', '.join(formats)}"
            )
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"directory {str(parent)!r} does not exist")
        if not _can_create_in(parent):
            raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
        return path

    parse.__name__ = "path"
    return parse
