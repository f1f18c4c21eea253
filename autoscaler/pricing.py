"""Reservation prices (Eva §4.2–4.4).

The reservation price RP(τ) of a task is the hourly cost of the cheapest
instance type that can host it alone: what the user would pay without packing.
A set of tasks T on an instance of cost C is cost-efficient when its
throughput-normalized reservation price TNRP(T) ≥ C.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from autoscaler.catalog import Catalog, InstanceType
from autoscaler.errors import InputError
from autoscaler.jobs import Demands, JobSpec, TaskSpec
from autoscaler.spot import SPOT_FAMILY_SUFFIX


def price_book_for(catalog: Catalog, previous: PriceBook | None) -> PriceBook:
    """`previous` if it prices this very catalog (planners keep one between rounds)."""
    if previous is not None and previous.catalog is catalog:
        return previous
    return PriceBook(catalog)


def cheapest_type(task: TaskSpec, catalog: Catalog) -> InstanceType:
    """The cheapest instance type that can host `task` alone (ties: by name)."""
    best = None
    for itype in catalog:
        if task.fits_alone(itype) and (
            best is None or (itype.hourly_cost, itype.name) < (best.hourly_cost, best.name)
        ):
            best = itype
    if best is None:
        raise InputError(
            "fits no instance type in the catalog", where=f"task {task.task_id!r}", field="demand"
        )
    return best


def reservation_price(task: TaskSpec, catalog: Catalog) -> float:
    """RP(τ): hourly cost of the cheapest type that hosts τ alone (§4.2)."""
    return cheapest_type(task, catalog).hourly_cost


#: How a slowed task of a multi-task job is valued (see `slowdown_charge`).
JobSlowdown = Literal["by-job", "shared", "whole"]
JOB_SLOWDOWNS: tuple[JobSlowdown, ...] = ("by-job", "shared", "whole")


def identical_tasks(job: JobSpec) -> bool:
    """Every task of the job demands the same (replicas: a data-parallel job)."""
    first = job.tasks[0].demands
    return all(t.demands == first for t in job.tasks)


def slowdown_charge(job: JobSpec, job_rp: float, rule: JobSlowdown) -> float | None:
    """The `job_rp` argument of `tnrp` for a task of `job` under `rule`.

    "whole" is Eva §4.4: every slowed task is charged the whole job's loss,
    which is exact when one task alone is slowed; summed over a job whose tasks
    are slowed alike it counts one slowdown once per task (16 tasks at 0.95:
    charged 16 × 0.05 × RP(j), for a loss of 0.05 × RP(j)), so a 16-task job
    is never packed at the default throughput. "shared" charges each task its
    own slowdown, `tput · RP(τ)`: exact when the job's tasks are slowed alike —
    as Algorithm 1's repeated compositions slow identical tasks — and never
    above the job's real loss, (1 − slowest tput) × RP(j), which it can miss
    by the job's size when one task is slowed. "by-job" (our default) takes the
    exact one of the two for each job: "shared" when its tasks demand the same
    (replicas, packed alike), "whole" when they differ (they land in different
    compositions, and the slowest sets the pace). On fuzzed traces of 4-task
    jobs of unlike tasks under harsh interference, "shared" cost 1.15–1.96× no
    packing and "whole" 0.82–1.21× while `tnrp` was floored at 0; unfloored,
    "by-job" costs 0.64–0.98× on 44 fuzzed worlds of 1- to 16-task jobs
    (`tests/simulator/harsh.py`, seeds 1–44), where it cost 0.67–1.55×.
    """
    if not job.is_multi_task or rule == "shared":
        return None
    if rule == "by-job" and identical_tasks(job):
        return None
    return job_rp


def tnrp(rp: float, throughput: float, job_rp: float | None = None) -> float:
    """Throughput-normalized reservation price of one task (§4.3–4.4).

    Single-task job: `throughput · RP(τ)`. Task of a multi-task job j:
    `RP(τ) − (1 − throughput) · RP(j)` with `RP(j) = Σ_{τ'∈j} RP(τ')` — a slow
    task slows the whole job, so the whole job's value is at stake. The two
    agree when j has one task. Not floored at 0: a task that stalls its job
    costs more than it is worth, and an instance holding it must pay for that.
    (A floor, as the reference applies while provisioning, valued a task at
    0.3 of a 16-task job's pace as "nothing", so the instance its neighbours
    paid for stayed cost-efficient and kept the whole job crawling.)
    """
    if job_rp is None:
        return throughput * rp
    return rp - (1.0 - throughput) * job_rp


def refused(rps: Iterable[float]) -> float:
    """The value of a co-location the user's cap on slowdown (`min_throughput`)
    refuses, given its tasks' RPs: −Σ RP(τ). Below zero, it is never worth its
    instance, so no packing keeps it; as a column of the configuration LP it
    costs more than its tasks alone (their RPs), so no optimum uses it."""
    return -sum(rps)


def on_demand_value(task: TaskSpec, catalog: Catalog) -> float | None:
    """V(τ): hourly cost of the cheapest *on-demand* offering that hosts τ alone, its
    spot families read as their plain ones (None: the catalog has none that fits)."""
    best = None
    for itype in catalog:
        if itype.is_spot:
            continue
        demand = task.demand_on(itype.family) or task.demand_on(itype.family + SPOT_FAMILY_SUFFIX)
        fitting = demand is not None and demand.fits_in(itype.capacity)
        if fitting and (best is None or itype.hourly_cost < best):
            best = itype.hourly_cost
    return best


def valued_tnrp(rp: float, throughput: float, at_stake: float) -> float:
    """TNRP when the time a slowdown costs is worth `at_stake` per hour rather than
    the RP: `RP(τ) − (1 − throughput) · at_stake` — what co-location saves against
    running alone on the cheapest offering, less the job's time it costs. With
    `at_stake` = RP(τ) (single task) or RP(j) (§4.4) it is `tnrp`."""
    return rp - (1.0 - throughput) * at_stake


class PriceBook:
    """Reservation prices against one catalog, memoized by demand vector.

    Tasks with equal demands have equal RPs; with millions of tasks and a few
    dozen distinct demands, the catalog is searched a few dozen times.

    With spot offerings in the catalog (`valued`), a task also has a *value*
    V(τ) ≥ RP(τ): the RP it has on on-demand capacity (`on_demand_value`). The
    RP stays what packing saves against — the cheapest way to run τ alone, a
    spot offering — but the throughput co-location takes away is the job's
    time, and an hour of a job is not worth less because spot makes its
    instance cheaper: Eva's TNRP (§4.3) prices the loss at RP because RP is
    the job's value there; spot splits the two. So a slowdown is charged at V
    (`valued_tnrp`), and packing on cheap spot capacity happens only when it
    saves more instance dollars than it costs job time at on-demand terms.
    """

    __slots__ = ("_by_demands", "_values", "catalog", "valued")

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._by_demands: dict[Demands, InstanceType] = {}
        self._values: dict[Demands, float] = {}
        self.valued = any(t.is_spot for t in catalog)

    def cheapest_type(self, task: TaskSpec) -> InstanceType:
        itype = self._by_demands.get(task.demands)
        if itype is None:
            itype = self._by_demands[task.demands] = cheapest_type(task, self.catalog)
        return itype

    def remember(self, task: TaskSpec, itype: InstanceType) -> None:
        """Record `itype` as `task`'s cheapest type, found elsewhere (vectorized, for
        many distinct demands at once); the caller vouches for it."""
        self._by_demands[task.demands] = itype

    def task_rp(self, task: TaskSpec) -> float:
        return self.cheapest_type(task).hourly_cost

    def job_rp(self, job: JobSpec) -> float:
        """RP(j) = Σ_{τ∈j} RP(τ)."""
        return sum(self.task_rp(t) for t in job.tasks)

    def task_value(self, task: TaskSpec) -> float:
        """V(τ): what an hour of τ's time is worth — its on-demand RP when the catalog
        has spot offerings (never below its RP), else its RP."""
        rp = self.task_rp(task)
        if not self.valued:
            return rp
        value = self._values.get(task.demands)
        if value is None:
            on_demand = on_demand_value(task, self.catalog)
            value = self._values[task.demands] = rp if on_demand is None else max(rp, on_demand)
        return value

    def job_value(self, job: JobSpec) -> float:
        """V(j) = Σ_{τ∈j} V(τ)."""
        return sum(self.task_value(t) for t in job.tasks)

    def no_packing_hourly_cost(self, jobs: Iterable[JobSpec]) -> float:
        """Hourly cost with every task alone on its cheapest fitting type."""
        return sum(self.job_rp(j) for j in jobs)
