"""The tree type-checks under mypy (configured in pyproject.toml), and the core strictly:
its decisions are typed dataclasses built field by field, and a dict unpacked into one,
an untyped helper or a value that may be None where none is allowed fails here."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from mypy import api
from mypy.main import define_options
from mypy.options import PER_MODULE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent

#: Every package of the tree: the core, the bindings, the application and the benchmarks.
PACKAGES = {"autoscaler", "app", "provisioners", "executor", "state", "simulator", "benchmarks"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def test_every_package_is_checked():
    config = _config()
    assert set(config["files"]) >= PACKAGES
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert on_disk <= set(config["files"]), "a package mypy does not check"


def test_the_core_is_checked_strictly():
    """Every flag of `--strict` (as this mypy defines them) is on for the core. They are
    spelled out because `strict = true` in an override turns them on for every module."""
    config = _config()
    overrides = config.get("overrides", ())
    assert not any("strict" in o for o in overrides), "strict = true would apply to every module"
    core = [o for o in overrides if "autoscaler.*" in o["module"]]
    assert len(core) == 1, "the core has no override of its own"
    _, _, strict_flags = define_options()
    assert strict_flags
    for flag, value in strict_flags:
        where = core[0] if flag in PER_MODULE_OPTIONS else config
        assert where.get(flag) == value, f"{flag} = {str(value).lower()} is missing"


@pytest.mark.long
def test_the_tree_has_no_type_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # mypy reads pyproject.toml and `files` from here
    report, errors, status = api.run(["--cache-dir", str(tmp_path / "mypy-cache")])
    assert status == 0, f"mypy:\n{report}{errors}"
