"""The README's "Run the daemon on this machine" is commands to paste, in order: each
`autoscaler` line must be one our CLI accepts, each file it names must exist in the
checkout, and the sequence must end the cluster. (tests/e2e/test_local_cluster.py runs the
same scenario against a real daemon.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def walkthrough() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run the daemon on this machine\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for line in section.splitlines():
        if line.startswith("    ") and line.strip():
            commands.append(line.strip().split(" #", 1)[0].strip())
    return commands


def test_the_walkthrough_is_a_complete_sequence_of_valid_commands():
    commands = walkthrough()
    assert commands[0] == "python -m pip install -e ."
    assert (ROOT / "deploy/local-docker.sh").stat().st_mode & 0o111  # runnable as written
    cli = [shlex.split(c.rstrip("&").strip().split(">", 1)[0]) for c in commands]
    cli = [argv for argv in cli if argv[0] == "autoscaler"]
    names = [argv[1] for argv in cli]
    for needed in ("init", "daemon", "submit", "status", "drain", "jobs", "cost-report", "down"):
        assert needed in names, needed
    assert names.index("init") < names.index("daemon") < names.index("submit")
    assert names.index("submit") < names.index("drain") < names.index("cost-report")
    assert names[-1] == "down"
    parser = build_parser()
    for argv in cli:
        args = parser.parse_args(argv[1:])  # exits (fails the test) on an unknown flag
        for value in vars(args).values():
            for path in value if isinstance(value, list) else [value]:
                if isinstance(path, Path) and path.suffix == ".toml" and "examples" in path.parts:
                    assert (ROOT / path).is_file(), path
    init = next(argv for argv in cli if argv[1] == "init")
    assert "--local" in init  # the embedded default: no AWS account


def test_a_walkthrough_line_with_a_wrong_flag_would_be_caught():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["drain", "--job", "sgd-train", "--whait"])
