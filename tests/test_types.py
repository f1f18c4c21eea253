"""The core type-checks under mypy's strict mode (configured in pyproject.toml): its
decisions are typed dataclasses built field by field, and a dict unpacked into one, an
untyped helper or a value that may be None where none is allowed fails here."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_the_core_is_checked_strictly():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert "autoscaler" in config["files"]
    strict = [o for o in config.get("overrides", ()) if o.get("strict")]
    assert any("autoscaler.*" in o["module"] for o in strict), "the core must stay strict"


def test_the_core_has_no_type_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # mypy reads pyproject.toml and `files` from here
    report, errors, status = api.run(["--cache-dir", str(tmp_path / "mypy-cache")])
    assert status == 0, f"mypy on the core:\n{report}{errors}"
