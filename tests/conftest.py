"""Suite-wide collection order: modules marked `long` first.

`.ci/run` spreads the suite over processes by module (pytest-xdist, `--dist loadfile`),
handing out modules in collection order; a module of minutes handed out last would run
alone while the other workers sit idle. Starting them first keeps the workers finishing
together. Order only: nothing is selected or skipped by the mark.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: takes minutes; its module is started first (tests/conftest.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    long_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("long")}
    # A stable sort: within each group the collection order stays, identically in every worker.
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in long_modules)
