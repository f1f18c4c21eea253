"""The `Executor` binding: a worker agent per instance, and the daemon's client of it.

- Worker side (installed alone on every instance, `autoscaler-worker`): `cli`
  (its entry point), `agent` (registration, heartbeats, the gRPC servicer),
  `runtime` (Docker), `storage` (S3 or a directory), `security` (TLS, tokens),
  `images` (a base image with no registry).
- Daemon side: `client.GrpcExecutor`, the production `Executor`.
- Job side: `reporter`, standard library only, copied into job images.
- Between them: `protos/worker.proto` and `messages` (its one encoding of a task launch).

It imports only the core's interfaces, and never numpy, HiGHS or SQLAlchemy.
"""
