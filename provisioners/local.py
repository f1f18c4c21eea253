"""`LocalCloud`: the `Cloud` interface on this machine — an instance is a worker agent process.

For trying the whole system without an AWS account (Ray's "fake multinode",
Karpenter's KWOK): launching an instance of type T starts `autoscaler worker`
on this host, advertising T's capacity (from the catalog), so the daemon packs
tasks onto it as onto an EC2 instance of that type, and the containers' cgroup
limits enforce what each task may use. Terminating stops the agent and removes
its containers. Billing is the catalog price (the state's ledger), so cost
reports mean what they would on EC2. Launch delays can be emulated.

Restart-safe like EC2: every instance is a directory under `root/instances/`
(its launch token, type, the agent's process id) written before the agent
starts, and the agents run in their own sessions, so a daemon killed with
SIGKILL and restarted lists, adopts or terminates exactly what is there.

Enrollment (`LocalCloud.verify`, the local cloud's `IdentityVerifier`): each
launch writes a one-time secret, mode 0600, into that agent's own work
directory, and keeps only its SHA-256 in the instance's record; the daemon
accepts it once. On one host the host's user is the trust boundary: the secret
keeps agents (and anything their jobs run) from passing for each other.

Spot reclaims (`provisioners.local_reclaims`): with a `ReclaimPlan` (a rate or an
availability trace per spot offering), each spot instance gets its reclaim time at
launch; from then its agent, polling the cloud's metadata stand-in (`--imds-url`),
finds EC2's interruption notice, and once the notice window is over (120 s, or
shorter in tests) the cloud terminates the instance. `reclaim()` injects one now.

Spot prices (`provisioners.local_spot_prices`): with a `SpotPriceTrace` (a
`DescribeSpotPriceHistory` dump, replayed from the cloud's epoch), `spot_prices()`
answers as EC2's refresh does — the prices in force and the history since the last
answer — so the daemon bills a running spot instance's price changes
(`app.daemon.record_spot_prices`); the catalog re-prices its spot offerings with them
(`offerings`, as `EC2Cloud.catalog`), and a launch records the price it lands at.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.catalog import Catalog
from autoscaler.cloud import (
    AvailabilityCache,
    CloudInstance,
    CloudRequestError,
    InsufficientCapacity,
    LaunchRequest,
    UnavailableOffering,
)
from executor.attempts import KEPT_FILE, LAUNCH_FILE, ask_to_checkpoint, attempt_directory
from executor.client import Launch
from executor.enrollment import EnrollmentRefused, check_secret, new_secret, secret_digest
from executor.protos import worker_pb2 as pb
from executor.runtime import LABEL_ATTEMPT, LABEL_INSTANCE, LABEL_TASK
from executor.security import write_secret
from provisioners.local_reclaims import NOTICE_WINDOW_S, NoticeServer, ReclaimPlan, notice_time
from provisioners.local_spot_prices import LOCAL_ZONE, SpotPriceTrace
from provisioners.spot_prices import SpotPriceTable

#: Where the metadata stand-in's port is kept, in the cloud's directory (one port for life).
NOTICE_PORT_FILE = "imds-port"
#: The agent's one-time enrollment secret, in its own work directory.
SECRET_FILE = "enrollment-secret"

log = logging.getLogger(__name__)


class LocalCloud:
    """Instances are `autoscaler worker` processes on this host."""

    def __init__(
        self,
        catalog: Catalog,
        root: Path,
        *,
        daemon_address: str,
        ca_path: Path,
        docker_url: str | None = None,
        emulate_delays: bool = False,
        clock: Callable[[], float] = time.time,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        throughput_window_s: float | None = None,
        stop_tasks: bool = True,
        orphan_timeout_s: float | None = None,
        orphan_max_s: float | None = None,
        stop_grace_s: float = 10.0,
        reclaims: ReclaimPlan | None = None,
        notice_window_s: float = NOTICE_WINDOW_S,
        notice_poll_s: float = 5.0,
        spot_prices: SpotPriceTrace | None = None,
        spot_epoch_s: float = 0.0,
        offerings: Callable[[Catalog, SpotPriceTable | None], Catalog] | None = None,
    ) -> None:
        # `catalog` as listed; `offerings` adds (and prices) its spot offerings, as on EC2.
        self._listed = catalog
        self._offerings = offerings
        self._catalog = catalog if offerings is None else offerings(catalog, None)
        self._live: SpotPriceTable | None = None
        # The spot price trace, from `spot_epoch_s`, of the types with a spot offering.
        self.spot_trace = spot_prices
        self.spot_epoch_s = spot_epoch_s
        self._spot_types = frozenset(t.launch_type for t in self._catalog if t.is_spot)
        self._spot_table: SpotPriceTable | None = None
        self._spot_newest: float | None = None
        # Absolute: agents are found by their work directory in their command line.
        self.root = root.absolute()
        self.daemon_address = daemon_address
        self.ca_path = ca_path
        self.docker_url = docker_url or os.environ.get("DOCKER_HOST")
        self.emulate_delays = emulate_delays
        self.clock = clock
        self.python = python
        self.extra_env = extra_env or {}
        self.throughput_window_s = throughput_window_s
        # What each agent is started with: checkpoint and stop its tasks on SIGTERM (an
        # instance told to stop), and its spend brake (None: the agent's own default).
        self.stop_tasks = stop_tasks
        self.orphan_timeout_s = orphan_timeout_s
        self.orphan_max_s = orphan_max_s
        # How long `terminate` waits for an agent after SIGTERM before SIGKILL.
        self.stop_grace_s = stop_grace_s
        self.availability = AvailabilityCache()
        self.reclaims = reclaims or ReclaimPlan()
        self.notice_window_s = notice_window_s
        self.notice_poll_s = notice_poll_s
        self._notices: NoticeServer | None = None
        self._lock = threading.RLock()
        self._prices_lock = threading.RLock()  # taken after `_lock` when both are
        self._base_ready = False
        (root / "instances").mkdir(parents=True, exist_ok=True)

    # -- the Cloud interface ---------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The listed types and the offerings `offerings` adds, at the spot prices in
        force (`spot_prices`)."""
        if self.spot_trace is None or self._offerings is None:
            return self._catalog
        with self._prices_lock:  # not the launches' lock: a launch may wait on Docker
            live = self.spot_prices()
            if live is not self._live:
                self._catalog = self._offerings(self._listed, live)
                self._live = live
            return self._catalog

    def spot_prices(self) -> SpotPriceTable | None:
        """The spot prices in force now by type (in `LOCAL_ZONE`), and as `history` the
        trace's changes since the previous answer with the price in force then (all of
        them up to now at the first: a restarted daemon's ledger catches up, idempotently)
        — EC2's refresh in shape. The same table, `retrieved_s` and all, until a change
        comes into force, so the daemon records each once. None without a trace, or
        before any price of the cluster's spot types is in force."""
        trace = self.spot_trace
        if trace is None:
            return None
        with self._prices_lock:
            now = self.clock()
            offset = now - self.spot_epoch_s
            newest = trace.newest(self._spot_types, offset)
            if newest is None or (self._spot_table is not None and newest == self._spot_newest):
                return self._spot_table
            known = self._spot_table
            since = None if known is None else known.retrieved_s - self.spot_epoch_s
            prices, history = trace.served(self._spot_types, since, offset)
            self._spot_table = SpotPriceTable(
                self._catalog.region or "",
                {itype: {LOCAL_ZONE: price} for itype, price in prices.items()},
                now,
                trace.source,
                {
                    itype: {LOCAL_ZONE: tuple((self.spot_epoch_s + at, p) for at, p in changes)}
                    for itype, changes in history.items()
                },
            )
            self._spot_newest = newest
            return self._spot_table

    def launch(self, request: LaunchRequest) -> CloudInstance:
        """Start an agent for this launch token, or return the one it already started."""
        with self._lock:
            if request.instance_type not in self._catalog:
                raise CloudRequestError(
                    f"instance type {request.instance_type} is not in the catalog"
                )
            existing = self._read(request.instance_id)
            if existing is not None and existing["state"] != "terminated":
                return self._view(existing)
            itype = self._catalog[request.instance_type]
            now = self.clock()
            if itype.is_spot and not self.reclaims.has_capacity(itype.name, now):
                self.availability.mark(itype.name, None, now, "no spot capacity (its trace)")
                raise InsufficientCapacity(itype.name, (LOCAL_ZONE,), "no spot capacity now")
            delays = itype.launch_delays if self.emulate_delays else None
            running_at = self.clock() + (delays.acquisition_s if delays else 0.0)
            record: dict[str, Any] = {
                "token": request.instance_id,
                "cloud_id": f"local-{secrets.token_hex(6)}",
                "type": itype.name,
                "launched_at": self.clock(),
                "running_at": running_at,
                "setup_s": delays.setup_s if delays else 0.0,
                "state": "pending",
                "pid": None,
            }
            if itype.is_spot:
                record["reclaim_at"] = self.reclaims.reclaim_at(
                    itype.name, request.instance_id, running_at
                )
                table = self.spot_prices()
                landed = table.price(itype.launch_type, LOCAL_ZONE) if table else None
                if landed is not None:  # billed at the price in force, as EC2 bills
                    record["hourly_price"] = landed
            secret = new_secret()
            record["enrollment_sha256"] = secret_digest(secret)
            record["enrolled"] = False
            self._write(record)  # recorded before the process exists: a crash leaves a trace
            work = self._dir(request.instance_id) / "work"
            work.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_secret(work / SECRET_FILE, secret + "\n", overwrite=True)
            record["pid"] = self._start_agent(record)
            self._write(record)
            return self._view(record)

    def terminate(
        self,
        instance_ids: Sequence[str],
        *,
        grace_s: float | None = None,
        waiting: Callable[[int, float], None] | None = None,
        remove_containers: bool = True,
    ) -> None:
        """Stop these agents and remove their containers; unknown ids are not an error.

        Every agent gets SIGTERM at once (started with `--stop-tasks`, each checkpoints and
        stops its tasks: an instance told to stop does so first), then SIGKILL when still
        alive after `grace_s` (default `stop_grace_s`; 0: at once). `waiting(alive, waited_s)`
        hears, about every second, how many agents are still stopping. Without
        `remove_containers`, containers an agent left are for `sweep` (`down`: it asks
        their jobs to checkpoint first)."""
        with self._lock:
            wanted = set(instance_ids)
            records = [
                r for r in self._records() if r["cloud_id"] in wanted and r["state"] != "terminated"
            ]
            grace = self.stop_grace_s if grace_s is None else grace_s
            self._stop_agents(records, grace, waiting, remove_containers)
            for record in records:
                record["state"] = "terminated"
                record["terminated_at"] = self.clock()
                self._write(record)

    def list(self) -> list[CloudInstance]:
        """Instances not terminated. An agent that died on its own is a terminated instance
        once none of its containers runs: until then the "machine" is up with its worker
        dead, as an EC2 instance whose agent was killed is, and listed so that the daemon
        terminates it (its containers with it) before starting its tasks elsewhere — never
        two live copies of a task."""
        with self._lock:
            out = []
            for record in self._records():
                if record["state"] == "terminated":
                    continue
                if (
                    record["pid"] is not None
                    and not _alive(record["pid"], record["token"])
                    and not self._running_containers(record["token"])
                ):
                    record["state"] = "terminated"
                    record["terminated_at"] = self.clock()
                    self._write(record)
                    continue
                reclaim_at = record.get("reclaim_at")
                if reclaim_at is not None and self.clock() >= reclaim_at + self.notice_window_s:
                    log.warning("reclaiming spot instance %s (%s)", record["token"], record["type"])
                    self._stop_agents([record], self.stop_grace_s)
                    record["state"] = "terminated"
                    record["terminated_at"] = self.clock()
                    record["reclaimed"] = True
                    self._write(record)
                    continue
                out.append(self._view(record))
            return sorted(out, key=lambda i: i.cloud_id)

    def unavailable(self) -> builtins.list[UnavailableOffering]:
        return self.availability.offerings(self.clock())

    # -- spot reclaims -----------------------------------------------------------------------

    def reclaim(self, instance_id: str, at: float | None = None) -> None:
        """Reclaim the instance of this launch token (a spot instance, or any: for tests and
        demonstrations) at `at` (now by default): its agent finds the notice at its next
        poll, and the cloud terminates it once the notice window is over."""
        with self._lock:
            record = self._read(instance_id)
            if record is None or record["state"] == "terminated":
                raise CloudRequestError(f"the local cloud runs no instance {instance_id}")
            record["reclaim_at"] = self.clock() if at is None else at
            self._write(record)

    def notice_of(self, instance_id: str) -> dict[str, str] | None:
        """The spot interruption notice the instance's metadata serves now (None: none)."""
        record = self._read(instance_id)
        reclaim_at = record.get("reclaim_at") if record is not None else None
        if reclaim_at is None or self.clock() < reclaim_at:
            return None
        return {"action": "terminate", "time": notice_time(reclaim_at + self.notice_window_s)}

    def notice_url(self, instance_id: str) -> str:
        """Where this instance's agent polls for notices (the stand-in starts at first use)."""
        with self._lock:
            if self._notices is None:
                self._notices = NoticeServer(self.notice_of, self.root / NOTICE_PORT_FILE)
            return self._notices.url_of(instance_id)

    def resume_notices(self) -> None:
        """Serve notices again where agents started by an earlier daemon poll (the port it
        recorded), before any launch asks for the stand-in; nothing when none ran."""
        if (self.root / NOTICE_PORT_FILE).exists():
            self.notice_url("")

    def close(self) -> None:
        """Stop the metadata stand-in (the agents keep running, as instances would)."""
        with self._lock:
            notices, self._notices = self._notices, None
        if notices is not None:
            notices.close()

    # -- enrollment --------------------------------------------------------------------------

    def verify(self, request: pb.EnrollRequest, launch: Launch) -> None:
        """Accept the one-time secret this cloud wrote for `launch`'s agent, once."""
        if request.WhichOneof("proof") != "local_secret":
            raise EnrollmentRefused("a local worker enrolls with its one-time secret")
        with self._lock:
            record = self._read(launch.instance_id)
            if record is None or record["state"] == "terminated":
                raise EnrollmentRefused(f"the local cloud runs no instance {launch.instance_id}")
            check_secret(
                request.local_secret, record.get("enrollment_sha256"), bool(record.get("enrolled"))
            )
            record["enrolled"] = True
            self._write(record)

    # -- cleaning up ----------------------------------------------------------------------

    def terminate_all(self) -> builtins.list[str]:
        """Stop every agent this cloud started (`autoscaler down`); returns their tokens."""
        records = [r for r in self._records() if r["state"] != "terminated"]
        self.terminate([r["cloud_id"] for r in records])
        return [r["token"] for r in records]

    def leftovers(self) -> Leftovers:
        """What of this cluster still runs on this host, whatever its records say: agent
        processes (found by their work directory under this cloud's root, so one whose
        record is lost or says terminated is found too) and containers labelled with any
        instance this cloud ever launched, its directories under this root (an agent killed
        with SIGKILL leaves them; another cluster of the same name on this host is not ours)."""
        tokens = {r["token"] for r in self._records()}
        marker = str(self.root / "instances") + "/"
        agents = sorted(
            pid for pid, cmdline in _processes() if marker in cmdline and "executor" in cmdline
        )
        containers: builtins.list[tuple[str, str]] = []
        client = self._docker()
        if client is not None:
            try:
                # Every cluster's on this engine: one that another removes between the
                # listing and its inspection is skipped, not an error (ignore_removed).
                for container in client.containers.list(
                    all=True, filters={"label": LABEL_INSTANCE}, ignore_removed=True
                ):
                    token = container.labels.get(LABEL_INSTANCE, "")
                    # Ours: one of our instances, and its directories under our root (an
                    # instance of another cluster of the same name on this host is not).
                    mounts = container.attrs.get("Mounts") or ()
                    if token in tokens and any(
                        str(m.get("Source", "")).startswith(marker) for m in mounts
                    ):
                        containers.append((container.id, token))
            finally:
                client.close()
        return Leftovers(tuple(agents), tuple(sorted(containers)))

    def sweep(self, grace_s: float = 0.0) -> Leftovers:
        """Remove what `leftovers` finds: agents get SIGTERM, then SIGKILL after `grace_s`;
        a container whose agent is gone has its job asked to checkpoint over its report
        socket, as the agent would (`ask_to_checkpoint`: the checkpoint and its step stay in
        its directory for `down` to upload), then is stopped and removed. Returns what
        it found. Processes are matched by their command line, so a reused pid is safe."""
        found = self.leftovers()
        for pid in found.agents:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in found.agents) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in found.agents:
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
        client = self._docker()
        if client is not None and found.containers:
            import docker

            try:
                if grace_s > 0:
                    # Their agents are gone: ask the jobs to checkpoint as an agent would.
                    ask_to_checkpoint(
                        [self._attempt_dir(client, c, t) for c, t in found.containers],
                        time.monotonic() + grace_s,
                    )
                for container_id, _token in found.containers:
                    try:
                        container = client.containers.get(container_id)
                        if grace_s > 0 and container.status == "running":
                            container.stop(timeout=min(10, max(1, int(grace_s))))
                        container.remove(force=True)
                    except docker.errors.APIError as exc:
                        if exc.status_code not in (404, 409):
                            raise
            finally:
                client.close()
        return found

    def kept_checkpoints(self) -> builtins.list[KeptCheckpoint]:
        """Checkpoints agents of this cloud left on this host's disk, not uploaded (the
        daemon could not be reached to grant the upload: `down` with the daemon stopped,
        or the spend brake): every attempt directory with a saved launch, a checkpoint
        directory that is not empty, and the step it was taken at (`kept.json`, which
        the agent writes when it keeps one, else the reporter's `final.json`)."""
        out = []
        for directory in sorted(self.root.glob("instances/*/work/attempts/*")):
            kept = _kept_step(directory)
            checkpoint = directory / "checkpoint"
            if kept is None or not (directory / LAUNCH_FILE).is_file():
                continue
            if not checkpoint.is_dir() or not any(checkpoint.iterdir()):
                continue
            out.append(KeptCheckpoint(directory, directory / LAUNCH_FILE, checkpoint, kept))
        return out

    # -- agents ------------------------------------------------------------------------------

    def _ensure_base_image(self) -> None:
        """The example jobs build FROM the local Python image: make it once, here, where
        the engine is (no registry is needed)."""
        if self._base_ready:
            return
        try:
            import docker

            from executor.images import ensure_python_image

            client = (
                docker.DockerClient(base_url=self.docker_url)
                if self.docker_url
                else (docker.from_env())
            )
            try:
                ensure_python_image(client)
            finally:
                client.close()
            self._base_ready = True
        except Exception as exc:  # the agent reports the build failure with its reason
            log.warning("could not make the local Python base image: %s", exc)

    def _start_agent(self, record: dict[str, Any]) -> int:
        self._ensure_base_image()
        itype = self._catalog[record["type"]]
        directory = self._dir(record["token"])
        work = directory / "work"
        work.mkdir(parents=True, exist_ok=True)
        capacity = ",".join(f"{v:g}" for v in itype.capacity)
        command = [
            self.python,
            "-m",
            "executor",
            "--daemon",
            self.daemon_address,
            "--ca",
            str(self.ca_path),
            "--enrollment-secret",
            str(work / SECRET_FILE),
            "--instance-id",
            record["token"],
            "--capacity",
            capacity,
            "--work-dir",
            str(work),
        ]
        if self.docker_url:
            command += ["--docker", self.docker_url]
        if self.throughput_window_s:
            command += ["--throughput-window", f"{self.throughput_window_s:g}"]
        if self.stop_tasks:
            command += ["--stop-tasks"]
        if self.orphan_timeout_s is not None:
            command += ["--orphan-timeout", f"{self.orphan_timeout_s:g}"]
        if self.orphan_max_s is not None:
            command += ["--orphan-max", f"{self.orphan_max_s:g}"]
        if itype.is_spot or self.reclaims:
            command += [
                "--imds-url",
                self.notice_url(record["token"]),
                "--notice-poll",
                f"{self.notice_poll_s:g}",
            ]
        wait = max(0.0, record["running_at"] - self.clock()) + record["setup_s"]
        if wait > 0:
            # Emulated acquisition and setup: the agent registers when EC2's would.
            command = ["sh", "-c", f'sleep {wait:.3f} && exec "$@"', "agent", *command]
        log = (directory / "agent.log").open("ab")
        env = {**os.environ, **self.extra_env, "AUTOSCALER_INSTANCE_ID": record["token"]}
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # survives the daemon, as an instance would
        )
        log.close()
        return process.pid

    def _stop_agents(
        self,
        records: Sequence[dict[str, Any]],
        grace_s: float,
        waiting: Callable[[int, float], None] | None = None,
        remove_containers: bool = True,
    ) -> None:
        """SIGTERM every agent at once, SIGKILL those alive after `grace_s`; then remove
        their containers (unless told not to)."""
        pids = [r["pid"] for r in records if r.get("pid") and _alive(r["pid"], r["token"])]
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
            # As systemd does: a stopped (SIGSTOP) agent handles its SIGTERM only once
            # continued, and would otherwise sit out the grace to be killed unsaved.
            _signal_group(pid, signal.SIGCONT)
        began = time.monotonic()
        told = began
        while (alive := sum(_alive(p) for p in pids)) and time.monotonic() < began + grace_s:
            if waiting is not None and time.monotonic() - told >= 1.0:
                told = time.monotonic()
                waiting(alive, told - began)
            time.sleep(0.05)
        for pid in pids:
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
        for record in records if remove_containers else ():
            self._remove_containers(record["token"])

    def _attempt_dir(self, client: Any, container_id: str, token: str) -> Path:
        """The attempt directory of a container of ours (from its labels)."""
        labels = client.containers.get(container_id).labels
        return attempt_directory(
            self._dir(token) / "work",
            labels.get(LABEL_TASK, ""),
            int(labels.get(LABEL_ATTEMPT, "0") or 0),
        )

    def _docker(self) -> Any:
        """A client of the engine, or None when there is none (no container ever ran)."""
        try:
            import docker

            return (
                docker.DockerClient(base_url=self.docker_url)
                if self.docker_url
                else (docker.from_env())
            )
        except Exception:
            return None

    def _running_containers(self, token: str) -> bool:
        """Whether a container of this instance runs (False without an engine)."""
        client = self._docker()
        if client is None:
            return False
        try:
            return bool(
                client.containers.list(
                    filters={"label": f"{LABEL_INSTANCE}={token}", "status": "running"}
                )
            )
        except Exception:  # the engine is gone: so is anything it ran
            return False
        finally:
            client.close()

    def _remove_containers(self, token: str) -> None:
        """The instance is gone: so are its containers (as on a terminated EC2 instance)."""
        client = self._docker()
        if client is None:
            return  # no engine: the agent never ran a container
        import docker

        try:
            for container in client.containers.list(
                all=True, filters={"label": f"{LABEL_INSTANCE}={token}"}
            ):
                try:
                    container.remove(force=True)
                except docker.errors.APIError as exc:
                    # gone already, or its removal in progress (the agent's own cleanup)
                    if exc.status_code not in (404, 409):
                        raise
        finally:
            client.close()

    # -- the registry --------------------------------------------------------------------------

    def _dir(self, token: str) -> Path:
        return self.root / "instances" / token

    def _read(self, token: str) -> dict[str, Any] | None:
        path = self._dir(token) / "instance.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _write(self, record: dict[str, Any]) -> None:
        directory = self._dir(record["token"])
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "instance.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, directory / "instance.json")

    def _records(self) -> builtins.list[dict[str, Any]]:
        out = []
        for path in sorted((self.root / "instances").glob("*/instance.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def _view(self, record: dict[str, Any]) -> CloudInstance:
        state = record["state"]
        if state == "pending" and self.clock() >= record["running_at"]:
            state = "running"
        return CloudInstance(
            record["cloud_id"],
            record["type"],
            state,  # type: ignore[arg-type]
            LOCAL_ZONE,
            record["token"],
            record["launched_at"],
            spot=record["type"] in self._catalog and self._catalog[record["type"]].is_spot,
            hourly_price=record.get("hourly_price"),
        )


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What of a local cluster runs on this host: agent process ids, and containers
    (id, the instance token of its label)."""

    agents: tuple[int, ...] = ()
    containers: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.agents or self.containers)


@dataclass(frozen=True, slots=True)
class KeptCheckpoint:
    """A checkpoint an agent kept on this host's disk: its attempt directory, the saved
    launch (`launch.pb`, the worker protocol's `StartTask`), the checkpoint directory
    and the job's step when it was taken."""

    directory: Path
    launch: Path
    checkpoint: Path
    step: int


def _kept_step(directory: Path) -> int | None:
    """The step of the checkpoint kept in an attempt directory, or None if none is kept."""
    for name, key in ((KEPT_FILE, "step"), ("report/final.json", "checkpoint_step")):
        try:
            document = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            continue
        step = document.get(key) if isinstance(document, dict) else None
        if isinstance(step, int | float) and not isinstance(step, bool) and step >= 0:
            return int(step)
    return None


def _processes() -> builtins.list[tuple[int, str]]:
    """(pid, command line) of every process this user can see (none without /proc)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline:
            out.append((int(entry.name), cmdline.replace(b"\0", b" ").decode("utf-8", "replace")))
    return out


def _alive(pid: int, token: str | None = None) -> bool:
    """Is the agent `pid` (for launch `token`) still running? A reused pid is not it."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and exited
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if token is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return True  # no /proc here: trust the pid
        # Empty while the process is between fork and exec: not yet known to be another.
        return not cmdline or token.encode() in cmdline
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
