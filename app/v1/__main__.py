"""`python -m app.v1`: regenerate the submission API's committed stubs from api.proto."""

from __future__ import annotations

import sys

from executor.protos.__main__ import ROOT, generate

PROTOS = ("app/v1/api.proto",)

if __name__ == "__main__":
    generate(ROOT, PROTOS)
    print("regenerated: " + ", ".join(PROTOS), file=sys.stderr)
