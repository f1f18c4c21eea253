"""A discrete-event loop on a virtual clock."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

#: Order of events that share a time: arrivals are seen by the round at that
#: time (as in Eva's simulator), world changes before the round reacts.
ARRIVAL, WORLD, ROUND = 0, 1, 2


class EventLoop:
    """Events are (time, priority, sequence) ordered; the clock jumps from one to the next.

    Handlers may schedule more events. After all events of one timestamp ran,
    `after_batch` (if set) is called once — the replay uses it to let the
    control loop react to everything that happened at that instant together.
    """

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._now = 0.0
        self.after_batch: Callable[[], None] | None = None
        self.events_run = 0

    def now(self) -> float:
        return self._now

    def at(self, time: float, handler: Callable[[], None], priority: int = WORLD) -> None:
        if time < self._now:
            raise ValueError(f"cannot schedule at {time} before now ({self._now})")
        heapq.heappush(self._queue, (time, priority, next(self._sequence), handler))

    def after(self, delay: float, handler: Callable[[], None], priority: int = WORLD) -> None:
        self.at(self._now + delay, handler, priority)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run events until the queue is empty or `until()` is true after a batch."""
        queue = self._queue
        while queue:
            time = queue[0][0]
            self._now = time
            while queue and queue[0][0] == time:
                _, _, _, handler = heapq.heappop(queue)
                handler()
                self.events_run += 1
            if self.after_batch is not None:
                self.after_batch()
            if until is not None and until():
                return
