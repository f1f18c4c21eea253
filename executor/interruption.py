"""Spot interruption notices, read from the instance metadata service (IMDSv2).

EC2 gives a spot instance two minutes' warning before it reclaims it: from then
on `latest/meta-data/spot/instance-action` answers `{"action": "terminate",
"time": "..."}` (404 before). Earlier, and less surely, it may publish a
rebalance recommendation at `latest/meta-data/events/recommendations/rebalance`
(`{"noticeTime": "..."}`): the instance runs a higher risk of interruption soon.
(EC2 User Guide, "Spot Instance interruption notices" and "EC2 instance
rebalance recommendations".) The local cloud serves the same paths from its
stand-in when it emulates a reclaim.

`NoticeWatcher` polls both every few seconds with a session token (a PUT first,
as IMDSv2 demands; a 401 renews it) and hands each new notice to its caller:
the agent checkpoints and stops its tasks inside the window and reports the
notice at its next heartbeat. A metadata service that does not answer is not a
notice: the watcher logs it once and keeps polling.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

INSTANCE_ACTION = "instance-action"
REBALANCE = "rebalance"
#: Where each notice is published, relative to the IMDS endpoint.
NOTICE_PATHS = {
    INSTANCE_ACTION: "/latest/meta-data/spot/instance-action",
    REBALANCE: "/latest/meta-data/events/recommendations/rebalance",
}
#: How often the agent asks by default: AWS recommends every 5 s (the notice comes 2 min early).
DEFAULT_POLL_S = 5.0
TOKEN_TTL_S = 21600


@dataclass(frozen=True, slots=True)
class Notice:
    """One notice as IMDS published it: its kind, the action (instance-action only) and
    the time it names."""

    kind: str
    action: str = ""
    time: str = ""

    def describe(self) -> str:
        if self.kind == INSTANCE_ACTION:
            return f"spot interruption notice: {self.action or 'terminate'} at {self.time}"
        return f"rebalance recommendation at {self.time}"


def parse_notice(kind: str, body: bytes) -> Notice | None:
    """The notice a 200 answer of `kind`'s path carries (None: not one we can read)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if kind == INSTANCE_ACTION:
        action, when = data.get("action"), data.get("time")
        if not isinstance(action, str) or not isinstance(when, str):
            return None
        return Notice(INSTANCE_ACTION, action, when)
    when = data.get("noticeTime")
    return Notice(REBALANCE, "", when) if isinstance(when, str) else None


class NoticeWatcher:
    """Polls IMDSv2 for spot interruption notices; each new one goes to `on_notice` once."""

    def __init__(
        self,
        endpoint: str,
        on_notice: Callable[[Notice], None],
        *,
        interval_s: float = DEFAULT_POLL_S,
        timeout_s: float = 2.0,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.on_notice = on_notice
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.seen: list[Notice] = []
        self._token: str | None = None
        self._failing = False

    def run(self, closing: threading.Event) -> None:
        """Poll until `closing` is set (the agent's notice thread)."""
        while not closing.is_set():
            self.poll()
            closing.wait(self.interval_s)

    def poll(self) -> list[Notice]:
        """Ask once for each kind of notice; returns the new ones (after handing each over)."""
        found: list[Notice] = []
        for kind, path in NOTICE_PATHS.items():
            try:
                body = self._get(path)
            except (urllib.error.URLError, OSError) as exc:
                if not self._failing:
                    log.warning("cannot read %s from %s: %s", kind, self.endpoint, exc)
                self._failing = True
                return found
            self._failing = False
            notice = parse_notice(kind, body) if body is not None else None
            if notice is not None and notice not in self.seen:
                self.seen.append(notice)
                found.append(notice)
                log.warning("%s", notice.describe())
                self.on_notice(notice)
        return found

    def _get(self, path: str) -> bytes | None:
        """The body at `path` (None: 404, nothing published), with a fresh token on a 401."""
        for _ in range(2):
            if self._token is None:
                self._token = self._new_token()
            request = urllib.request.Request(
                f"{self.endpoint}{path}", headers={"X-aws-ec2-metadata-token": self._token}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    return bytes(answer.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:
                    self._token = None  # expired: ask for another once
                    continue
                raise
        return None

    def _new_token(self) -> str:
        request = urllib.request.Request(
            f"{self.endpoint}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
            return str(answer.read().decode())


__all__ = ["INSTANCE_ACTION", "REBALANCE", "Notice", "NoticeWatcher", "parse_notice"]
