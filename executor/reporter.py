"""The job side: count iterations, report throughput, checkpoint when asked.

Standard library only: copy this file into any image with a Python 3. Like
Eva's EvaIterator (§5), it wraps the job's data iterator:

    from reporter import Reporter

    reporter = Reporter(start=restored_step)       # listens on $AUTOSCALER_REPORT_SOCKET
    for batch in reporter.wrap(loader):            # one iteration per item
        train(batch)
        if reporter.should_checkpoint():           # the worker wants to move the task
            save(os.environ["AUTOSCALER_CHECKPOINT_DIR"], reporter.iterations)
            reporter.checkpoint_done()
            break                                  # exit: the worker uploads the directory

Write checkpoints atomically (a temporary file, then `os.replace`): the worker
uploads whatever the checkpoint directory holds when the container ends, and
a job may also be stopped by SIGTERM (then SIGKILL after a grace period) if it
does not answer in time. A job may checkpoint on its own at any time too;
whatever the directory holds when the attempt ends is kept.

Wire protocol (version 1), for a job in any language
----------------------------------------------------

The job listens on the Unix socket `$AUTOSCALER_REPORT_SOCKET` (in a
directory the worker bind-mounts; a container without network still reaches
it). The worker connects and sends requests; each request and each answer is
one JSON object on one line (UTF-8, ending in `\\n`); a connection may carry
several requests, answered in order.

    {"op": "status"}
        -> {"ok": true, "protocol": 1, "iterations": 1200, "throughput": 4.1,
            "window_s": 300, "first_iteration_at": 1718000000.5,
            "checkpoint_requested": false, "checkpoint_done": false}
    {"op": "checkpoint"}
        -> {"ok": true, "checkpoint_requested": true, "checkpoint_done": false}
    anything else
        -> {"ok": false, "error": "..."}

- `iterations`: done so far, counting from the step the job resumed at.
- `throughput`: iterations per second over the last `window_s` seconds
  (`$AUTOSCALER_THROUGHPUT_WINDOW_S`, default 300), measured from the first
  iteration on (start-up is not counted); `null` until a whole window has
  passed.
- `first_iteration_at`: Unix time of the first iteration of this run.
- `checkpoint`: the worker asks the job to save a checkpoint and stop;
  `checkpoint_done` turns true once the job has saved it.

When the job exits, the reporter leaves its last count beside the socket, in
`final.json` (`{"protocol": 1, "iterations": 1200}`, written atomically): the
worker polls every few seconds, and the iterations after its last poll would
otherwise be lost from the task's progress.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

PROTOCOL = 1
DEFAULT_WINDOW_S = 300.0
SOCKET_ENV = "AUTOSCALER_REPORT_SOCKET"
#: Beside the socket: the count when the job exited.
FINAL_FILE = "final.json"
WINDOW_ENV = "AUTOSCALER_THROUGHPUT_WINDOW_S"
#: Samples kept per window: throughput is exact to within window / RESOLUTION seconds.
RESOLUTION = 64
_MAX_LINE = 4096

T = TypeVar("T")


class Reporter:
    """Counts a job's iterations and answers the worker over the report socket.

    `socket_path` defaults to `$AUTOSCALER_REPORT_SOCKET`; without one (a job
    run by hand) nothing listens and the reporter only counts. `start` is the
    iteration the job resumed from, so counts continue across migrations.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        window_s: float | None = None,
        start: float = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s is None:
            window_s = float(os.environ.get(WINDOW_ENV) or DEFAULT_WINDOW_S)
        if not window_s > 0:
            raise ValueError(f"the throughput window must be positive, got {window_s}")
        self.window_s = float(window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._count = float(start)
        self._samples: deque[tuple[float, float]] = deque()  # (time, count), oldest first
        self._first_at: float | None = None  # Unix time of the first iteration
        self._requested = threading.Event()
        self._done = False
        self._closed = threading.Event()
        self._server: socket.socket | None = None
        path = socket_path if socket_path is not None else os.environ.get(SOCKET_ENV)
        if path:
            self._server = _listen(path)
            self._path = path
            thread = threading.Thread(target=self._serve, name="reporter", daemon=True)
            thread.start()
            atexit.register(self.close)

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

    def should_checkpoint(self) -> bool:
        """True once the worker has asked for a checkpoint (and it is not done yet)."""
        return self._requested.is_set() and not self._done

    def checkpoint_done(self) -> None:
        """Tell the worker the checkpoint is saved (complete, in the checkpoint directory)."""
        with self._lock:
            self._done = True

    def wait_for_checkpoint_request(self, timeout: float | None = None) -> bool:
        """Block until the worker asks for a checkpoint (jobs that are not loops)."""
        return self._requested.wait(timeout)

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
            }

    def answer(self, request: Any) -> dict[str, Any]:
        """The answer to one decoded request (see the wire protocol above)."""
        op = request.get("op") if isinstance(request, dict) else None
        if op == "status":
            return self.status()
        if op == "checkpoint":
            self._requested.set()
            with self._lock:
                return {"ok": True, "checkpoint_requested": True, "checkpoint_done": self._done}
        return {"ok": False, "error": f"unknown op {op!r}; expected 'status' or 'checkpoint'"}

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
        """Stop listening (the socket file is removed) and leave the final count."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            final = os.path.join(os.path.dirname(self._path), FINAL_FILE)
            with contextlib.suppress(OSError):
                with open(final + ".tmp", "w") as handle:
                    json.dump({"protocol": PROTOCOL, "iterations": self.iterations}, handle)
                os.replace(final + ".tmp", final)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
