"""A reader that goes away early (`autoscaler … | head -1`) ends the command quietly."""

from __future__ import annotations

import subprocess
import sys


def test_a_closed_pipe_ends_the_command_without_a_traceback():
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "plan", "--limit", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.readline().startswith(b"Plan for 200 tasks")
    process.stdout.close()  # what `head -1` does after its line
    _, err = process.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
    assert process.returncode in (0, 141)
