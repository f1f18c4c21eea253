"""Between the Executor contract's dataclasses and the worker protocol's messages.

One place converts, in both directions, so the daemon and the agent cannot
disagree on what a field means.
"""

from __future__ import annotations

import re
from typing import cast

from autoscaler.execution import FailureClass, ResourceLimits, TaskLaunch, TaskReport, TaskState
from autoscaler.jobs import TaskRun
from executor.protos import worker_pb2 as pb

_STATE_TO_PB: dict[str, int] = {
    "starting": pb.TASK_STATE_STARTING,
    "running": pb.TASK_STATE_RUNNING,
    "checkpointing": pb.TASK_STATE_CHECKPOINTING,
    "stopped": pb.TASK_STATE_STOPPED,
    "completed": pb.TASK_STATE_COMPLETED,
    "failed": pb.TASK_STATE_FAILED,
}
_STATE_FROM_PB: dict[int, str] = {number: name for name, number in _STATE_TO_PB.items()}

_FAILURE_TO_PB: dict[str, int] = {
    "deterministic": pb.FAILURE_CLASS_DETERMINISTIC,
    "transient": pb.FAILURE_CLASS_TRANSIENT,
    "infrastructure": pb.FAILURE_CLASS_INFRASTRUCTURE,
}
_FAILURE_FROM_PB: dict[int, str] = {number: name for name, number in _FAILURE_TO_PB.items()}

#: The trailing metadata of a FAILED_PRECONDITION with which the daemon says why it gave an
#: instance up: RELEASED (scale-in, drain, down: a normal end) or LOST.
ENDED_KEY = "autoscaler-instance-ended"
RELEASED, LOST = "released", "lost"

#: Agent and daemon refuse task ids and attempts they could not name files or keys after.
MAX_ID = 200

#: What an instance id (ours: a launch token) may look like: it names files and certificates.
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class BadMessage(ValueError):
    """A message misses a field or holds a value no sender of ours would send."""


def state_to_pb(state: str) -> int:
    return _STATE_TO_PB[state]


def state_from_pb(value: int) -> TaskState:
    try:
        return cast(TaskState, _STATE_FROM_PB[value])
    except KeyError:
        raise BadMessage(f"unknown task state {value}") from None


def failure_to_pb(failure: FailureClass | None) -> int:
    return pb.FAILURE_CLASS_UNSPECIFIED if failure is None else _FAILURE_TO_PB[failure]


def failure_from_pb(value: int) -> FailureClass | None:
    """The class a status carries; None when unspecified (or a value this side does not
    know: an agent newer than the daemon)."""
    return cast("FailureClass | None", _FAILURE_FROM_PB.get(value))


def launch_to_pb(
    launch: TaskLaunch, *, build_context_url: str = "", checkpoint_url: str = ""
) -> pb.StartTask:
    """The start command of `launch`, with the grants to read its build context and its
    checkpoint (presigned URLs the daemon made for this attempt)."""
    run, limits = launch.run, launch.limits
    request = pb.StartTask(
        task_id=launch.task_id,
        job_id=launch.job_id,
        attempt=launch.attempt,
        instance_id=launch.instance_id,
        workload=launch.workload,
        run=pb.TaskRun(
            build_context=run.build_context or "",
            image=run.image or "",
            command=list(run.command),
            env=[pb.EnvVar(name=k, value=v) for k, v in run.env],
            network=run.network,
            fatal_exit_codes=list(run.fatal_exit_codes),
        ),
        limits=pb.Limits(cpus=limits.cpus, memory_gb=limits.memory_gb, gpus=list(limits.gpus)),
        checkpoint=launch.checkpoint or "",
        build_context_url=build_context_url,
        checkpoint_url=checkpoint_url,
    )
    if run.shm_size_gb is not None:
        request.run.shm_size_gb = run.shm_size_gb
    if run.checkpoint_every_s is not None:
        request.run.checkpoint_every_s = run.checkpoint_every_s
    if limits.shm_size_gb is not None:
        request.limits.shm_size_gb = limits.shm_size_gb
    return request


def launch_from_pb(request: pb.StartTask) -> TaskLaunch:
    """The launch a request asks for; BadMessage names the field that is wrong."""
    if not request.task_id or len(request.task_id) > MAX_ID:
        raise BadMessage("task_id must be 1 to 200 characters")
    if not request.job_id or len(request.job_id) > MAX_ID:
        raise BadMessage("job_id must be 1 to 200 characters")
    if request.attempt < 1:
        raise BadMessage(f"attempt must be at least 1, got {request.attempt}")
    run = request.run
    if not run.build_context and not run.image:
        raise BadMessage("the task names neither a build context nor an image")
    if run.HasField("checkpoint_every_s") and not run.checkpoint_every_s > 0:
        raise BadMessage(f"checkpoint_every_s must be positive, got {run.checkpoint_every_s}")
    limits = request.limits
    if not limits.cpus > 0 or not limits.memory_gb > 0:
        raise BadMessage(
            f"limits must be positive, got {limits.cpus} cores and {limits.memory_gb} GiB"
        )
    return TaskLaunch(
        task_id=request.task_id,
        job_id=request.job_id,
        attempt=request.attempt,
        instance_id=request.instance_id,
        workload=request.workload,
        run=TaskRun(
            build_context=run.build_context or None,
            image=run.image or None,
            command=tuple(run.command),
            env=tuple(sorted((e.name, e.value) for e in run.env)),
            shm_size_gb=run.shm_size_gb if run.HasField("shm_size_gb") else None,
            network=run.network,
            checkpoint_every_s=(
                run.checkpoint_every_s if run.HasField("checkpoint_every_s") else None
            ),
            fatal_exit_codes=tuple(run.fatal_exit_codes),
        ),
        limits=ResourceLimits(
            cpus=limits.cpus,
            memory_gb=limits.memory_gb,
            gpus=tuple(limits.gpus),
            shm_size_gb=limits.shm_size_gb if limits.HasField("shm_size_gb") else None,
        ),
        checkpoint=request.checkpoint or None,
    )


def report_from_pb(status: pb.TaskStatus, instance_id: str | None) -> TaskReport:
    state = state_from_pb(status.state)
    return TaskReport(
        task_id=status.task_id,
        state=state,
        instance_id=instance_id,
        attempt=status.attempt,
        progress=status.iterations,
        throughput=(
            status.throughput if state == "running" and status.HasField("throughput") else None
        ),
        checkpoint=status.checkpoint or None,
        exit_code=status.exit_code if status.HasField("exit_code") else None,
        reason=status.reason,
        phases=dict(status.phases),
        log_tail=tuple(status.log_tail),
        failure=failure_from_pb(status.failure) if state in ("failed", "stopped") else None,
    )
