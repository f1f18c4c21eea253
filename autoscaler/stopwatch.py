"""Elapsed time for reports, the one clock the deciding core may read.

Planners report how long an LP or a search took; nothing they decide may
depend on it (budgets are counted in nodes and iterations, never seconds),
so a replay gives the same plans on a busy machine as on an idle one.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def stopwatch() -> Callable[[], float]:
    """A function returning the seconds since this call (for reports only)."""
    started = time.perf_counter()
    return lambda: time.perf_counter() - started
