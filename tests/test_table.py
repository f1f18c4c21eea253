"""Terminal tables: within 100 columns (or the terminal's width), short values never cut."""

from __future__ import annotations

from app.table import format_table


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_table_that_fits_is_one_line_per_row():
    text = format_table(
        ["type", "$/h"], [("c7i.large", "0.08925"), ("p3.2xlarge", "3.06")], [False, True]
    )
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two rows
    assert lines[2].startswith("c7i.large") and lines[2].endswith("0.08925")
    assert lines[3].endswith("   3.06")  # right-aligned


def test_headers_give_way_first_then_long_text_but_never_numbers():
    headers = [f"a long header number {i}" for i in range(5)]
    rows = [[f"{1234567.891 * i:,.3f}" for i in range(4)] + ["x" * 150]]
    text = format_table(headers, rows, width=100)
    assert widest(text) <= 100
    assert "header number 4" not in text.splitlines()[0]  # headers broke between words
    for value in rows[0][:4]:
        assert value in text  # every number whole, on one line
    assert "x" * 24 in text and text.count("x") == 150  # the long text wrapped, nothing lost


def test_a_narrow_terminal_gets_a_narrower_table():
    rows = [(f"instance-{i}", "reason " * 12) for i in range(3)]
    assert widest(format_table(["instance", "why"], rows, width=60)) <= 60


def test_a_table_that_cannot_fit_without_cutting_values_is_printed_wider():
    rows = [[f"{'9' * 20}" for _ in range(8)]]
    text = format_table([f"c{i}" for i in range(8)], rows, width=100)
    assert text.count("9" * 20) == 8 and widest(text) > 100
