"""The cluster's global storage: build contexts, checkpoints and logs.

Every instance reads and writes one store (Eva §5: "all instances in the
cluster have access to a global storage"), named by a URL:

- `s3://bucket/prefix` — S3 through boto3 (on EC2, the instance role's
  credentials; `AWS_ENDPOINT_URL` or `endpoint_url=` for moto_server);
- `file:///abs/dir` — a directory, the default for running everything on
  one machine without AWS.

Layout (keys, relative to the URL), named here and nowhere else (the
daemon's submission API, its grants and the worker agent all call
`context_key`, `attempt_prefix`, `checkpoint_key`, `log_key`, `job_prefix`):

    contexts/<sha256>.tar.gz                              build contexts, content-addressed
    jobs/<job>/<task>/<attempt>/checkpoint-<step>.tar.gz  checkpoints, versioned by step
                                                          (the newest two kept: `prune`)
    jobs/<job>/<task>/<attempt>/output.log                container logs

Everything one attempt writes is under its own prefix, so the daemon can grant
an attempt exactly its objects and check that a reported checkpoint is the
attempt's own (`is_checkpoint_of`). Workers hold no storage credentials: the
daemon hands them grants (`Storage.grant_get`, `Storage.grant_put`: presigned
S3 URLs with a short expiry, or `file://` paths on one host), and the worker
moves bytes with `download` and `upload`, which need no credentials at all.

Archives are `executor.packing`'s one reproducible `.tar.gz` format.

A reference (`ref`) is the full URL of a key; it is what travels in task
reports and the state. Writes are atomic: an object is visible under its key
only once it is complete (S3 shows a PUT or a multipart upload only when it
completes, and boto3 aborts a failed multipart upload; the directory store
writes a temporary file and renames it), so a half-uploaded checkpoint is
never referenced.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote, unquote, urlparse

from executor.packing import pack_context

CONTEXTS = "contexts"
JOBS = "jobs"
ARCHIVE = ".tar.gz"  # `executor.packing`'s format: contexts and checkpoints
LOG = ".log"
CHECKPOINT = "checkpoint-"  # + the step, zero-padded (lexical order is step order)
LOG_NAME = "output.log"
CONTEXTS_PREFIX = f"{CONTEXTS}/"  # what every build context's key starts with

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SAFE_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+@-]*")


class StorageError(RuntimeError):
    """A storage operation failed; the message says which object and why."""


class NotFound(StorageError):
    """No object under that key."""


@runtime_checkable
class Storage(Protocol):
    """One bucket (or directory) of objects named by relative keys."""

    url: str

    def ref(self, key: str) -> str:
        """The full URL of `key`."""
        ...

    def key(self, ref_or_key: str) -> str:
        """The key of a reference into this store (a bare key is returned checked)."""
        ...

    def put_file(self, key: str, path: str | Path) -> str:
        """Upload `path` under `key` atomically; returns its reference."""
        ...

    def put_bytes(self, key: str, data: bytes) -> str: ...

    def get_file(self, ref_or_key: str, path: str | Path) -> None:
        """Download to `path` (written atomically: a temporary file, then renamed)."""
        ...

    def exists(self, key: str) -> bool: ...

    def modified_at(self, key: str) -> float | None:
        """When the object was last written (Unix time), None if there is none."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with `prefix`, sorted."""
        ...

    def delete(self, key: str) -> None: ...

    def grant_get(self, key: str, expires_s: float) -> str:
        """A URL anyone holding it may read `key` from, for `expires_s`."""
        ...

    def grant_put(self, key: str, expires_s: float) -> str:
        """A URL anyone holding it may write `key` at (once complete), for `expires_s`."""
        ...


def open_storage(url: str, **aws_kwargs: Any) -> Storage:
    """The store a URL names. `aws_kwargs` go to `boto3.client("s3", ...)`
    (`endpoint_url`, `region_name`, credentials) for `s3://` URLs."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{url!r}: an S3 URL needs a bucket: s3://BUCKET[/PREFIX]")
        return S3Storage(parsed.netloc, parsed.path.strip("/"), **aws_kwargs)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise StorageError(f"{url!r}: a file URL needs an absolute path: file:///DIR")
        return FileStorage(Path(unquote(parsed.path)))
    raise StorageError(f"{url!r}: storage must be s3://BUCKET[/PREFIX] or file:///ABSOLUTE/DIR")


# -- keys --------------------------------------------------------------------------------------


def check_key(key: str) -> str:
    """`key` if it is a plain relative key (no empty, `.` or `..` part, no backslash)."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts) or "\\" in key or "\x00" in key:
        raise StorageError(f"{key!r} is not a valid storage key")
    return key


