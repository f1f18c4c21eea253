"""Peak Python memory of a call, measured in a fresh process.

`tracemalloc.stop()` races with threads that allocate while it unhooks the allocators
(CPython 3.11 has no fix: the test process segfaulted when gRPC's own threads were busy,
and gRPC starts such threads for a client too). So the call runs in a spawned child that
never stops tracing: it reports its peak and exits."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import tracemalloc
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def _measure(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        fn(*args)  # untraced: the modules it imports on first use are not its working set
    err = io.StringIO()
    tracemalloc.start()
    with contextlib.redirect_stderr(err):
        result = fn(*args)
    _, peak = tracemalloc.get_traced_memory()
    conn.send((result, peak, err.getvalue()))
    conn.close()
    os._exit(0)  # no tracemalloc.stop(), no interpreter teardown beside gRPC's threads


def peak_traced(fn: Callable[..., Any], *args: Any) -> tuple[Any, int, str]:
    """`fn(*args)`'s result, its peak traced allocation in bytes and what it wrote to
    stderr, from the second of two calls in a spawned process (`fn` must be idempotent;
    it, `args` and the result must pickle)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_measure, args=(send, fn, args))
    child.start()
    send.close()
    try:
        outcome = receive.recv()
    except EOFError:
        child.join()
        raise AssertionError(f"the measured call's process ended with {child.exitcode}") from None
    child.join()
    return outcome
