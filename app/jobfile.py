"""Job files: what a user submits, checked before anything leaves their machine.

Our format (TOML):

    id = "train-1"                  # optional, unique; default: NAME-<8 hex>
    name = "resnet18"               # required: jobs of one name share what is learned
    full_throughput = 2.5           # optional: iterations per second alone
    max_tasks_per_instance = 1      # optional: spread the tasks (anti-affinity)
    init_delay_s = 10               # optional: how long it takes to resume
    priority = 5                    # optional: queue place in its team (higher first)
    max_cost = 40.0                 # optional: dollars; reached: checkpointed and stopped
    capacity = "auto"               # optional: "auto" (spot or on-demand), "spot", "on-demand"
    deadline_s = 86400              # optional: finish within this long of submission
    # max_jct_factor = 2            # or within this factor of its time alone (when known)

    [tasks.node0]
    context = "train"               # a directory holding a Dockerfile (relative to this file)
    # image = "autoscaler/python:3.11"   # an existing image instead of a context
    command = ["python", "train.py"]
    env = { EPOCHS = "3" }
    demand = { any = [0, 1, 2] }    # [gpu, cpu cores, ram GiB], on any family or per family
    shm_size_gb = 1
    network = false                 # containers get no network unless a task asks
    replicas = 2                    # data-parallel copies: node0-0, node0-1
    checkpoint_every_s = 900        # how often the job checkpoints (the reporter's schedule)
    fatal_exit_codes = [3]          # exits that mean "do not retry": the job fails at once

Eva's `config.json` (a `tasks` list of `{name, dir, demand, shm_size,
full_throughput}` and job-level delays) is read too. Build contexts are packed
by `executor.packing.pack_context` (re-exported here), the cluster's one packer:
`.dockerignore` honoured, a reproducible `.tar.gz` whose sha256 is its name, so
the same directory is uploaded once whoever packs it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from app.files import CONFIG_LIMIT, Vector, read_input_file
from autoscaler.catalog import Catalog
from autoscaler.errors import InputError
from autoscaler.fairshare import MAX_PRIORITY
from autoscaler.jobs import (
    DEFAULT_BUILD_IMAGE_S,
    DEFAULT_FETCH_S,
    DEFAULT_INIT_S,
    DEFAULT_KILL_S,
    DEFAULT_UPLOAD_S,
    JobSpec,
    TaskRun,
    TaskSpec,
    demand_problem,
    validate_against_catalog,
    without_missing_families,
    workload_key,
)
from autoscaler.limits import MAX_CAPACITY, MAX_DELAY_S, MAX_JOB_COST
from autoscaler.resources import Resources
from executor.packing import pack_context as pack_context  # what `submit` uploads
from provisioners.documents import (
    FieldError,
    Strict,
    convert,
    decode_utf8,
    dotted,
    number,
    parse_json,
    parse_toml,
    text,
    whole,
)

#: Ids of jobs, tasks and clusters: safe in file names, S3 keys, tags and task ids.
Identifier = Annotated[
    str,
    text(
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
]
Delay = Annotated[float, number(ge=0, le=MAX_DELAY_S)]
Family = Annotated[
    str,
    text(
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$",
        description="an instance family such as 'c7i', or 'any'",
    ),
]
EnvName = Annotated[
    str,
    text(
        max_length=256,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="an environment variable name (letters, digits, '_'; not a digit first)",
    ),
]
#: The most replicas one task may ask for.
MAX_REPLICAS = 1000


def check_demand(demand: Mapping[str, tuple[float, float, float]]) -> None:
    """The demand rules (`autoscaler.jobs.demand_problem`), naming the vector at fault."""
    for family, vector in demand.items():
        problem = demand_problem(vector)
        if problem is not None:
            at = problem.component
            raise FieldError(
                problem.message,
                f"demand.{family}" if at is None else f"demand.{family}[{at}]",
                list(vector) if at is None else vector[at],
            )


class TaskFile(Strict, frozen=True):
    """`[tasks.NAME]` of a job file."""

    demand: Annotated[dict[Family, Vector], msgspec.Meta(min_length=1, max_length=64)]
    context: Annotated[str, text(min_length=1, max_length=4096)] | None = None
    image: Annotated[str, text(min_length=1, max_length=1024)] | None = None
    command: Annotated[
        tuple[Annotated[str, text(max_length=65536)], ...], msgspec.Meta(max_length=4096)
    ] = ()
    env: Annotated[
        dict[EnvName, Annotated[str, text(max_length=65536)]], msgspec.Meta(max_length=4096)
    ] = msgspec.field(default_factory=dict)
    shm_size_gb: Annotated[float, number(gt=0, le=MAX_CAPACITY[2])] | None = None
    network: bool = False
    replicas: Annotated[int, whole(ge=1, le=MAX_REPLICAS)] = 1
    # Passed to the job as AUTOSCALER_CHECKPOINT_EVERY_S (the worker's default: 900 s).
    checkpoint_every_s: Annotated[float, number(ge=1.0, le=30 * 86400.0)] | None = None
    # Exit statuses the job declares deterministic failures (never retried); 0 is success,
    # and above 255 no process can exit with.
    fatal_exit_codes: Annotated[
        tuple[Annotated[int, whole(ge=1, le=255)], ...], msgspec.Meta(max_length=255)
    ] = ()
    fetch_s: Delay = DEFAULT_FETCH_S
    build_s: Delay = DEFAULT_BUILD_IMAGE_S
    kill_s: Delay = DEFAULT_KILL_S
    upload_s: Delay = DEFAULT_UPLOAD_S

    def check(self) -> None:
        check_demand(self.demand)
        for name in self.env:
            if name.startswith("AUTOSCALER_"):
                raise FieldError(
                    f"{name} is reserved: the worker sets AUTOSCALER_* itself", "env", name
                )
        if (self.context is None) == (self.image is None):
            raise FieldError("give either 'context' (a directory with a Dockerfile) or 'image'")


class JobFile(Strict, frozen=True):
    """A job file (TOML): the job, and its tasks by name."""

    name: Identifier
    tasks: Annotated[dict[Identifier, TaskFile], msgspec.Meta(min_length=1, max_length=1000)]
    id: Identifier | None = None
    full_throughput: Annotated[float, number(gt=0, le=1e12)] | None = None
    max_tasks_per_instance: Annotated[int, whole(ge=1, le=100_000)] | None = None
    init_delay_s: Delay = DEFAULT_INIT_S
    priority: Annotated[int, whole(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] | None = None
    max_cost: (
        Annotated[float, number(gt=0, le=MAX_JOB_COST, description="a number of US dollars")] | None
    ) = None
    # Markets its tasks may run on, and when it must be done (`autoscaler.spot`).
    capacity: Literal["auto", "spot", "on-demand"] = "auto"
    deadline_s: Annotated[float, number(gt=0, le=365 * 86400.0)] | None = None
    max_jct_factor: Annotated[float, number(ge=1.0, le=1e6)] | None = None

    def check(self) -> None:
        if self.deadline_s is not None and self.max_jct_factor is not None:
            raise FieldError("give deadline_s or max_jct_factor, not both", ("max_jct_factor",))
        # Task names the job's tasks run under: a key, or its replicas KEY-0, KEY-1, ...
        # Two that are equal but for case would share a checkpoint directory on a
        # case-insensitive file system, and one named like another's replica would
        # take its place.
        owner: dict[str, str] = {}
        total = 0
        for key, task in self.tasks.items():
            names = [key] if task.replicas == 1 else [f"{key}-{n}" for n in range(task.replicas)]
            total += len(names)
            for name in names:
                other = owner.setdefault(name.lower(), key)
                if other != key:
                    raise FieldError(
                        f"task {key!r} makes a task named {name!r}, which task {other!r} "
                        "makes too (replicas are named KEY-0, KEY-1, ...; names are compared "
                        "ignoring case): rename one",
                        ("tasks", key),
                    )
        if total > MAX_REPLICAS * 10:
            raise FieldError(f"makes {total:,} tasks; a job has at most {MAX_REPLICAS * 10:,}")


class EvaTask(Strict, frozen=True):
    """One task of Eva's `config.json`."""

    demand: Annotated[dict[Family, Vector], msgspec.Meta(min_length=1, max_length=64)]
    name: Identifier = "task"
    dir: Annotated[str, text(min_length=1, max_length=4096)] = "."
    shm_size: Annotated[float, number(gt=0, le=MAX_CAPACITY[2])] | None = None
    full_throughput: Annotated[float, number(gt=0, le=1e12)] | None = None

    def check(self) -> None:
        check_demand(self.demand)