def is_digest(text: str) -> bool:
    """Whether `text` is a sha256 hex digest: what names a build context."""
    return bool(_SHA256.fullmatch(text))


def context_key(digest: str) -> str:
    """`contexts/<sha256>.tar.gz`: a build context under its content address."""
    if not is_digest(digest):
        raise StorageError(f"{digest!r} is not a sha256 hex digest")
    return f"{CONTEXTS}/{digest}{ARCHIVE}"


def context_digest(ref_or_key: str) -> str:
    """The sha256 a build context's reference names (its content address)."""
    name = ref_or_key.rstrip("/").rsplit("/", 1)[-1]
    digest = name.removesuffix(ARCHIVE)
    if name == digest or not is_digest(digest):
        raise StorageError(f"{ref_or_key!r} is not a build context (contexts/<sha256>.tar.gz)")
    return digest


def context_key_of(ref_or_key: str) -> str:
    """The key of a build context's reference (`s3://b/p/contexts/<sha256>.tar.gz` ->
    `contexts/<sha256>.tar.gz`), whichever storage it names."""
    return context_key(context_digest(ref_or_key))


def job_prefix(job_id: str, task: str = "") -> str:
    """`jobs/<job>/` (or `jobs/<job>/<task>/`, `task` the task's key in its job): what
    the keys of a job's (a task's) checkpoints and logs start with."""
    prefix = f"{JOBS}/{job_id}/"
    return f"{prefix}{task}/" if task else prefix


def attempt_prefix(job_id: str, task_id: str, attempt: int) -> str:
    """`jobs/<job>/<task>/<attempt>/`: every object one attempt writes starts with it;
    `task_id` may be `<job>/<task>`."""
    task = task_id.removeprefix(f"{job_id}/")
    for part in (job_id, *task.split("/")):
        if not _SAFE_PART.fullmatch(part):
            raise StorageError(f"{part!r} cannot be part of a storage key")
    if int(attempt) < 1:
        raise StorageError(f"attempt {attempt} cannot be part of a storage key")
    return f"{job_prefix(job_id, task)}{int(attempt)}/"


def checkpoint_key(job_id: str, task_id: str, attempt: int, step: int) -> str:
    """`jobs/<job>/<task>/<attempt>/checkpoint-<step>.tar.gz`: one version of an attempt's
    checkpoint, named by the job's step when it was taken."""
    if int(step) < 0:
        raise StorageError(f"step {step} cannot be part of a storage key")
    return f"{attempt_prefix(job_id, task_id, attempt)}{CHECKPOINT}{int(step):012d}{ARCHIVE}"


def log_key(job_id: str, task_id: str, attempt: int) -> str:
    """`jobs/<job>/<task>/<attempt>/output.log`: the attempt's container log."""
    return f"{attempt_prefix(job_id, task_id, attempt)}{LOG_NAME}"


def is_log_key(key: str) -> bool:
    """Whether `key` names a container's log."""
    return key.startswith(f"{JOBS}/") and key.endswith(LOG)


def is_checkpoint_of(storage: Storage, ref: str, job_id: str, task_id: str, attempt: int) -> bool:
    """Whether `ref` is a checkpoint under this attempt's own prefix in `storage` (what
    a worker may report for it; anything else would point a task at foreign data)."""
    try:
        key = storage.key(ref)
        prefix = attempt_prefix(job_id, task_id, attempt)
    except StorageError:
        return False
    name = key[len(prefix) :] if key.startswith(prefix) else ""
    step = name.removeprefix(CHECKPOINT).removesuffix(ARCHIVE)
    return name == f"{CHECKPOINT}{step}{ARCHIVE}" and step.isdigit() and len(step) == 12


def checkpoint_step(ref: str | None) -> int | None:
    """The job's step a checkpoint reference was taken at (its versioned name), or None
    when `ref` names no checkpoint version."""
    if not ref:
        return None
    name = ref.rstrip("/").rsplit("/", 1)[-1]
    step = name.removeprefix(CHECKPOINT).removesuffix(ARCHIVE)
    if name != f"{CHECKPOINT}{step}{ARCHIVE}" or not step.isdigit():
        return None
    return int(step)


#: Checkpoint versions of an attempt kept when a newer one is reported: the newest, and one
#: before it (should the newest prove unreadable).
KEEP_CHECKPOINTS = 2


