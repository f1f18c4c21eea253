"""The web dashboard: its endpoints' server time with 1,000 jobs, and screenshots.

`python -m benchmarks dashboard [--jobs N]` fills a cluster's state as a daemon
would have written it (N jobs of three users: most completed, some running on
six instances, the rest queued; two hours of rounds), then times each JSON
endpoint the pages poll, in-process (no network, no TLS), beside its baseline:
the command line's own document builder on the same state (`app.reports`), so
the ratio is the dashboard's overhead (session, role, audit entry, JSON) and
the absolute time says whether a page loads in under a second.

`python -m benchmarks screenshots --out docs/screenshots` serves the dashboard
over HTTPS on such a state (a few dozen jobs) and has headless Chromium
(`/usr/bin/chromium`, driven by Playwright) log in and capture every page.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from app.config import ClusterConfig, load_cluster_config
from app.init import init_cluster
from app.reports import cluster_status, cost_report, job_list
from app.table import format_table
from app.users import Authenticator, add_user
from app.wiring import first_admin, offline_catalog, open_state
from autoscaler.jobs import JobSpec, TaskSpec, TraceFacts
from autoscaler.resources import Resources
from autoscaler.store import ActionRecord, RoundIntents, RoundRecord, TaskUpdate

#: The users of the filled state: (name, team).
USERS = (("ana", "ml"), ("bo", "vision"), ("cy", None))

#: Instance types of the filled state, with their catalog prices ($/h, us-east-1).
TYPES = (("c7i.2xlarge", 0.357), ("r7i.2xlarge", 0.5292), ("c7i.xlarge", 0.1785))

CHROMIUM = "/usr/bin/chromium"

#: Instances of the filled state (within `init --local`'s max_instances of 8).
INSTANCES = 6


def _job(job_id: str, tasks: int, total: float) -> JobSpec:
    specs = tuple(
        TaskSpec(
            task_id=f"{job_id}/t{i}",
            job_id=job_id,
            name=f"t{i}",
            workload="resnet18" if i % 2 == 0 else "lm",
            demands=(("any", Resources(0, 1 + i % 3, 2 + 2 * (i % 2))),),
        )
        for i in range(tasks)
    )
    return JobSpec(job_id, f"train-{job_id}", specs, 20.0, trace=TraceFacts(total_iters=total))


def fill(store: Any, jobs: int, now: float, seed: int = 1) -> None:
    """`jobs` jobs over the last two hours, as a daemon records them: 70% completed,
    10% running on six instances, 20% queued, and a round every two minutes."""
    rng = random.Random(seed)
    start = now - 7200.0
    instances = []
    for k in range(INSTANCES):
        itype, price = TYPES[k % len(TYPES)]
        instance_id = f"demo-{k:03d}"
        at = start + 60.0 * k
        store.record_round(
            RoundRecord(at, "eva", "full", True, f"launch {instance_id}"),
            RoundIntents(requests=((instance_id, itype, price),)),
        )
        store.transition_instance(instance_id, "running", at + 30.0, cloud_id=f"c-{k}")
        store.instance_worker(instance_id, at + 45.0, ready=True)
        instances.append(instance_id)
    done, running = int(jobs * 0.7), int(jobs * 0.1)
    for n in range(jobs):
        job_id = f"job-{n:05d}"
        owner, team = USERS[n % len(USERS)]
        at = start + 7000.0 * n / jobs
        spec = _job(job_id, 1 + n % 2, 2000.0)
        store.submit_job(spec, owner=owner, at=at, team=team or "")
        if n >= done + running:
            continue  # queued
        where = instances[n % len(instances)]
        ups = [
            TaskUpdate(
                t.task_id,
                status="running",
                instance_id=where,
                attempt=1,
                throughput=round(rng.uniform(5.0, 20.0), 2),
                progress=round(rng.uniform(100.0, 1900.0)),
            )
            for t in spec.tasks
        ]
        store.update_tasks(ups, at + 20.0)
        store.job_started(job_id, at + 20.0)
        if n < done:
            store.job_finished(job_id, min(now, at + rng.uniform(600.0, 2400.0)))
    for r in range(60):
        at = start + 120.0 * r
        hourly = 2.5 + 0.8 * rng.random()
        store.record_round(
            RoundRecord(
                at,
                "eva",
                "full" if r % 5 == 0 else "partial",
                r % 3 == 0,
                "the full reconfiguration saves more than its migrations cost (Eva §4.3)"
                if r % 5 == 0
                else "partial: a full reconfiguration would not pay for its migrations",
                numbers={
                    "hourly_cost": round(hourly, 4),
                    "no_packing_hourly_cost": round(hourly * 1.9, 4),
                    "lower_bound_hourly_cost": round(hourly * 0.86, 4),
                },
                actions=(
                    ActionRecord(
                        "launch", f"demo-{r % INSTANCES:03d}", "pack queued tasks", "done"
                    ),
                    ActionRecord(
                        "launch",
                        "r7i.8xlarge",
                        "over [guardrails] max_hourly_spend",
                        "refused",
                        "would reach $21.4/h",
                    ),
                ),
            )
        )


def demo_cluster(directory: Path, jobs: int, now: float) -> tuple[ClusterConfig, Any]:
    """`init --local` in `directory`, its state filled (`fill`) and its first admin known."""
    init_cluster(directory, name="demo", local=True)
    config = load_cluster_config(directory / "autoscaler.toml")
    store = open_state(config, create=True)
    first_admin(config, store, now)
    fill(store, jobs, now)
    _write_logs(config, store, directory)
    return config, store


def _write_logs(config: ClusterConfig, store: Any, directory: Path) -> None:
    """A log for each running task, where its worker would have uploaded it."""
    from executor.storage import log_key, open_storage

    storage = open_storage(config.storage.url)
    scratch = directory / "log.txt"
    for record in store.jobs(["running"]):
        for task in store.tasks_of(record.job_id):
            lines = [f"step {s}: loss {2.0 / (1 + s / 100):.4f}" for s in range(0, 400, 20)]
            scratch.write_text("\n".join(["resumed at step 0", *lines]) + "\n")
            storage.put_file(log_key(record.job_id, task.task_id, task.attempt), scratch)


def build_dashboard(
    config: ClusterConfig, store: Any, now: Callable[[], float], *, what_if: bool = False
) -> Any:
    """The daemon's dashboard on `store` (the planner and catalog the daemon would use)."""
    from app.api import SubmissionService
    from app.dashboard.server import Dashboard
    from app.what_if import what_if as replay
    from executor.storage import open_storage

    catalog = offline_catalog(config)
    service = SubmissionService(
        store,
        open_storage(config.storage.url),
        lambda: catalog,
        now=now,
        planner=config.planner.planner,
        options=config.control_options(),
    )
    return Dashboard(
        service,
        Authenticator(service.accounts, now=now),
        guardrails=config.guardrails,
        cluster=config.cluster.name,
        now=now,
        what_if=(lambda since, until: replay(config, since, until)) if what_if else None,
    )


