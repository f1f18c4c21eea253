"""Tables for people at a terminal: aligned, fitted to the terminal, never wider than 100 columns.

rich does the layout (it measures cells, shrinks and wraps the widest columns
when a table would not fit, and knows unicode widths); a table written to a
pipe or a file gets 100 columns, so what a script captures is what a person
would read.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

#: Nothing a person reads is wider than this.
MAX_WIDTH = 100
#: Cells up to this long (numbers, names, ids) are never broken across lines.
SHORT = 24


def output_width() -> int:
    """The width to lay text out in: the terminal's, at most MAX_WIDTH; MAX_WIDTH in a pipe."""
    columns = shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(40, min(columns, MAX_WIDTH))


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    right: Sequence[bool] | None = None,
    width: int | None = None,
) -> str:
    """Rows under headers; `right[i]` right-aligns column i.

    Fitted to `width` columns (default `output_width()`) by giving way in order:
    headers break between words, then long text cells (reasons, lists) wrap.
    Short values — numbers, names, ids — are never broken or cut: a table that
    cannot fit without that is printed wider instead.
    """
    width = width or output_width()
    right = right or [False] * len(headers)
    cells = [[str(cell) for cell in row] for row in rows]
    data = [max((len(row[i]) for row in cells), default=0) for i in range(len(headers))]
    gaps = 2 * (len(headers) - 1)
    wrapped_headers = [str(h) for h in headers]
    sizes = [max(d, len(h)) for d, h in zip(data, wrapped_headers, strict=True)]
    if sum(sizes) + gaps > width:
        # First give way: headers break between words.
        wrapped_headers = [_break_words(str(h), d) for h, d in zip(headers, data, strict=True)]
        sizes = [max(d, _longest_line(h)) for d, h in zip(data, wrapped_headers, strict=True)]
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
        collapse_padding=True,
    )
    for i, (header, align_right) in enumerate(zip(wrapped_headers, right, strict=True)):
        short = data[i] <= SHORT
        table.add_column(
            header,
            justify="right" if align_right else "left",
            no_wrap=short,
            overflow="fold",
            min_width=sizes[i] if short else min(sizes[i], SHORT),
        )
    for row in cells:
        table.add_row(*row)
    floor = sum(s if d <= SHORT else min(s, SHORT) for s, d in zip(sizes, data, strict=True))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=max(width, floor + gaps),
        color_system=None,
        highlight=False,
        emoji=False,
        markup=False,
        force_terminal=False,
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())


def _break_words(header: str, room: int) -> str:
    """The header on several lines, each as long as the column's data allows (or one word)."""
    lines: list[str] = []
    for word in header.split():
        if lines and len(lines[-1]) + 1 + len(word) <= max(room, len(word)):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines) or header


def _longest_line(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def wrap(text: str, width: int | None = None) -> str:
    """A paragraph for a person: wrapped to the output width."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width or output_width()))


def wrap_hanging(text: str, indent: int, width: int | None = None) -> str:
    """A `label   value` line wrapped to the output width, continuation lines
    indented under the value."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width or output_width(), subsequent_indent=" " * indent))


def money(value: float) -> str:
    """Dollars: cents, or hundredths of a cent below a dollar (a small job's cost is not $0.00)."""
    return f"${value:,.2f}" if abs(value) >= 1 or value == 0 else f"${value:.4f}"


def dollars(amount: float) -> str:
    """Whole dollars without the sign, for a column headed "$": cents below $100 (a
    short replay must not read "$0")."""
    return f"{amount:,.2f}" if abs(amount) < 100 else f"{amount:,.0f}"


def shorten(items: Sequence[str], limit: int = 60) -> str:
    """Comma-joined items, cut with a count of the rest when longer than `limit` chars."""
    text = ""
    for i, item in enumerate(items):
        piece = item if i == 0 else ", " + item
        if len(text) + len(piece) > limit and i > 0:
            return f"{text}, … (+{len(items) - i} more)"
        text += piece
    return text
