"""Reading users' files: the one place the command line and the daemon turn paths into data.

Each format has one strict schema (msgspec, see `provisioners.documents` for
why that library and the rules every reader follows) and one size limit,
stated here:

| format | schema | limit |
|---|---|---|
| cluster configuration (TOML) | `app.config.ClusterConfigFile` | 1 MiB |
| job file (TOML) / Eva `config.json` | `app.jobfile.JobFile` / `EvaJobConfig` | 1 MiB |
| trace (Eva JSON, or gzip of it) | `TraceJob` below | 1 GiB, inflated |
| catalog (Eva `ec2_config.json`, or our cache) | `provisioners.catalog` | 64 MiB |
| contention matrix (CSV) | `load_contention_matrix` | 16 MiB, 64 KiB a cell |

The deciding core (`catalog`, `jobs`, `throughput`, ...) receives objects
already checked; every path, every read and every "file not found" lives here,
so the core stays free of I/O (checked by the import-linter contracts in
`pyproject.toml`).
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import gc
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from autoscaler.availability import AvailabilityTrace
from autoscaler.catalog import Catalog
from autoscaler.errors import InputError
from autoscaler.jobs import (
    DEFAULT_BUILD_IMAGE_S,
    DEFAULT_FETCH_S,
    DEFAULT_INIT_S,
    DEFAULT_KILL_S,
    DEFAULT_UPLOAD_S,
    Demands,
    JobSpec,
    TaskRun,
    TaskSpec,
    TraceFacts,
    demand_problem,
    validate_against_catalog,
    workload_key,
)
from autoscaler.limits import MAX_CAPACITY, MAX_DELAY_S
from autoscaler.resources import Resources
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputEntry, ThroughputTable
from provisioners.catalog import CATALOG_LIMIT, catalog_from_document
from provisioners.documents import (
    MIB,
    Strict,
    decode_utf8,
    dotted,
    gunzip_bounded,
    locate_error,
    number,
    parse_json,
    parse_toml,
    read_regular_file,
    text,
    whole,
)
from provisioners.local_spot_prices import SpotPriceTrace

#: The largest cluster configuration or job file read: a few KiB is usual.
CONFIG_LIMIT = 1 * MIB
#: The largest trace read, after decompression: 1M jobs of Eva's format are ~330 MB.
TRACE_LIMIT = 1024 * MIB
#: The largest spot availability trace read (a year of 60-s intervals is ~1.6 MB).
AVAILABILITY_TRACE_LIMIT = 64 * MIB
#: The largest spot price trace read (a `describe-spot-price-history` dump).
SPOT_PRICE_TRACE_LIMIT = 64 * MIB
#: The largest contention matrix read, and its longest cell.
CSV_LIMIT = 16 * MIB
CSV_CELL_LIMIT = 64 * 1024


def read_input_file(path: str | Path, what: str, limit: int = CONFIG_LIMIT) -> bytes:
    """The bytes of a user's regular file, at most `limit`; else a one-line InputError."""
    return read_regular_file(path, what, limit)


def read_toml(path: str | Path, what: str, limit: int = CONFIG_LIMIT) -> dict[str, Any]:
    """The parsed TOML document at `path`, or an InputError naming the file and the problem."""
    p = str(path)
    return parse_toml(decode_utf8(read_regular_file(p, what, limit), what, p), p)


def read_json(path: str | Path, what: str, limit: int = TRACE_LIMIT) -> Any:
    """A JSON file (gzip-compressed or not), read within `limit` bytes, duplicate keys refused."""
    p = str(path)
    data = gunzip_bounded(read_regular_file(p, what, limit), p, limit)
    return parse_json(decode_utf8(data, what, p), p)


def load_spot_price_trace(path: str | Path) -> SpotPriceTrace:
    """A spot price trace for the local cloud (the AWS CLI's `describe-spot-price-history`
    JSON), read bounded, duplicate keys refused; an InputError naming the file, field and
    value otherwise."""
    p = str(path)
    return SpotPriceTrace.from_document(read_json(p, "spot price trace", SPOT_PRICE_TRACE_LIMIT), p)


