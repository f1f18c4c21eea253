"""The `Executor` binding: a worker agent per instance, and the daemon's client of it.

Trust (ARCHITECTURE "Trust and identity"): workers dial out and nothing dials
a worker. A worker enrolls by proving its instance (`enrollment`: EC2's signed
identity document, checked by `provisioners.identity`, or the local cloud's
one-time secret) and gets a short-lived client certificate from the worker CA
naming that instance (`security`); the daemon's server certificate comes from
a separate server CA every client pins. Every later call is mutual TLS, and
the daemon judges it by its state: reports only for attempts placed on the
caller, checkpoints only under the attempt's prefix, storage only through
grants (presigned URLs) refused once an attempt is given up (fencing).

- Worker side (installed alone on every instance, `autoscaler-worker`, its own
  wheel from `distribution`): `cli` (its entry point), `agent` (enrollment,
  renewal, heartbeats, the command stream, composition), `attempts` (each
  attempt from start to its final state, adoption after a restart, fencing),
  `artifacts` (image, checkpoint, log, through grants), `runtime` (Docker),
  `interruption` (spot interruption notices and rebalance recommendations, polled
  from IMDSv2), `storage` (the one key layout; S3 or a directory for the daemon, `download`
  and `upload` with a grant for the worker), `packing` (the one archive
  format: contexts and checkpoints), `enrollment` (proofs), `security` (TLS,
  certificates, tokens), `images` (a base image with no registry).
- Daemon side: `client.GrpcExecutor`, the production `Executor`, and the
  `Ledger` through which it reads the state.
- Job side: `reporter`, standard library only, copied into job images.
- Between them: `protos/worker.proto` (`autoscaler.worker.v2`) and `messages`
  (its one encoding of a task launch).

It imports only the core's interfaces, and never numpy, HiGHS or SQLAlchemy.
"""