def prune_checkpoints(
    storage: Storage,
    ref: str,
    job_id: str,
    task_id: str,
    attempt: int,
    keep: int = KEEP_CHECKPOINTS,
) -> list[str]:
    """Delete the attempt's checkpoint versions older than the `keep` newest up to `ref` (the
    latest one reported complete); versions after it (an upload in flight, done before its
    report) are left alone. Returns the keys deleted."""
    if not is_checkpoint_of(storage, ref, job_id, task_id, attempt):
        return []
    newest = storage.key(ref)
    prefix = attempt_prefix(job_id, task_id, attempt)
    versions = [
        key
        for key in storage.list(f"{prefix}{CHECKPOINT}")
        if key <= newest and is_checkpoint_of(storage, key, job_id, task_id, attempt)
    ]  # zero-padded steps: the keys' order is the steps' order
    doomed = sorted(versions)[:-keep] if keep > 0 else versions
    for key in doomed:
        storage.delete(key)
    return doomed


# -- build contexts ----------------------------------------------------------------------------


def upload_context(storage: Storage, directory: str | Path) -> str:
    """Pack `directory` (`executor.packing`, honouring its `.dockerignore`) and store it
    under its digest unless it is already there; returns the reference a
    `TaskRun.build_context` holds."""
    data, digest = pack_context(directory)
    key = context_key(digest)
    if not storage.exists(key):
        storage.put_bytes(key, data)
    return storage.ref(key)


# -- references --------------------------------------------------------------------------------


class _References:
    """A reference is the store's URL, a slash, and the key: one rule for every store."""

    url: str

    def ref(self, key: str) -> str:
        """The full URL of `key`."""
        return f"{self.url}/{check_key(key)}"

    def key(self, ref_or_key: str) -> str:
        """The key of a reference into this store (a bare key is returned checked)."""
        if ref_or_key.startswith(self.url + "/"):
            return check_key(ref_or_key[len(self.url) + 1 :])
        if "://" in ref_or_key:
            raise StorageError(f"{ref_or_key!r} is not in this storage ({self.url})")
        return check_key(ref_or_key)


# -- a directory -------------------------------------------------------------------------------


class FileStorage(_References):
    """Objects as files under a directory (one machine, or a shared file system)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = "file://" + str(root).rstrip("/")

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_file(self, key: str, path: str | Path) -> str:
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.part"
            try:
                with open(path, "rb") as source, open(temporary, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                    sink.flush()
                    os.fsync(sink.fileno())
                os.replace(temporary, target)
            finally:
                temporary.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot store {self.ref(key)}: {exc.strerror or exc}") from None
        return self.ref(key)

    def put_bytes(self, key: str, data: bytes) -> str:
        with tempfile.NamedTemporaryFile(prefix="autoscaler-put-") as handle:
            handle.write(data)
            handle.flush()
            return self.put_file(key, handle.name)

    def get_file(self, ref_or_key: str, path: str | Path) -> None:
        source = self._path(self.key(ref_or_key))
        if not source.is_file():
            raise NotFound(f"{self.ref(self.key(ref_or_key))}: no such object")
        try:
            _atomic_copy(lambda sink: _copy_from(source, sink), Path(path))
        except OSError as exc:
            raise StorageError(f"cannot read {source}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def modified_at(self, key: str) -> float | None:
        try:
            return self._path(key).stat().st_mtime
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for path in _walk(self.root):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and not path.name.startswith(".") and key.startswith(prefix):
                keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def grant_get(self, key: str, expires_s: float) -> str:
        """The object's own path: on one host (the local cloud) the daemon vouches for a
        path, and the host's user is the trust boundary (nothing to presign)."""
        return _file_url(self._path(key))

    def grant_put(self, key: str, expires_s: float) -> str:
        return _file_url(self._path(key))


def _walk(root: Path) -> Iterator[Path]:
    for here, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            yield Path(here) / name


def _copy_from(source: Path, sink: io.BufferedWriter) -> None:
    with open(source, "rb") as handle:
        shutil.copyfileobj(handle, sink, 1 << 20)


