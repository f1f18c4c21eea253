"""The scheduling period: how often a round runs, and the window throughput is measured over.

Eva re-plans the cluster once a period (§4); its simulations, and our replays,
use 300 s. A worker measures each task's throughput over a window one round
long, so that every round learns from what ran since the one before (§4.3);
the window is never longer than the default period, so a cluster with long
rounds still hears of a slow pair within five minutes.

Plain numbers, no imports: the daemon's configuration, the replay, both cloud
bindings' worker command lines and the worker agent itself read them here.
"""

from __future__ import annotations

#: Seconds between scheduling rounds unless the cluster's `interval_s` says otherwise.
ROUND_INTERVAL_S = 300.0


def throughput_window_s(interval_s: float) -> float:
    """The window workers report throughput over when rounds run every `interval_s`."""
    return min(ROUND_INTERVAL_S, interval_s)
