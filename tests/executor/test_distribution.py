"""The light worker wheel: everything the worker imports, nothing the planner or the
daemon needs, valid wheel metadata, and an install that runs without numpy."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from executor.distribution import FORBIDDEN, build, module_closure, requirements_for

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("executor", "autoscaler", *FORBIDDEN)

#: Imports every executor module (lazily imported ones too) and prints the project's
#: modules then loaded: what the worker can import, measured rather than declared.
LOADED = """
import json, pkgutil, sys, importlib
import executor
for info in pkgutil.walk_packages(executor.__path__, "executor."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dist"), root=ROOT)


def names(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as archive:
        return set(archive.namelist())


def test_the_wheel_holds_every_project_module_the_worker_imports(wheel):
    run = subprocess.run(
        [sys.executable, "-c", LOADED], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = [m for m in json.loads(run.stdout) if m.split(".")[0] in FIRST_PARTY]
    files = names(wheel.path)
    for module in loaded:
        base = module.replace(".", "/")
        assert f"{base}.py" in files or f"{base}/__init__.py" in files, module
    assert "executor/protos/worker.proto" in files
    # Nothing of the application, another binding, or the planner's numpy modules.
    assert not [f for f in files if f.split("/")[0] in FORBIDDEN]
    for heavy in ("planner", "lp", "pricing", "decide", "control", "store"):
        assert f"autoscaler/{heavy}.py" not in files
    assert wheel.path.name == "ec2_batch_autoscaler_worker-0.1.0-py3-none-any.whl"


def test_the_wheel_metadata_is_valid_and_requires_only_the_workers_packages(wheel):
    with zipfile.ZipFile(wheel.path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    info = "ec2_batch_autoscaler_worker-0.1.0.dist-info"
    wheel_file = files[f"{info}/WHEEL"].decode()
    assert "Wheel-Version: 1.0" in wheel_file and "Root-Is-Purelib: true" in wheel_file
    assert "Tag: py3-none-any" in wheel_file
    entry_points = files[f"{info}/entry_points.txt"].decode()
    assert "[console_scripts]\nautoscaler-worker = executor.cli:main" in entry_points
    metadata = files[f"{info}/METADATA"].decode().splitlines()
    assert "Name: ec2-batch-autoscaler-worker" in metadata and "Version: 0.1.0" in metadata
    required = {line.split(": ")[1].split(">")[0] for line in metadata if "Requires-Dist" in line}
    assert {"grpcio", "protobuf", "docker", "cryptography"} <= required
    # The agent serves nothing (it dials the daemon) and verifies no identity document.
    excluded = {"numpy", "highspy", "sqlalchemy", "alembic", "pydantic", "rich", "asn1crypto"}
    assert not required & (excluded | {"grpcio-health-checking"})
    # RECORD lists every other file once, with its sha256 (urlsafe, unpadded) and size.
    record = files[f"{info}/RECORD"].decode().splitlines()
    rows = dict(line.split(",", 1) for line in record)
    assert set(rows) == set(files) and rows[f"{info}/RECORD"] == ","
    for name, data in files.items():
        if name.endswith("/RECORD"):
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert rows[name] == f"sha256={digest},{len(data)}", name


def test_the_wheel_is_reproducible(wheel, tmp_path):
    again = build(tmp_path, root=ROOT)
    assert again.path.read_bytes() == wheel.path.read_bytes() and again.sha256 == wheel.sha256


def test_the_worker_reaching_an_application_module_is_refused(tmp_path):
    for package in ("executor", "autoscaler", "app"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "executor" / "agent.py").write_text("def f():\n    from app import config\n")
    (tmp_path / "app" / "config.py").write_text("")
    with pytest.raises(RuntimeError, match=r"the worker imports app, app\.config"):
        module_closure(tmp_path, ["executor.agent"])


def test_requirements_are_the_projects_own_for_what_is_imported():
    project = ["numpy>=1.26", "boto3>=1.34", "grpcio>=1.85.1", "protobuf>=7.35.1"]
    # botocore comes with boto3; `google` is protobuf's namespace; numpy is not imported.
    assert requirements_for({"boto3", "botocore", "grpc", "google"}, project) == [
        "boto3>=1.34",
        "grpcio>=1.85.1",
        "protobuf>=7.35.1",
    ]
    with pytest.raises(RuntimeError, match="imports docker, which no requirement"):
        requirements_for({"grpc", "docker"}, project)


@pytest.mark.timeout(600)
@pytest.mark.long
def test_installed_alone_the_worker_runs_without_the_planners_packages(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, worker = venv / "bin" / "python", venv / "bin" / "autoscaler-worker"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", str(wheel.path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"  # not the repository: only the installed copy imports
    elsewhere.mkdir()
    help_ = subprocess.run(
        [worker, "--help"], capture_output=True, text=True, env=env, cwd=elsewhere, timeout=120
    )
    assert help_.returncode == 0 and "usage: autoscaler-worker" in help_.stdout, help_.stderr
    # What the agent does beyond its flags loads too: TLS keys, gRPC, the docker SDK's
    # .dockerignore matcher, boto3 for S3.
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    (context / ".dockerignore").write_text("*.log\n")
    (context / "x.log").write_text("ignored")
    works = subprocess.run(
        [
            python,
            "-c",
            "import sys, executor.agent, executor.client\n"
            "from executor.security import Authority\n"
            "from executor.packing import pack_context\n"
            "from executor.storage import open_storage\n"
            "Authority.create('test').issue(['w'])\n"
            "open_storage('s3://bucket/prefix', region_name='us-east-1')\n"
            f"print(pack_context({str(context)!r})[1])\n"
            "assert executor.agent.__file__.startswith(sys.prefix), executor.agent.__file__\n",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
        timeout=120,
    )
    assert works.returncode == 0, works.stderr[-2000:]
    from executor.packing import pack_context

    assert works.stdout.strip() == pack_context(context)[1]  # the same packer, installed
    for heavy in ("numpy", "highspy", "sqlalchemy", "pydantic"):
        missing = subprocess.run(
            [python, "-c", f"import {heavy}"], capture_output=True, env=env, cwd=elsewhere
        )
        assert missing.returncode != 0, f"{heavy} is installed beside the worker"
