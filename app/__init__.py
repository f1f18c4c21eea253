"""The application: the `autoscaler` command line and the daemon, built from the bindings.

- `cli`, `commands/`: the command line, one module per group of commands
  (`plan`, `replay` and `trace`, `catalog`, `db`, and the cluster's: `init`,
  `daemon`, `submit`, `jobs`, `status`, `cost-report`, `down`, …).
- `daemon`, `api` (+ `v1/api.proto`), `leader`, `metrics`, `notify`: the
  long-running service: APScheduler ticks driving the core's `ControlLoop`, the
  gRPC submission API, one leader per cluster, Prometheus metrics, webhook
  notifications sent from the state's outbox by a thread of their own.
- `config`, `state_config`, `init`, `jobfile`: the files users own (the
  cluster's TOML, job files) and `autoscaler init`, which writes them.
- `wiring`: the one place that picks a binding for each interface from the
  configuration (EC2 or the local cloud, SQL state, the gRPC executor), with
  the cloud's way for workers to prove their instance and the executor's view
  of the state (`StateLedger`).
- `files`, `validation`, `cli_io`, `table`, `reports`, `replay_report`,
  `bundled`: reading users' files with one-line errors, command-line values and
  outputs, tables, cost reports; `schemas`: the formats' published JSON Schemas.

Only this package imports the bindings; nothing imports it.
"""