def load_availability_trace(path: str | Path) -> AvailabilityTrace:
    """A spot availability trace file (Can't Be Late's format), read bounded, duplicate keys
    refused; an InputError naming the file, field and value otherwise."""
    p = str(path)
    return AvailabilityTrace.from_document(
        read_json(p, "availability trace", AVAILABILITY_TRACE_LIMIT), p
    )


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector held off while a large document becomes objects.

    Decoding a 300,000-job trace makes millions of objects that live on; the
    collector's passes over them found nothing and took most of the time
    (5.9 s of a 6.0 s decode, against 1.1 s without). What was made meanwhile
    is then frozen (`gc.freeze`), or the first collection after would walk all
    of it once more (1 s); it is freed as usual when nothing refers to it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()


# -- the trace format (Eva's JSON) ------------------------------------------------------------

#: The latest arrival or longest duration a trace may state, in seconds: Unix
#: timestamps fit (they are shifted to the first arrival); milliseconds of a decade do not.
MAX_TRACE_SECONDS = 1e11

Delay = Annotated[float, number(ge=0, le=MAX_DELAY_S)]
#: A GPU count: a container is given whole devices (Docker's `--gpus`).
Gpus = Annotated[
    float,
    msgspec.Meta(
        ge=0,
        le=MAX_CAPACITY[0],
        multiple_of=1,
        description=f"a whole number of GPUs from 0 to {MAX_CAPACITY[0]:,.0f} (a container "
        "is given whole devices)",
    ),
]
Vector = Annotated[
    tuple[
        Gpus,
        Annotated[float, number(ge=0, le=MAX_CAPACITY[1])],
        Annotated[float, number(ge=0, le=MAX_CAPACITY[2])],
    ],
    msgspec.Meta(description="a list [gpu, cpu cores, ram GiB]"),
]
#: Characters no name may hold: control characters, and the invisible ones that make two
#: names look alike (zero-width spaces and joiners, direction marks, the byte-order mark).
_INVISIBLE = r"\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"
#: A job id, task key or name: one line of printable text that fits a task id
#: (`<job>/<task>`) and a storage key.
_KEY_PATTERN = r"^[^\s/%s]([^/%s]*[^\s/%s])?$" % ((_INVISIBLE,) * 3)
Key = Annotated[
    str,
    text(
        min_length=1,
        max_length=256,
        pattern=_KEY_PATTERN,
        description="1-256 characters, no '/' and no spaces at either end",
    ),
]
Name = Annotated[
    str,
    text(
        min_length=1,
        max_length=256,
        pattern=r"^[^\s%s]([^%s]*[^\s%s])?$" % ((_INVISIBLE,) * 3),
        description="1-256 characters, no spaces at either end",
    ),
]
Family = Annotated[
    str,
    text(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$",
        description="an instance family such as 'c7i', or 'any'",
    ),
]
Demand = Annotated[dict[Family, Vector], msgspec.Meta(min_length=1, max_length=64)]


class TraceTask(Strict, frozen=True):
    """One task of a trace's job: its demand per family, and Eva's per-task delays.

    Optional fields default to `UNSET` rather than None, so that a decoded trace
    tells which keys were written (see `_count_keys`)."""

    demand: Demand
    name: Name | UnsetType = UNSET
    fetch_delay: Delay | UnsetType | None = UNSET
    build_image_delay: Delay | UnsetType | None = UNSET
    kill_delay: Delay | UnsetType | None = UNSET
    upload_delay: Delay | UnsetType | None = UNSET
    image_id: (
        Annotated[str, text(max_length=256)]
        | Annotated[int, whole(ge=0, le=2**62)]
        | UnsetType
        | None
    ) = UNSET
    shm_size: Annotated[float, number(ge=0, le=MAX_CAPACITY[2])] | UnsetType | None = UNSET


