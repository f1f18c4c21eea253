"""`autoscaler daemon`: the process that runs a cluster unattended.

It takes the cluster's leader lock (one daemon acts per cluster; a second one
waits and says so), serves gRPC on two ports — users (TLS, a user's token on
every call, allowed by role and audited: `app.api.UserAuth`) and worker
enrollment on `[api] listen`, the enrolled workers on the workers' port (mutual
TLS: a client certificate from the worker CA, which `UserAuth` lets through to
services that check it themselves) — exposes Prometheus metrics, serves the web
dashboard when `[dashboard] enabled` (`app.dashboard`: HTTPS, the same users,
roles and audit log), and lets APScheduler 3 run a
round every `interval_s` and the step that carries it out every `step_s` —
on one worker thread, so never two at once (`max_instances=1`, `coalesce`).
SIGTERM or SIGINT finishes the current round or step and exits; instances
keep running, and the next start continues from the database.

With `[[notify]]` webhooks, a thread of its own posts the notification outbox's
events (`app.notify`); the daemon adds its leadership and, after each round, the
budget and held-offering crossings it sees. No round waits for a webhook.

Every decision is logged as one JSON line with its reason.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import grpc

from app.api import Storage, SubmissionService, UserAuth, add_submission
from app.config import ClusterConfig
from app.leader import LeaderLock
from app.metrics import Metrics
from app.teams import team_policy
from app.users import Authenticator
from autoscaler.catalog import Catalog
from autoscaler.cloud import Cloud
from autoscaler.control import ControlLoop
from autoscaler.decide import StepDecision
from autoscaler.execution import Executor, InstanceNotice
from autoscaler.failures import AttemptEnd
from autoscaler.spot import price_changes
from autoscaler.store import RefreshedPrices, RoundRecord

log = logging.getLogger("autoscaler.daemon")

#: Environment variable naming a round's point at which the daemon kills itself with
#: SIGKILL (tests of restart safety only): `synced`, `decided`, `recorded`, `launched`,
#: `acted` or `stepped`, optionally `POINT:N` for its N-th passage.
FAULT_ENV = "AUTOSCALER_TEST_KILL_AT"

#: The one-off round a reclaim notice or a lost worker asks for (`Daemon.replan_now`).
REPLAN_JOB = "replan"

#: How long delivered and failed notifications are kept in the state.
NOTIFY_RETENTION_S = 30 * 86400.0

#: Threads of the gRPC server: API calls, and one per connected worker's command stream.
WORKER_THREADS = 512


class WallClock:
    def now(self) -> float:
        return time.time()


@dataclass
class Bindings:
    """What the daemon drives; `autoscaler daemon` builds them from the configuration."""

    store: Any  # a SqlStore: the leader lock lives in its database
    cloud: Cloud
    executor: Executor
    storage: Storage
    catalog: Callable[[], Catalog]
    add_worker_services: Callable[[grpc.Server], None] = lambda server: None
    worker_methods: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class Daemon:
    """One cluster's control loop, API server and metrics, while it holds the lock."""

    def __init__(
        self,
        config: ClusterConfig,
        bindings: Bindings,
        *,
        dry_run: bool = False,
        clock: Any = None,
        server_credentials: grpc.ServerCredentials | None = None,
        worker_credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.config = config
        self.bindings = bindings
        self.clock = clock or WallClock()
        # --dry-run: record, don't act. [ec2] dry_run is EC2's own: the round acts and EC2
        # checks every call (permissions too) with DryRun=True, starting nothing.
        self.options = config.control_options(dry_run=dry_run)
        self.metrics = Metrics()
        self.stop = threading.Event()
        self.server_credentials = server_credentials
        self.worker_credentials = worker_credentials
        self._planner = config.planner.planner()
        self._busy = threading.Lock()
        self._fault = _fault_from_env()
        self.loop = ControlLoop(
            self._planner,
            bindings.cloud,
            bindings.executor,
            bindings.store,
            self.clock,
            self.options,
            passed=self._passed,
            attempt_ended=_attempt_ended,
            catalog=self._spot_rates(),
        )
        self.api = SubmissionService(
            bindings.store,
            bindings.storage,
            bindings.catalog,
            now=self.clock.now,
            planner=config.planner.planner,
            options=self.options,
            max_context_bytes=int(config.limits.max_context_mb * 2**20),
            teams=config.teams,
        )
        self.authenticator = Authenticator(self.api.accounts, now=self.clock.now)
        self.scheduler: Any = None
        self.server: grpc.Server | None = None
        self.notifier: Any = None  # app.notify.Notifier, with [[notify]] webhooks
        self.notices: Any = None
        self._notify_thread: threading.Thread | None = None
        if config.notify:
            from app.notify import Notices, Notifier, webhooks
            from state.outbox import SqlOutbox

            outbox = SqlOutbox(bindings.store.engine)
            self.notifier = Notifier(
                outbox,
                webhooks(config),
                config.cluster.name,
                self.clock,
                on_attempt=lambda outcome: self.metrics.notifications.labels(outcome).inc(),
            )
            self.notices = Notices(outbox, config.guardrails)
        # Reclaims already in the history when this daemon starts were counted by the one
        # before it (or happened before it ran): the counter counts only those recorded after.
        self._reclaims_at: float | None = None
        self._reclaims_seen: set[tuple[str, float]] = set()
        self._observe_interruptions(counting=False)
        # The spot prices whose history the ledger was last brought up to (their retrieval).
        self._prices_recorded: float | None = None
        self._seed_spot_prices()
        if hasattr(bindings.executor, "on_notice"):  # workers report their providers' notices
            bindings.executor.on_notice = self.noticed
        self.dashboard: Any = None  # the DashboardServer, when [dashboard] enabled

    def _spot_rates(self) -> Callable[[Catalog, float], Catalog] | None:
        """With `[spot] enabled`, what the rounds price spot offerings at: their bands refined
        by this cluster's interruption history and rebalance recommendations."""
        spot = self.config.spot
        if not spot.enabled:
            return None
        from app.spot_rates import SpotRates

        return SpotRates(
            self.bindings.store,
            prior_hours=spot.prior_hours,
            history_days=spot.history_days,
            refresh_s=spot.refresh_minutes * 60.0,
            rebalance_rate_per_hour=spot.rebalance_rate_per_hour,
        ).catalog

    # -- the control loop ------------------------------------------------------------------

    def round(self) -> RoundRecord | None:
        """One scheduling round (never concurrently with a step)."""
        with self._busy:
            started = time.perf_counter()
            try:
                self._team_limits()
                self.record_spot_prices()
                outcome = self.loop.schedule()
            except Exception:
                log.exception("round failed; the next one starts from the database")
                return None
            finally:
                self._observe_interruptions()
            seconds = time.perf_counter() - started
            record = outcome.record
            self.metrics.observe_round(record, seconds)
            _event(
                "round",
                chosen=record.chosen,
                reason=record.reason,
                hourly_cost=record.numbers.get("hourly_cost"),
                lower_bound=record.numbers.get("lower_bound_hourly_cost"),
                seconds=round(seconds, 3),
                dry_run=self.options.dry_run,
            )
            for action in record.actions:
                _event(
                    "decision",
                    kind=action.kind,
                    target=action.target,
                    reason=action.reason,
                    outcome=action.outcome,
                    message=action.message,
                )
            for task, why in record.numbers.get("infeasible", {}).items():
                _event("waiting", task=task, reason=why)
            # Budgets: a job at its max_cost (stopping, then stopped) and a team at its
            # daily budget, each once a round while it lasts.
            for job_id, capped in record.numbers.get("max_cost", {}).items():
                _event("max_cost", job=job_id, state=capped["state"], reason=capped["reason"])
            over = record.numbers.get("fair_share", {}).get("over_daily_budget", {})
            for team, spent in over.items():
                _event("daily_budget", team=team, **spent)
            self._observe_state()
            if self.notices is not None:
                try:  # a budget or held offering crossed: into the outbox, sent by the notifier
                    self.notices.after_round(record, self.bindings.store, self.clock.now())
                except Exception:
                    log.exception("notifications of the round failed; the next round retries")
            return record

    def _seed_spot_prices(self) -> None:
        """Hand the cloud the spot prices the cluster last refreshed, kept in the state, so
        quotes and the first plan after a (re)start — on this machine or another — use
        them. The rule: the kept prices are used when they are younger than `[spot]
        history_days` (the span the cluster's own spot history counts over), and until a
        refresh brings newer ones; with none kept, or older, the bundled snapshot prices
        the offerings until the first refresh, as before."""
        seed = getattr(self.bindings.cloud, "seed_spot_prices", None)
        if seed is None or not self.config.spot.enabled:
            return
        kept = self.bindings.store.spot_prices(self.config.cluster.region)
        if kept is None:
            return
        age_s = self.clock.now() - kept.retrieved_at
        if age_s > self.config.spot.history_days * 86400.0:
            log.info("spot: the kept spot prices are %.1f days old: not used", age_s / 86400)
            return
        from provisioners.spot_prices import SpotPriceTable

        seed(SpotPriceTable(kept.region, kept.prices, kept.retrieved_at, kept.source))

    def record_spot_prices(self) -> set[str]:
        """Bring the ledger and the state up to the cloud's latest spot price refresh,
        before a round relies on it: each running spot instance whose offering's price
        moved gets a new price segment from the time the price history says it moved
        (`autoscaler.spot.price_changes`, `Store.reprice_instances`), then the prices are
        kept in the state, dated. Idempotent: a refresh applied again (after a kill, by a
        restarted daemon) writes nothing twice. Returns the instances re-priced."""
        refresh = getattr(self.bindings.cloud, "spot_prices", None)
        if refresh is None or not self.config.spot.enabled:
            return set()
        try:
            table = refresh()
            if table is None or table.retrieved_s == self._prices_recorded:
                return set()
            repriced = record_refresh(self.bindings.store, table)
        except Exception:
            log.exception("spot prices not recorded; the next round tries again")
            return set()
        self._prices_recorded = table.retrieved_s
        if repriced:
            _event("spot_repriced", instances=sorted(repriced), retrieved=table.retrieved_s)
        return repriced

    def _team_limits(self) -> None:
        """The teams' limits this round decides by: `team set`'s over the config's
        (`app.teams`), read afresh so a change takes effect at the next round."""
        try:
            records = self.api.accounts.teams()
        except RuntimeError:  # no state database for accounts (a test's store)
            return
        policy = team_policy(self.config.teams, records)
        self.loop.options = replace(self.options, teams=policy)
        self.api.options = self.loop.options

    def prune_audit(self) -> int:
        """Delete audit entries older than `[audit] keep_days` (none without it): the log
        of every call grows with every call, and a cluster's policy says how long it is
        kept. Returns how many went."""
        keep = self.config.audit.keep_days
        if keep is None:
            return 0
        pruned = self.api.accounts.prune_audit(self.clock.now() - keep * 86400.0)
        if pruned:
            _event("audit_pruned", entries=pruned, keep_days=keep)
        return pruned

    def step(self) -> StepDecision | None:
        """One step between rounds; asks for an early round when a worker was lost."""
        with self._busy:
            try:
                step = self.loop.progress()
            except Exception:
                log.exception("step failed; the next one starts from the database")
                return None
            finally:
                self._observe_interruptions()
            self.metrics.observe_step(step)
            for launch in step.starts:
                _event(
                    "decision",
                    kind="start",
                    target=launch.task_id,
                    reason=f"attempt {launch.attempt} on {launch.instance_id}",
                )
            for stop in step.stops:
                _event("decision", kind="stop", target=stop.task_id, reason=stop.reason)
            for action in step.terminations:
                _event(
                    "decision", kind="terminate", target=action.instance_id, reason=action.reason
                )
            for job_id, reason in step.failed_jobs:
                _event("job_failed", job=job_id, reason=reason)
            if step:
                self._observe_state()
        if step.replan:
            self.replan_now()
        return step

    def noticed(self, instance_id: str, notice: InstanceNotice) -> None:
        """A worker reports its provider's notice: a reclaim is planned for at once — the
        round starts now, not at the next period — and a rebalance recommendation is
        recorded by the next round or step (the interruption history keeps both), from
        which the rounds price its instance's offering higher (`app.spot_rates`)."""
        _event("notice", instance=instance_id, kind=notice.kind, reason=notice.describe())
        if notice.reclaims:
            self.replan_now()

    def _observe_interruptions(self, *, counting: bool = True) -> None:
        """`autoscaler_interruptions_total` once per reclaim a round or step recorded, read
        from the state's interruption history — one record per instance and kind, however
        many rounds see its notice again — from the newest time seen on (`_reclaims_at`).
        At start (`counting` False) the history is only read: its reclaims were counted by
        the daemon before this one, or happened before any ran."""
        store = self.bindings.store
        try:
            records = store.interruptions(self._reclaims_at)
        except Exception:  # the next round or step reads them again
            log.exception("the interruption history could not be read")
            return
        for r in records:
            key = (r.instance_id, r.at)  # those at the cursor are read again: once each
            if r.kind != "reclaim" or key in self._reclaims_seen:
                continue
            if counting:
                self.metrics.observe_interruption(r.offering)
            if self._reclaims_at is None or r.at > self._reclaims_at:
                self._reclaims_at = r.at
                self._reclaims_seen = {k for k in self._reclaims_seen if k[1] == r.at}
            self._reclaims_seen.add(key)

    def replan_now(self) -> None:
        """Run a round at once (no-op before the scheduler runs). A one-off job beside the
        periodic one: APScheduler skips a run of a job still running (`max_instances`
        counts per job), so bringing the periodic round forward while one runs — a notice
        arriving mid-round — left the reclaim to the round a whole period later. This
        one runs right after the round in progress, on the same worker thread; notices
        arriving together make one round."""
        if self.scheduler is not None:
            self.scheduler.add_job(
                self.round,
                "date",
                run_date=datetime.now(UTC),
                id=REPLAN_JOB,
                replace_existing=True,
                max_instances=2,  # one running, one to follow it
            )

    def _observe_state(self) -> None:
        """The metrics' counts, counted by the store (no third snapshot of the round)."""
        self.metrics.observe_counts(self.bindings.store.state_counts())

    def _passed(self, point: str) -> None:
        if self._fault is not None and self._fault(point):
            _event("test_fault", point=point)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    # -- the process ---------------------------------------------------------------------------

    def run(self) -> int:
        """Lead, serve and schedule until `stop` is set; 0 on a clean exit."""
        store = self.bindings.store
        leader = LeaderLock(store.engine, self.config.cluster.name)
        if not leader.acquire(self.stop, poll_s=2.0, on_wait=lambda m: _event("waiting", reason=m)):
            return 0
        _event("leading", cluster=self.config.cluster.name, lock=leader.holder)
        # The local cloud's spot notices, where agents a previous daemon started poll: by
        # the leader only (a waiting daemon must not take or move that port).
        resume_notices = getattr(self.bindings.cloud, "resume_notices", None)
        if resume_notices is not None:
            resume_notices()
        resuming = resuming_event(store)
        if resuming:  # never a silent relaunch: say what the first round plans again
            _event("resuming", **resuming)
        if self.notices is not None:
            try:
                self.notices.leader(f"{socket.gethostname()} (pid {os.getpid()})", self.clock.now())
            except Exception:  # news of it is not worth not leading
                log.exception("the notification of this daemon's leadership failed")
            self._notify_thread = self.notifier.start(self.stop)
        try:
            self._serve()
            self._schedule()
            self.stop.wait()
            _event("stopping", reason="signal received: finishing the current round or step")
        finally:
            if self.scheduler is not None:
                self.scheduler.shutdown(wait=True)
            if self.dashboard is not None:
                self.dashboard.stop()
            if self.server is not None:
                self.server.stop(grace=5).wait()
            if self._notify_thread is not None:  # it ends after the post it is in, if any
                self.stop.set()
                self._notify_thread.join()
            leader.release()
            _event("stopped", reason="instances keep running; the next start continues")
        return 0

    def _serve(self) -> None:
        from concurrent import futures

        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        from executor.security import server_options

        # Each connected worker holds one thread on its command stream: room for many.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKER_THREADS),
            interceptors=[
                UserAuth(
                    self.authenticator,
                    self.api.accounts,
                    now=self.clock.now,
                    open=self.bindings.worker_methods,
                )
            ],
            options=server_options(),
        )
        add_submission(server, self.api)
        self.bindings.add_worker_services(server)
        status = health.HealthServicer()
        status.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(status, server)
        address = self.config.api.listen
        if self.server_credentials is None:
            raise ValueError("the daemon serves TLS only: give it server credentials")
        server.add_secure_port(address, self.server_credentials)
        workers = None
        if self.worker_credentials is not None:
            workers = self.config.worker_listen
            if not server.add_secure_port(workers, self.worker_credentials):
                raise ValueError(f"cannot listen on {workers} ([api] worker_listen)")
        server.start()
        self.server = server
        _event(
            "serving",
            api=address,
            advertise=self.config.api_address,
            workers=workers,
            workers_advertised=self.config.worker_address if workers else None,
        )
        if self.config.metrics.listen:
            from prometheus_client import start_http_server

            host, _, port = self.config.metrics.listen.rpartition(":")
            host = host.removeprefix("[").removesuffix("]")  # an IPv6 address, bracketed
            start_http_server(int(port), addr=host, registry=self.metrics.registry)
            _event("metrics", listen=self.config.metrics.listen)
        if self.config.dashboard.enabled:
            self._serve_dashboard()

    def _serve_dashboard(self) -> None:
        """The web dashboard over HTTPS with the API's certificate (`app.dashboard`)."""
        from app.dashboard.server import Dashboard, DashboardServer

        config = self.config

        def what_if(since: float, until: float) -> dict[str, Any]:
            from app.what_if import what_if as replay

            return replay(config, since, until)

        dashboard = Dashboard(
            self.api,
            self.authenticator,
            guardrails=config.guardrails,
            cluster=config.cluster.name,
            what_if=what_if,
            now=self.clock.now,
        )
        server = DashboardServer(
            dashboard,
            config.dashboard.listen,
            config.secrets.server_cert,
            config.secrets.server_key,
        )
        server.start()
        self.dashboard = server
        _event("dashboard", listen=f"https://{config.dashboard.listen}/")

    def _schedule(self) -> None:
        cluster = self.config.cluster
        scheduler = job_scheduler()
        scheduler.add_job(
            self.round,
            "interval",
            seconds=cluster.interval_s,
            id="round",
            next_run_time=datetime.now(UTC),
        )
        scheduler.add_job(self.step, "interval", seconds=cluster.step_s, id="step")
        scheduler.add_job(
            self.api.collect_orphan_contexts, "interval", seconds=3600, id="collect-contexts"
        )
        scheduler.add_job(
            self.api.collect_finished_checkpoints,
            "interval",
            seconds=3600,
            id="collect-checkpoints",
            kwargs={"retention_s": self.config.storage.checkpoint_retention_days * 86400.0},
        )
        if self.config.audit.keep_days is not None:
            scheduler.add_job(
                self.prune_audit,
                "interval",
                seconds=3600,
                id="prune-audit",
                next_run_time=datetime.now(UTC),
            )
        scheduler.add_job(self._prune_notifications, "interval", seconds=3600, id="prune-notify")
        scheduler.start()
        self.scheduler = scheduler

    def _prune_notifications(self) -> None:
        """Forget notifications ended more than `NOTIFY_RETENTION_S` ago (the outbox gets
        a row per finished job, webhooks or not)."""
        from state.outbox import SqlOutbox

        SqlOutbox(self.bindings.store.engine).prune(self.clock.now() - NOTIFY_RETENTION_S)


