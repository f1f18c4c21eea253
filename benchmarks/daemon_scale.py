"""The daemon at scale: 10,000 jobs submitted through the API, and a round over 10,000 tasks.

1. Submission: N one-task jobs through the real gRPC API (TLS, token) into the
   SQL state, one call each, as `autoscaler submit` makes them. Printed: jobs
   per second, and the ratio to the store's own `submit_job` timed in the same
   run (the API's overhead beyond the database).
2. A round over N active tasks on the SQL state: sync, snapshot, decide,
   record, act (launching into a cloud that answers at once), timed against
   the planner alone on the same snapshot. The round's overhead beyond
   planning should stay a small multiple of planning.

The database is `--url` (or `$AUTOSCALER_BENCH_DATABASE_URL`); PostgreSQL is
what the issue asks for. Without one, a SQLite file in a temporary directory.
Each part wipes the database it is given, so it must be an empty one (which the
benchmark then marks as its own): one holding other tables, such as a cluster's
state, is refused with exit 2 and left as it was.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc

from app.api import ApiClient, SubmissionService, UserAuth, add_submission
from app.config import load_cluster_config
from app.init import DAEMON_NAME, init_cluster
from app.table import format_table
from app.users import Authenticator
from app.wiring import daemon_security, first_admin
from autoscaler import control
from autoscaler.cloud import AvailabilityCache, CloudInstance, LaunchRequest
from autoscaler.control import ControlLoop
from autoscaler.decide import ControlOptions
from autoscaler.errors import InputError
from autoscaler.planner import planner_by_name
from autoscaler.store import StateCounts
from benchmarks.timing import timed, timed_cpu
from benchmarks.workloads import pai_catalog_and_jobs, sample_jobs
from executor.security import read_token, secure_channel, server_options


class InstantCloud:
    """A cloud whose instances exist the moment they are asked for (no delays, no API)."""

    def __init__(self, catalog) -> None:
        self._catalog = catalog
        self.instances: dict[str, CloudInstance] = {}
        self.availability = AvailabilityCache()

    def catalog(self):
        return self._catalog

    def launch(self, request: LaunchRequest) -> CloudInstance:
        found = self.instances.get(request.instance_id)
        if found is None:
            found = CloudInstance(
                f"i-{len(self.instances):08d}",
                request.instance_type,
                "running",
                "local",
                request.instance_id,
                0.0,
            )
            self.instances[request.instance_id] = found
        return found

    def terminate(self, ids) -> None:
        gone = set(ids)
        self.instances = {k: v for k, v in self.instances.items() if v.cloud_id not in gone}

    def list(self):
        return list(self.instances.values())

    def unavailable(self):
        return []


class NoWorkers:
    def start(self, launch) -> None: ...

    def stop(self, task_id, attempt) -> None: ...

    def report(self):
        from autoscaler.execution import ExecutorReport

        return ExecutorReport()

    def acknowledge(self, task_id, attempt) -> None: ...

    def release(self, instance_id) -> None: ...


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t


#: The table that marks a database as this benchmark's own (`fresh_store`).
OWNED_MARKER = "autoscaler_benchmark_owned"


def fresh_store(url: str | None, directory: Path):
    """An empty state for one part of the benchmark: in a SQLite file of `directory`,
    or in the database `url` names, wiped first — only an empty one or one this
    benchmark marked as its own (`OWNED_MARKER`): a state database given by mistake is
    refused (InputError), never wiped."""
    from sqlalchemy import MetaData, inspect, text

    from state.database import create_state_engine, shown
    from state.migrate import upgrade
    from state.store import SqlStore

    if url is None:
        for old in directory.glob("bench.db*"):
            old.unlink()
        url = f"sqlite:///{directory / 'bench.db'}"
    engine = create_state_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        if tables and OWNED_MARKER not in tables:
            raise InputError(
                f"holds {len(tables)} table(s) this benchmark did not create "
                f"(e.g. {sorted(tables)[0]!r}), and it wipes the database it is given: "
                "name an empty database",
                source=shown(url),
            )
        if engine.dialect.name == "postgresql":  # an empty schema for each part
            with engine.begin() as conn:
                conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
        else:
            old_tables = MetaData()
            old_tables.reflect(engine)
            old_tables.drop_all(engine)  # in the order their foreign keys allow
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {OWNED_MARKER} (at INTEGER)"))
        upgrade(engine)
    finally:
        engine.dispose()
    return SqlStore(url), url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks daemon", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--url", default=os.environ.get("AUTOSCALER_BENCH_DATABASE_URL"))
    parser.add_argument(
        "--round-only", action="store_true", help="skip part 1 (submission through the API)"
    )
    args = parser.parse_args(argv)
    try:
        run(args)
    except InputError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def run(args: argparse.Namespace) -> None:
    catalog, source = pai_catalog_and_jobs()
    jobs = sample_jobs(source, args.jobs, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        print(f"database: {args.url or 'SQLite (a temporary file; give --url for PostgreSQL)'}")
        if not args.round_only:
            submission(directory, args.url, catalog, jobs)
        a_round(directory, args.url, catalog, jobs)


def submission(directory: Path, url: str | None, catalog, jobs) -> None:
    init_cluster(directory / "cluster", name="bench", local=True)
    config = load_cluster_config(directory / "cluster" / "autoscaler.toml")
    store, _ = fresh_store(url, directory)
    service = SubmissionService(store, None, lambda: catalog)  # type: ignore[arg-type]
    credentials = daemon_security(config)
    first_admin(config, store, 0.0)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=[UserAuth(Authenticator(service.accounts), service.accounts)],
        options=server_options(),
    )
    add_submission(server, service)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    ca = config.secrets.ca_cert.read_bytes()
    token = read_token(config.secrets.api_token)
    channel = secure_channel(f"127.0.0.1:{port}", ca, token, server_name=DAEMON_NAME)
    client = ApiClient(channel, f"127.0.0.1:{port}")
    print(f"\n1. submitting {len(jobs):,} jobs through the API …", flush=True)
    api_s, _ = timed(lambda: [client.submit(j) for j in jobs])
    client.close()
    server.stop(None)
    store.close()
    store, _ = fresh_store(url, directory)
    renamed = [replace(j, job_id=f"direct-{j.job_id}") for j in jobs]
    direct_s, _ = timed(
        lambda: [store.submit_job(j, owner="bench", at=0.0) for j in _retag(renamed)]
    )
    store.close()
    print(
        format_table(
            ["path", "jobs", "seconds", "jobs/s", "÷ store alone"],
            [
                (
                    "API (gRPC, TLS, token)",
                    f"{len(jobs):,}",
                    f"{api_s:.1f}",
                    f"{len(jobs) / api_s:,.0f}",
                    f"{api_s / direct_s:.2f}x",
                ),
                (
                    "store.submit_job alone",
                    f"{len(jobs):,}",
                    f"{direct_s:.1f}",
                    f"{len(jobs) / direct_s:,.0f}",
                    "1.00x",
                ),
            ],
            [False, True, True, True, True],
        )
    )


def _retag(jobs):
    """Jobs whose task ids follow their new job id."""
    out = []
    for job in jobs:
        tasks = tuple(
            replace(t, task_id=f"{job.job_id}/{t.name}", job_id=job.job_id) for t in job.tasks
        )
        out.append(replace(job, tasks=tasks))
    return out


def a_round(directory: Path, url: str | None, catalog, jobs) -> None:
    store, _ = fresh_store(url, directory)
    for job in jobs:
        store.submit_job(job, owner="bench", at=0.0)
    clock = Clock()
    options = ControlOptions()
    cloud = InstantCloud(catalog)
    planner = planner_by_name("eva")
    tasks = sum(len(j.tasks) for j in jobs)
    print(f"\n2. a round over {tasks:,} active tasks …", flush=True)
    loop = ControlLoop(planner, cloud, NoWorkers(), store, clock, options)
    planning = _PlanningCpu()
    with planning:
        first_s, first_cpu, first = timed_cpu(loop.schedule)
        first_planning_cpu = planning.take()
        clock.t += 300
        again = ControlLoop(planner_by_name("eva"), cloud, NoWorkers(), store, clock, options)
        second_s, second_cpu, second = timed_cpu(again.schedule)
        second_planning_cpu = planning.take()
    launches = sum(1 for a in first.record.actions if a.kind == "launch")
    # The daemon's metrics after each round: counted by the store, against counting a full
    # snapshot (a fresh store's: what the metrics read before), same figures.
    counts_s, counts_cpu, counts = timed_cpu(store.state_counts)
    from state.store import SqlStore

    fresh = SqlStore(store.engine)
    full_s, full_cpu, full = timed_cpu(
        lambda: StateCounts.of(fresh.snapshot(with_throughput=False))
    )
    assert counts == full, "the metrics' counts differ from the snapshot's"
    store.close()
    rows = [
        (f"first round ({launches:,} launches)", first, first_s, first_cpu, first_planning_cpu),
        ("next round (planner anew; no change)", second, second_s, second_cpu, second_planning_cpu),
    ]
    print(
        format_table(
            ["round", "planning s", "round s", "÷ planning", "planning CPU", "round CPU", "CPU ÷"],
            [
                (
                    name,
                    f"{o.planning_seconds:.2f}",
                    f"{s:.2f}",
                    f"{s / o.planning_seconds:.2f}x",
                    f"{p:.2f}",
                    f"{c:.2f}",
                    f"{c / p:.2f}x",
                )
                for name, o, s, c, p in rows
            ],
            [False, True, True, True, True, True, True],
        )
    )
    print(
        format_table(
            ["metrics after a round", "s", "CPU"],
            [
                ("store.state_counts()", f"{counts_s:.3f}", f"{counts_cpu:.3f}"),
                ("counting a full snapshot", f"{full_s:.3f}", f"{full_cpu:.3f}"),
            ],
            [False, True, True],
        )
    )
    print(
        "CPU: this process's CPU time (a loaded machine stretches wall time, not CPU time; "
        "the database server's work on PostgreSQL is in wall time only)."
    )
    print(
        "\nThe round's overhead beyond planning is the state's reads and writes "
        "(sync and its snapshot, one transaction for the decision, one for the launches' answers, "
        "and the step after the round with its own snapshot). The next round's snapshots "
        "read only the rows written since the previous one (`SqlStore.snapshot`)."
    )


class _PlanningCpu:
    """The CPU seconds spent in the round's `decide` (the planning the round's table
    divides by), counted while in use by wrapping the control loop's `decide`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> _PlanningCpu:
        self._decide = control.decide

        def counted(*args, **kwargs):
            started = time.process_time()
            try:
                return self._decide(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - started

        control.decide = counted  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        control.decide = self._decide  # type: ignore[assignment]

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


if __name__ == "__main__":
    started = time.time()
    main()
    print(f"\n({time.time() - started:.0f} s in all)")
