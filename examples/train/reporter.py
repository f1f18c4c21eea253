"""The job side: count iterations, report throughput, checkpoint on schedule and when asked.

Standard library only: copy this file into any image with a Python 3. Like
Eva's EvaIterator (§5), it wraps the job's data iterator:

    from reporter import Reporter

    reporter = Reporter(start=restored_step)       # listens on $AUTOSCALER_REPORT_SOCKET
    for batch in reporter.wrap(loader):            # one iteration per item
        train(batch)
        if reporter.checkpoint_due():              # every checkpoint_every_s, or asked
            save(os.environ["AUTOSCALER_CHECKPOINT_DIR"], reporter.iterations)
            reporter.checkpoint_done()             # the worker uploads it while we run on
            if reporter.stop_requested:            # the worker wants to move the task
                break                              # exit: the last one is uploaded too

`checkpoint_due()` turns true every `$AUTOSCALER_CHECKPOINT_EVERY_S` seconds
(the job file's `checkpoint_every_s`, default 900) and at once when the worker
asks the job to checkpoint and stop. Each completed checkpoint is uploaded
while the job runs, so a crash of anything (the job, the worker agent, the
instance, the daemon) loses at most one interval, and a task resumes from its
newest complete checkpoint. Write checkpoints atomically (a temporary file,
then `os.replace`); after `checkpoint_done()` leave the directory alone until
`checkpoint_due()` says otherwise: the worker copies it first (the copy is
what it uploads), and `checkpoint_due()` stays false until it has. A job that
writes its directory without telling (no `checkpoint_done()`) still has it
uploaded when its attempt ends.

The watchdog: when no worker has asked the reporter anything for
`$AUTOSCALER_WATCHDOG_S` seconds (its agent died, or was cut off: the daemon
may already be running the task elsewhere), the reporter asks the job to
checkpoint and stop as the worker would, and the process exits with status
75 (`ORPHANED_EXIT`, EX_TEMPFAIL) once the reporter closes (at exit, or when
its `with` block ends) or `$AUTOSCALER_WATCHDOG_GRACE_S` seconds later
(default 30), whichever comes first. A job never outlives its worker by much.

Wire protocol (version 2), for a job in any language
----------------------------------------------------

The job listens on the Unix socket `$AUTOSCALER_REPORT_SOCKET` (in a
directory the worker bind-mounts; a container without network still reaches
it). The worker connects and sends requests; each request and each answer is
one JSON object on one line (UTF-8, ending in `\\n`); a connection may carry
several requests, answered in order.

    {"op": "status"}
        -> {"ok": true, "protocol": 2, "iterations": 1200, "throughput": 4.1,
            "window_s": 300, "first_iteration_at": 1718000000.5,
            "checkpoint_requested": false, "checkpoint_done": false,
            "checkpoint_seq": 3, "checkpoint_step": 1100, "checkpoint_collected": 2,
            "orphaned": false}
    {"op": "checkpoint"}
        -> {"ok": true, "checkpoint_requested": true, "checkpoint_done": false}
    {"op": "collected", "seq": 3}
        -> {"ok": true, "checkpoint_collected": 3}
    anything else
        -> {"ok": false, "error": "..."}

- `iterations`: done so far, counting from the step the job resumed at.
- `throughput`: iterations per second over the last `window_s` seconds
  (`$AUTOSCALER_THROUGHPUT_WINDOW_S`, default 300), measured from the first
  iteration on (start-up is not counted); `null` until a whole window has
  passed.
- `first_iteration_at`: Unix time of the first iteration of this run.
- `checkpoint`: the worker asks the job to save a checkpoint and stop;
  `checkpoint_done` turns true once the job has saved one since.
- `checkpoint_seq`: checkpoints the job has completed in this run (each
  `checkpoint_done()`), `checkpoint_step` the step of the last one (`null`
  before the first); `collected`: the worker has copied checkpoint `seq` out
  of the directory, and the job may write the next one. When the worker
  speaks this version (`$AUTOSCALER_WORKER_PROTOCOL` is 2 or more) the job
  writes no new checkpoint until the last one is collected; otherwise it
  never waits.
- `orphaned`: the watchdog has fired.
- Every request, whatever it is, tells the watchdog the worker is alive.

When the job exits, the reporter leaves its last count beside the socket, in
`final.json` (`{"protocol": 2, "iterations": 1200, "checkpoint_seq": 3,
"checkpoint_step": 1100, "orphaned": false}`, written atomically): the worker
polls every second or so, and what the job did after its last poll would
otherwise be lost.

The environment the worker sets: `AUTOSCALER_CHECKPOINT_DIR` (where to save and
restore; restored before the job starts when it resumes, `AUTOSCALER_RESUMED`
is then 1), `AUTOSCALER_REPORT_SOCKET`, `AUTOSCALER_THROUGHPUT_WINDOW_S`,
`AUTOSCALER_CHECKPOINT_EVERY_S`, `AUTOSCALER_WORKER_PROTOCOL`,
`AUTOSCALER_WATCHDOG_S` (0: no watchdog) and `AUTOSCALER_WATCHDOG_GRACE_S`,
besides the task's identity (`AUTOSCALER_JOB_ID`, `AUTOSCALER_TASK_ID`,
`AUTOSCALER_ATTEMPT`, `AUTOSCALER_INSTANCE_ID`, `AUTOSCALER_GPUS`).

How the worker reads the job's exit status (the attempt's failure class,
which decides whether the task is tried again): 0 is done (or, after a
checkpoint request, stopped); 126 and 127 (command not executable, not
found) and the codes the job file declares fatal (`fatal_exit_codes`) are
the job's deterministic errors, failing it at once; 75 after the watchdog
fired is not the job's doing; any other status, and being killed for
memory, is transient: retried from the last checkpoint.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

PROTOCOL = 2
DEFAULT_WINDOW_S = 300.0
DEFAULT_CHECKPOINT_EVERY_S = 900.0
DEFAULT_WATCHDOG_GRACE_S = 30.0
SOCKET_ENV = "AUTOSCALER_REPORT_SOCKET"
#: Beside the socket: the count when the job exited.
FINAL_FILE = "final.json"
WINDOW_ENV = "AUTOSCALER_THROUGHPUT_WINDOW_S"
CHECKPOINT_EVERY_ENV = "AUTOSCALER_CHECKPOINT_EVERY_S"
WATCHDOG_ENV = "AUTOSCALER_WATCHDOG_S"
WATCHDOG_GRACE_ENV = "AUTOSCALER_WATCHDOG_GRACE_S"
#: The protocol version the worker speaks (2: it collects each checkpoint).
WORKER_PROTOCOL_ENV = "AUTOSCALER_WORKER_PROTOCOL"
#: The exit status of a job its watchdog stopped (sysexits' EX_TEMPFAIL: try again later).
ORPHANED_EXIT = 75
#: Samples kept per window: throughput is exact to within window / RESOLUTION seconds.
RESOLUTION = 64
_MAX_LINE = 4096
#: After the watchdog's checkpoint is saved, how long the job has to exit on its own.
_SETTLE_S = 2.0

T = TypeVar("T")


class Reporter:
    """Counts a job's iterations, says when to checkpoint, answers the worker over the
    report socket, and stops the job when no worker is left to hear it (the watchdog).

    `socket_path` defaults to `$AUTOSCALER_REPORT_SOCKET`; without one (a job
    run by hand) nothing listens and the reporter only counts and keeps time.
    `start` is the iteration the job resumed from, so counts continue across
    migrations. The other settings default to the environment the worker sets
    (see the module's docstring); `clock` and `exit` are for tests.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        window_s: float | None = None,
        start: float = 0,
        clock: Callable[[], float] = time.monotonic,
        checkpoint_every_s: float | None = None,
        watchdog_s: float | None = None,
        watchdog_grace_s: float | None = None,
        worker_collects: bool | None = None,
        exit: Callable[[int], None] | None = None,
    ) -> None:
        if window_s is None:
            window_s = _env_seconds(WINDOW_ENV, DEFAULT_WINDOW_S)
        if not window_s > 0:
            raise ValueError(f"the throughput window must be positive, got {window_s}")
        if checkpoint_every_s is None:
            checkpoint_every_s = _env_seconds(CHECKPOINT_EVERY_ENV, DEFAULT_CHECKPOINT_EVERY_S)
        if not checkpoint_every_s > 0:
            raise ValueError(f"the checkpoint interval must be positive, got {checkpoint_every_s}")
        if watchdog_s is None:
            watchdog_s = _env_seconds(WATCHDOG_ENV, 0.0)
        if watchdog_grace_s is None:
            watchdog_grace_s = _env_seconds(WATCHDOG_GRACE_ENV, DEFAULT_WATCHDOG_GRACE_S)
        if worker_collects is None:
            worker_collects = _env_seconds(WORKER_PROTOCOL_ENV, 1) >= 2
        self.window_s = float(window_s)
        self.checkpoint_every_s = float(checkpoint_every_s)
        self.watchdog_s = max(float(watchdog_s), 0.0)
        self.watchdog_grace_s = max(float(watchdog_grace_s), 0.0)
        self._clock = clock
        self._exit = exit or _exit_process
        self._lock = threading.Lock()
        self._count = float(start)
        self._samples: deque[tuple[float, float]] = deque()  # (time, count), oldest first
        self._first_at: float | None = None  # Unix time of the first iteration
        self._requested = threading.Event()
        self._done = False  # a checkpoint completed since the request
        self._done_at: float | None = None
        now = clock()
        self._seq = 0  # checkpoints completed in this run
        self._step: float | None = None  # the step of the last one
        self._last_checkpoint_at = now
        self._collected = 0
        self._heard_at = now  # the worker's last request (any)
        self._orphaned_at: float | None = None
        self._closed = threading.Event()
        self._closing = threading.Lock()  # one closes, the other waits for it
        self._server: socket.socket | None = None
        path = socket_path if socket_path is not None else os.environ.get(SOCKET_ENV)
        # Only a worker collects checkpoints, and only one that speaks version 2.
        self._handshake = bool(path) and worker_collects
        if path:
            self._server = _listen(path)
            self._path = path
            thread = threading.Thread(target=self._serve, name="reporter", daemon=True)
            thread.start()
            atexit.register(self.close)
            if self.watchdog_s:
                watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                watchdog.start()

    # -- counting -----------------------------------------------------------------

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield the items of `iterable`, counting one iteration per item."""
        for item in iterable:
            yield item
            self.step()

    def step(self, n: float = 1) -> None:
        """Count `n` more iterations."""
        now = self._clock()
        with self._lock:
            self._count += n
            if self._first_at is None:
                self._first_at = time.time()
                self._samples.append((now, self._count - n))
            if now - self._samples[-1][0] >= self.window_s / RESOLUTION:
                self._samples.append((now, self._count))
            self._trim(now)

    @property
    def iterations(self) -> float:
        with self._lock:
            return self._count

    def throughput(self) -> float | None:
        """Iterations per second over the last window; None until a window has passed."""
        now = self._clock()
        with self._lock:
            self._trim(now)
            if not self._samples or now - self._samples[0][0] < self.window_s:
                return None
            since, count = self._samples[0]
            return (self._count - count) / (now - since)

    def _trim(self, now: float) -> None:
        # Keep the newest sample at least a window old, and every sample after it.
        samples = self._samples
        while len(samples) > 1 and now - samples[1][0] >= self.window_s:
            samples.popleft()

    # -- checkpoints --------------------------------------------------------------

    def checkpoint_due(self) -> bool:
        """True when the job should save a checkpoint now: `checkpoint_every_s` has passed
        since its last one (or its start), or the worker (or the watchdog) asked for one.
        False while the worker has not yet collected the last one."""
        now = self._clock()
        with self._lock:
            if not self._may_write():
                return False
            if self._requested.is_set() and not self._done:
                return True
            return now - self._last_checkpoint_at >= self.checkpoint_every_s

    def should_checkpoint(self) -> bool:
        """True once the worker has asked for a checkpoint (and it is not done yet)."""
        with self._lock:
            return self._requested.is_set() and not self._done and self._may_write()

    @property
    def stop_requested(self) -> bool:
        """The worker (or the watchdog) asked the job to checkpoint and stop: once the
        checkpoint is done, exit."""
        return self._requested.is_set()

    def checkpoint_done(self, step: float | None = None) -> None:
        """Tell the worker a checkpoint is saved (complete, in the checkpoint directory), as
        of `step` (default: the iterations counted so far): it is uploaded at once."""
        now = self._clock()
        with self._lock:
            self._seq += 1
            self._step = self._count if step is None else float(step)
            self._last_checkpoint_at = now
            if self._requested.is_set():
                self._done = True
                self._done_at = now

    def wait_for_checkpoint_request(self, timeout: float | None = None) -> bool:
        """Block until the worker asks for a checkpoint (jobs that are not loops)."""
        return self._requested.wait(timeout)

    def _may_write(self) -> bool:
        """The last checkpoint is collected (or nobody collects, or nobody is left to)."""
        return not self._handshake or self._orphaned_at is not None or self._collected >= self._seq

    # -- the watchdog -------------------------------------------------------------

    @property
    def orphaned(self) -> bool:
        """The watchdog fired: no worker asked anything for `watchdog_s` seconds."""
        with self._lock:
            return self._orphaned_at is not None

    def _watch(self) -> None:
        period = min(1.0, self.watchdog_s / 8)
        while not self._closed.wait(period):
            self.watchdog_tick()

    def watchdog_tick(self) -> None:
        """One look (its thread looks every second or so): fire when the worker has been
        silent for `watchdog_s`; once fired, end the process when the job has saved its
        checkpoint (and had a moment to exit by itself) or the grace is over."""
        now = self._clock()
        with self._lock:
            silent = now - self._heard_at
            if self._orphaned_at is None:
                if silent < self.watchdog_s:
                    return
                self._orphaned_at = now
                self._requested.set()
                fired, finish = True, False
            else:
                settled = self._done_at is not None and now - self._done_at >= _SETTLE_S
                fired = False
                finish = settled or now - self._orphaned_at >= self.watchdog_grace_s
        if finish:
            self.close()
        elif fired:
            print(
                f"reporter: no word from the worker for {silent:.0f} s: checkpointing and "
                f"stopping (exit status {ORPHANED_EXIT})",
                file=sys.stderr,
                flush=True,
            )

    # -- the socket ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        throughput = self.throughput()
        with self._lock:
            return {
                "ok": True,
                "protocol": PROTOCOL,
                "iterations": self._count,
                "throughput": throughput,
                "window_s": self.window_s,
                "first_iteration_at": self._first_at,
                "checkpoint_requested": self._requested.is_set(),
                "checkpoint_done": self._done,
                "checkpoint_seq": self._seq,
                "checkpoint_step": self._step,
                "checkpoint_collected": self._collected,
                "orphaned": self._orphaned_at is not None,
            }

    def answer(self, request: Any) -> dict[str, Any]:
        """The answer to one decoded request (see the wire protocol above)."""
        now = self._clock()
        with self._lock:
            self._heard_at = now
        op = request.get("op") if isinstance(request, dict) else None
        if op == "status":
            return self.status()
        if op == "checkpoint":
            self._requested.set()
            with self._lock:
                return {"ok": True, "checkpoint_requested": True, "checkpoint_done": self._done}
        if op == "collected":
            seq = request.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                return {"ok": False, "error": "collected needs the checkpoint's seq (an integer)"}
            with self._lock:
                self._collected = max(self._collected, min(seq, self._seq))
                return {"ok": True, "checkpoint_collected": self._collected}
        return {
            "ok": False,
            "error": f"unknown op {op!r}; expected 'status', 'checkpoint' or 'collected'",
        }

    def _serve(self) -> None:
        server = self._server
        assert server is not None
        while not self._closed.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                return  # closed
            with connection:
                connection.settimeout(5.0)
                with contextlib.suppress(OSError):  # the worker went away; it asks again
                    self._converse(connection)

    def _converse(self, connection: socket.socket) -> None:
        buffer = b""
        while True:
            chunk = connection.recv(4096)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    answer = self.answer(json.loads(line))
                except ValueError:
                    answer = {"ok": False, "error": "not a JSON object on one line"}
                connection.sendall(json.dumps(answer).encode() + b"\n")
            if len(buffer) > _MAX_LINE:
                connection.sendall(b'{"ok": false, "error": "request too long"}\n')
                return

    def close(self) -> None:
        """Stop listening (the socket file is removed) and leave the final count; once the
        watchdog has fired, end the process with `ORPHANED_EXIT` — also when the watchdog's
        thread closed first, as the job exits: the interpreter would otherwise end with the
        job's own status before that thread's exit."""
        with self._closing:
            if not self._closed.is_set():
                self._closed.set()
                self._leave_final()
        if self.orphaned:
            self._exit(ORPHANED_EXIT)

    def _leave_final(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            with self._lock:
                final = {
                    "protocol": PROTOCOL,
                    "iterations": self._count,
                    "checkpoint_seq": self._seq,
                    "checkpoint_step": self._step,
                    "orphaned": self._orphaned_at is not None,
                }
            path = os.path.join(os.path.dirname(self._path), FINAL_FILE)
            with contextlib.suppress(OSError):
                with open(path + ".tmp", "w") as handle:
                    json.dump(final, handle)
                os.replace(path + ".tmp", path)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _env_seconds(name: str, default: float) -> float:
    """A number from the environment (the worker sets these); `default` when unset or bad."""
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


def _exit_process(code: int) -> None:
    """End the whole process now, from any thread (what is printed is kept)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _listen(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):  # left by an earlier run of the container
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _through_directory(server.bind, path)
    # The socket's directory is this container's own bind mount: whoever may reach it is
    # the worker. Open the socket itself, so a job running as any user can be asked.
    os.chmod(path, 0o666)
    server.listen(8)
    return server


def ask(path: str, request: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """Send one request to the reporter listening on `path` and return its answer
    (the worker's side of the protocol, also handy for debugging a job)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        _connect(client, path)
        client.sendall(json.dumps(request).encode() + b"\n")
        buffer = b""
        while b"\n" not in buffer:
            chunk = client.recv(4096)
            if not chunk:
                raise ConnectionError("the reporter closed the connection without answering")
            buffer += chunk
            if len(buffer) > _MAX_LINE * 4:
                raise ConnectionError("the reporter's answer is too long")
    answer = json.loads(buffer.split(b"\n", 1)[0])
    if not isinstance(answer, dict):
        raise ConnectionError("the reporter's answer is not a JSON object")
    return answer


def _connect(client: socket.socket, path: str) -> None:
    _through_directory(client.connect, path)


def _through_directory(call: Callable[[str], None], path: str) -> None:
    """Bind or connect to a Unix socket, also when its path is longer than the 107 bytes a
    socket address holds (a worker's directories can be deep): through the directory's
    file descriptor, /proc/self/fd/N/NAME, which is short."""
    if len(path.encode()) < 100:
        call(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        call(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)
