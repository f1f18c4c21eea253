"""The worker's gRPC service (`autoscaler.worker.v1.Worker`): what the daemon calls.

It only translates: a request into the attempt runner's call, the runner's
refusals into gRPC status codes (a malformed launch INVALID_ARGUMENT, a launch
the worker refuses FAILED_PRECONDITION). Who may call it is the agent's
`TokenAuth` interceptor's business, not this one's.
"""

from __future__ import annotations

from typing import Any

import grpc

from executor.attempts import AttemptRunner, Rejected
from executor.messages import BadMessage, launch_from_pb
from executor.protos import worker_pb2 as pb
from executor.protos import worker_pb2_grpc as pb_grpc


class WorkerService(pb_grpc.WorkerServicer):
    """StartTask, StopTask and ListTasks over the attempts of one worker."""

    def __init__(self, attempts: AttemptRunner) -> None:
        self.attempts = attempts

    def StartTask(self, request: pb.StartTaskRequest, context: grpc.ServicerContext) -> Any:
        try:
            launch = launch_from_pb(request)
            return pb.StartTaskResponse(status=self.attempts.start(launch))
        except BadMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Rejected as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def StopTask(self, request: pb.StopTaskRequest, context: grpc.ServicerContext) -> Any:
        status = self.attempts.stop(request.task_id, request.attempt)
        if status is None:
            return pb.StopTaskResponse(known=False)
        return pb.StopTaskResponse(known=True, status=status)

    def ListTasks(self, request: pb.ListTasksRequest, context: grpc.ServicerContext) -> Any:
        return pb.ListTasksResponse(tasks=self.attempts.statuses())
