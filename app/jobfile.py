"""Job files: what a user submits, checked before anything leaves their machine.

Our format (TOML):

    id = "train-1"                  # optional, unique; default: NAME-<8 hex>
    name = "resnet18"               # required: jobs of one name share what is learned
    full_throughput = 2.5           # optional: iterations per second alone
    max_tasks_per_instance = 1      # optional: spread the tasks (anti-affinity)
    init_delay_s = 10               # optional: how long it takes to resume

    [tasks.node0]
    context = "train"               # a directory holding a Dockerfile (relative to this file)
    # image = "autoscaler/python:3.11"   # an existing image instead of a context
    command = ["python", "train.py"]
    env = { EPOCHS = "3" }
    demand = { any = [0, 1, 2] }    # [gpu, cpu cores, ram GiB], on any family or per family
    shm_size_gb = 1
    network = false                 # containers get no network unless a task asks
    replicas = 2                    # data-parallel copies: node0-0, node0-1

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
from typing import Any

from pydantic import Field, field_validator, model_validator

from app.files import decode_text, read_input_file
from app.validation import Delay, Identifier, NonNegative, Positive, Strict, parse_model
from autoscaler.catalog import Catalog
from autoscaler.errors import InputError
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
    workload_key,
)
from autoscaler.resources import Resources
from executor.packing import pack_context as pack_context  # what `submit` uploads

Vector = tuple[NonNegative, NonNegative, NonNegative]


class TaskFile(Strict):
    context: str | None = None
    image: str | None = None
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    demand: dict[str, Vector]
    shm_size_gb: Positive | None = None
    network: bool = False
    replicas: int = Field(1, ge=1, le=1000)
    fetch_s: Delay = DEFAULT_FETCH_S
    build_s: Delay = DEFAULT_BUILD_IMAGE_S
    kill_s: Delay = DEFAULT_KILL_S
    upload_s: Delay = DEFAULT_UPLOAD_S

    @field_validator("demand")
    @classmethod
    def _demands(cls, value: dict[str, Vector]) -> dict[str, Vector]:
        if not value:
            raise ValueError("needs at least one vector: { any = [gpu, cpu, ram_gb] }")
        for family, vector in value.items():
            if not family or not family.replace("-", "").isalnum():
                raise ValueError(f"{family!r} is not an instance family (or 'any')")
            problem = demand_problem(vector)
            if problem is not None:
                raise ValueError(f"{family} {problem.message}")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if (
                not name
                or not (name[0].isalpha() or name[0] == "_")
                or not all(c.isalnum() or c == "_" for c in name)
            ):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith("AUTOSCALER_"):
                raise ValueError(f"{name} is reserved: the worker sets AUTOSCALER_* itself")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> TaskFile:
        if (self.context is None) == (self.image is None):
            raise ValueError("give either 'context' (a directory with a Dockerfile) or 'image'")
        return self


class JobFile(Strict):
    id: Identifier | None = None
    name: Identifier
    full_throughput: Positive | None = None
    max_tasks_per_instance: int | None = Field(None, ge=1)
    init_delay_s: Delay = DEFAULT_INIT_S
    tasks: dict[Identifier, TaskFile]

    @field_validator("tasks")
    @classmethod
    def _some(cls, value: dict[str, TaskFile]) -> dict[str, TaskFile]:
        if not value:
            raise ValueError("needs at least one task: [tasks.NAME]")
        return value


@dataclass(frozen=True, slots=True)
class Submission:
    """A checked job and the build contexts its tasks need uploaded (task id -> directory)."""

    job: JobSpec
    contexts: Mapping[str, Path]


def load_job_file(path: str | Path, catalog: Catalog | None) -> Submission:
    """Read, check and resolve one job file (ours in TOML, or Eva's config.json).

    Without a catalog, everything but the demands' fit is checked: a mistake in
    the file is found before any daemon is asked for its catalog.
    """
    p = Path(path)
    text = decode_text(read_input_file(p, "job"), "job", str(p))
    if p.suffix == ".json":
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"malformed JSON at line {exc.lineno}: {exc.msg}", source=str(p)
            ) from None
        data = _from_eva(data, str(p))
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"malformed TOML: {exc}", source=str(p)) from None
    parsed = parse_model(JobFile, data, source=str(p))
    submission = _resolve(parsed, p.parent, str(p))
    if catalog is not None:
        validate_against_catalog((submission.job,), catalog, source=str(p))
    return submission


def _from_eva(data: Any, source: str) -> Any:
    """Eva's `config.json` in our schema (its task names may repeat: tasks are numbered)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), list):
        raise InputError("must be an object with a 'tasks' list (Eva's config.json)", source=source)
    delays = {
        "fetch_s": data.get("fetch_delay"),
        "build_s": data.get("build_image_delay"),
        "kill_s": data.get("kill_delay"),
        "upload_s": data.get("upload_delay"),
    }
    tasks: dict[str, Any] = {}
    throughputs = []
    for i, task in enumerate(data["tasks"]):
        if not isinstance(task, Mapping):
            raise InputError("must be an object", source=source, where=f"tasks[{i}]")
        entry = {
            "context": task.get("dir", "."),
            "demand": task.get("demand"),
            **{k: v for k, v in delays.items() if v is not None},
        }
        if task.get("shm_size") is not None:
            entry["shm_size_gb"] = task["shm_size"]
        tasks[f"{task.get('name', 'task')}-{i}"] = entry
        if task.get("full_throughput") is not None:
            throughputs.append(task["full_throughput"])
    out: dict[str, Any] = {"name": data.get("name"), "tasks": tasks}
    if throughputs:
        out["full_throughput"] = min(throughputs)
    if data.get("init_delay") is not None:
        out["init_delay_s"] = data["init_delay"]
    return out


def _resolve(parsed: JobFile, base: Path, source: str) -> Submission:
    job_id = parsed.id or f"{parsed.name}-{secrets.token_hex(4)}"
    tasks: list[TaskSpec] = []
    contexts: dict[str, Path] = {}
    for key, task in parsed.tasks.items():
        directory = None
        if task.context is not None:
            directory = (base / task.context).resolve()
            where = f"task {key!r}"
            if not directory.is_dir():
                raise InputError(
                    "is not a directory",
                    source=source,
                    where=where,
                    field="context",
                    value=task.context,
                    has_value=True,
                )
            if not (directory / "Dockerfile").is_file():
                raise InputError(
                    "has no Dockerfile",
                    source=source,
                    where=where,
                    field="context",
                    value=task.context,
                    has_value=True,
                )
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
    )
    return Submission(job, contexts)


def with_contexts(job: JobSpec, refs: Mapping[str, str]) -> JobSpec:
    """The job with each task's uploaded build context (task id -> stored ref)."""
    tasks = tuple(
        replace(t, run=replace(t.run, build_context=refs[t.task_id])) if t.task_id in refs else t
        for t in job.tasks
    )
    return replace(job, tasks=tasks)
