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


def timed_cpu(fn: Callable[..., T]) -> tuple[float, float, T]:
    """(wall seconds, CPU seconds of this process, result) of one call of `fn`: on a shared
    machine the CPU time is what the call would take on one of its own, which wall time
    is not (work done in child processes is not counted)."""
    cpu_started = time.process_time()
    wall_s, result = timed(fn)
    return wall_s, time.process_time() - cpu_started, result


def best_of(repeats: int, fn: Callable[..., T]) -> tuple[float, T]:
    """The fastest of `repeats` calls (machines here are shared and noisy)."""
    best, result = timed(fn)
    for _ in range(repeats - 1):
        seconds, result = timed(fn)
        best = min(best, seconds)
    return best, result