def _atomic_copy(write: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.part"
    try:
        with open(temporary, "wb") as sink:
            write(sink)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


# -- S3 ----------------------------------------------------------------------------------------


class S3Storage(_References):
    """Objects in an S3 bucket, under an optional prefix."""

    def __init__(self, bucket: str, prefix: str = "", **aws_kwargs: Any) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        config = aws_kwargs.pop("config", None) or Config(retries={"mode": "standard"})
        self.client = boto3.client("s3", config=config, **aws_kwargs)

    def _object(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: str | Path) -> str:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(str(path), self.bucket, self._object(key))
        except (S3UploadFailedError, ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot upload {self.ref(key)}: {_aws_message(exc)}") from None
        return self.ref(key)

    def put_bytes(self, key: str, data: bytes) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._object(key), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot upload {self.ref(key)}: {_aws_message(exc)}") from None
        return self.ref(key)

    def get_file(self, ref_or_key: str, path: str | Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(ref_or_key)
        try:
            _atomic_copy(
                lambda sink: self.client.download_fileobj(self.bucket, self._object(key), sink),
                Path(path),
            )
        except ClientError as exc:
            if _aws_code(exc) in ("404", "NoSuchKey", "NotFound"):
                raise NotFound(f"{self.ref(key)}: no such object") from None
            raise StorageError(f"cannot download {self.ref(key)}: {_aws_message(exc)}") from None
        except BotoCoreError as exc:
            raise StorageError(f"cannot download {self.ref(key)}: {exc}") from None

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def modified_at(self, key: str) -> float | None:
        head = self._head(key)
        return None if head is None else head["LastModified"].timestamp()

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if _aws_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StorageError(f"cannot look up {self.ref(key)}: {_aws_message(exc)}") from None
        except BotoCoreError as exc:
            raise StorageError(f"cannot look up {self.ref(key)}: {exc}") from None

    def list(self, prefix: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        keys = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            )
            for page in pages:
                keys += [item["Key"][len(base) :] for item in page.get("Contents", ())]
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot list {self.url}/{prefix}: {_aws_message(exc)}") from None
        return sorted(keys)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._object(key))
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot delete {self.ref(key)}: {_aws_message(exc)}") from None

    def grant_get(self, key: str, expires_s: float) -> str:
        """A presigned GET (signed with the daemon's credentials, valid `expires_s`)."""
        return self._presign("get_object", key, expires_s)

    def grant_put(self, key: str, expires_s: float) -> str:
        """A presigned PUT of one object (up to 5 GB: S3's single-PUT limit). S3 shows an
        object only once its PUT completes, so a half-uploaded checkpoint is never seen."""
        return self._presign("put_object", key, expires_s)

    def _presign(self, operation: str, key: str, expires_s: float) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return str(
                self.client.generate_presigned_url(
                    operation,
                    Params={"Bucket": self.bucket, "Key": self._object(key)},
                    ExpiresIn=max(1, int(expires_s)),
                )
            )
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot presign {self.ref(key)}: {_aws_message(exc)}") from None


# -- moving bytes with a grant (the worker's side: no credentials) ------------------------------


def download(url: str, path: str | Path, *, timeout_s: float = 60.0) -> None:
    """Fetch the object a grant's URL names into `path` (written atomically)."""
    target = Path(path)
    if url.startswith("file://"):
        source = Path(unquote(urlparse(url).path))
        if not source.is_file():
            raise NotFound(f"{url}: no such object")
        try:
            _atomic_copy(lambda sink: _copy_from(source, sink), target)
        except OSError as exc:
            raise StorageError(f"cannot read {source}: {exc.strerror or exc}") from None
        return
    _check_http(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            _atomic_copy(lambda sink: shutil.copyfileobj(response, sink, 1 << 20), target)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"{_shown(url)}: no such object") from None
        raise StorageError(f"cannot download {_shown(url)}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise StorageError(f"cannot download {_shown(url)}: {exc}") from None


def upload(url: str, path: str | Path, *, timeout_s: float = 300.0) -> None:
    """Store the file `path` at the object a grant's URL names (atomically: a temporary
    file renamed, or one PUT that S3 shows only once complete)."""
    source = Path(path)
    if url.startswith("file://"):
        target = Path(unquote(urlparse(url).path))
        try:
            _atomic_copy(lambda sink: _copy_from(source, sink), target)
        except OSError as exc:
            raise StorageError(f"cannot store {target}: {exc.strerror or exc}") from None
        return
    _check_http(url)
    try:
        size = source.stat().st_size
        with source.open("rb") as body:
            request = urllib.request.Request(
                url,
                data=body,
                method="PUT",
                headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
            )
            with urllib.request.urlopen(request, timeout=timeout_s):
                pass
    except urllib.error.HTTPError as exc:
        raise StorageError(
            f"cannot upload to {_shown(url)}: HTTP {exc.code} {exc.reason}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise StorageError(f"cannot upload to {_shown(url)}: {exc}") from None


def _check_http(url: str) -> None:
    if urlparse(url).scheme not in ("http", "https"):
        raise StorageError(f"{_shown(url)}: a grant must be an http(s) or file URL")


def _shown(url: str) -> str:
    """A URL without its query: a presigned URL's signature is a credential, never logged."""
    return url.split("?", 1)[0]


def _file_url(path: Path) -> str:
    return "file://" + quote(str(path))


def _aws_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _aws_message(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        return f"{error.get('Code', '')}: {error.get('Message', '')}".strip(": ")
    return str(exc)
