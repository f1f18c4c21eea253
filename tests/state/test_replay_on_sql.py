"""The production round logic on the SQL store: a replay gives the in-memory figures."""

import json

import pytest

from simulator.replay import replay
from state.memory import InMemoryStore
from tests.simulator.test_hand_computed import NO_INTERFERENCE, catalog, job


def test_a_replay_on_the_sql_store_matches_the_in_memory_one(sql_store):
    # Launches, a migration, throughput learning and the ledger, all through SqlStore.
    jobs = [job("a", 0.0, 1000.0), job("b", 300.0, 600.0)]
    memory = InMemoryStore()
    in_memory = replay(jobs, catalog(), NO_INTERFERENCE, "eva-full-only", store=memory)
    # ... with the control loop rebuilt from the store at every round and step
    on_sql = replay(
        jobs, catalog(), NO_INTERFERENCE, "eva-full-only", store=sql_store, rebuild=True
    )
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


@pytest.mark.long
def test_a_loop_rebuilt_at_every_step_on_sqlite_replays_pai_200_byte_for_byte(tmp_path):
    # Nothing the loop needs lives only in memory: a loop rebuilt from the SQL store
    # at every step replays the whole bundled trace exactly as one kept throughout.
    # (SQLite only: PostgreSQL runs the same code and takes several times longer.)
    from app.bundled import bundled
    from app.files import load_catalog, load_contention_matrix, load_jobs
    from simulator.world import ground_truth
    from state.database import create_state_engine
    from state.migrate import upgrade
    from state.store import SqlStore

    catalog = load_catalog(bundled("ec2_config.json"))
    jobs = load_jobs(bundled("pai_200.json"), catalog)
    truth = ground_truth(load_contention_matrix(bundled("contention_matrix.csv")))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_state_engine(url)
    upgrade(engine)
    engine.dispose()
    in_memory = replay(jobs, catalog, truth, "eva")
    with SqlStore(url) as store:
        rebuilt = replay(jobs, catalog, truth, "eva", store=store, rebuild=True)
    assert json.dumps(rebuilt.document()) == json.dumps(in_memory.document())
