"""The daemon's configuration file: one TOML document, each part parsed by its owner.

`[ec2]` and `[guardrails]` belong to `provisioners.config`, `[state]` to
`state.config`; this module only reads the file, so a missing or malformed
file gets the same one-line error whichever part asked.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from autoscaler.errors import InputError, decode_text, read_input_file


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The parsed TOML document at `path`, or an InputError naming the file and the problem."""
    p = Path(path)
    text = decode_text(read_input_file(p, "configuration"), "configuration", str(p))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"malformed TOML: {exc}", source=str(p)) from None
