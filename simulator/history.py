"""A replayable trace of what a cluster really ran, read from its own state.

A running cluster records, in its `Store`, everything a replay needs: the jobs
and their tasks' demands (the specs as submitted), when each was submitted,
how many iterations each did and how fast it runs alone (measured, or given by
its spec), the co-location throughput table it learned (Eva §4.3), the prices
it paid (the ledger bills each instance at the price of its request), and which
planner decided its rounds. `cluster_history` turns that into the inputs of
`simulator.replay.replay` — so "what would last week have cost under another
scheduler?" is answered by the same control loop the cluster ran, on the
cluster's own measurements instead of a published trace.

What is taken from the state, and how:

- **Jobs**: those submitted within the window, in submission order, arriving at
  their submission time (relative to the replay's origin). A job's work is what
  it did: its tasks' latest progress (iterations; a completed job's is all of
  it) at its solo speed — the spec's `full_throughput`, else the one the
  cluster learned. A job still running, or cancelled, is replayed for the work
  it did until then; a job that did nothing (cancelled while queued) or whose
  solo speed was never known is left out, with the reason. The spec's own trace
  facts are never read: a real cluster's have none, and a replayed one's would
  be the answer rather than the measurement.
- **Interference**: the learned throughput table is the replay's ground truth;
  co-locations the cluster never observed run at `default_throughput`, as the
  planner assumed.
- **Prices**: each instance type the ledger billed in the window is priced at
  what the cluster paid for it (the time-weighted mean over the window's
  intervals); the other types keep the catalog's price.
- **Rounds**: the replay's origin is the cluster's last round at or before the
  window's first submission, so the replayed rounds fall on the cluster's grid.
- **What the cluster paid**: the ledger within the window, idle instances
  included — the figure a cloud bill shows.

The window is cut by submission time: a job submitted before it is left out
even while its instances bill within it (the ledger figure then includes their
cost), so a window starting while older jobs still run overstates the actual
spend against the replays; the history says how many such jobs ran into it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from autoscaler.catalog import Catalog
from autoscaler.jobs import JobSpec, TraceFacts
from autoscaler.store import JobRecord, Store
from autoscaler.throughput import DEFAULT_THROUGHPUT, ThroughputTable


@dataclass(frozen=True, slots=True)
class ClusterHistory:
    """A cluster's jobs in a window, as a replayable trace, and what it paid for them.

    Job arrivals are seconds after `origin` (epoch seconds of the cluster's clock).
    """

    jobs: tuple[JobSpec, ...]
    catalog: Catalog  # at the prices the cluster paid
    truth: ThroughputTable  # the co-location table the cluster learned
    origin: float  # the replay's t = 0 on the cluster's clock
    since: float  # the window, on the cluster's clock
    until: float
    spend: float  # the ledger within the window, idle included
    scheduler: str | None  # the planner the window's rounds name most (None: no round)
    left_out: tuple[tuple[str, str], ...] = ()  # (job id, why)
    earlier_jobs: int = 0  # jobs submitted before the window that were still running in it
    repriced: tuple[tuple[str, float, float], ...] = ()  # (type, catalog $/h, paid $/h)
    unknown_types: tuple[str, ...] = ()  # billed types the catalog no longer has


def cluster_history(
    store: Store,
    catalog: Catalog,
    *,
    since: float,
    until: float,
    default_throughput: float = DEFAULT_THROUGHPUT,
) -> ClusterHistory:
    """The jobs the cluster was given within [since, until] as a replayable trace, with
    the prices it paid, the table it learned and what the ledger billed (module docstring)."""
    records = sorted(store.jobs(), key=lambda r: (r.submitted_at, r.job_id))
    window = [r for r in records if since <= r.submitted_at <= until]
    earlier = sum(
        1
        for r in records
        if r.submitted_at < since
        and r.started_at is not None
        and (r.finished_at is None or r.finished_at > since)
    )
    rounds = [r for r in store.rounds() if r.at <= until]
    first = window[0].submitted_at if window else since
    before = [r.at for r in rounds if r.at <= first]
    origin = max(before) if before and max(before) >= since else first
    planners = Counter(r.planner for r in rounds if r.at >= since)
    scheduler = planners.most_common(1)[0][0] if planners else None

    jobs: list[JobSpec] = []
    left_out: list[tuple[str, str]] = []
    for record in window:
        spec, why = _replayable(store, record, record.submitted_at - origin)
        if spec is None:
            left_out.append((record.job_id, why))
        else:
            jobs.append(spec)

    uptime = store.uptime()
    spend = sum(i.cost(since, until) for i in uptime)
    paid: dict[str, tuple[float, float]] = {}  # type -> (dollars, hours) in the window
    for interval in uptime:
        end = until if interval.end is None else min(interval.end, until)
        hours = max(0.0, end - max(interval.start, since)) / 3600.0
        if hours > 0:
            dollars, total = paid.get(interval.instance_type, (0.0, 0.0))
            paid[interval.instance_type] = (dollars + hours * interval.hourly_price, total + hours)
    types = []
    repriced = []
    for itype in catalog:
        if itype.name in paid:
            dollars, hours = paid[itype.name]
            price = dollars / hours
            if abs(price - itype.hourly_cost) > 1e-9 * max(1.0, itype.hourly_cost):
                repriced.append((itype.name, itype.hourly_cost, price))
                itype = replace(itype, hourly_cost=price)
        types.append(itype)
    learned = store.snapshot(default_throughput).throughput
    return ClusterHistory(
        jobs=tuple(jobs),
        catalog=Catalog(types, catalog.region),
        truth=learned.with_default(default_throughput),
        origin=origin,
        since=since,
        until=until,
        spend=spend,
        scheduler=scheduler,
        left_out=tuple(left_out),
        earlier_jobs=earlier,
        repriced=tuple(repriced),
        unknown_types=tuple(sorted(set(paid) - {t.name for t in catalog})),
    )


def _replayable(store: Store, record: JobRecord, arrival_s: float) -> tuple[JobSpec | None, str]:
    """The job as a trace entry: its spec, arriving at `arrival_s`, with the work it did
    (None and why when it did none, or its solo speed is unknown)."""
    spec = record.spec
    done = max((t.progress for t in store.tasks_of(record.job_id)), default=0.0)
    if done <= 0:
        return None, f"did no work ({record.status})"
    if spec.full_throughput is not None:
        # The spec states its speed: the replay's planner knows it from the start too.
        facts = TraceFacts(arrival_time_s=arrival_s, total_iters=done)
    elif record.solo_throughput:
        # Learned by running alone: in the replay it runs `done / solo` seconds at one
        # iteration per second, and the replay's planner learns its speed the same way.
        facts = TraceFacts(arrival_time_s=arrival_s, duration_s=done / record.solo_throughput)
    else:
        return None, "its speed alone was never measured (it never ran without neighbours)"
    return replace(spec, trace=facts), ""
