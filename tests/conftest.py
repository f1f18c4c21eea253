"""Suite-wide: the collection order (modules marked `long` first), and `fake_agent`.

`.ci/run` spreads the suite over processes by module (pytest-xdist, `--dist loadfile`),
handing out modules in collection order; a module of minutes handed out last would run
alone while the other workers sit idle. Starting them first keeps the workers finishing
together. Order only: nothing is selected or skipped by the mark.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: takes minutes; its module is started first (tests/conftest.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    long_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("long")}
    # A stable sort: within each group the collection order stays, identically in every worker.
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in long_modules)


@pytest.fixture
def fake_agent(tmp_path: Path) -> str:
    """A stand-in for `python -m autoscaler worker …` (a local cloud's instance): it records
    its arguments in its work directory (`argv`) and waits."""
    script = tmp_path / "fake-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, time, pathlib\n"
        "pathlib.Path(sys.argv[sys.argv.index('--work-dir') + 1], 'argv').write_text("
        "' '.join(sys.argv[1:]))\n"
        "time.sleep(600)\n"
    )
    script.chmod(0o755)
    return str(script)
