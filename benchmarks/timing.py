"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[..., T]) -> tuple[float, T]:
    """(seconds, result) of one call of `fn`, without arguments (a lambda may bind a loop
    variable as a default, which `Callable[[], T]` would refuse)."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def best_of(repeats: int, fn: Callable[..., T]) -> tuple[float, T]:
    """The fastest of `repeats` calls (machines here are shared and noisy)."""
    best, result = timed(fn)
    for _ in range(repeats - 1):
        seconds, result = timed(fn)
        best = min(best, seconds)
    return best, result
