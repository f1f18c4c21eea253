"""The cluster commands: init, daemon, submit, jobs, job, cancel, logs, status, cost-report.

`init` writes a configuration and the cluster's secrets; `daemon` runs the
cluster; `submit`, `jobs`, `job`, `cancel`, `logs` and `status` talk to the
daemon's API (TLS, the user's token: `$AUTOSCALER_TOKEN_FILE`, else the
cluster's `secrets/api.token`); `cost-report` reads the state database
alone, daemon running or not, and calls no cloud.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import textwrap
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.cli_io import add_json, note, print_json, progress
from app.config import ClusterConfig, load_cluster_config
from app.down import DEFAULT_GRACE_S
from app.table import format_table, money, shorten
from app.validation import (
    PLOT_FORMATS,
    atomic_output,
    check_outputs,
    number_arg,
    output_path,
    parse_since,
    state_files,
)
from autoscaler.errors import InputError

FINAL = ("completed", "cancelled", "failed")


def register(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser(
        "init",
        help="write a cluster configuration and create its CAs, certificate and API token",
        description="Write DIR/autoscaler.toml (commented, safe defaults) and DIR/secrets/ "
        "(the server CA, the daemon's certificate, the worker CA and the API token; mode "
        "0600). Run again, it keeps every file that exists.",
    )
    init.add_argument("--dir", type=Path, default=Path("."), help="where to write (default .)")
    init.add_argument("--name", default=None, help="cluster name (default: a new unique one)")
    init.add_argument(
        "--local",
        action="store_true",
        help="instances are worker agents on this machine; storage and state in DIR",
    )
    init.add_argument("--region", default="us-east-1", help="AWS region (default us-east-1)")
    init.add_argument("--bucket", default=None, help="S3 bucket for contexts and checkpoints")
    add_json(init)
    init.set_defaults(func=cmd_init)

    daemon = sub.add_parser(
        "daemon",
        help="run the cluster: rounds, the submission API, workers, metrics",
        description="Run the autoscaler for the cluster of --config until SIGTERM or SIGINT "
        "(instances keep running; a restart continues from the database).",
    )
    _config(daemon)
    daemon.add_argument(
        "--dry-run",
        action="store_true",
        help="decide and record every round, launch and terminate nothing",
    )
    daemon.add_argument(
        "--check",
        action="store_true",
        help="check the configuration as the daemon's start does (addresses, secrets and "
        "their modes, storage, the database URL, the catalog), print what it found and exit",
    )
    daemon.set_defaults(func=cmd_daemon)

    submit = sub.add_parser(
        "submit",
        help="submit a job (a TOML job file, or Eva's config.json)",
        description="Check the job file against the cluster's catalog, upload its build "
        "contexts (once each, honouring .dockerignore), and queue it.",
    )
    submit.add_argument("job_file", type=Path, nargs="+", metavar="JOB")
    submit.add_argument("--wait", action="store_true", help="wait until the job(s) finish")
    submit.add_argument(
        "--quote",
        action="store_true",
        help="submit nothing: print what each job would cost at the cluster's current packing, "
        "beside its price with no packing and its share of the LP lower bound",
    )
    submit.add_argument(
        "--duration",
        type=number_arg(0.0, 10 * 365 * 86400.0, low_open=True),
        default=0.0,
        metavar="SECONDS",
        help="with --quote: how long the job runs, for its total cost",
    )
    submit.add_argument(
        "--iterations",
        type=number_arg(0.0, 1e18, low_open=True),
        default=0.0,
        metavar="N",
        help="with --quote: how many iterations it runs (at --throughput, else the job's "
        "full_throughput), for its total cost",
    )
    submit.add_argument(
        "--throughput",
        type=number_arg(0.0, 1e12, low_open=True),
        default=0.0,
        metavar="PER_S",
        help="with --quote: its iterations per second alone",
    )
    add_json(submit)
    _config(submit)
    submit.set_defaults(func=cmd_submit)

    down = sub.add_parser(
        "down",
        help="checkpoint every task, then terminate every instance of the cluster "
        "(stop the daemon first)",
        description="Ask every running task to checkpoint and stop (bounded by --grace), "
        "upload what they saved, remove whatever of the cluster is left (agents and "
        "containers on this host, found by their marks even when their records or the "
        "daemon are gone; on EC2 every instance tagged with the cluster), terminate every "
        "instance, and record it. Jobs stay queued: the next `autoscaler daemon` names "
        "them (its `resuming` event) and resumes each task from its newest checkpoint; "
        "`cancel` gives a job up.",
    )
    down.add_argument("--yes", action="store_true", help="do it (without it: only list)")
    down.add_argument(
        "--grace",
        type=_grace,
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help=f"how long tasks may take to checkpoint and stop (default: {DEFAULT_GRACE_S:g})",
    )
    down.add_argument(
        "--now",
        action="store_true",
        help="skip the grace: stop everything at once (tasks resume from their last "
        "checkpoint uploaded while they ran)",
    )
    add_json(down)
    _config(down)
    down.set_defaults(func=cmd_down)

    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--status", nargs="+", default=None, choices=["queued", "running", *FINAL])
    jobs.add_argument(
        "--limit", type=number_arg(0, 10**9, integer=True), default=0, help="the latest N (0: all)"
    )
    jobs.add_argument(
        "--wait",
        action="store_true",
        help="first wait until every unfinished job has finished (exit 1 if one did not complete)",
    )
    add_json(jobs)
    _config(jobs)
    jobs.set_defaults(func=cmd_jobs)

    job = sub.add_parser("job", help="one job: its tasks, where they run, progress, cost")
    job.add_argument("job_id", metavar="ID", help="a job id, or the name of one job")
    job.add_argument(
        "--show-secrets",
        action="store_true",
        help="show the tasks' env values (the job's owner or an admin only; hidden otherwise)",
    )
    add_json(job)
    _config(job)
    job.set_defaults(func=cmd_job)

    cancel = sub.add_parser("cancel", help="cancel a job (its tasks stop, its instances drain)")
    cancel.add_argument("job_id", metavar="ID")
    add_json(cancel)
    _config(cancel)
    cancel.set_defaults(func=cmd_cancel)

    drain = sub.add_parser(
        "drain",
        help="move every task off an instance (then terminate it), or one job's tasks",
        description="Mark an instance draining: the next round places its tasks elsewhere; "
        "each keeps running until its new instance is ready, checkpoints, and resumes there. "
        "The instance terminates once empty. With --job, only that job's tasks move off the "
        "instances they run on; the instances and their other tasks stay.",
    )
    target = drain.add_mutually_exclusive_group(required=True)
    target.add_argument("instance_id", metavar="INSTANCE", nargs="?")
    target.add_argument(
        "--job",
        metavar="JOB",
        help="move only this job's tasks off the instances they run on (its id, or the "
        "name of one unfinished job): see a migration without looking up an instance",
    )
    drain.add_argument(
        "--wait",
        action="store_true",
        help="return once the moved tasks run again elsewhere (with --job: also first "
        "wait until its tasks run)",
    )
    drain.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="with --wait: give up waiting after this long (the move goes on; default 900)",
    )
    add_json(drain)
    _config(drain)
    drain.set_defaults(func=cmd_drain)

    logs = sub.add_parser("logs", help="the container logs of a job's tasks")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--task", default="", help="one task's name")
    logs.add_argument(
        "--tail", type=number_arg(0, 10**7, integer=True), default=0, help="last N lines of each"
    )
    add_json(logs)
    _config(logs)
    logs.set_defaults(func=cmd_logs)

    status = sub.add_parser("status", help="instances, $/h, and the last round's choice and why")
    add_json(status)
    _config(status)
    status.set_defaults(func=cmd_status)

    cost = sub.add_parser(
        "cost-report",
        help="spend so far, $/h now, what no packing would cost, the LP bound (from the database)",
        description="Costs from the state database alone (daemon running or not, no cloud "
        "call): spend per instance type and per job, $/h now, no packing's cost, the LP lower "
        "bound, the savings. --dry-run adds jobs hypothetically and shows what the next round "
        "would launch.",
    )
    cost.add_argument(
        "--since",
        default=None,
        metavar="T",
        help="only spend from T on: an ISO 8601 date or time (2026-11-23, 20261123T1000Z), "
        "a span back from now (12h, 7d, 2w), or epoch seconds marked with @ (@1700000000)",
    )
    add_json(cost)
    cost.add_argument(
        "--by",
        choices=("job", "user", "team"),
        default="job",
        help="group the spend by job (default), by the job's owner, or by the team it was "
        "submitted under: the same total, split otherwise",
    )
    cost.add_argument(
        "--plot",
        type=output_path(".png", PLOT_FORMATS),
        default=None,
        metavar="OUT.png",
        help="draw spend",
    )
    cost.add_argument(
        "--dry-run",
        type=Path,
        nargs="+",
        default=None,
        metavar="JOBS",
        help="job files added hypothetically: what the next round would launch for them",
    )
    cost.add_argument(
        "--what-if",
        action="store_true",
        help="add what the jobs since --since would have cost under each scheduler, replayed "
        "from the database (seconds to minutes: see `autoscaler replay --from-cluster`)",
    )
    _config(cost)
    cost.set_defaults(func=cmd_cost_report)


def _config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="TOML",
        help="cluster configuration (default: $AUTOSCALER_CONFIG, else ./autoscaler.toml)",
    )


# -- init and daemon ------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from app.init import init_cluster

    result = init_cluster(
        args.dir, name=args.name, local=args.local, region=args.region, bucket=args.bucket
    )
    config = load_cluster_config(result.config)
    if config.state.url.startswith("sqlite:"):
        from app.wiring import first_admin, open_state

        store = open_state(config, create=True)  # a local database is ready to report from
        try:
            first_admin(config, store, time.time())  # else the daemon's first start does it
        finally:
            store.close()
    admin_token = config.secrets.api_token
    if args.json:
        print_json(
            {
                "config": str(result.config),
                "written": [str(p) for p in result.written],
                "kept": [str(p) for p in result.kept],
                "admin_token": str(admin_token),
            }
        )
        return 0
    for path in result.written:
        print(f"wrote {path}")
    for path in result.kept:
        print(f"kept  {path} (exists; never overwritten)")
    if config.cloud.provider == "ec2":
        _init_policies(config)
    print(
        f"\nthe admin's token is in {admin_token} (mode 0600; the CLI uses it by default)\n"
        f"next: autoscaler daemon --config {result.config}\n"
        f"      autoscaler submit --config {result.config} JOB.toml\n"
        f"      autoscaler user add NAME --role submit --config {result.config}  (teammates)"
    )
    return 0


def _init_policies(config: ClusterConfig) -> None:
    """The IAM policies and lifecycle rule of an EC2 cluster, written beside its
    configuration once its bucket is known (else `deploy policy` writes them later)."""
    from app.commands.deploy import write_cluster_policies

    if "REPLACE-WITH-YOUR-BUCKET" in config.storage.url:
        print(
            "\nset [storage] url to your bucket, then write the cluster's IAM policies and "
            f"S3 lifecycle rule:\n  autoscaler deploy policy --config {config.path}"
        )
        return
    for path in write_cluster_policies(config):
        print(f"wrote {path} (from the configuration: write again after changing it)")


def cmd_daemon(args: argparse.Namespace) -> int:
    import signal

    from app.config import check_daemon_config
    from app.daemon import Daemon, configure_logging
    from app.wiring import build_bindings, daemon_security, first_admin, worker_security

    config = load_cluster_config(args.config)
    found = check_daemon_config(config)
    if args.check:
        print(f"{config.path}: the daemon would start: {'; '.join(found)}")
        return 0
    _private_log_files()
    configure_logging()
    bindings = build_bindings(config)
    credentials = daemon_security(config)
    first_admin(config, bindings.store, time.time())
    daemon = Daemon(
        config,
        bindings,
        dry_run=args.dry_run,
        server_credentials=credentials,
        worker_credentials=worker_security(config),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop.set())
    return daemon.run()


def _private_log_files() -> None:
    """The daemon's log, when standard output or error is a file of ours (`autoscaler daemon
    > daemon.log 2>&1`, made by the shell with its umask), readable by its owner alone:
    it names jobs, users and decisions."""
    import stat

    for fd in (1, 2):
        try:
            status = os.fstat(fd)
            if stat.S_ISREG(status.st_mode) and status.st_uid == os.getuid():
                os.fchmod(fd, stat.S_IMODE(status.st_mode) & 0o700)
        except OSError:
            continue


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be from 0 to 3600 seconds, got {text!r}")
    return value


def cmd_down(args: argparse.Namespace) -> int:
    from app.down import describe, graceful_down
    from app.wiring import build_cloud, open_state

    config = load_cluster_config(args.config)
    cloud = build_cloud(config)
    listed = cloud.list()
    if not args.yes:
        found = cloud.leftovers() if hasattr(cloud, "leftovers") else None
        known = {i.instance_id for i in listed}
        containers = [c for c, token in found.containers if token not in known] if found else []
        if args.json:
            print_json(
                {
                    "terminated": [],
                    "would_terminate": [describe(i) for i in listed],
                    "leftovers": {
                        "agents": list(found.agents) if found else [],
                        "containers": containers,
                    },
                }
            )
            return 0
        for inst in listed:
            print(
                f"would terminate {inst.instance_id or '?'} ({inst.cloud_id}, "
                f"{inst.instance_type}, {inst.state})"
            )
        if containers:
            print(f"would remove {len(containers)} leftover container(s) of ended instances")
        print(f"{len(listed)} instance(s); run again with --yes to terminate them")
        return 0
    from app.leader import LeaderLock
    from executor.storage import open_storage

    grace = 0.0 if args.now else args.grace
    store = open_state(config)
    # Holding the daemon's lock: no daemon relaunches what this terminates.
    leader = LeaderLock(store.engine, config.cluster.name)
    try:
        if not leader.try_acquire():
            raise InputError(
                f"a daemon is running for cluster {config.cluster.name!r} (it holds "
                f"{leader.holder}): stop it first (SIGTERM), or it relaunches for queued jobs",
                source=str(config.path),
            )
        try:
            if grace and listed:
                progress(
                    f"asking the tasks on {len(listed)} instance(s) to checkpoint and stop "
                    f"(at most {grace:g} s; --now skips this)"
                )
            report = graceful_down(
                store,
                cloud,
                open_storage(config.storage.url),
                time.time,
                grace_s=grace,
                waiting=lambda alive, waited: progress(
                    f"  {alive} agent(s) still checkpointing their tasks ({waited:.0f} s of "
                    f"{grace:g} s)"
                ),
            )
        finally:
            leader.release()
    finally:
        store.close()
    if args.json:
        print_json({**report.to_json(), "would_terminate": []})
        return 0
    print(render_down(report))
    return 0


def render_down(report: Any) -> str:
    """What `down` stopped: the tasks with the checkpoint each resumes from, the
    instances, and leftovers found beyond the records."""
    lines = []
    if report.tasks:
        rows = [
            (
                t.job_id,
                t.task_id,
                t.instance_id,
                t.attempt,
                "start" if t.checkpoint_step is None else t.checkpoint_step,
                t.saved,
            )
            for t in report.tasks
        ]
        lines.append(
            format_table(
                ["job", "task", "instance", "attempt", "resumes from step", "checkpoint saved"],
                rows,
                right=[False, False, False, True, True, False],
            )
        )
        lines.append("")
    gone = [i["instance"] for i in report.instances]
    lines.append(f"terminated {len(gone)} instance(s)" + (f": {', '.join(gone)}" if gone else ""))
    if report.leftover_agents or report.leftover_containers:
        lines.append(
            f"removed leftovers: {len(report.leftover_agents)} agent process(es), "
            f"{len(report.leftover_containers)} container(s)"
        )
    if report.unuploaded:
        lines.append(
            f"{len(report.unuploaded)} checkpoint(s) kept on disk could not be uploaded "
            "(run `down --yes` again): " + ", ".join(report.unuploaded)
        )
    if report.tasks:
        jobs = sorted({t.job_id for t in report.tasks})
        lines.append(
            f"{len(jobs)} job(s) stay queued and resume at the next `autoscaler daemon`: "
            + shorten(jobs)
        )
    return "\n".join(lines)


# -- talking to the daemon ----------------------------------------------------------------------


#: A file holding the user's token (mode 0600), when it is not the cluster's `api.token`.
TOKEN_FILE_ENV = "AUTOSCALER_TOKEN_FILE"


def connect(config: ClusterConfig):
    """A client of the daemon with the user's token: the file `$AUTOSCALER_TOKEN_FILE`
    names, else the cluster's `secrets/api.token` (the first admin's)."""
    from app.api import ApiClient
    from executor.security import DAEMON_NAME, read_token, secure_channel

    secrets = config.secrets
    try:
        ca = secrets.ca_cert.read_bytes()
        token = read_token(os.environ.get(TOKEN_FILE_ENV) or secrets.api_token)
    except (OSError, ValueError) as exc:  # missing, unsafe mode, not UTF-8 text
        raise InputError(
            f"cannot read the cluster's secrets: {exc}", source=str(config.path)
        ) from None
    channel = secure_channel(config.api_address, ca, token, server_name=DAEMON_NAME)
    return ApiClient(channel, config.api_address, str(secrets.ca_cert))


def _client(args: argparse.Namespace):
    return connect(load_cluster_config(args.config))


def cmd_submit(args: argparse.Namespace) -> int:
    from app.jobfile import load_job_file, with_contexts
    from autoscaler.jobs import validate_against_catalog, without_missing_families
    from provisioners.catalog import catalog_from_document

    if (args.duration or args.iterations or args.throughput) and not args.quote:
        raise InputError("--duration, --iterations and --throughput go with --quote")
    # The files first: a mistake in one needs no daemon to be reported.
    submissions = [load_job_file(path, None) for path in args.job_file]
    config = load_cluster_config(args.config)
    with connect(config) as client:
        catalog = catalog_from_document(client.catalog(), source="the daemon's catalog")
        for index, (path, submission) in enumerate(zip(args.job_file, submissions, strict=True)):
            job, notes = without_missing_families(submission.job, catalog)
            for note in notes:
                progress(f"{path}: {note}")
            submissions[index] = submission = dataclasses.replace(submission, job=job)
            validate_against_catalog((submission.job,), catalog, source=str(path))
        if args.quote:
            return _quote(client, [s.job for s in submissions], args)
        limit = int(config.limits.max_context_mb * 2**20)
        packed: dict[Path, tuple[Path, str]] = {}
        with tempfile.TemporaryDirectory(prefix="autoscaler-contexts-") as scratch:
            for submission in submissions:
                for directory in submission.contexts.values():
                    if directory not in packed:
                        progress(f"packing {directory} …")
                        out = Path(scratch) / f"{len(packed)}.tar.gz"
                        packed[directory] = (out, _pack(directory, out, limit))
            refs = client.upload_contexts({digest: out for out, digest in packed.values()})
        ids = []
        for submission in submissions:
            contexts = {
                task: refs[packed[directory][1]] for task, directory in submission.contexts.items()
            }
            ids.append(client.submit(with_contexts(submission.job, contexts)))
        if args.json:
            print_json({"jobs": ids})
        else:
            for job_id, submission in zip(ids, submissions, strict=True):
                print(f"submitted {job_id} ({len(submission.job.tasks)} task(s))")
        if not args.wait:
            return 0
        return _wait(client, ids)


def _quote(client: Any, jobs: Sequence[Any], args: argparse.Namespace) -> int:
    """`submit --quote`: each job's cost at the current packing, nothing submitted."""
    quotes = [
        client.quote(
            job,
            duration_s=args.duration,
            iterations=args.iterations,
            throughput=args.throughput,
        )
        for job in jobs
    ]
    if args.json:
        print_json({"quotes": quotes})
    else:
        print(render_quotes(quotes))
    return 0


def render_quotes(quotes: Sequence[dict[str, Any]]) -> str:
    """The quotes as a table: $/h packed, with no packing, the LP bound's share, totals."""

    def cell(value: float | None, unit: str = "") -> str:
        return "-" if value is None else money(value) + unit

    rows = [
        (
            q["job"],
            q["tasks"],
            q.get("capacity", "auto"),
            cell(q["hourly_cost_packed"], "/h"),
            cell(q["hourly_cost_no_packing"], "/h"),
            cell(q["hourly_lower_bound_share"], "/h"),
            "-" if q["hours"] is None else f"{q['hours']:.2f} h",
            cell(q["total_packed"]),
            cell(q["total_no_packing"]),
        )
        for q in quotes
    ]
    lines = [
        format_table(
            [
                "job",
                "tasks",
                "capacity",
                "packed",
                "no packing",
                "LP bound share",
                "for",
                "total",
                "no packing",
            ],
            rows,
            [False, True, False, True, True, True, True, True, True],
        )
    ]
    for q in quotes:
        if q.get("waiting"):
            lines.append(f"{q['job']}: {q['waiting']}")
        for task, why in q.get("infeasible", {}).items():
            lines.append(f"{task}: cannot be placed: {why}")
        if q["hourly_cost_packed"] is None and not q.get("infeasible") and not q.get("waiting"):
            lines.append(f"{q['job']}: not placed by the current plan")
    lines.append(
        "packed: its part of the instances it would share (dominant share), next round's "
        "plan; no packing: each task alone on its cheapest type; both among the offerings "
        "its capacity allows (spot at its price with reclaims paid for)"
    )
    return "\n".join(lines)


def _pack(directory: Path, out: Path, limit: int) -> str:
    """A build context packed to `out` (its digest); refused over `limit` uncompressed bytes."""
    from executor.packing import PackingError, pack_context_file

    try:
        return pack_context_file(directory, out, max_bytes=limit)
    except PackingError as exc:
        raise InputError(str(exc)) from None


def _wait(client: Any, ids: Sequence[str], poll_s: float = 2.0, *, quiet: bool = False) -> int:
    """Follow the jobs until each has finished; 0 when all completed."""
    last: dict[str, str] = {}
    while True:
        states = {job_id: client.job(job_id) for job_id in ids}
        for job_id, detail in states.items():
            line = f"{detail['status']}, {detail['running']}/{detail['tasks']} running"
            if last.get(job_id) != line and not quiet:
                print(f"{job_id}: {line}" + (f" ({detail['reason']})" if detail["reason"] else ""))
                last[job_id] = line
        if all(d["status"] in FINAL for d in states.values()):
            return 0 if all(d["status"] == "completed" for d in states.values()) else 1
        time.sleep(poll_s)


def cmd_jobs(args: argparse.Namespace) -> int:
    code = 0
    with _client(args) as client:
        if args.wait:
            waiting = [j["job"] for j in client.jobs((), 0)["jobs"] if j["status"] not in FINAL]
            code = _wait(client, waiting, quiet=args.json)
        document = client.jobs(args.status or (), args.limit)
    if args.json:
        print_json(document)
        return code
    rows = [
        (
            j["job"],
            j["name"],
            j["status"],
            f"{j['running']}/{j['tasks']}",
            f"{j['progress']:,.0f}",
            _when(j["submitted_at"]),
            shorten([j["reason"]], 40) if j["reason"] else "",
        )
        for j in document["jobs"]
    ]
    if not rows:
        print("no jobs")
        return 0
    print(
        format_table(
            ["job", "name", "status", "running", "progress", "submitted", "why"],
            rows,
            [False, False, False, True, True, False, False],
        )
    )
    return code


def cmd_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        detail = client.job(_job_id(client, args.job_id), show_secrets=args.show_secrets)
    if args.json:
        print_json(detail)
        return 0
    print(
        f"{detail['job']} ({detail['name']}, {detail['owner']}): {detail['status']}"
        + (f" — {detail['reason']}" if detail["reason"] else "")
    )
    cap = detail.get("max_cost")
    print(
        f"cost so far {money(detail['cost'])}"
        + (f" of max_cost {money(cap)}" if cap is not None else "")
        + f"; submitted {_when(detail['submitted_at'])}"
    )
    if detail.get("waiting"):
        print(detail["waiting"])
    capacity = detail.get("capacity", "auto")
    if detail.get("spot_share") or detail.get("interruptions") or capacity != "auto":
        print(
            f"capacity {capacity}: on spot {detail['spot_share']:.0%} of its task-time; "
            f"{detail['interruptions']} interruption(s), "
            f"work lost {_duration(detail['work_lost_s'])}"
        )
    rows = [
        (
            t["task"].split("/", 1)[1],
            t["status"],
            t["instance"] or "-",
            t["attempt"],
            t.get("moves", t["migrations"]),
            _retries(t),
            f"{t['progress']:,.0f}",
            "-" if t["throughput"] is None else f"{t['throughput']:.3g}/s",
            shorten([t["reason"]], 44) if t["reason"] else "",
        )
        for t in detail["task_list"]
    ]
    print()
    print(
        format_table(
            [
                "task",
                "status",
                "instance",
                "attempt",
                "moves",
                "retries",
                "iterations",
                "rate",
                "why",
            ],
            rows,
            [False, False, False, True, True, False, True, True, False],
        )
    )
    env = [(t["task"].split("/", 1)[1], t.get("env") or {}) for t in detail["task_list"]]
    if any(values for _, values in env):
        print()
        for task, values in env:
            for name, value in values.items():
                print(f"{task}: {name}={value}")
        if not args.show_secrets:
            print("(env values hidden: --show-secrets shows them to the owner or an admin)")
    return 0


def _retries(task: dict[str, Any]) -> str:
    """Retries, with the class of the latest failure and how many counted toward
    `max_attempts` (the job's own): "2 (transient, 1 counted)". An attempt its spot
    instance's reclaim ended is named so, not by its class ("infrastructure"), when
    reclaims account for every retry not counted."""
    retries = task.get("retries", 0)
    if not retries:
        return "0"
    failure = task.get("failure") or "?"
    uncounted = retries - task.get("failures", 0)
    if failure == "infrastructure" and 0 < uncounted <= task.get("interruptions", 0):
        failure = "reclaim"  # short: the cell stays unbroken in the table
    return f"{retries} ({failure}, {task.get('failures', 0)} counted)"


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        cancelled, status = client.cancel(args.job_id)
    if args.json:
        print_json({"job": args.job_id, "cancelled": cancelled, "status": status})
    elif cancelled:
        print(f"cancelled {args.job_id}: its tasks stop and its instances drain")
    else:
        print(f"{args.job_id} had already finished ({status})")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = ""
        if args.job is None:
            targets = [args.instance_id]
        else:
            job = _job_id(client, args.job, unfinished=True, field="--job")
            targets = _instances_of(client, job, wait=args.wait)
        drained = []
        leaving: dict[str, str] = {}  # task -> the instance it leaves
        for instance_id in targets:
            draining, status, tasks = client.drain(instance_id, job)
            leaving.update({task: instance_id for task in tasks})
            drained.append(
                {"instance": instance_id, "draining": draining, "status": status, "tasks": tasks}
            )
            if args.json:
                continue
            if draining and job:
                print(
                    f"moving {len(tasks)} task(s) of {job} off {instance_id} at the next round; "
                    "the instance and its other tasks stay"
                )
            elif draining:
                print(f"draining {instance_id}: its tasks move at the next round, then it ends")
            elif job:
                print(f"no task of {job} runs on {instance_id} now: nothing to move")
            else:
                print(f"{instance_id} is {status}: nothing to drain")
        moved: dict[str, str] = {}
        if args.wait and leaving:
            if not args.json:
                print(f"waiting up to {args.timeout:g} s for the moved tasks to run again")
            moved = _wait_moved(client, leaving, timeout_s=args.timeout)
            if not args.json:
                for task, where in sorted(moved.items()):
                    print(f"{task} runs on {where}")
    if args.json:
        print_json({"instances": drained, "moved": moved})
    return 0


class MoveTimeout(InputError):
    """`drain --wait` gave up: the moved tasks did not all run again in time."""


def _wait_moved(
    client: Any, leaving: dict[str, str], *, timeout_s: float, poll_s: float = 2.0
) -> dict[str, str]:
    """Wait until each task in `leaving` runs a new attempt on another instance (or has
    finished); returns task -> where it runs. Past `timeout_s`, fails naming those
    still waiting and why."""
    deadline = time.monotonic() + timeout_s
    jobs = sorted({task.split("/", 1)[0] for task in leaving})
    while True:
        waiting: dict[str, str] = {}
        moved: dict[str, str] = {}
        for job in jobs:
            detail = client.job(job)
            for t in detail["task_list"]:
                if t["task"] not in leaving:
                    continue
                here = t["instance"]
                if t["status"] in FINAL:
                    moved[t["task"]] = t["status"]
                elif t["status"] == "running" and here and here != leaving[t["task"]]:
                    moved[t["task"]] = here
                else:
                    waiting[t["task"]] = (
                        f"{t['status']}: {t['reason']}" if t["reason"] else t["status"]
                    )
        if not waiting:
            return moved
        if time.monotonic() >= deadline:
            still = "; ".join(f"{task} {why}" for task, why in sorted(waiting.items()))
            raise MoveTimeout(
                f"not yet running elsewhere after {timeout_s:g} s: {still} "
                "(the move goes on; `autoscaler job` follows it)",
                field="--timeout",
                value=timeout_s,
                has_value=True,
            )
        time.sleep(poll_s)


def _job_id(client: Any, ref: str, *, unfinished: bool = False, field: str = "ID") -> str:
    """A job named by its id, or by its name when one job (unfinished, if asked) has it."""
    listed = client.jobs((), 0)["jobs"]
    if any(j["job"] == ref for j in listed):
        return ref
    named = [
        j["job"] for j in listed if j["name"] == ref and not (unfinished and j["status"] in FINAL)
    ]
    if len(named) == 1:
        return named[0]
    if not named:
        return ref  # the daemon names what it does not know
    raise InputError(
        f"{len(named)} jobs have this name ({', '.join(named)}): give an id",
        field=field,
        value=ref,
        has_value=True,
    )


def _instances_of(client: Any, job: str, *, wait: bool, poll_s: float = 2.0) -> list[str]:
    """The instances a job's tasks run on; `job` is its id or the name of one unfinished job.
    `wait`: until every unfinished task of the job runs."""
    job = _job_id(client, job, unfinished=True, field="--job")
    told = False
    while True:
        detail = client.job(job)
        if detail["status"] in FINAL:
            raise InputError(
                f"the job has finished ({detail['status']}): nothing to drain",
                field="--job",
                value=job,
                has_value=True,
            )
        tasks = [t for t in detail["task_list"] if t["status"] not in FINAL]
        instances = sorted({t["instance"] for t in tasks if t["instance"]})
        if (tasks and all(t["status"] == "running" for t in tasks)) or (instances and not wait):
            return instances
        if not wait:
            raise InputError(
                "no task of this job runs on an instance yet (--wait waits for it)",
                field="--job",
                value=job,
                has_value=True,
            )
        if not told:
            print(f"waiting for {job} to run ({detail['running']}/{detail['tasks']} running)")
            told = True
        time.sleep(poll_s)


def cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        document = client.logs(_job_id(client, args.job_id), args.task, args.tail)
    if args.json:
        print_json(document)
        return 0
    if not document["logs"]:
        print(f"no logs yet for {args.job_id} (a log is saved when an attempt ends)")
    for name, text in document["logs"].items():
        print(f"==> {name} <==")
        print(text)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.status()
    if args.json:
        print_json(status)
        return 0
    print(render_status(status))
    return 0


def render_status(status: dict[str, Any]) -> str:
    rows = [
        (
            i["instance"],
            i["type"],
            i["status"],
            i["worker"],
            f"{i['hourly_price']:.4g}",
            len(i["tasks"]),
            _duration(i["uptime_s"]),
        )
        for i in status["instances"]
    ]
    out = [f"{len(rows)} instance(s), {money(status['hourly_cost'])}/h now"]
    spot = status.get("spot") or {}
    if spot.get("instances") or spot.get("interruptions_last_day"):
        line = (
            f"spot: {spot['instances']} instance(s), {money(spot['hourly_cost'])}/h; "
            f"{spot['interruptions_last_day']} interruption(s) in the last day"
        )
        if spot.get("reclaimed_now"):
            line += f"; being reclaimed: {', '.join(spot['reclaimed_now'])}"
        out.append(line)
    if rows:
        out += [
            "",
            format_table(
                ["instance", "type", "status", "worker", "$/h", "tasks", "up"],
                rows,
                [False, False, False, False, True, True, True],
            ),
        ]
    tasks = ", ".join(f"{n} {s}" for s, n in status["tasks"].items()) or "none"
    jobs = ", ".join(f"{n} {s}" for s, n in status["jobs"].items()) or "none"
    out += ["", f"jobs: {jobs}", f"tasks of active jobs: {tasks}"]
    last = status.get("last_round")
    if last:
        bound = last.get("lower_bound_hourly_cost")
        out += ["", f"last round {_when(last['at'])}: {last['reason']}"]
        if last.get("hourly_cost") is not None:
            out.append(
                f"  planned {money(last['hourly_cost'])}/h"
                + (f", LP lower bound {money(bound)}/h" if bound else "")
            )
        for itype, why in last.get("held", {}).items():
            out.append(f"  {itype} {why}")
        for task, why in last.get("infeasible", {}).items():
            out.append(f"  waiting: {task}: {why}")
    return "\n".join(out)


# -- cost report -------------------------------------------------------------------------------


def cmd_cost_report(args: argparse.Namespace) -> int:
    from app.jobfile import load_job_file
    from app.reports import cost_report
    from app.wiring import offline_catalog, open_state
    from provisioners.catalog import catalog_cache_path, price_table_path

    config = load_cluster_config(args.config)
    now = time.time()
    since = parse_since(args.since, now) if args.since else 0.0
    ec2 = config.provisioner.ec2
    check_outputs(
        {"--plot": args.plot},
        [
            ("the cluster's configuration", config.path),
            *state_files(config.state.sqlite_path),
            ("the catalog cache", catalog_cache_path(ec2)),
            ("the price table", price_table_path(ec2)),
            *(("a --dry-run job file", p) for p in args.dry_run or ()),
        ],
    )
    catalog = offline_catalog(config)
    if args.dry_run and not len(catalog):
        raise InputError(
            f"the cluster's catalog is empty (region {ec2.region}, families "
            f"{', '.join(ec2.families) or '-'}, types {', '.join(ec2.types) or '-'}): "
            "nothing to plan the --dry-run jobs on; see `autoscaler catalog show`",
            source=str(config.path),
        )
    hypothetical = [load_job_file(p, catalog).job for p in args.dry_run or ()]
    store = open_state(config)
    try:
        report = cost_report(
            store,
            catalog,
            now,
            since=since,
            planner=config.planner.planner(),
            options=config.control_options(),
            hypothetical=hypothetical,
        )
        uptime = store.uptime()
    finally:
        store.close()
    if args.what_if:
        from app.what_if import what_if

        report["what_if"] = what_if(config, since, now)
    if args.json:
        print_json(report)
    else:
        print(render_cost_report(report, by=args.by))
    if args.plot is not None:
        from app.reports import timeline

        plot_costs(
            timeline(uptime, since or _first(uptime, now), now), args.plot, config.cluster.name
        )
        note(f"plot written to {args.plot}")
    return 0


def render_cost_report(report: dict[str, Any], by: str = "job") -> str:
    out = [
        f"Spend {_when(report['since']) if report['since'] else 'since the first record'}"
        f" until {_when(report['until'])}: {money(report['spend'])}",
        "",
    ]
    if report["spend_by_type"]:
        out += [
            format_table(
                ["instance type", "spend"],
                [(t, money(v)) for t, v in report["spend_by_type"].items()],
                [False, True],
            ),
            "",
        ]
    jobs = report["spend_by_job"]
    if jobs and by == "job":
        rows = [
            (j, report["jobs"].get(j, {}).get("status", "?"), money(v)) for j, v in jobs.items()
        ]
        rows.append(("(idle: no task on the instance)", "", money(report["idle"])))
        out += [format_table(["job", "status", "spend"], rows, [False, False, True]), ""]
    if jobs and by != "job":
        grouped = [(k, money(v)) for k, v in report[f"spend_by_{by}"].items()]
        grouped.append(("(idle: no task on the instance)", money(report["idle"])))
        out += [format_table([by, "spend"], grouped, [False, True]), ""]
    if jobs:
        out += textwrap.wrap(f"Shared instances: {report['attribution']}.", 96)
        out.append("")
    bound = report["lower_bound_hourly_cost_now"]
    parts = report["savings_parts"]
    out += [
        f"Hourly cost now          {money(report['hourly_cost_now'])}/h",
        f"No packing now           {money(report['no_packing_hourly_cost_now'])}/h",
        f"LP lower bound now       {money(bound)}/h" if bound is not None else "",
        f"No packing so far        {money(report['no_packing_spend'])}",
        f"  − spend on tasks       {money(parts['spend_on_tasks'])}",
        f"  − idle spend           {money(parts['idle'])}",
        f"  = saved                {money(report['savings'])}",
    ]
    spot = report.get("spot") or {}
    if spot.get("spot_instance_hours") or spot.get("interruptions"):
        by_offering = ", ".join(f"{n} {o}" for o, n in spot["interruptions_by_offering"].items())
        out += [
            "",
            f"Spot share               {spot['spot_share']:.1%} of instance-hours, "
            f"{money(spot['spot_spend'])} of the spend",
            f"Saved against on-demand  {money(spot['savings_vs_on_demand'])}",
            *(
                [
                    f"  ({len(spot['savings_at_current_price'])} spot instance(s) requested "
                    "before launch prices were kept: against today's on-demand price)"
                ]
                if spot.get("savings_at_current_price")
                else []
            ),
            f"Interruptions            {spot['interruptions']}"
            + (f" ({by_offering})" if by_offering else ""),
            f"Work lost                {spot['work_lost_task_hours']:.3g} task-hours",
        ]
    if report.get("what_if"):
        from app.what_if import what_if_line

        out += ["", *textwrap.wrap(what_if_line(report["what_if"]), 96)]
    dry = report.get("dry_run")
    if dry:
        launches = ", ".join(f"{n} x {t}" for t, n in dry["launch"].items()) or "nothing"
        out += [
            "",
            f"Dry run: adding {len(dry['jobs'])} job(s), {dry['tasks']} task(s)",
            f"  the next round would launch {launches} ({money(dry['launch_hourly_cost'])}/h)",
            f"  $/h would go from {money(dry['hourly_cost_before'])} to "
            f"{money(dry['hourly_cost_after'] or 0.0)} ({dry['reason']})",
        ]
        for line in dry["refused"]:
            out.append(f"  refused: {line}")
        for task, why in dry["infeasible"].items():
            out.append(f"  would wait: {task}: {why}")
    return "\n".join(line for line in out if line is not None)


def plot_costs(points: list[tuple[float, float, float]], path: Path, title: str) -> None:
    """Spend and $/h over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [datetime.fromtimestamp(t, UTC) for t, _, _ in points]
    fig, (rate_ax, spend_ax) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    rate_ax.step(times, [r for _, r, _ in points], where="post")
    spend_ax.plot(times, [s for _, _, s in points])
    rate_ax.set_ylabel("$/h")
    spend_ax.set_ylabel("spend ($)")
    rate_ax.set_title(f"cluster {title}")
    spend_ax.set_xlabel("time (UTC)")
    for ax in (rate_ax, spend_ax):
        ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=110)
    except (OSError, ValueError) as exc:
        message = getattr(exc, "strerror", None) or exc
        raise InputError(f"cannot write plot: {message}", source=str(path)) from None
    finally:
        plt.close(fig)


def _first(uptime: Sequence[Any], now: float) -> float:
    return min((i.start for i in uptime), default=now)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
