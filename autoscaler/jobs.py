"""Jobs and their tasks, as submitted by users or read from Eva's trace format.

A job spec has three parts, each read by a different component:

- **what the planner needs** (`JobSpec`, `TaskSpec`): demands per instance
  family, the workload key throughputs are learned under, the delays a move
  costs, anti-affinity, the solo throughput a report is normalized by;
- **what a worker runs** (`TaskRun`): a build context or an image, the
  command, environment, shared-memory size, whether it may use the network,
  how often the job checkpoints on its own, which exit codes are fatal;
- **trace facts** (`TraceFacts`): arrival, duration, total iterations — what
  a trace knows in advance and a real cluster only learns by running the job.
  Only the simulator (and the baselines it runs) reads them.

Trace format (`pai_200.json`): `{job_id: {"name", "tasks": {task_id: {"name",
"demand": {family_or_any: [gpu, cpu, ram_gb]}, ...}}, ...}}`. Only `tasks` and
each task's `demand` are required; the rest (arrival time, duration, delays)
is used by the simulator and the migration criterion when present. One field
is ours: `max_tasks_per_instance` (anti-affinity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from autoscaler.catalog import ANY_FAMILY, Catalog, InstanceType
from autoscaler.errors import InputError, check_number
from autoscaler.limits import MAX_DELAY_S
from autoscaler.resources import Resources

#: Table 1 of the Eva paper averages job checkpointing at 8 s and job launch at
#: 47 s. Tasks whose trace entry gives no delays get these, split the way the
#: trace's own fields split them.
DEFAULT_KILL_S = 1.0
DEFAULT_UPLOAD_S = 7.0
DEFAULT_FETCH_S = 1.0
DEFAULT_BUILD_IMAGE_S = 10.0
DEFAULT_INIT_S = 36.0

#: How often a job checkpoints on its own unless its job file says otherwise: a crash of
#: anything (agent, container, instance, daemon) loses at most this much work.
DEFAULT_CHECKPOINT_EVERY_S = 900.0


def workload_key(job_name: str, task_name: str) -> str:
    """Key under which a task's co-location throughput is learned.

    Job `resnet18[3]`, task `node0` -> `resnet18_node0`: the trailing index is
    dropped so that every job of the same kind shares what was learned (§4.3).
    """
    if job_name.endswith("]"):
        start = job_name.rfind("[", 0, len(job_name) - 1)
        if start >= 0 and "]" not in job_name[start + 1 : -1]:
            job_name = job_name[:start]
    return f"{job_name}_{task_name}"


@dataclass(frozen=True, slots=True)
class TaskRun:
    """What a worker runs for a task: a container from a build context or an image.

    `build_context` is the content-addressed location of the packed directory
    holding the task's Dockerfile (`s3://bucket/prefix/contexts/<sha256>.tar.gz`);
    `image` an image reference used instead. Eva's traces name an image id,
    which the simulator uses to model the image cache.
    """

    build_context: str | None = None
    image: str | None = None
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # sorted (name, value) pairs
    shm_size_gb: float | None = None
    network: bool = False  # containers get no network unless the job asks for it
    # How often the job checkpoints on its own (the reporter's `checkpoint_due()`); None:
    # the worker's default, `DEFAULT_CHECKPOINT_EVERY_S`.
    checkpoint_every_s: float | None = None
    # Exit codes the job declares fatal: an attempt ending with one fails the job at once
    # (a retry would fail the same way), where another non-zero code is retried.
    fatal_exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TraceFacts:
    """What a trace knows about a job before it runs (the simulator's, not the planner's)."""

    arrival_time_s: float = 0.0
    duration_s: float | None = None
    total_iters: float | None = None


#: A task's demand per instance family it may run on: `(family or "any", demand)`, sorted.
Demands = tuple[tuple[str, Resources], ...]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task: a demand vector per instance family it may run on, its delays, what it runs."""

    task_id: str  # "<job_id>/<task_id>"
    job_id: str
    name: str
    workload: str
    demands: Demands
    kill_s: float = DEFAULT_KILL_S
    upload_s: float = DEFAULT_UPLOAD_S
    fetch_s: float = DEFAULT_FETCH_S
    build_image_s: float = DEFAULT_BUILD_IMAGE_S
    run: TaskRun = TaskRun()

    def demand_on(self, family: str) -> Resources | None:
        """Demand on `family`, falling back to the `any` vector; None if it can't run there."""
        fallback = None
        for key, demand in self.demands:
            if key == family:
                return demand
            if key == ANY_FAMILY:
                fallback = demand
        return fallback

    def fits_alone(self, itype: InstanceType) -> bool:
        """True when the task may run on `itype`'s family and fits an empty instance of it."""
        demand = self.demand_on(itype.family)
        return demand is not None and demand.fits_in(itype.capacity)

    @property
    def checkpoint_s(self) -> float:
        """Time to stop and checkpoint this task before it can move."""
        return self.kill_s + self.upload_s


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job: one or more data-parallel tasks; the slowest task sets its pace (§4.4)."""

    job_id: str
    name: str
    tasks: tuple[TaskSpec, ...]
    # Iterations per second when alone: reported throughputs are divided by it.
    # None: learned the first time the job runs alone.
    full_throughput: float | None = None
    init_delay_s: float = DEFAULT_INIT_S
    # Anti-affinity (CvxCluster §3.2.1): at most this many of the job's tasks on
    # one instance, e.g. 1 to spread replicas for fault tolerance. None: no limit.
    max_tasks_per_instance: int | None = None
    trace: TraceFacts = TraceFacts()

    @property
    def is_multi_task(self) -> bool:
        return len(self.tasks) > 1

    @property
    def anti_affinity(self) -> int | None:
        """The per-instance limit when it can bind (fewer than all tasks), else None."""
        limit = self.max_tasks_per_instance
        return limit if limit is not None and limit < len(self.tasks) else None


#: Parsed demand blocks by their raw form (`jobs_from_eva` validates each block once).
_DemandCache = dict[tuple[Any, ...], Demands]


def jobs_from_eva(data: object, source: str = "jobs") -> tuple[JobSpec, ...]:
    """Parse and validate the Eva trace structure into jobs (in file order)."""
    if not isinstance(data, Mapping):
        raise InputError("must be a JSON object mapping job ids to jobs", source=source)
    if not data:
        raise InputError("contains no jobs", source=source)
    # Traces repeat a few dozen demand blocks over many tasks: each distinct
    # block is validated once and its parsed form shared.
    demand_cache: _DemandCache = {}
    return tuple(_job(str(job_id), spec, source, demand_cache) for job_id, spec in data.items())


def _number(
    spec: Mapping[str, Any],
    key: str,
    default: float | None,
    where: str,
    source: str,
    positive: bool = False,
    maximum: float | None = None,
) -> float | None:
    """An optional numeric field; the common well-formed case stays cheap."""
    value = spec.get(key)
    if value is None:
        return default
    if (
        type(value) in (int, float)
        and (value > 0 if positive else value >= 0)
        and value != math.inf
        and (maximum is None or value <= maximum)
    ):
        return float(value)
    return check_number(
        value, field=key, where=where, source=source, strictly_positive=positive, maximum=maximum
    )


def _job(job_id: str, spec: Any, source: str, demand_cache: _DemandCache) -> JobSpec:
    if type(spec) is not dict and not isinstance(spec, Mapping):
        raise InputError("must be an object", source=source, where=f"job {job_id!r}")
    _check_id(job_id, "job id", source, f"job {job_id!r}")
    name = spec.get("name", job_id)
    raw_tasks = spec.get("tasks")
    if type(name) is not str or not name or type(raw_tasks) is not dict or not raw_tasks:
        _reject_job(job_id, name, raw_tasks, source)
    assert isinstance(raw_tasks, Mapping)  # else _reject_job raised
    where = f"job {job_id!r}"
    tasks = tuple(
        _task(job_id, name, str(task_key), task_spec, source, demand_cache)
        for task_key, task_spec in raw_tasks.items()
    )
    return JobSpec(
        job_id=job_id,
        name=name,
        tasks=tasks,
        full_throughput=_number(spec, "full_throughput", None, where, source, positive=True),
        init_delay_s=_number(spec, "init_delay", DEFAULT_INIT_S, where, source, maximum=MAX_DELAY_S)
        or 0.0,
        max_tasks_per_instance=_limit(spec.get("max_tasks_per_instance"), where, source),
        trace=TraceFacts(
            arrival_time_s=_number(spec, "arrival_time", 0.0, where, source) or 0.0,
            duration_s=_number(spec, "duration", None, where, source, positive=True),
            total_iters=_number(spec, "total_iters", None, where, source, positive=True),
        ),
    )


def _check_id(value: str, what: str, source: str, where: str) -> None:
    """Job ids and task keys make task ids (`job/task`) and storage keys: no '/', no
    whitespace or control characters, not empty."""
    if not value or "/" in value or not value.isprintable() or value != value.strip():
        raise InputError(
            f"a {what} may not be empty or hold '/', spaces at its ends or control characters "
            "(task ids are '<job>/<task>')",
            source=source,
            where=where,
            value=value,
            has_value=True,
        )


def _reject_job(job_id: str, name: object, raw_tasks: object, source: str) -> None:
    where = f"job {job_id!r}"
    if not isinstance(name, str) or not name:
        raise InputError(
            "must be a non-empty string",
            source=source,
            where=where,
            field="name",
            value=name,
            has_value=True,
        )
    if not isinstance(raw_tasks, Mapping) or not raw_tasks:
        raise InputError(
            "must be a non-empty object of tasks",
            source=source,
            where=where,
            field="tasks",
            value=raw_tasks,
            has_value=raw_tasks is not None,
        )


def _limit(value: object, where: str, source: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(
            "must be a positive integer",
            source=source,
            where=where,
            field="max_tasks_per_instance",
            value=value,
            has_value=True,
        )
    return value


_DELAY_FIELDS = (
    ("kill_delay", DEFAULT_KILL_S),
    ("upload_delay", DEFAULT_UPLOAD_S),
    ("fetch_delay", DEFAULT_FETCH_S),
    ("build_image_delay", DEFAULT_BUILD_IMAGE_S),
)


def _task(
    job_id: str, job_name: str, task_key: str, spec: Any, source: str, demand_cache: _DemandCache
) -> TaskSpec:
    if type(spec) is not dict and not isinstance(spec, Mapping):
        raise InputError(
            "must be an object", source=source, where=f"job {job_id!r} task {task_key!r}"
        )
    _check_id(task_key, "task key", source, f"job {job_id!r} task {task_key!r}")
    name = spec.get("name", task_key)
    if type(name) is not str or not name:
        raise InputError(
            "must be a non-empty string",
            source=source,
            where=f"job {job_id!r} task {task_key!r}",
            field="name",
            value=name,
            has_value=True,
        )
    raw_demand: Any = spec.get("demand")
    try:
        cache_key = tuple([(f, *v) for f, v in raw_demand.items()])
        demands = demand_cache.get(cache_key)
    except (AttributeError, TypeError):  # not a mapping of lists: validated below
        cache_key, demands = None, None
    if demands is None:
        demands = _demands(raw_demand, f"job {job_id!r} task {task_key!r}", source)
        if cache_key is not None:
            demand_cache[cache_key] = demands
    if any(key in spec for key, _ in _DELAY_FIELDS):
        where = f"job {job_id!r} task {task_key!r}"
        kill, upload, fetch, build = (
            _number(spec, key, default, where, source, maximum=MAX_DELAY_S)
            for key, default in _DELAY_FIELDS
        )
    else:
        kill, upload, fetch, build = (default for _, default in _DELAY_FIELDS)
    image = spec.get("image_id")
    shm = spec.get("shm_size")
    where = f"job {job_id!r} task {task_key!r}"
    shm_gb = None if shm is None else _number(spec, "shm_size", None, where, source)
    run = TaskRun(image=None if image is None else str(image), shm_size_gb=shm_gb)
    return TaskSpec(
        task_id=f"{job_id}/{task_key}",
        job_id=job_id,
        name=name,
        workload=workload_key(job_name, name),
        demands=demands,
        kill_s=kill,  # type: ignore[arg-type]
        upload_s=upload,  # type: ignore[arg-type]
        fetch_s=fetch,  # type: ignore[arg-type]
        build_image_s=build,  # type: ignore[arg-type]
        run=run,
    )


def _demands(raw_demand: Any, where: str, source: str) -> Demands:
    if not isinstance(raw_demand, Mapping) or not raw_demand:
        raise InputError(
            "must be an object mapping an instance family (or 'any') to [gpu, cpu, ram_gb]",
            source=source,
            where=where,
            field="demand",
            value=raw_demand,
            has_value=raw_demand is not None,
        )
    demands = []
    for family, vector in raw_demand.items():
        fname = f"demand.{family}"
        if not isinstance(vector, list) or len(vector) != 3:
            raise InputError(
                "must be a list [gpu, cpu, ram_gb]",
                source=source,
                where=where,
                field=fname,
                value=vector,
                has_value=True,
            )
        values = [
            check_number(v, field=f"{fname}[{i}]", where=where, source=source)
            for i, v in enumerate(vector)
        ]
        problem = demand_problem(values)
        if problem is not None:
            at = problem.component
            raise InputError(
                problem.message,
                source=source,
                where=where,
                field=fname if at is None else f"{fname}[{at}]",
                value=vector if at is None else vector[at],
                has_value=True,
            )
        demands.append((str(family), Resources.of(values)))
    return tuple(sorted(demands))


class DemandProblem(NamedTuple):
    """Why a demand vector cannot be scheduled: the message, and the index of the
    component at fault (None: the vector as a whole)."""

    message: str
    component: int | None = None


def demand_problem(vector: Sequence[float]) -> DemandProblem | None:
    """Why a demand `[gpu, cpu, ram_gb]` cannot be scheduled as given (None: it can).

    The demand rules, for every way a job is submitted (a trace, a job file): a
    container is given whole GPU devices, so a GPU demand is a whole number; and
    a task asks for something, since a zero vector would let any number of copies
    share one instance.
    """
    if vector[0] != int(vector[0]):
        return DemandProblem(
            f"asks for {vector[0]:g} GPUs, not a whole number: a container is given whole devices",
            0,
        )
    if not any(vector):
        return DemandProblem(
            "asks for nothing: a task needs some CPU or memory (a zero vector would let "
            "any number of copies share one instance)"
        )
    return None


def validate_against_catalog(
    jobs: tuple[JobSpec, ...] | list[JobSpec], catalog: Catalog, source: str = "jobs"
) -> None:
    """Reject tasks that name a family no type has, or that fit no instance type."""
    families = catalog.families
    valid: set[Demands] = set()  # demand blocks already checked
    for job in jobs:
        for task in job.tasks:
            if task.demands in valid:
                continue
            where = f"job {job.job_id!r} task {task.task_id.split('/', 1)[1]!r}"
            for family, _demand in task.demands:
                if family != ANY_FAMILY and family not in families:
                    raise InputError(
                        f"no instance type in the catalog has family {family!r} "
                        f"(families: {', '.join(sorted(families))})",
                        source=source,
                        where=where,
                        field=f"demand.{family}",
                    )
            if not any(task.fits_alone(t) for t in catalog):
                shown = ", ".join(f"{f}: {d}" for f, d in task.demands)
                raise InputError(
                    f"fits no instance type in the catalog (demand {shown}; "
                    f"closest: {_closest_type(task, catalog)})",
                    source=source,
                    where=where,
                    field="demand",
                )
            valid.add(task.demands)


def _closest_type(task: TaskSpec, catalog: Catalog) -> str:
    """The usable type `task` misses by the fewest resources, then by the least
    (relative): what to compare the demand with in an error message."""

    def shortfall(t: InstanceType) -> tuple[int, float]:
        demand = task.demand_on(t.family)
        assert demand is not None
        need, have = demand.as_tuple(), t.capacity.as_tuple()
        short = [(n - h) / n for n, h in zip(need, have, strict=True) if n > h]
        return len(short), sum(short)

    usable = [t for t in catalog if task.demand_on(t.family) is not None]
    best = min(usable, key=lambda t: (*shortfall(t), t.name))
    return f"{best.name} {best.capacity}"


def spec_document(job: JobSpec) -> dict[str, Any]:
    """The job's spec as a JSON-ready document with every field, so it round-trips exactly."""
    document = _fields(job, skip=("tasks", "trace"))
    document["trace"] = _fields(job.trace)
    document["tasks"] = [
        {
            **_fields(task, skip=("demands", "run")),
            "demands": [[family, list(demand)] for family, demand in task.demands],
            "run": {
                **_fields(task.run, skip=("command", "env", "fatal_exit_codes")),
                "command": list(task.run.command),
                "env": [list(pair) for pair in task.run.env],
                "fatal_exit_codes": list(task.run.fatal_exit_codes),
            },
        }
        for task in job.tasks
    ]
    return document


def spec_from_document(document: Mapping[str, Any]) -> JobSpec:
    """The JobSpec a document holds (see `spec_document`); fields it lacks take their defaults."""
    tasks = []
    for task in document["tasks"]:
        run = task.get("run") or {}
        tasks.append(
            TaskSpec(
                **_known(TaskSpec, task, skip=("demands", "run")),
                demands=tuple((family, Resources(*vector)) for family, vector in task["demands"]),
                run=TaskRun(
                    **_known(TaskRun, run, skip=("command", "env", "fatal_exit_codes")),
                    command=tuple(run.get("command", ())),
                    env=tuple((name, value) for name, value in run.get("env", ())),
                    fatal_exit_codes=tuple(run.get("fatal_exit_codes", ())),
                ),
            )
        )
    return JobSpec(
        **_known(JobSpec, document, skip=("tasks", "trace")),
        tasks=tuple(tasks),
        trace=TraceFacts(**_known(TraceFacts, document.get("trace") or {})),
    )


def _fields(value: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value) if f.name not in skip}


def _known(cls: type, document: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        f.name: document[f.name] for f in fields(cls) if f.name in document and f.name not in skip
    }
