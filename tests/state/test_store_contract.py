"""The SQL Store binding against the Store contract, on SQLite and on PostgreSQL."""

import pytest

from state.store import SqlStore
from tests.store_contract import *  # noqa: F403


@pytest.fixture
def store(sql_store: SqlStore) -> SqlStore:
    return sql_store