def job_scheduler() -> Any:
    """The daemon's APScheduler: every job on one worker thread, so never two at once,
    a late run coalesced into one, none dropped for lateness."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    return BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(max_workers=1)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        timezone=UTC,
    )


def resuming_event(store: Any) -> dict[str, Any] | None:
    """What a starting daemon says it picks up (None: nothing): the unfinished jobs in the
    database — queued ones included, such as those `down` stopped — and the step each of
    their tasks resumes from (its newest checkpoint; None: from the start). Nothing is
    relaunched silently."""
    from executor.storage import checkpoint_step

    unfinished = store.jobs(("queued", "running"))
    if not unfinished:
        return None
    tasks = store.snapshot(with_throughput=False).tasks
    return {
        "jobs": [j.job_id for j in unfinished],
        "from_step": {
            t.task_id: checkpoint_step(t.checkpoint)
            for t in sorted(tasks.values(), key=lambda t: t.task_id)
            if t.status not in ("completed", "cancelled", "failed")
        },
        "reason": f"{len(unfinished)} unfinished job(s) in the database are planned again "
        "at the first round, each task from its newest checkpoint",
    }


def record_refresh(store: Any, table: Any) -> set[str]:
    """One spot price refresh (a `provisioners.spot_prices.SpotPriceTable`: prices, and the
    history behind them by zone name) into the state: first the running spot instances'
    price segments at the history's times (`autoscaler.spot.price_changes`,
    `Store.reprice_instances`), then the prices, dated (`Store.record_spot_prices`). In that
    order, and each idempotent, so a process killed between the two, or a refresh applied
    again, leaves the ledger as once. Returns the instances re-priced."""
    zones = {i.instance_id: i.zone for i in store.instances()}
    running = [
        (u, zones.get(u.instance_id)) for u in store.uptime(table.retrieved_s) if u.end is None
    ]
    repriced: set[str] = store.reprice_instances(price_changes(running, table.history))
    store.record_spot_prices(
        RefreshedPrices(table.region, table.prices, table.retrieved_s, table.source)
    )
    return repriced


def _event(event: str, **fields: Any) -> None:
    """One structured log line: what happened and why."""
    log.info(json.dumps({"event": event, **fields}, default=str))


def _attempt_ended(end: AttemptEnd) -> None:
    """An attempt that ended without completing, with whose doing it was: in the
    decision log, since what follows (retry now, after a back-off, or fail the job)
    is decided by its class."""
    _event(
        "attempt_ended",
        task=end.task_id,
        attempt=end.attempt,
        failure=end.failure,
        counted=end.counted,
        reason=end.reason,
        retry_at=end.update.retry_at,
        job_failed=end.job_failure or None,
    )


def _fault_from_env() -> Callable[[str], bool] | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    wanted = int(nth) if nth else 1
    seen = [0]

    def hit(name: str) -> bool:
        if name != point:
            return False
        seen[0] += 1
        return seen[0] == wanted

    return hit


class JsonLines(logging.Formatter):
    """Log records as JSON lines (a message that is already JSON is merged in)."""

    def format(self, record: logging.LogRecord) -> str:
        base = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        message = record.getMessage()
        try:
            parsed = json.loads(message)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            base.update(parsed)
        else:
            base["message"] = message
        if record.exc_info:
            base["error"] = self.formatException(record.exc_info)
        return json.dumps(base, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Libraries' INFO lines are not the daemon's story: Alembic says "Context impl
    # SQLiteImpl" and "Will assume transactional DDL" at every start.
    for noisy in ("apscheduler", "botocore", "urllib3", "docker", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
