"""Spot price segments and refreshed prices on SQL: the upgrade that keeps the refreshed
prices (0014) keeps the data written before it, and the ledger written at 0013 takes
price segments after it."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from autoscaler.store import InstanceChange, PriceChange, RefreshedPrices
from state.database import create_state_engine
from state.migrate import alembic_config, head_revision, upgrade
from state.store import SqlStore
from tests.store_writes import adopted_round

HOUR = 3600.0


def test_an_upgrade_from_0013_keeps_the_ledger_and_adds_the_kept_prices(db_url: str) -> None:
    with SqlStore(db_url) as store:
        adopted_round(store, HOUR, requests=[("i1", "p3.2xlarge:spot", 0.9)])
        store.transition_instances([InstanceChange("i1", "running", "c-1", "us-east-1a")], HOUR)
        ledger = store.uptime()
    engine = create_state_engine(db_url)
    try:
        command.downgrade(alembic_config(engine), "0013")
        with engine.connect() as conn:
            assert "spot_prices" not in inspect(conn).get_table_names()
        assert upgrade(engine) == ("0013", head_revision())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM spot_prices")).scalar_one() == 0
    finally:
        engine.dispose()
    with SqlStore(db_url) as store:
        assert store.uptime() == ledger
        assert store.spot_prices("us-east-1") is None
        # The stretch opened before the upgrade takes a segment after it.
        assert store.reprice_instances([PriceChange("i1", 1.2, 2 * HOUR)]) == {"i1"}
        assert [(u.hourly_price, u.start, u.end) for u in store.uptime()] == [
            (0.9, HOUR, 2 * HOUR),
            (1.2, 2 * HOUR, None),
        ]
        kept = RefreshedPrices("us-east-1", {"p3.2xlarge": {"use1-az1": 1.2}}, 2 * HOUR, "EC2")
        assert store.record_spot_prices(kept)
    with SqlStore(db_url) as restarted:  # another process reads what was kept
        assert restarted.spot_prices("us-east-1") == kept
        assert restarted.cost_between(0, 3 * HOUR) == pytest.approx(0.9 + 1.2)
