"""The global storage: one contract for a directory and for S3 (moto_server over HTTP)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from executor.packing import pack_directory
from executor.storage import (
    NotFound,
    StorageError,
    attempt_prefix,
    checkpoint_key,
    context_digest,
    context_key,
    download,
    is_checkpoint_of,
    log_key,
    open_storage,
    prune_checkpoints,
    upload,
    upload_context,
)
from tests.executor.conftest import MOTO_CREDENTIALS, s3_options


@pytest.fixture(params=["file", "s3"])
def storage(request, tmp_path):
    if request.param == "file":
        return open_storage(f"file://{tmp_path}/store")
    url = request.getfixturevalue("s3_url")
    return open_storage(url, **s3_options(request.getfixturevalue("moto_endpoint")))


def test_put_get_list_exists_delete_round_trip(storage, tmp_path):
    source = tmp_path / "blob"
    data = os.urandom(300_000)
    source.write_bytes(data)
    ref = storage.put_file("jobs/j/t/1.tar.gz", source)
    assert ref == f"{storage.url}/jobs/j/t/1.tar.gz"
    storage.put_bytes("jobs/j/t/1.log", b"hello\n")
    assert storage.exists("jobs/j/t/1.tar.gz") and not storage.exists("jobs/j/t/2.tar.gz")
    written = storage.modified_at("jobs/j/t/1.tar.gz")
    assert written is not None and abs(written - time.time()) < 3600  # a Unix time, today
    assert storage.modified_at("jobs/j/t/2.tar.gz") is None
    assert storage.list("jobs/j/") == ["jobs/j/t/1.log", "jobs/j/t/1.tar.gz"]
    assert storage.list("contexts/") == []
    target = tmp_path / "deep" / "copy"
    storage.get_file(ref, target)  # by reference ...
    assert target.read_bytes() == data
    storage.get_file("jobs/j/t/1.log", target)  # ... or by key
    assert target.read_bytes() == b"hello\n"
    assert storage.key(ref) == "jobs/j/t/1.tar.gz"
    storage.delete("jobs/j/t/1.tar.gz")
    assert storage.list() == ["jobs/j/t/1.log"]
    with pytest.raises(NotFound, match=r"jobs/j/t/1\.tar\.gz: no such object"):
        storage.get_file(ref, target)
    assert target.read_bytes() == b"hello\n"  # a failed download leaves the file alone


def test_keys_that_could_escape_or_belong_elsewhere_are_refused(storage, tmp_path):
    for bad in ("../etc/passwd", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(StorageError, match="not a valid storage key"):
            storage.exists(bad)
    with pytest.raises(StorageError, match="is not in this storage"):
        storage.key("s3://someone-else/jobs/j/t/1.tar.gz")
    with pytest.raises(StorageError, match="cannot be part of a storage key"):
        checkpoint_key("job", "job/../../x", 1, 0)
    for bad_attempt_or_step in ((0, 5), (1, -1)):
        with pytest.raises(StorageError, match="cannot be part of a storage key"):
            checkpoint_key("job", "job/t", *bad_attempt_or_step)
    # Everything one attempt writes is under its own prefix; checkpoints are versioned by
    # step, zero-padded so that the newest sorts last.
    assert attempt_prefix("j1", "j1/trainer", 3) == "jobs/j1/trainer/3/"
    assert checkpoint_key("j1", "j1/trainer", 3, 250) == (
        "jobs/j1/trainer/3/checkpoint-000000000250.tar.gz"
    )
    assert log_key("j1", "j1/trainer", 3) == "jobs/j1/trainer/3/output.log"


def test_a_checkpoint_belongs_to_an_attempt_only_under_its_own_prefix(storage):
    own = storage.ref(checkpoint_key("j1", "j1/t", 3, 40))
    assert is_checkpoint_of(storage, own, "j1", "j1/t", 3)
    foreign = [
        storage.ref(checkpoint_key("j1", "j1/t", 2, 40)),  # an earlier attempt's
        storage.ref(checkpoint_key("j2", "j2/t", 3, 40)),  # another job's
        own.replace(storage.url, storage.url + "-other"),  # another store's
        storage.ref(log_key("j1", "j1/t", 3)),  # not a checkpoint
        storage.ref("jobs/j1/t/3/checkpoint-40.tar.gz"),  # not one the layout names
        storage.ref("contexts/" + "a" * 64 + ".tar.gz"),
        "s3://elsewhere/jobs/j1/t/3/checkpoint-000000000040.tar.gz",
        "",
    ]
    assert not [ref for ref in foreign if is_checkpoint_of(storage, ref, "j1", "j1/t", 3)]


def test_grants_move_bytes_without_credentials(storage, tmp_path):
    source = tmp_path / "in"
    source.write_bytes(b"checkpoint bytes")
    key = checkpoint_key("j", "j/t", 1, 7)
    upload(storage.grant_put(key, 60), source)
    assert storage.exists(key)
    download(storage.grant_get(key, 60), tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"checkpoint bytes"
    with pytest.raises(NotFound):
        download(storage.grant_get(checkpoint_key("j", "j/t", 1, 8), 60), tmp_path / "none")


def test_contexts_are_content_addressed_and_packed_reproducibly(storage, tmp_path):
    directory = tmp_path / "ctx"
    (directory / "src").mkdir(parents=True)
    (directory / "Dockerfile").write_text("FROM scratch\n")
    (directory / "src" / "main.py").write_text("print(1)\n")
    first = pack_directory(directory, tmp_path / "a.tar.gz")
    os.utime(directory / "Dockerfile", (1, 1))  # another time stamp, the same content
    second = pack_directory(directory, tmp_path / "b.tar.gz")
    assert first == second == hashlib.sha256((tmp_path / "a.tar.gz").read_bytes()).hexdigest()
    ref = upload_context(storage, directory)
    assert ref == storage.ref(context_key(first)) and context_digest(ref) == first
    assert upload_context(storage, directory) == ref  # already there: not uploaded again
    (directory / "src" / "main.py").write_text("print(2)\n")
    assert upload_context(storage, directory) != ref
    assert len(storage.list("contexts/")) == 2
    with pytest.raises(StorageError, match="not a build context"):
        context_digest(storage.ref("jobs/j/t/1.tar.gz"))


def test_a_file_store_write_that_fails_leaves_nothing_under_the_key(tmp_path):
    storage = open_storage(f"file://{tmp_path}/store")
    storage.put_bytes("jobs/j/t/1.tar.gz", b"complete")
    with pytest.raises(StorageError, match=r"cannot store .*jobs/j/t/1\.tar\.gz"):
        storage.put_file("jobs/j/t/1.tar.gz", tmp_path / "missing")
    target = tmp_path / "out"
    storage.get_file("jobs/j/t/1.tar.gz", target)
    assert target.read_bytes() == b"complete"
    assert sorted(p.name for p in (tmp_path / "store/jobs/j/t").iterdir()) == ["1.tar.gz"]


def test_an_s3_multipart_upload_that_fails_midway_is_never_visible(s3_url, moto_endpoint, tmp_path):
    storage = open_storage(s3_url, **s3_options(moto_endpoint))
    big = tmp_path / "big"
    big.write_bytes(os.urandom(20 << 20))  # above boto3's multipart threshold (8 MB)
    parts = []

    def fail_the_second_part(params, **kwargs):
        parts.append(params["PartNumber"])
        if params["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "UploadPart")

    storage.client.meta.events.register("provide-client-params.s3.UploadPart", fail_the_second_part)
    with pytest.raises(StorageError, match=r"cannot upload s3://.*/jobs/j/t/1\.tar\.gz"):
        storage.put_file("jobs/j/t/1.tar.gz", big)
    assert 2 in parts
    assert not storage.exists("jobs/j/t/1.tar.gz")
    raw = boto3.client("s3", endpoint_url=moto_endpoint, **MOTO_CREDENTIALS)
    bucket = s3_url.removeprefix("s3://").split("/")[0]
    assert raw.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted


def test_storage_urls_are_checked(tmp_path):
    assert open_storage(f"file://{tmp_path}/x/").url == f"file://{tmp_path}/x"
    for bad, message in [
        ("s3://", "needs a bucket"),
        ("file://relative/dir", "needs an absolute path"),
        ("gs://bucket", "must be s3://BUCKET"),
        ("/plain/path", "must be s3://BUCKET"),
    ]:
        with pytest.raises(StorageError, match=message):
            open_storage(bad)


def test_s3_errors_are_one_line_with_the_object(moto_endpoint, tmp_path):
    storage = open_storage("s3://no-such-bucket/p", **s3_options(moto_endpoint))
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"s3://no-such-bucket/p/jobs/a/b/1\.log.*NoSuchBucket"):
        storage.put_file("jobs/a/b/1.log", tmp_path / "f")
    assert Path(tmp_path / "f").exists()


def test_pruning_keeps_the_newest_two_versions_up_to_the_one_reported(storage):
    keys = [checkpoint_key("j", "j/t", 2, step) for step in (5, 40, 300, 2000, 9000)]
    for key in keys:
        storage.put_bytes(key, b"weights")
    other = checkpoint_key("j", "j/t", 1, 10)  # the attempt it resumed from: not this one's
    storage.put_bytes(other, b"weights")
    # Step 2000 is the latest reported complete; 9000 was uploaded since (not yet reported).
    deleted = prune_checkpoints(storage, storage.ref(keys[3]), "j", "j/t", 2)
    assert sorted(deleted) == keys[:2]
    assert storage.list(attempt_prefix("j", "j/t", 2)) == keys[2:]
    assert storage.exists(other)
    # A reference that is not this attempt's checkpoint prunes nothing.
    assert prune_checkpoints(storage, storage.ref(other), "j", "j/t", 2) == []
    assert storage.list(attempt_prefix("j", "j/t", 2)) == keys[2:]