class TraceJob(Strict, frozen=True):
    """One job of a trace (Eva's `pai_200.json` format; `max_tasks_per_instance` is ours)."""

    tasks: Annotated[dict[Key, TraceTask], msgspec.Meta(min_length=1, max_length=100_000)]
    name: Name | UnsetType = UNSET
    arrival_time: Annotated[float, number(ge=0, le=MAX_TRACE_SECONDS)] | UnsetType | None = UNSET
    duration: Annotated[float, number(gt=0, le=MAX_TRACE_SECONDS)] | UnsetType | None = UNSET
    total_iters: Annotated[float, number(gt=0, le=1e18)] | UnsetType | None = UNSET
    full_throughput: Annotated[float, number(gt=0, le=1e12)] | UnsetType | None = UNSET
    init_delay: Delay | UnsetType | None = UNSET
    max_tasks_per_instance: Annotated[int, whole(ge=1, le=100_000)] | UnsetType | None = UNSET
    support_throughput_aware: bool | UnsetType | None = UNSET  # Eva's; ours always learn
    # The team whose fair share of a binding budget the job spends (ours; none: no team).
    team: Name | UnsetType = UNSET


Trace = Annotated[dict[Key, TraceJob], msgspec.Meta(min_length=1)]
_JOB_FIELDS = TraceJob.__struct_fields__[1:]
_TASK_FIELDS = TraceTask.__struct_fields__[1:]


def trace_where(path: Sequence[Any]) -> tuple[str | None, str | None]:
    """`job 'a' task '0'` and the field within it, for errors in a trace."""
    if not path:
        return None, None
    where = f"job {str(path[0])!r}"
    rest = list(path[1:])
    if len(rest) >= 2 and rest[0] == "tasks":
        where += f" task {str(rest[1])!r}"
        rest = rest[2:]
    return where, dotted(rest) or None


def jobs_from_eva(data: object, source: str = "jobs") -> tuple[JobSpec, ...]:
    """Jobs from a decoded trace document (in file order), checked against its schema."""
    if isinstance(data, Mapping) and not data:
        raise InputError("contains no jobs", source=source)
    if not isinstance(data, Mapping):
        raise InputError("must be a JSON object mapping job ids to jobs", source=source)
    with no_gc():
        checked = {}
        for job_id, raw in data.items():
            try:
                if not isinstance(job_id, str) or len(job_id) > 256 or not _KEY.match(job_id):
                    raise msgspec.ValidationError(str(job_id))
                checked[job_id] = msgspec.convert(raw, TraceJob, strict=True)
            except (msgspec.ValidationError, TypeError):
                raise locate_error(
                    {job_id: raw}, Trace, source=source, where_of=trace_where
                ) from None
        return _jobs(checked, source)[0]


