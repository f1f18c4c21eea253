"""Input and output shared by the command-line commands.

`--json` means one thing on every command: the command's result as one JSON
document on standard output, instead of the table a person reads (messages and
progress go to standard error, so the output pipes into `jq` or redirects into
a file). Files a command writes besides (`--plot`, `trace synthesize --out`)
are named by their own flags, checked against the command's inputs before any
work (`app.validation.check_outputs`), and written whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from app.validation import number_arg, write_atomically
from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec


def load_inputs(
    catalog_path: Path | None, jobs_path: Path | None
) -> tuple[Catalog, tuple[JobSpec, ...]]:
    """A catalog and the jobs checked against it; the bundled Eva data by default."""
    catalog = load_catalog(catalog_path or bundled("ec2_config.json"))
    jobs = load_jobs(jobs_path or bundled("pai_200.json"), catalog)
    return catalog, jobs


def progress(message: str) -> None:
    """A phase message for a person at a terminal (kept out of pipes and logs)."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def note(message: str) -> None:
    """A line for whoever runs the command, on standard error (never in the JSON)."""
    print(message, file=sys.stderr, flush=True)


def add_json(parser: argparse.ArgumentParser) -> None:
    """`--json`: the result as one JSON document on standard output, instead of the table."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON document on standard output instead of the table",
    )


def print_json(document: Any) -> None:
    """`document` as indented JSON on standard output (deterministic: keys as given)."""
    data = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    sys.stdout.write(data.decode() + "\n")
    sys.stdout.flush()


def write_json(path: Path, document: Any) -> None:
    """`document` as indented JSON in the file `path`, written whole (see `write_atomically`)."""
    write_atomically(path, orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")


def silence_solver_banner() -> None:
    """HiGHS prints a banner to stdout the first time a solver is made in a process;
    make that first one here, with stdout pointed away, so reports and JSON on stdout
    stay clean."""
    import os

    import highspy

    saved = os.dup(1)
    try:
        sys.stdout.flush()
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def add_min_throughput(parser: argparse.ArgumentParser) -> None:
    """`--min-throughput`, the user's cap on co-location slowdown (`EvaPlanner`)."""
    parser.add_argument(
        "--min-throughput",
        type=number_arg(0.0, 1.0),
        default=0.0,
        metavar="T",
        help="Eva's planners co-locate no task where they expect it below this share of "
        "its full speed, whatever it would save (default 0: the cost criterion decides)",
    )
