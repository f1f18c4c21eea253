"""One fault of `python -m benchmarks faults`, end to end through the benchmark's own code:
the worker agent under the training job killed with SIGKILL on the local cloud.

The timings it measures are reported by the benchmark, never asserted here; what is asserted
holds whatever the machine's load: the fault was seen and a new attempt ran, that attempt
resumed from the checkpoint the daemon knew (not from step 0), no two copies of the task ever
ran at once, the job completed, and `down` left no agent, no instance and no running
container.
"""

from __future__ import annotations

import pytest

from benchmarks.faults import run_fault
from tests.executor.conftest import docker_client, python_image  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(900), pytest.mark.long]


def test_a_killed_agent_resumes_from_its_checkpoint_once_and_leaves_nothing_running(
    tmp_path,
    python_image,  # noqa: F811 (the example builds FROM it)
    docker_client,  # noqa: F811
):
    outcome = run_fault("kill-agent", tmp_path, docker_client, total=600)

    assert outcome.job_status == "completed", outcome.notes
    assert outcome.detect_s is not None and outcome.recover_s is not None, outcome.notes
    assert outcome.attempts >= 2
    assert outcome.checkpoint_step is not None and outcome.checkpoint_step > 0
    assert outcome.resumed_step is not None
    assert outcome.resumed_step >= outcome.checkpoint_step  # nothing checkpointed was lost
    assert outcome.duplicates == 0 and outcome.overlap_s == 0
    # `down` stops every agent and instance and no container runs; containers that exited
    # (the killed agent's, stopped by its watchdog) may still be listed until `down`
    # removes stopped ones too.
    assert outcome.leaks["agents"] == 0
    assert outcome.leaks["instances"] == 0
    assert outcome.leaks["running"] == 0
