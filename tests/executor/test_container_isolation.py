"""A job's container, on a real Docker engine: not root, a read-only root filesystem, a
bounded writable scratch, and its checkpoint directory writable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor.runtime import ContainerSpec, RuntimeFailure

PROBE = r"""
import os, sys
print("uid", os.getuid(), "gid", os.getgid())
for path in ("/probe", "/usr/probe"):
    try:
        open(path, "w").write("x")
        print("root-writable", path)
    except OSError as exc:
        print("root-refused", path, exc.errno)
open("/tmp/small", "wb").write(b"x" * (1 << 20))
print("scratch-ok", os.environ["HOME"])
try:
    with open("/tmp/big", "wb") as big:
        for _ in range(32):
            big.write(b"x" * (1 << 20))
            big.flush()
    print("scratch-unbounded")
except OSError as exc:
    print("scratch-full", exc.errno)
open("/checkpoint/state.json", "w").write("{}")
print("checkpoint-ok")
"""


def run(runtime, spec: ContainerSpec) -> str:
    container = runtime.run(spec)
    try:
        runtime.wait(container)
        return runtime.logs(container).decode()
    finally:
        runtime.remove(container)


def test_a_job_runs_as_a_non_root_user_on_a_read_only_root_with_bounded_scratch(
    docker_runtime, python_image, tmp_path: Path
):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    os.chmod(checkpoint, 0o777)  # as the agent makes it (executor.attempts)
    out = run(
        docker_runtime,
        ContainerSpec(
            name=f"isolation-{os.getpid()}",
            image=python_image,
            command=("python", "-c", PROBE),
            memory_bytes=256 * 2**20,
            scratch_bytes=8 * 2**20,
            mounts={str(checkpoint): "/checkpoint"},
        ),
    )
    lines = out.splitlines()
    uid = int(lines[0].split()[1])
    assert uid != 0, out
    assert "root-refused /probe 30" in lines and "root-refused /usr/probe 30" in lines, out
    assert "scratch-ok /tmp" in lines, out
    assert "scratch-full 28" in lines, out  # ENOSPC: 8 MiB, not 32
    assert "checkpoint-ok" in lines, out
    assert (checkpoint / "state.json").read_text() == "{}"


def test_a_spec_asking_for_root_is_refused_before_docker_is_asked(docker_runtime, python_image):
    spec = ContainerSpec(name="never", image=python_image, user="0:0")
    with pytest.raises(RuntimeFailure, match="never runs as root"):
        docker_runtime.run(spec)
