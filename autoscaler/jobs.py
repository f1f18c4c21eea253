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
is ours: `max_tasks_per_instance` (anti-affinity). Its strict schema and reader
are the application's (`app.files.TraceJob`, `jobs_from_eva`): the core reads
no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

from autoscaler.catalog import ANY_FAMILY, Catalog, InstanceType
from autoscaler.errors import InputError
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
    team: str = ""  # whose fair share of a binding budget it spends ("": no team)


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
    # Its place in its team's queue when the budget binds (higher first; None: the team's
    # default), held within the team's bound (`autoscaler.fairshare`).
    priority: int | None = None
    # Dollars the job may be charged (its attributed spend, `autoscaler.spend`): reached,
    # it is checkpointed and stopped — an infrastructure stop, not a failure. None: no cap.
    max_cost: float | None = None
    # Which markets its tasks may run on: "auto" (spot or on-demand, by effective price),
    # "spot" or "on-demand" (`autoscaler.spot`).
    capacity: str = "auto"
    # Finish within this many seconds of submission (None: no deadline), or within this
    # factor of its running time alone when that is known; as the slack runs out it is
    # pinned to on-demand (`autoscaler.spot.pinned_on_demand`).
    deadline_s: float | None = None
    max_jct_factor: float | None = None

    @property
    def is_multi_task(self) -> bool:
        return len(self.tasks) > 1

    @property
    def anti_affinity(self) -> int | None:
        """The per-instance limit when it can bind (fewer than all tasks), else None."""
        limit = self.max_tasks_per_instance
        return limit if limit is not None and limit < len(self.tasks) else None


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


def without_missing_families(job: JobSpec, catalog: Catalog) -> tuple[JobSpec, tuple[str, ...]]:
    """The job with each task's demand on a family no catalog type has dropped, when
    another of its listed families (or `any`) is in the catalog; a note for each.

    Eva's `config.json` lists a demand per family it was measured on; a cluster
    that lacks one of them can still run the task on the others. A task all of
    whose families are missing keeps them, for `validate_against_catalog` to refuse.
    """
    families = catalog.families
    notes: list[str] = []
    tasks = []
    for task in job.tasks:
        known = tuple((f, d) for f, d in task.demands if f == ANY_FAMILY or f in families)
        missing = [f for f, _ in task.demands if f != ANY_FAMILY and f not in families]
        if missing and known:
            notes.append(
                f"task {task.task_id!r}: ignored family {', '.join(sorted(missing))} "
                f"(no such type in the catalog); it runs on {', '.join(f for f, _ in known)}"
            )
            task = replace(task, demands=known)
        tasks.append(task)
    if not notes:
        return job, ()
    return replace(job, tasks=tuple(tasks)), tuple(notes)


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
