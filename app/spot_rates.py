"""The interruption rates the daemon's rounds price spot offerings at (`autoscaler.spot`).

Two things the daemon has learned move an offering's rate away from its advisor band:

- **Its own history.** Over the last `[spot] history_days`, the reclaims the state recorded
  per offering (`Store.interruption_counts`, reclaims only) and the spot instance-hours the
  cluster ran on it (the ledger's billed uptime, `Store.uptime`) give the blended rate
  `(λ_band · H0 + reclaims) / (H0 + hours)` with H0 = `[spot] prior_hours`
  (`autoscaler.spot.blended_rate`): the band weighs as H0 instance-hours of evidence,
  so a few hours cannot swing the price. Recomputed at most every `refresh_minutes`.
- **A rebalance recommendation** for instance I (EC2's signal that a reclaim is likelier
  soon): I's offering is priced at least at `[spot] rebalance_rate_per_hour` (default 1:
  a reclaim expected within the hour) for `1 / rate` hours after the recommendation while
  I is live — unless every task on I is known to finish within the restart delay R
  (`autoscaler.spot.restart_seconds`: a replacement's start-up and the job's init), for a
  move cannot run it again sooner than that and a reclaim loses at most what is left.
  Nothing else changes: Full/Partial reconfiguration and the migration
  criterion (Eva §4.5) weigh the higher effective price against the cost of moving, so a
  long task is moved — make before break: the new instance is launched and the task
  checkpoints and restarts there once it is ready, as every migration does — and a task
  about to finish is left where it is. A recommendation is never a failure.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.errors import InputError
from autoscaler.spot import (
    RATE_HISTORY_S,
    RATE_PRIOR_HOURS,
    RATE_REFRESH_S,
    LearnedRates,
    restart_seconds,
    with_rates,
)
from autoscaler.work import job_work

log = logging.getLogger("autoscaler.daemon")

#: Instance states in which a rebalance recommendation still concerns the instance.
LIVE = ("requested", "pending", "running", "draining")


class SpotRates:
    """The daemon's catalog: the cloud's, with the rates above (`catalog(base, now)`)."""

    def __init__(
        self,
        store: Any,
        *,
        prior_hours: float = RATE_PRIOR_HOURS,
        history_days: float = RATE_HISTORY_S / 86400.0,
        refresh_s: float = RATE_REFRESH_S,
        rebalance_rate_per_hour: float = 1.0,
    ) -> None:
        self.store = store
        self.prior_hours = prior_hours
        self.history_s = history_days * 86400.0
        self.refresh_s = refresh_s
        # The blend itself, as replays learn it: from the state's reclaims and ledger.
        self._learned = LearnedRates(
            store.interruption_counts,
            lambda since: ((u.instance_type, u.start, u.end) for u in store.uptime(since)),
            prior_hours=prior_hours,
            history_s=self.history_s,
        )
        self.rebalance_rate = rebalance_rate_per_hour
        self._observed: dict[str, float] = {}
        self._base: Catalog | None = None
        self._at = -math.inf
        self._memo: tuple[Catalog, tuple[tuple[str, float], ...], Catalog] | None = None
        # instance → (when it was judged, finishing): a snapshot at most every refresh
        self._finishing: dict[str, tuple[float, bool]] = {}

    def catalog(self, base: Catalog, now: float) -> Catalog:
        """`base` with its spot offerings at the learned rates; the same object while the
        rates are the same (planners reuse what they derived from a catalog object)."""
        if not any(t.is_spot for t in base):
            return base
        if base is not self._base or not 0.0 <= now - self._at < self.refresh_s:
            try:
                self._observed = self.observed(base, now)
            except Exception:  # the bands still price the offerings
                log.exception("the interruption history could not be read")
            self._base, self._at = base, now
        rates = dict(self._observed)
        for offering in self.rebalancing(base, now):
            if offering in base and base[offering].is_spot:
                known = rates.get(offering, base[offering].interruption_per_hour)
                rates[offering] = max(known, self.rebalance_rate)
        key = tuple(sorted(rates.items()))
        if self._memo is not None and self._memo[0] is base and self._memo[1] == key:
            return self._memo[2]
        out = with_rates(base, rates)
        self._memo = (base, key, out)
        return out

    def observed(self, base: Catalog, now: float) -> dict[str, float]:
        """The blended rate of each spot offering over the history window
        (`LearnedRates.rates`)."""
        return self._learned.rates(base, now)

    def rebalancing(self, base: Catalog, now: float) -> set[str]:
        """Offerings of live instances recommended for rebalancing within `1 / rate` hours
        whose tasks are not all about to finish (`finishing`)."""
        if self.rebalance_rate <= 0.0:
            return set()
        try:
            recent = self.store.interruptions(now - 3600.0 / self.rebalance_rate)
        except Exception:
            log.exception("the interruption history could not be read")
            return set()
        out: set[str] = set()
        for r in recent:
            if r.kind != "rebalance":
                continue
            inst = self.store.instance(r.instance_id)
            if inst is None or inst.status not in LIVE or inst.reclaimed_at is not None:
                continue
            if r.offering in base and self._finishes(r.instance_id, base[r.offering], now):
                continue
            out.add(r.offering)
        return out

    def _finishes(self, instance_id: str, itype: InstanceType, now: float) -> bool:
        """`finishing`, judged again at most every refresh period (it reads a snapshot,
        and rounds and steps ask for the catalog every few seconds)."""
        known = self._finishing.get(instance_id)
        if known is None or not 0.0 <= now - known[0] < self.refresh_s:
            self._finishing = {
                k: v for k, v in self._finishing.items() if 0.0 <= now - v[0] < self.refresh_s
            }
            known = (now, self.finishing(instance_id, itype))
            self._finishing[instance_id] = known
        return known[1]

    def finishing(self, instance_id: str, itype: InstanceType) -> bool:
        """Whether every task on the instance (one at least) is known to finish within
        the offering's restart delay: its job's work (`autoscaler.work.job_work`) less its
        progress, at full speed. Work not known: not finishing (the criterion decides)."""
        snapshot = self.store.snapshot(with_throughput=False)
        jobs = {j.job_id: j.spec for j in snapshot.jobs}
        on = [t for t in snapshot.tasks.values() if t.instance_id == instance_id]
        if not on:
            return False
        restart = restart_seconds(itype)
        for task in on:
            try:
                work = job_work(jobs[task.job_id])
            except (InputError, KeyError):
                return False
            if max(0.0, work.iterations - task.progress) / work.speed > restart:
                return False
        return True
