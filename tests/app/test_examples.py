"""The examples users copy from: each job file is valid, and each carries the reporter the
worker speaks to (a copy, because a build context cannot reach outside its directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.bundled import bundled
from app.files import load_catalog
from app.jobfile import load_job_file, pack_context

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent for p in (ROOT / "examples").glob("*/job.toml"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"train", "data-parallel", "memory"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_job_file_is_accepted_and_its_context_packs(example):
    submission = load_job_file(example / "job.toml", load_catalog(bundled("ec2_config.json")))
    assert submission.job.tasks and set(submission.contexts.values()) == {example}
    data, digest = pack_context(example)
    assert len(data) > 0 and len(digest) == 64


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_carries_the_reporter_the_worker_ships(example):
    assert (example / "reporter.py").read_bytes() == (
        ROOT / "executor" / "reporter.py"
    ).read_bytes()
    assert "FROM autoscaler/python:3.11" in (example / "Dockerfile").read_text()
