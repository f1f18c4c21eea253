"""File input and output shared by the command-line commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from app.validation import number_arg
from autoscaler.catalog import Catalog
from autoscaler.errors import InputError
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


def write_json(path: Path, document: dict[str, Any]) -> None:
    try:
        path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise InputError(f"cannot write JSON: {exc.strerror or exc}", source=str(path)) from None


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


def warn_unmatched(table: Any, jobs: Any, source: str) -> None:
    """Say so when a throughput file names no workload of the jobs: it would be read and
    silently never used (a different naming, or the wrong file)."""
    known = {w for (w, _), _ in table.items()} | {o for (_, c), _ in table.items() for o in c}
    wanted = {t.workload for j in jobs for t in j.tasks}
    if known and not known & wanted:
        example = sorted(wanted)[0] if wanted else "?"
        print(
            f"warning: {source}: none of its {len(known)} workloads appears in the jobs "
            f"(theirs are like {example!r}): its throughputs will not be used",
            file=sys.stderr,
        )


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
