"""Paths of the data bundled with the core package (Eva's public artifact; see
autoscaler/data/eva/README.md): facts, not code, read here and by the catalog binding."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled(name: str) -> Path:
    """Path of a bundled data file: `pai_200.json`, `ec2_config.json`, `contention_matrix.csv`."""
    return Path(str(resources.files("autoscaler") / "data" / "eva" / name))