class EvaJobConfig(Strict, frozen=True):
    """Eva's `config.json`: a job of `tasks` (names may repeat), and its delays."""

    name: Identifier
    tasks: Annotated[list[EvaTask], msgspec.Meta(min_length=1, max_length=1000)]
    total_iters: Annotated[float, number(gt=0, le=1e18)] | None = None
    duration: Annotated[float, number(gt=0, le=1e11)] | None = None
    init_delay: Delay | None = None
    fetch_delay: Delay | None = None
    build_image_delay: Delay | None = None
    kill_delay: Delay | None = None
    upload_delay: Delay | None = None


@dataclass(frozen=True, slots=True)
class Submission:
    """A checked job and the build contexts its tasks need uploaded (task id -> directory)."""

    job: JobSpec
    contexts: Mapping[str, Path]


def _job_where(path: Any) -> tuple[str | None, str | None]:
    parts = list(path)
    if len(parts) >= 2 and parts[0] == "tasks":
        task = parts[1]
        label = f"tasks[{task}]" if isinstance(task, int) else f"task {str(task)!r}"
        return label, dotted(parts[2:]) or None
    return None, dotted(parts) or None


def load_job_file(path: str | Path, catalog: Catalog | None) -> Submission:
    """Read, check and resolve one job file (ours in TOML, or Eva's config.json).

    Without a catalog, everything but the demands' fit is checked: a mistake in
    the file is found before any daemon is asked for its catalog.
    """
    p = Path(path)
    source = str(p)
    text_ = decode_utf8(read_input_file(p, "job", CONFIG_LIMIT), "job", source)
    if p.suffix == ".json":
        data = parse_json(text_, source)
        if not isinstance(data, Mapping):
            raise InputError(
                "must be an object with a 'tasks' list (Eva's config.json)", source=source
            )
        parsed = _from_eva(convert(data, EvaJobConfig, source=source, where_of=_job_where))
    else:
        parsed = convert(parse_toml(text_, source), JobFile, source=source, where_of=_job_where)
    submission = _resolve(parsed, p.parent, source)
    if catalog is not None:
        job, _ = without_missing_families(submission.job, catalog)
        submission = replace(submission, job=job)
        validate_against_catalog((submission.job,), catalog, source=source)
    return submission


