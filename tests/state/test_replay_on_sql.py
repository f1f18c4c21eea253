"""The production round logic on the SQL store: a replay gives the in-memory figures."""

import pytest

from autoscaler.store import InMemoryStore
from simulator.replay import replay
from tests.simulator.test_hand_computed import NO_INTERFERENCE, catalog, job


def test_a_replay_on_the_sql_store_matches_the_in_memory_one(sql_store):
    # Launches, a migration, throughput learning and the ledger, all through SqlStore.
    jobs = [job("a", 0.0, 1000.0), job("b", 300.0, 600.0)]
    memory = InMemoryStore()
    in_memory = replay(jobs, catalog(), NO_INTERFERENCE, "eva-full-only", store=memory)
    on_sql = replay(jobs, catalog(), NO_INTERFERENCE, "eva-full-only", store=sql_store)
    assert on_sql.total_cost == pytest.approx(in_memory.total_cost)
    assert on_sql.total_cost == pytest.approx(on_sql.billed)
    assert on_sql.jct_hours == pytest.approx(in_memory.jct_hours)
    assert on_sql.migrations == in_memory.migrations == 1
    assert [(r.at, r.chosen) for r in sql_store.rounds()] == [
        (r.at, r.chosen) for r in memory.rounds()
    ]
    assert {j.status for j in sql_store.jobs()} == {"completed"}
    assert sql_store.instances() == []
    assert sql_store.cost_between(0, 10_000) == pytest.approx(memory.cost_between(0, 10_000))