def jobs_from_json(data: bytes, source: str) -> tuple[JobSpec, ...]:
    """Jobs from a trace file's bytes, decoded and checked by msgspec.

    The jobs are decoded as one array (each job's bytes as they are in the file),
    so a bad one is named by its index in msgspec's error at the cost of one
    pass, however far down the file it is.

    Duplicate keys are looked for without a second parse: every key of valid
    JSON is followed by the only colons outside strings, so the file's colons
    number the keys written plus the colons inside strings; the decoded trace
    counts the keys it kept (fields left `UNSET` were not written) and the
    colons of its strings. Fewer kept than written means a key was given twice,
    and only then (or when an escaped colon spoils the count) is the file parsed
    again, by the standard library with a pairs hook, to name it.
    """
    data = data.removeprefix(b"\xef\xbb\xbf")
    with no_gc():
        try:
            top = _TOP.decode(data)
        except msgspec.ValidationError:
            raise InputError(
                "must be a JSON object mapping job ids to jobs", source=source
            ) from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError):
            parse_json(decode_utf8(data, "jobs", source), source)  # says what is malformed
            raise InputError("malformed JSON", source=source) from None
        if not top:
            raise InputError("contains no jobs", source=source)
        ids = list(top)
        for job_id in ids:
            if len(job_id) > 256 or not _KEY.match(job_id):
                raise locate_error({job_id: {}}, Trace, source=source, where_of=trace_where)
        raws = list(top.values())
        decoded: list[TraceJob] = []
        try:
            for start in range(0, len(raws), _CHUNK):  # a bad job costs its chunk, not all
                decoded += _JOBS.decode(b"[" + b",".join(raws[start : start + _CHUNK]) + b"]")
        except msgspec.ValidationError as exc:
            at = re.match(r".* - at `\$\[(\d+)\]", str(exc))
            job_id = ids[len(decoded) + int(at.group(1))] if at else ids[len(decoded)]
            # the failing job parsed exactly (a key given twice, 1e400 read as inf) to name
            # the field and value
            raw = decode_utf8(bytes(top[job_id]), "jobs", source)
            document = {job_id: parse_json(raw, source)}
            raise locate_error(document, Trace, source=source, where_of=trace_where) from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError):
            parse_json(decode_utf8(data, "jobs", source), source)
            raise InputError("malformed JSON", source=source) from None
        jobs, keys = _jobs(dict(zip(ids, decoded, strict=True)), source)
        if keys != data.count(b":") or _ESCAPED_COLON.search(data):
            parse_json(decode_utf8(data, "jobs", source), source)  # names a repeated key
    return jobs


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
#: Jobs decoded at once: a bad one costs the jobs of its chunk and the chunks before it.
_CHUNK = 50_000
_JOBS = msgspec.json.Decoder(list[TraceJob])
_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


_KEY = re.compile(_KEY_PATTERN)


def _jobs(trace: Mapping[str, TraceJob], source: str) -> tuple[tuple[JobSpec, ...], int]:
    """The jobs of a checked trace, and the number of keys it holds and colons in its
    strings (see `jobs_from_json`). The rules between items are applied first (names
    apart after normalising, demands), so a bad job costs no building."""
    seen: dict[str, str] = {}
    demand_cache: dict[Any, Demands] = {}  # traces repeat a few dozen demand blocks
    for job_id, job in trace.items():
        _same_after_normalising(seen, job_id, source, f"job {job_id!r}", "job id")
        if len(job.tasks) > 1:
            task_names: dict[str, str] = {}
            for key in job.tasks:
                where = f"job {job_id!r} task {key!r}"
                _same_after_normalising(task_names, key, source, where, "task key")
        for key, task in job.tasks.items():
            demand_key = tuple(task.demand.items())
            if demand_key not in demand_cache:
                where = f"job {job_id!r} task {key!r}"
                demand_cache[demand_key] = _demands(task.demand, source, where)
    runs: dict[tuple[str | None, float | None], TaskRun] = {}
    jobs = []
    keys = len(trace)
    for job_id, job in trace.items():
        name = job_id if job.name is UNSET else job.name
        keys += sum(getattr(job, f) is not UNSET for f in _JOB_FIELDS) + 1 + len(job.tasks)
        keys += job_id.count(":") + name.count(":") * (job.name is not UNSET)
        tasks = []
        for key, task in job.tasks.items():
            demands = demand_cache[tuple(task.demand.items())]
            keys += sum(getattr(task, f) is not UNSET for f in _TASK_FIELDS) + 1
            keys += len(task.demand) + key.count(":")
            image_id = task.image_id
            image = None if image_id is UNSET or image_id is None else str(image_id)
            if isinstance(image_id, str):
                keys += image_id.count(":")
            shm = None if task.shm_size is UNSET else task.shm_size
            run_key = (image, shm)
            run = runs.get(run_key)
            if run is None:
                run = runs[run_key] = TaskRun(image=image, shm_size_gb=shm)
            task_name = key if task.name is UNSET else task.name
            if task.name is not UNSET:
                keys += task_name.count(":")
            tasks.append(
                TaskSpec(
                    task_id=f"{job_id}/{key}",
                    job_id=job_id,
                    name=task_name,
                    workload=workload_key(name, task_name),
                    demands=demands,
                    kill_s=_or(task.kill_delay, DEFAULT_KILL_S),
                    upload_s=_or(task.upload_delay, DEFAULT_UPLOAD_S),
                    fetch_s=_or(task.fetch_delay, DEFAULT_FETCH_S),
                    build_image_s=_or(task.build_image_delay, DEFAULT_BUILD_IMAGE_S),
                    run=run,
                )
            )
        jobs.append(
            JobSpec(
                job_id=job_id,
                name=name,
                tasks=tuple(tasks),
                full_throughput=_or(job.full_throughput, None),
                init_delay_s=_or(job.init_delay, DEFAULT_INIT_S),
                max_tasks_per_instance=None
                if job.max_tasks_per_instance is UNSET
                else job.max_tasks_per_instance,
                trace=TraceFacts(
                    arrival_time_s=_or(job.arrival_time, 0.0),
                    duration_s=_or(job.duration, None),
                    total_iters=_or(job.total_iters, None),
                    team="" if job.team is UNSET else job.team,
                ),
            )
        )
    return tuple(jobs), keys