def _from_eva(config: EvaJobConfig) -> JobFile:
    """Eva's `config.json` in our schema (its task names may repeat: tasks are numbered)."""
    delays = {
        "fetch_s": config.fetch_delay,
        "build_s": config.build_image_delay,
        "kill_s": config.kill_delay,
        "upload_s": config.upload_delay,
    }
    given = {k: v for k, v in delays.items() if v is not None}
    tasks = {
        f"{task.name}-{i}": TaskFile(
            context=task.dir,
            demand=task.demand,
            shm_size_gb=task.shm_size,
            **given,  # type: ignore[arg-type]
        )
        for i, task in enumerate(config.tasks)
    }
    speeds = [t.full_throughput for t in config.tasks if t.full_throughput is not None]
    return JobFile(
        name=config.name,
        tasks=tasks,
        full_throughput=min(speeds) if speeds else None,
        init_delay_s=config.init_delay if config.init_delay is not None else DEFAULT_INIT_S,
    )


def _resolve(parsed: JobFile, base: Path, source: str) -> Submission:
    job_id = parsed.id or f"{parsed.name}-{secrets.token_hex(4)}"
    tasks: list[TaskSpec] = []
    contexts: dict[str, Path] = {}
    for key, task in parsed.tasks.items():
        directory = None
        if task.context is not None:
            directory = _context_directory(base, task.context, source, f"task {key!r}")
        names = [key] if task.replicas == 1 else [f"{key}-{n}" for n in range(task.replicas)]
        for name in names:
            task_id = f"{job_id}/{name}"
            if directory is not None:
                contexts[task_id] = directory
            tasks.append(
                TaskSpec(
                    task_id=task_id,
                    job_id=job_id,
                    name=name,
                    workload=workload_key(parsed.name, key),
                    demands=tuple(
                        sorted((family, Resources(*v)) for family, v in task.demand.items())
                    ),
                    kill_s=task.kill_s,
                    upload_s=task.upload_s,
                    fetch_s=task.fetch_s,
                    build_image_s=task.build_s,
                    run=TaskRun(
                        image=task.image,
                        command=tuple(task.command),
                        env=tuple(sorted(task.env.items())),
                        shm_size_gb=task.shm_size_gb,
                        network=task.network,
                        checkpoint_every_s=task.checkpoint_every_s,
                        fatal_exit_codes=tuple(sorted(set(task.fatal_exit_codes))),
                    ),
                )
            )
    job = JobSpec(
        job_id=job_id,
        name=parsed.name,
        tasks=tuple(tasks),
        full_throughput=parsed.full_throughput,
        init_delay_s=parsed.init_delay_s,
        max_tasks_per_instance=parsed.max_tasks_per_instance,
        priority=parsed.priority,
        max_cost=parsed.max_cost,
        capacity=parsed.capacity,
        deadline_s=parsed.deadline_s,
        max_jct_factor=parsed.max_jct_factor,
    )
    return Submission(job, contexts)


