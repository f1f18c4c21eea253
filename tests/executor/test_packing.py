"""The one packer: reproducible bytes, `.dockerignore` as Docker documents it, symlinks kept."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from executor.packing import (
    dockerignore_patterns,
    pack_context,
    pack_directory,
    unpack_checkpoint,
)


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_digest_depends_on_the_content_only(tmp_path):
    root = tree(tmp_path / "ctx", {"Dockerfile": "FROM scratch\n", "src/main.py": "print(1)\n"})
    data, digest = pack_context(root)
    # Other times, another owner, other permission bits of the same kind: the same bytes.
    os.utime(root / "Dockerfile", (1, 1))
    os.utime(root / "src", (2, 2))
    if os.geteuid() == 0:
        os.chown(root / "src" / "main.py", 4321, 4321)
    os.chmod(root / "src" / "main.py", 0o600)
    again, same = pack_context(root)
    assert (again, same) == (data, digest)
    assert data[4:8] == b"\0\0\0\0"  # the gzip header's time
    entries = members(data)
    assert all(m.mtime == 0 and m.uid == m.gid == 0 and not m.uname for m in entries.values())
    assert entries["src/main.py"].mode == 0o644 and entries["src"].mode == 0o755
    # An executable stays executable (a script COPY'd into the image must run) ...
    os.chmod(root / "src" / "main.py", 0o700)
    _, executable = pack_context(root)
    assert executable != digest
    assert members(pack_context(root)[0])["src/main.py"].mode == 0o755
    # ... and other content is another digest.
    os.chmod(root / "src" / "main.py", 0o644)
    (root / "src" / "main.py").write_text("print(2)\n")
    assert pack_context(root)[1] != digest


def test_a_checkpoint_and_a_context_of_the_same_files_are_the_same_bytes(tmp_path):
    root = tree(tmp_path / "d", {"Dockerfile": "FROM scratch\n", "a/b.txt": "b"})
    data, digest = pack_context(root)
    assert pack_directory(root, tmp_path / "out.tar.gz") == digest
    assert (tmp_path / "out.tar.gz").read_bytes() == data


def test_dockerignore_patterns_exceptions_and_the_files_docker_always_sends(tmp_path):
    root = tree(
        tmp_path / "ctx",
        {
            "Dockerfile": "FROM scratch\n",
            "app.py": "",
            "notes.log": "",
            "deep/er/trace.log": "",
            "deep/er/keep.py": "",
            "pkg/__pycache__/m.pyc": "",
            "build/out.o": "",
            "build/keep.txt": "",
            "a.tmp": "",
            "ab.tmp": "",
            "README.md": "",
            "README-secret.md": "",
            "CHANGES.md": "",
            "# literal": "",
        },
    )
    (root / ".dockerignore").write_text(
        "\ufeff# a comment in column 1\n"
        "\n"
        "Dockerfile\n"  # Docker still sends these two
        ".dockerignore\n"
        "*.log\n"  # the root only: `*` does not cross '/'
        "**/*.log\n"  # ... `**` does, at any depth
        "**/__pycache__\n"
        "/build/\n"  # leading and trailing slashes do not matter
        "!build/keep.txt\n"  # an exception inside an excluded directory
        "?.tmp\n"  # one character
        "*.md\n"
        "!README*.md\n"
        "README-secret.md\n"  # the last line that matches decides
        "  # literal\n"  # not in column 1: a pattern, not a comment
    )
    entries = members(pack_context(root)[0])
    files = {name for name, m in entries.items() if m.isfile()}
    assert files == {
        "Dockerfile",
        ".dockerignore",
        "app.py",
        "deep/er/keep.py",
        "build/keep.txt",
        "ab.tmp",
        "README.md",
    }
    assert "pkg" in entries and "pkg/__pycache__" not in entries


def test_dockerignore_lines_are_read_as_the_docker_cli_reads_them(tmp_path):
    (tmp_path / ".dockerignore").write_text(
        "\ufeff*.log\n# comment\n  # not a comment: it is not in column 1\n  spaced  \n!  kept\n!\n"
    )
    assert dockerignore_patterns(tmp_path) == [
        "*.log",
        "# not a comment: it is not in column 1",
        "spaced",
        "!kept",
    ]
    assert dockerignore_patterns(tmp_path / "nowhere") == []


def test_symlinks_are_stored_as_symlinks_never_followed(tmp_path):
    outside = tree(tmp_path / "outside", {"secret.txt": "not for the image"})
    root = tree(tmp_path / "ctx", {"Dockerfile": "FROM scratch\n"})
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linked-dir").symlink_to(outside, target_is_directory=True)
    data, _ = pack_context(root)
    entries = members(data)
    assert entries["link.txt"].issym() and entries["link.txt"].linkname == str(
        outside / "secret.txt"
    )
    assert entries["linked-dir"].issym()
    assert not any(name.startswith("linked-dir/") for name in entries)
    assert b"not for the image" not in gzip.decompress(data)


def test_a_checkpoint_unpacks_to_what_was_packed_and_refuses_links(tmp_path):
    saved = tree(tmp_path / "saved", {"state.json": '{"step": 7}', "shards/0.bin": "weights"})
    archive = tmp_path / "ckpt.tar.gz"
    pack_directory(saved, archive)
    restored = tmp_path / "restored"
    restored.mkdir()
    unpack_checkpoint(archive, restored)
    assert (restored / "state.json").read_text() == '{"step": 7}'
    assert (restored / "shards" / "0.bin").read_text() == "weights"
    (saved / "escape").symlink_to("/etc/passwd")
    pack_directory(saved, archive)
    with pytest.raises(tarfile.TarError, match="'escape' is not allowed"):
        unpack_checkpoint(archive, tmp_path / "again")


def test_only_a_directory_can_be_packed(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="not a directory"):
        pack_context(tmp_path / "file")
