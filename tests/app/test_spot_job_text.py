"""What `autoscaler job` prints about spot: the job's capacity, and a retry its spot
instance's reclaim caused named as a reclaim rather than by its failure class."""

from __future__ import annotations

from app.commands.cluster import _retries
from app.reports import job_detail
from autoscaler.catalog import Catalog
from state.memory import InMemoryStore
from tests.builders import job


def test_a_retry_every_uncounted_one_of_which_a_reclaim_caused_reads_as_a_reclaim():
    reclaimed = {"retries": 1, "failures": 0, "failure": "infrastructure", "interruptions": 1}
    assert _retries(reclaimed) == "1 (reclaim, 0 counted)"
    assert len(_retries(reclaimed)) <= 24  # short enough never to wrap in the table
    # An infrastructure retry beyond the reclaims (a lost worker) keeps its class.
    assert _retries({**reclaimed, "retries": 2}) == "2 (infrastructure, 0 counted)"
    assert _retries({**reclaimed, "interruptions": 0}) == "1 (infrastructure, 0 counted)"
    # The job's own failure, counted, on a reclaimed instance or not: its class.
    failed = {"retries": 2, "failures": 1, "failure": "transient", "interruptions": 1}
    assert _retries(failed) == "2 (transient, 1 counted)"
    assert _retries({"retries": 0}) == "0"


def test_a_jobs_detail_carries_its_capacity():
    store = InMemoryStore()
    for capacity in ("spot", "on-demand", "auto"):
        store.submit_job(job(f"j-{capacity}", (0, 1, 2), capacity=capacity), owner="u", at=0.0)
        detail = job_detail(store, f"j-{capacity}", Catalog([]), 1.0)
        assert detail is not None and detail["capacity"] == capacity
