"""Spot reclaims on the local cloud: when a spot instance is taken back, and the notice of it.

So the whole interruption path — the notice, the agent checkpointing and stopping
its tasks, the daemon planning them elsewhere, the instance going away — runs on
one machine without an AWS account. Two ways to say when capacity goes:

- **a rate per offering** (reclaims per instance-hour): each spot instance's reclaim
  time is drawn at its launch from an exponential distribution, from a generator
  seeded with the cluster's seed and the instance's launch token, so a run is
  repeatable and no draw depends on the order of launches;
- **an availability trace per offering**, in the format "Can't Be Late" (NSDI '24)
  publishes its AWS spot traces in: `{"metadata": {"gap_seconds": 600}, "data":
  [0, 1, ...]}`, one sample per interval from the local cloud's epoch, **1 = no spot
  capacity**; a trace shorter than the run repeats. A launch into an interval of 1
  finds no capacity; a running instance is reclaimed at the start of the next one.

`NoticeServer` is the instance metadata service's stand-in: each instance's agent
polls `<url>/i/<launch token>/latest/meta-data/spot/instance-action` (IMDSv2: a PUT
for a session token first), which answers 404 until its reclaim, then EC2's
notice, `{"action": "terminate", "time": <reclaim + window>}`; the local cloud
terminates the instance when the window is over.

The stand-in keeps one address for the cluster's life, as EC2's metadata service keeps
169.254.169.254: its port is recorded in the local cloud's directory (`port_file`) and
bound again by the next daemon, so agents started before a daemon restart — which were
told the URL once, on their command line — keep receiving notices. (Telling running
agents a new URL instead would need a channel to every agent and a change to the
agent's IMDS client, which on EC2 never moves.)
"""

from __future__ import annotations

import errno
import json
import logging
import math
import random
import secrets
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from autoscaler.availability import AvailabilityTrace
from autoscaler.errors import InputError

log = logging.getLogger(__name__)

#: EC2's warning before a spot instance is reclaimed.
NOTICE_WINDOW_S = 120.0


class ReclaimPlan:
    """When the local cloud reclaims each spot instance, by offering (its catalog name)."""

    def __init__(
        self,
        rates_per_hour: Mapping[str, float] | None = None,
        traces: Mapping[str, AvailabilityTrace] | None = None,
        *,
        seed: int = 0,
        epoch_s: float = 0.0,
    ) -> None:
        self.rates_per_hour = dict(rates_per_hour or {})
        self.traces = dict(traces or {})
        for offering, rate in self.rates_per_hour.items():
            if not 0 <= rate < math.inf:
                raise InputError(
                    "must be 0 or more reclaims per instance-hour",
                    field=f"reclaim_rates.{offering}",
                    value=rate,
                    has_value=True,
                )
        self.seed = seed
        self.epoch_s = epoch_s

    def __bool__(self) -> bool:
        return bool(self.rates_per_hour or self.traces)

    def has_capacity(self, offering: str, now_s: float) -> bool:
        trace = self.traces.get(offering)
        return trace is None or trace.available(now_s - self.epoch_s)

    def reclaim_at(self, offering: str, token: str, running_at_s: float) -> float | None:
        """When an instance of `offering` launched with `token`, running from
        `running_at_s`, is reclaimed (None: never, by this plan)."""
        trace = self.traces.get(offering)
        if trace is not None:
            after = trace.next_unavailable(running_at_s - self.epoch_s)
            return None if after is None else self.epoch_s + after
        rate = self.rates_per_hour.get(offering, 0.0)
        if rate <= 0:
            return None
        draw = random.Random(f"{self.seed}:{offering}:{token}").expovariate(rate / 3600.0)
        return running_at_s + draw


def notice_time(at_s: float) -> str:
    """A time as IMDS writes it: ISO 8601, UTC, to the second, with a Z."""
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NoticeServer:
    """The instance metadata service's stand-in for the local cloud's instances, on
    127.0.0.1: IMDSv2 sessions, and for each instance (`/i/<token>`) the spot
    instance-action notice `notices(token)` gives (None: 404, no notice). With
    `port_file`, it listens on the port recorded there (where agents started by an
    earlier daemon poll) and records the port it listens on."""

    def __init__(
        self,
        notices: Callable[[str], Mapping[str, Any] | None],
        port_file: Path | None = None,
    ) -> None:
        self.session = secrets.token_urlsafe(16)
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                token, path = _split(self.path)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if token is None or path != "/latest/api/token" or not ttl:
                    self._answer(400, b"")
                    return
                self._answer(200, owner.session.encode())

            def do_GET(self) -> None:
                owner.requests += 1
                if self.headers.get("X-aws-ec2-metadata-token") != owner.session:
                    self._answer(401, b"")
                    return
                token, path = _split(self.path)
                body = None
                if token is not None and path == "/latest/meta-data/spot/instance-action":
                    notice = notices(token)
                    body = json.dumps(notice).encode() if notice is not None else None
                self._answer(200 if body is not None else 404, body or b"")

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _bind(Handler, recorded_port(port_file))
        if port_file is not None:
            port_file.parent.mkdir(parents=True, exist_ok=True)
            port_file.write_text(f"{self.server.server_port}\n")
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="local-imds", daemon=True
        )
        self._thread.start()

    def url_of(self, token: str) -> str:
        """The metadata endpoint one instance's agent polls."""
        return f"{self.url}/i/{token}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def recorded_port(port_file: Path | None) -> int:
    """The port an earlier stand-in recorded (0: none, any free port)."""
    if port_file is None:
        return 0
    try:
        port = int(port_file.read_text())
    except (OSError, ValueError):
        return 0
    return port if 0 < port < 65536 else 0


def _bind(handler: type[BaseHTTPRequestHandler], port: int) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port`; on another free port when something else holds it
    (agents polling the old one then see no notices: their instances still go at the
    reclaim, and the daemon finds their workers lost)."""
    try:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        if port == 0 or exc.errno != errno.EADDRINUSE:
            raise
        log.warning("the spot notice port %d is taken: agents started before see no notices", port)
        return ThreadingHTTPServer(("127.0.0.1", 0), handler)


def _split(path: str) -> tuple[str | None, str]:
    """(launch token, the IMDS path after it) of `/i/<token>/latest/...`."""
    parts = path.split("/", 3)
    if len(parts) < 4 or parts[1] != "i" or not parts[2]:
        return None, path
    return parts[2], "/" + parts[3]


__all__ = [
    "NOTICE_WINDOW_S",
    "AvailabilityTrace",
    "NoticeServer",
    "ReclaimPlan",
    "notice_time",
]
