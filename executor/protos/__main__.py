"""`python -m executor.protos`: regenerate the committed stubs from the .proto files."""

from __future__ import annotations

import sys
from pathlib import Path

#: The repository root: proto paths (and so the stubs' imports) are relative to it.
ROOT = Path(__file__).resolve().parents[2]
PROTOS = ("executor/protos/worker.proto",)


def generate(out: Path, protos: tuple[str, ...] = PROTOS) -> None:
    """Write `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` for each proto (paths relative to
    the repository root) under `out`."""
    from grpc_tools import protoc

    for proto in protos:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{ROOT}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(ROOT / proto),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {proto} (exit status {code})")


if __name__ == "__main__":
    generate(ROOT)
    print("regenerated: " + ", ".join(PROTOS), file=sys.stderr)
