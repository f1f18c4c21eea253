"""The layering rules of ARCHITECTURE.md, as import-linter contracts in pyproject.toml."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_deciding_core_imports_no_binding_no_io_and_no_clock(monkeypatch):
    monkeypatch.chdir(ROOT)
    # lint_imports reads pyproject.toml from the working directory and returns 0 when kept.
    assert lint_imports(no_cache=True) == 0, "run `lint-imports` to see the broken contract"


def test_the_contract_names_every_module_that_decides():
    text = (ROOT / "pyproject.toml").read_text()
    for module in (
        "planner",
        "patterns",
        "lp",
        "reconfiguration",
        "pricing",
        "throughput",
        "decide",
    ):
        assert f'"autoscaler.{module}"' in text