def _or(value: Any, default: Any) -> Any:
    return default if value is None or value is UNSET else float(value)


def _same_after_normalising(
    seen: dict[str, str], key: str, source: str, where: str, what: str
) -> None:
    """Refuse a name equal to an earlier one but for case or Unicode normalisation: on
    a case-insensitive file system, or after a copy that normalises, they are one."""
    if not key.isprintable():
        raise InputError(
            f"a {what} must be printable text (no control or invisible characters)",
            source=source,
            where=where,
            value=key,
            has_value=True,
        )
    folded = unicodedata.normalize("NFC", key).casefold() if not key.isascii() else key.lower()
    other = seen.setdefault(folded, key)
    if other != key:
        raise InputError(
            f"{what} {key!r} and {other!r} differ only by case or Unicode normalisation; "
            "name them apart",
            source=source,
            where=where,
        )


def _demands(demand: Mapping[str, tuple[float, float, float]], source: str, where: str) -> Demands:
    out = []
    for family, vector in demand.items():
        problem = demand_problem(vector)
        if problem is not None:
            at = problem.component
            raise InputError(
                problem.message,
                source=source,
                where=where,
                field=f"demand.{family}" if at is None else f"demand.{family}[{at}]",
                value=list(vector) if at is None else vector[at],
                has_value=True,
            )
        out.append((family, Resources(*map(float, vector))))
    return tuple(sorted(out))


# -- loading files ----------------------------------------------------------------------------


def load_catalog(path: str | Path) -> Catalog:
    """A catalog in Eva's `ec2_config.json` format (or our catalog cache, which extends it)."""
    p = str(path)
    return catalog_from_document(read_json(p, "catalog", CATALOG_LIMIT), source=p)


def load_jobs(path: str | Path, catalog: Catalog | None = None) -> tuple[JobSpec, ...]:
    """Load jobs in Eva's trace format; with a catalog, also check every task can be placed."""
    p = str(path)
    data = gunzip_bounded(read_regular_file(p, "jobs", TRACE_LIMIT), p, TRACE_LIMIT)
    jobs = jobs_from_json(data, p)
    if catalog is not None:
        validate_against_catalog(jobs, catalog, source=str(path))
    return jobs


# -- the contention matrix (CSV) ---------------------------------------------------------------


def load_contention_matrix(
    path: str | Path, default: float = DEFAULT_THROUGHPUT
) -> ThroughputTable:
    """Load Eva's contention-matrix CSV as a table of pairwise throughputs."""
    p = str(path)
    text = decode_utf8(read_regular_file(p, "throughput CSV", CSV_LIMIT), "throughput CSV", p)
    return contention_matrix_from_csv(text, default, source=p)


