"""The in-memory Store binding (used by replays) against the Store contract."""

import pytest

from state.memory import InMemoryStore
from tests.store_contract import *  # noqa: F403


@pytest.fixture
def store():
    return InMemoryStore()
