"""Typed errors for bad user input: one readable line, naming where and what."""

from __future__ import annotations


class InputError(ValueError):
    """A user-supplied file or value is invalid.

    The message is a single line naming the source, the offending item and
    field, the value, and what was expected, so the CLI can print it as-is.
    """

    def __init__(
        self,
        problem: str,
        *,
        source: str | None = None,
        where: str | None = None,
        field: str | None = None,
        value: object = None,
        has_value: bool = False,
    ) -> None:
        self.problem = problem
        self.source = source
        self.where = where
        self.field = field
        self.value = value
        parts = []
        if source:
            parts.append(source)
        if where:
            parts.append(where)
        if field is not None:
            parts.append(f"field {field!r}" + (f" = {shown(value)}" if has_value else ""))
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {problem}" if prefix else problem)


#: The longest value an error message repeats: a megabyte-long string stays one short line.
MAX_SHOWN = 100


def shown(value: object) -> str:
    """`repr(value)`, cut to `MAX_SHOWN` characters (a huge value in a bad file must not
    make a huge error line)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        digits = int(value.bit_length() * 0.30103)  # type: ignore[attr-defined]
        text = f"<an integer of about {digits:,} digits>"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"