def _rows(text: str, source: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of the non-blank rows."""
    reader = csv.reader(text.splitlines())
    csv.field_size_limit(CSV_CELL_LIMIT)
    rows = []
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise InputError(
            f"malformed CSV: {exc} (a cell holds at most {CSV_CELL_LIMIT:,} characters)",
            source=source,
            where=f"line {reader.line_num}",
        ) from None
    return rows


def contention_matrix_from_csv(
    text: str, default: float = DEFAULT_THROUGHPUT, source: str = "contention matrix"
) -> ThroughputTable:
    """Pairwise throughputs from Eva's contention-matrix CSV.

    Row = the workload whose throughput is given, column = the co-located
    workload, `x` = not measured (left to the default). A workload is named
    once as a row and once as a column; each value is in (0, 1].
    """
    rows = _rows(text, source)
    if len(rows) < 2 or len(rows[0][1]) < 2:
        raise InputError("needs a header row of workloads and at least one data row", source=source)
    header_line, header = rows[0]
    columns = [c.strip() for c in header[1:]]
    for i, name in enumerate(columns):
        where = f"line {header_line} column {i + 2}"
        if not name:
            raise InputError("names no workload", source=source, where=where)
        if columns.index(name) != i:
            raise InputError(
                "names a workload a column before it names: say each once",
                source=source,
                where=where,
                value=name,
                has_value=True,
            )
    entries: dict[tuple[str, tuple[str, ...]], ThroughputEntry] = {}
    row_names: set[str] = set()
    for line_no, row in rows[1:]:
        workload = row[0].strip()
        if not workload:
            raise InputError(
                "the first cell must name the workload whose throughputs the row gives",
                source=source,
                where=f"line {line_no}",
            )
        if workload in row_names:
            raise InputError(
                "names a workload an earlier row names: say each once",
                source=source,
                where=f"line {line_no}",
                value=workload,
                has_value=True,
            )
        row_names.add(workload)
        if len(row) - 1 != len(columns):
            raise InputError(
                f"has {len(row) - 1} values, header has {len(columns)}",
                source=source,
                where=f"line {line_no} ({workload!r})",
            )
        for other, cell in zip(columns, row[1:], strict=True):
            cell = cell.strip()
            if cell.lower() == "x":
                continue
            where = f"line {line_no}"
            if not cell:
                raise InputError(
                    "is empty: write a throughput in (0, 1], or 'x' for not measured",
                    source=source,
                    where=where,
                    field=f"{workload}/{other}",
                )
            try:
                value = float(cell) if _DECIMAL.match(cell) else None
            except ValueError:
                value = None
            if value is None:
                raise InputError(
                    "must be a number or 'x'",
                    source=source,
                    where=where,
                    field=f"{workload}/{other}",
                    value=cell,
                    has_value=True,
                )
            if not 0.0 < value <= 1.0:
                raise InputError(
                    "must be in (0, 1]",
                    source=source,
                    where=where,
                    field=f"{workload}/{other}",
                    value=cell,
                    has_value=True,
                )
            entries[(workload, (other,))] = ThroughputEntry(value)
    return ThroughputTable(entries, default)


_DECIMAL = re.compile(r"^[+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")


def check_workloads(table: ThroughputTable, jobs: Iterable[JobSpec], source: str) -> None:
    """Every workload a contention matrix names is one of the jobs', exactly.

    A row or column that matches no workload would be silently unused: a case
    typo (`GPT2_node0`) leaves its pairs at the default, and the planner packs
    tasks the user measured as slowing each other to a tenth.
    """
    wanted = {t.workload for j in jobs for t in j.tasks}
    named = sorted(
        {w for (w, _), _ in table.items()} | {o for (_, c), _ in table.items() for o in c}
    )
    for name in named:
        if name in wanted:
            continue
        close = difflib.get_close_matches(name, sorted(wanted), n=1, cutoff=0.0)
        folded = {w.casefold(): w for w in wanted}.get(name.casefold())
        hint = folded or (close[0] if close else None)
        raise InputError(
            "names no workload of the jobs (workloads are '<job name>_<task name>', "
            f"{len(wanted)} here" + (f"; did you mean {hint!r}?)" if hint else ")"),
            source=source,
            field="workload",
            value=name,
            has_value=True,
        )
