"""Reading users' files: the one place the command line and the daemon turn paths into data.

The deciding core (`catalog`, `jobs`, `throughput`, ...) only parses documents
already read; every path, every read and every "file not found" lives here,
so the core stays free of I/O (checked by the import-linter contracts in
`pyproject.toml`).
"""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path
from typing import Any

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

    A key given twice in one object (a job id, a task, an instance type) is an
    error naming it: JSON parsers silently keep the last, which loses a job. The
    standard library's C scanner with a pairs hook checks that at about 1.7x
    orjson's time on a 200,000-job trace (2.5 s against 1.4 s), a price worth a
    job not silently dropped. A gzip-compressed file (`.json.gz`, recognized by its
    magic bytes) is decompressed first, so long traces can be kept compressed.
    """
    p = Path(path)
    data = read_input_file(p, what)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InputError(f"cannot decompress gzip file: {exc}", source=str(p)) from None
    try:
        return json.loads(data, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InputError(
            f"key {exc.key!r} appears twice in one object (JSON would keep only the last)",
            source=str(p),
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=str(p)
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason})", source=str(p)) from None
    except RecursionError:
        raise InputError("malformed JSON: nested too deeply", source=str(p)) from None


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
