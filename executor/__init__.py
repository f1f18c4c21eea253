"""The `Executor` binding: a worker agent per instance, and the daemon's client of it.

- Worker side (installed alone on every instance, `autoscaler-worker`, its own
  wheel from `distribution`): `cli` (its entry point), `agent` (registration,
  heartbeats, composition), `attempts` (each attempt from start to its final
  state, and adoption after a restart), `artifacts` (image, checkpoint, log),
  `servicer` (the gRPC service the daemon calls), `runtime` (Docker), `storage`
  (S3 or a directory, and the one key layout), `packing` (the one archive
  format: contexts and checkpoints), `security` (TLS, tokens), `images` (a base
  image with no registry).
- Daemon side: `client.GrpcExecutor`, the production `Executor`.
- Job side: `reporter`, standard library only, copied into job images.
- Between them: `protos/worker.proto` and `messages` (its one encoding of a task launch).

It imports only the core's interfaces, and never numpy, HiGHS or SQLAlchemy.
"""
