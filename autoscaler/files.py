"""Reading users' files: the one place the command line and the daemon turn paths into data.

The deciding core (`catalog`, `jobs`, `throughput`, ...) only parses documents
already read; every path, every read and every "file not found" lives here,
so the core stays free of I/O (checked by the import-linter contracts in
`pyproject.toml`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import orjson

from autoscaler.catalog import Catalog, catalog_from_eva
from autoscaler.errors import InputError
from autoscaler.jobs import JobSpec, jobs_from_eva, validate_against_catalog
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputTable, contention_matrix_from_csv


def read_input_file(path: str | Path, what: str) -> bytes:
    """The bytes of a user's file; a missing or unreadable one is a one-line InputError."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} file not found", source=str(p)) from None
    except IsADirectoryError:
        raise InputError(f"{what} path is a directory, not a file", source=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read {what} file: {exc.strerror or exc}", source=str(p)) from None


def decode_text(data: bytes, what: str, source: str) -> str:
    """UTF-8 text of a user's file, or an InputError saying it is not text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"cannot read {what} file: not UTF-8 text ({exc.reason})", source=source
        ) from None


def read_json(path: str | Path, what: str) -> Any:
    """Read a JSON file, turning a missing or malformed file into an InputError.

    orjson parses million-task traces markedly faster than the standard library.
    """
    p = Path(path)
    data = read_input_file(p, what)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=str(p)
        ) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The parsed TOML document at `path`, or an InputError naming the file and the problem."""
    p = Path(path)
    text = decode_text(read_input_file(p, "configuration"), "configuration", str(p))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"malformed TOML: {exc}", source=str(p)) from None


def load_catalog(path: str | Path) -> Catalog:
    """Load and validate a catalog in Eva's `ec2_config.json` format."""
    return catalog_from_eva(read_json(path, "catalog"), source=str(path))


def load_jobs(path: str | Path, catalog: Catalog | None = None) -> tuple[JobSpec, ...]:
    """Load jobs in Eva's trace format; with a catalog, also check every task can be placed."""
    jobs = jobs_from_eva(read_json(path, "jobs"), source=str(path))
    if catalog is not None:
        validate_against_catalog(jobs, catalog, source=str(path))
    return jobs


def load_contention_matrix(
    path: str | Path, default: float = DEFAULT_THROUGHPUT
) -> ThroughputTable:
    """Load Eva's contention-matrix CSV as a table of pairwise throughputs."""
    p = Path(path)
    text = decode_text(read_input_file(p, "throughput CSV"), "throughput CSV", str(p))
    return contention_matrix_from_csv(text, default, source=str(p))
