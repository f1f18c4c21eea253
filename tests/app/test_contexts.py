"""Build contexts: inside the job file's directory, limited by what they hold uncompressed,
packed and uploaded as a stream (a context is never whole in memory)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from app.api import ApiRefused
from app.cli import main
from app.commands.cluster import connect
from executor.packing import ContextTooLarge, pack_context, pack_context_file
from tests.app.test_submit import GOOD, write_job
from tests.traced import peak_traced


def submit(api, path: Path) -> int:
    return main(["submit", "--config", str(api.config.path), str(path)])


@pytest.mark.parametrize("context", ["../outside", "train/../../outside", "/etc"])
def test_a_context_outside_the_job_files_directory_is_refused_in_one_line(
    api, tmp_path, capsys, context
):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM scratch\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    path = write_job(jobs, GOOD.replace('context = "train"', f'context = "{context}"'))
    assert submit(api, path) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "inside the job file's directory" in err
    assert api.store.jobs() == [] and api.storage.list("contexts/") == []


def test_a_symlink_leading_out_of_the_job_files_directory_is_refused(api, tmp_path, capsys):
    secret = tmp_path / "home"
    secret.mkdir()
    (secret / "Dockerfile").write_text("FROM scratch\nCOPY . /\n")
    (secret / "id_rsa").write_text("not for the cluster")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "ctx").symlink_to(secret, target_is_directory=True)
    path = write_job(jobs, GOOD.replace('context = "train"', 'context = "ctx"'))
    assert submit(api, path) == 2
    err = capsys.readouterr().err
    assert "outside the job file's directory" in err and "symlink" in err
    assert api.storage.list("contexts/") == []


def test_a_symlink_inside_the_directory_is_followed(api, tmp_path, capsys):
    path = write_job(tmp_path, GOOD.replace('context = "train"', 'context = "link"'))
    (tmp_path / "link").symlink_to(tmp_path / "train", target_is_directory=True)
    assert submit(api, path) == 0, capsys.readouterr().err
    assert len(api.storage.list("contexts/")) == 1


def test_a_large_sparse_context_is_refused_by_its_uncompressed_size_without_reading_it(
    api, tmp_path, capsys
):
    path = write_job(tmp_path, GOOD)
    with open(tmp_path / "train" / "zeros.bin", "wb") as sparse:
        sparse.truncate(2 * 2**30)  # 2 GiB of zeros, no block on disk; gzip makes it ~2 MB
    status, peak, err = peak_traced(main, ["submit", "--config", str(api.config.path), str(path)])
    assert status == 2
    assert "(uncompressed) is over the limit of 256 MiB" in err, err
    assert peak < 32 * 2**20, peak
    assert api.storage.list("contexts/") == []


def test_packing_streams_to_a_file_with_bounded_memory(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    with open(context / "weights.bin", "wb") as out:
        for _ in range(48):
            out.write(os.urandom(2**20))  # incompressible: in memory it would be 48 MiB
    pack = functools.partial(pack_context_file, max_bytes=64 * 2**20)
    digest, peak, _ = peak_traced(pack, context, tmp_path / "ctx.tar.gz")
    assert peak < 8 * 2**20, peak
    assert digest == hashlib.sha256((tmp_path / "ctx.tar.gz").read_bytes()).hexdigest()
    assert digest == pack_context(context)[1]  # one packer: the same bytes either way
    with pytest.raises(ContextTooLarge, match="over the limit of 40 MiB"):
        pack_context_file(context, tmp_path / "again.tar.gz", max_bytes=40 * 2**20)


def test_the_daemon_refuses_an_archive_that_inflates_past_the_limit(api):
    # 8 MiB of zeros compress to a few KiB: under the fixture's 2 MiB limit as sent.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 8 * 2**20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    bomb = gzip.compress(raw.getvalue())
    assert len(bomb) < 2**20
    digest = hashlib.sha256(bomb).hexdigest()
    with connect(api.config) as client, pytest.raises(ApiRefused, match="inflates to more"):
        client.upload_contexts({digest: bomb})
    assert api.storage.list("contexts/") == []
