"""Elapsed time for reports, the one clock the deciding core may read.

Planners report how long an LP or a search took; nothing they decide may
depend on it (budgets are counted in nodes and iterations, never seconds),
so a replay gives the same plans on a busy machine as on an idle one. The
lower bounds reported beside a plan stop their column generation on the
process's CPU time (`cpu_stopwatch`), so how far they get does not depend on
what else the machine runs either.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def stopwatch() -> Callable[[], float]:
    """A function returning the seconds since this call (for reports only)."""
    started = time.perf_counter()
    return lambda: time.perf_counter() - started


def cpu_stopwatch() -> Callable[[], float]:
    """A function returning the CPU seconds this process spent since this call: the
    budget of a bound's column generation, which a busy machine does not cut short."""
    started = time.process_time()
    return lambda: time.process_time() - started