def _median_s(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def endpoint_times(jobs: int, repeat: int = 5) -> list[tuple[str, float, float]]:
    """(endpoint, its median server seconds, its baseline's) on a state of `jobs` jobs."""
    from starlette.testclient import TestClient

    from executor.security import read_token

    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        config, store = demo_cluster(Path(tmp), jobs, now)
        try:
            catalog = offline_catalog(config)
            dashboard = build_dashboard(config, store, lambda: now)
            client = TestClient(dashboard.app, base_url="https://testserver")
            token = read_token(config.secrets.api_token)
            client.post("/login", data={"token": token})
            planner = config.planner.planner()
            options = config.control_options()
            baselines: dict[str, Callable[[], Any]] = {
                "/api/now": lambda: cluster_status(store, now),
                "/api/jobs": lambda: (job_list(store), cost_report(store, catalog, now)),
                "/api/spend": lambda: cost_report(
                    store, catalog, now, planner=planner, options=options
                ),
                "/api/decisions": lambda: store.rounds(limit=200),
                "/now": lambda: None,
            }
            rows = []
            for path, baseline in baselines.items():
                answer = client.get(path)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: {answer.status_code} {answer.text[:200]}")
                served = _median_s(partial(client.get, path), repeat)
                rows.append((path, served, _median_s(baseline, repeat)))
            return rows
        finally:
            store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks dashboard", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    rows = endpoint_times(args.jobs, args.repeat)
    print(f"{args.jobs} jobs in the state (SQLite), median of {args.repeat} requests:")
    print(
        format_table(
            ["endpoint", "served (s)", "baseline (s)", "ratio", "< 1 s"],
            [
                (
                    path,
                    f"{served:.3f}",
                    f"{base:.3f}",
                    f"{served / base:.2f}" if base > 1e-4 else "—",
                    "yes" if served < 1.0 else "NO",
                )
                for path, served, base in rows
            ],
            [False, True, True, True, False],
        )
    )
    print(
        "baseline: the command line's document builders on the same state: status; jobs "
        "and cost-report; cost-report with its LP bound; the round log. /now is the page "
        "skeleton. The dashboard adds the session, the role check, the audit entry, JSON."
    )


# -- screenshots -------------------------------------------------------------------------------


def screenshots(argv: list[str] | None = None) -> None:
    """Serve a demo cluster's dashboard over HTTPS and capture every page with Chromium."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks screenshots", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from app.dashboard.server import DashboardServer
    from executor.security import read_token

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        config, store = demo_cluster(Path(tmp), args.jobs, now)
        add_user(store_accounts(store), "rita", "read", None, now)
        dashboard = build_dashboard(config, store, time.time, what_if=True)
        server = DashboardServer(
            dashboard,
            config.dashboard.listen,
            config.secrets.server_cert,
            config.secrets.server_key,
        )
        server.start()
        try:
            base = f"https://{config.dashboard.listen}"
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
                # The cluster's CA is private: trust the server's key alone (as clients pin it).
                page = browser.new_context(
                    ignore_https_errors=True, viewport={"width": 1400, "height": 1000}
                ).new_page()
                page.goto(f"{base}/login")
                page.fill("#token", read_token(config.secrets.api_token))
                page.click("#login")
                page.wait_for_url(f"{base}/now")
                shots = {
                    "now": "/now",
                    "jobs": "/jobs",
                    "job": f"/jobs/job-{int(args.jobs * 0.75):05d}",
                    "spend": "/spend",
                    "decisions": "/decisions",
                }
                for name, path in shots.items():
                    page.goto(base + path)
                    page.wait_for_selector("#updated:has-text('updated')")
                    if name == "spend":
                        page.wait_for_selector("#chart-hourly canvas")
                        # The what-if line: the week replayed under the other schedulers.
                        page.wait_for_selector("#what-if:has-text('would have cost')")
                    target = args.out / f"{name}.png"
                    page.screenshot(path=str(target), full_page=name in ("now", "spend"))
                    print(f"wrote {target}")
                browser.close()
        finally:
            server.stop()
            store.close()


def store_accounts(store: Any) -> Any:
    from state.accounts import SqlAccounts

    return SqlAccounts(store.engine)