#: The largest `.dockerignore` read (its patterns, not data).
DOCKERIGNORE_LIMIT = 1024 * 1024


def _context_directory(base: Path, context: str, source: str, where: str) -> Path:
    """The build context's directory, checked as far as packing it will need: it is
    inside the job file's directory (`..`, absolute paths and symlinks leading out are
    refused: a job file from elsewhere cannot ship the submitter's other files), exists
    (no symlink loop on the way), holds a Dockerfile, and its `.dockerignore` is text."""

    def refuse(problem: str) -> InputError:
        return InputError(
            problem, source=source, where=where, field="context", value=context, has_value=True
        )

    given = Path(context)
    if given.is_absolute() or ".." in given.parts:
        raise refuse("must be a directory inside the job file's directory (no '..', not absolute)")
    try:
        inside = base.resolve(strict=True)
        directory = (base / context).resolve(strict=True)
    except FileNotFoundError:
        raise refuse("is not a directory") from None
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long, no permission
        raise refuse(f"cannot be resolved: {getattr(exc, 'strerror', None) or exc}") from None
    if not directory.is_relative_to(inside):  # a symlink on the way led out
        raise refuse(f"leads outside the job file's directory (to {directory}) through a symlink")
    if not directory.is_dir():
        raise refuse("is not a directory")
    if not (directory / "Dockerfile").is_file():
        raise refuse("has no Dockerfile")
    ignore = directory / ".dockerignore"
    if ignore.exists():
        raw = read_input_file(ignore, ".dockerignore", DOCKERIGNORE_LIMIT)
        decode_utf8(raw, ".dockerignore", str(ignore))
    return directory


def with_contexts(job: JobSpec, refs: Mapping[str, str]) -> JobSpec:
    """The job with each task's uploaded build context (task id -> stored ref)."""
    tasks = tuple(
        replace(t, run=replace(t.run, build_context=refs[t.task_id])) if t.task_id in refs else t
        for t in job.tasks
    )
    return replace(job, tasks=tasks)
