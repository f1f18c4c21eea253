"""Plain-text tables for terminal reports."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None
) -> str:
    """Render rows under headers, columns padded; `right[i]` right-aligns column i."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = right or [False] * len(headers)

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def money(value: float) -> str:
    return f"${value:,.2f}"


def shorten(items: Sequence[str], limit: int = 60) -> str:
    """Comma-joined items, cut with a count of the rest when longer than `limit` chars."""
    text = ""
    for i, item in enumerate(items):
        piece = item if i == 0 else ", " + item
        if len(text) + len(piece) > limit and i > 0:
            return f"{text}, … (+{len(items) - i} more)"
        text += piece
    return text
