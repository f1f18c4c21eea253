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
            parts.append(f"field {field!r}" + (f" = {value!r}" if has_value else ""))
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {problem}" if prefix else problem)


def check_number(
    value: object,
    *,
    field: str,
    where: str,
    source: str | None,
    minimum: float | None = 0.0,
    strictly_positive: bool = False,
    maximum: float | None = None,
) -> float:
    """Return `value` as a float, or raise InputError naming the field and value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(
            "must be a number",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise InputError(
            "must be a finite number",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    if strictly_positive and number <= 0:
        raise InputError(
            "must be positive",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    if minimum is not None and number < minimum:
        raise InputError(
            f"must be at least {minimum:g}",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    if maximum is not None and number > maximum:
        raise InputError(
            f"must be at most {maximum:,g}",
            source=source,
            where=where,
            field=field,
            value=value,
            has_value=True,
        )
    return number
