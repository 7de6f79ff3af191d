"""Where finished audio is kept: a directory, an S3 bucket, or Redis (``CHATTTS_FARM_AUDIO_STORE``).

Workers write each finished job's encoded audio to the store under a key made from the job's id; the
web serves it from there in pieces (byte ranges), never whole into memory; ``chattts-farm gc`` deletes
audio past ``CHATTTS_FARM_AUDIO_TTL_S``. Redis holds all it keeps in memory, which fills under load,
so it is only for small setups; a directory (a volume shared by every host) or a bucket is not bounded
by memory.

- ``file:<dir>``: one file per job, ``<dir>/<2 characters>/<job id>.<format>``, written to a temporary
  file and renamed into place, so a reader never sees half a file;
- ``s3://<bucket>/<prefix>``: one object per job, ``<prefix>/<job id>.<format>`` (boto3, credentials
  from the usual AWS variables; another S3-compatible server through ``CHATTTS_FARM_S3_ENDPOINT_URL``);
- ``redis``: the key ``chattts:audio:<job id>``, expiring by itself.

Torch-free and Flask-free: callers read a result's audio with :func:`fetch_audio` whatever the store.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

import redis

from chattts_farm import redis_keys
from chattts_farm.contract import FarmError
from chattts_farm.settings import Settings

FILE_SCHEME = "file:"
S3_SCHEME = "s3://"
REDIS_STORE = "redis"
# What one read of a stored file or object yields: large enough to keep a response's writes few,
# small enough that thousands of responses at once hold little memory.
CHUNK_BYTES = 256 * 1024
# Job ids are chosen by whoever sends the task: one that is not a plain name (a path, say) is stored
# under its hash instead, so no id can name a file outside the store.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_HASHED = "sha256-"
_TEMPORARY_SUFFIX = ".partial"


class AudioExpired(FarmError):
    """The store holds no audio for the job (any more): it expired, or was never written there."""


@dataclass
class StoredAudio:
    """One job's stored audio, opened: its size and version, and its bytes read in pieces on demand.

    The file store holds the file open from :meth:`AudioStore.open` on, so a gc that deletes it
    meanwhile does not cut a response short; :meth:`close` lets it go.
    """

    key: str
    size: int
    # Changes whenever the audio does (a re-run overwrites it): an HTTP entity tag, without its quotes.
    etag: str | None
    modified: float | None  # Unix time of the write, where the store keeps one
    _read: Callable[[int, int], Iterator[bytes]]
    _close: Callable[[], None] = field(default=lambda: None)

    def chunks(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """The bytes ``start`` up to (not including) ``stop`` (default: the end), a piece at a time."""
        stop = self.size if stop is None else min(stop, self.size)
        return self._read(start, stop) if start < stop else iter(())

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def close(self) -> None:
        self._close()

    def __enter__(self) -> StoredAudio:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AudioStore(ABC):
    """A place for jobs' audio. Every method but :meth:`key` and :meth:`url` reaches the store."""

    @abstractmethod
    def key(self, job_id: str, audio_format: str) -> str:
        """The key of a job's audio in this store: the same for every run of the job."""

    def url(self, key: str) -> str | None:
        """Where a caller outside the farm finds the audio (a ``file:`` or ``s3:`` URL); None for Redis."""
        return None

    @abstractmethod
    def write(self, key: str, audio: bytes) -> None:
        """Store the audio under ``key``, replacing any earlier; readers see the old or the new, whole."""

    @abstractmethod
    def open(self, key: str) -> StoredAudio | None:
        """The audio under ``key``, or None when there is none (expired, or never written)."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The audio's size in bytes, or None when there is none."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Delete the audio; False when there was none."""

    @abstractmethod
    def expire(self, older_than: float) -> int:
        """Delete the audio written before ``older_than`` (Unix time); how many were deleted."""


def stored_name(job_id: str) -> str:
    """The job's name in a file or object store: its id when that is a plain name, else the id's hash."""
    if _PLAIN_NAME.fullmatch(job_id):
        return job_id
    return _HASHED + hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()


class FileStore(AudioStore):
    """A directory, local or a volume every host mounts (NFS, a cluster file system)."""

    def __init__(self, directory: Path):
        self.directory = directory.resolve()

    def key(self, job_id: str, audio_format: str) -> str:
        name = stored_name(job_id)
        # A directory per first two characters of the id (or hash): none grows to millions of entries.
        return f"{name.removeprefix(_HASHED)[:2]}/{name}.{audio_format}"

    def url(self, key: str) -> str:
        return self._path(key).as_uri()

    def write(self, key: str, audio: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMPORARY_SUFFIX)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(audio)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temporary, 0o644)  # mkstemp's 0600 would keep the web, if another user, out
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def open(self, key: str) -> StoredAudio | None:
        try:
            file = self._path(key).open("rb")
        except FileNotFoundError:
            return None
        status = os.fstat(file.fileno())
        return StoredAudio(
            key,
            status.st_size,
            f"{status.st_size:x}-{status.st_mtime_ns:x}",
            status.st_mtime,
            lambda start, stop: _file_chunks(file, start, stop),
            file.close,
        )

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def expire(self, older_than: float) -> int:
        # Temporary files of writers that died are past their time as well.
        deleted = 0
        for path in self.directory.glob("*/*"):
            try:
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    deleted += not path.name.endswith(_TEMPORARY_SUFFIX)
            except FileNotFoundError:  # another gc, or a re-run's rename, got there first
                continue
        return deleted

    def _path(self, key: str) -> Path:
        path = (self.directory / key).resolve()
        if path.parent.parent != self.directory:
            raise ValueError(f"{key!r} is not a key of the audio store in {self.directory}")
        return path


def _file_chunks(file: IO[bytes], start: int, stop: int) -> Iterator[bytes]:
    # pread: one open file serves any number of ranges, each from its own offset.
    offset = start
    while offset < stop:
        data = os.pread(file.fileno(), min(CHUNK_BYTES, stop - offset), offset)
        if not data:
            return
        offset += len(data)
        yield data


class S3Store(AudioStore):
    """A bucket of S3 or of any S3-compatible server (MinIO, Ceph, R2, ...)."""

    def __init__(self, bucket: str, prefix: str, client: Any):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client

    @classmethod
    def connect(cls, location: str, endpoint_url: str = "") -> S3Store:
        """The store at ``s3://bucket/prefix``; credentials and region from the usual AWS variables."""
        try:
            import boto3
            from botocore.config import Config
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"the audio store {location} needs boto3: pip install 'chattts-farm[s3]'"
            ) from None

        bucket, _, prefix = location.removeprefix(S3_SCHEME).partition("/")
        # A store away for a while (restarting, say) is waited for, as workers wait for Redis, rather
        # than failing the job whose audio is being written: backoff up to 20 s a try.
        retries = Config(retries={"max_attempts": 10, "mode": "standard"})
        return cls(bucket, prefix, boto3.client("s3", endpoint_url=endpoint_url or None, config=retries))

    def key(self, job_id: str, audio_format: str) -> str:
        name = f"{stored_name(job_id)}.{audio_format}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, key: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{key}"

    def write(self, key: str, audio: bytes) -> None:
        # An S3 object appears whole or not at all.
        self.client.put_object(Bucket=self.bucket, Key=key, Body=audio)

    def open(self, key: str) -> StoredAudio | None:
        head = self._head(key)
        if head is None:
            return None
        etag = head["ETag"].strip('"')

        def read(start: int, stop: int) -> Iterator[bytes]:
            # IfMatch: a range of this version, never half of one run's audio and half of a re-run's.
            answer = self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{stop - 1}", IfMatch=f'"{etag}"'
            )
            body = answer["Body"]
            try:
                yield from body.iter_chunks(CHUNK_BYTES)
            finally:
                body.close()

        return StoredAudio(key, head["ContentLength"], etag, head["LastModified"].timestamp(), read)

    def size(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else head["ContentLength"]

    def delete(self, key: str) -> bool:
        existed = self._head(key) is not None
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return existed

    def expire(self, older_than: float) -> int:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
        )
        expired = [
            item["Key"]
            for page in pages
            for item in page.get("Contents", ())
            if item["LastModified"].timestamp() < older_than
        ]
        for start in range(0, len(expired), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": key} for key in expired[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        return len(expired)

    def _head(self, key: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise


class RedisStore(AudioStore):
    """Redis, as before there were stores: every byte in memory, each key expiring by itself."""

    def __init__(self, client: redis.Redis, ttl_s: int):
        self.client = client
        self.ttl_s = ttl_s

    def key(self, job_id: str, audio_format: str) -> str:
        return redis_keys.audio(job_id)

    def write(self, key: str, audio: bytes) -> None:
        self.client.set(key, audio, ex=self.ttl_s)

    def open(self, key: str) -> StoredAudio | None:
        size = self.size(key)
        if size is None:
            return None

        def read(start: int, stop: int) -> Iterator[bytes]:
            for offset in range(start, stop, CHUNK_BYTES):
                data = self.client.getrange(key, offset, min(offset + CHUNK_BYTES, stop) - 1)
                if not data:  # expired while it was read
                    return
                yield data

        return StoredAudio(key, size, None, None, read)

    def size(self, key: str) -> int | None:
        with self.client.pipeline(transaction=True) as pipeline:
            exists, size = pipeline.exists(key).strlen(key).execute()
        return size if exists else None

    def delete(self, key: str) -> bool:
        return bool(self.client.delete(key))

    def expire(self, older_than: float) -> int:
        return 0  # each key expires by itself, CHATTTS_FARM_AUDIO_TTL_S after its write


def from_settings(settings: Settings, redis_client: redis.Redis | None = None) -> AudioStore:
    """The store ``settings`` name; ``redis_client`` is the process's own, for the Redis store."""
    location = settings.audio_store_location
    if location == REDIS_STORE:
        return RedisStore(redis_client or redis.Redis.from_url(settings.redis_url), settings.audio_ttl_s)
    if location.startswith(S3_SCHEME):
        return S3Store.connect(location, settings.s3_endpoint_url)
    # file:/data/audio, file:///data/audio (a file URL) and file:var/audio (relative to here) alike.
    return FileStore(Path(unquote(urlsplit(location).path) or location.removeprefix(FILE_SCHEME)))


def fetch_audio(
    result: dict, *, redis_url: str | None = None, s3_endpoint_url: str | None = None, s3_client: Any = None
) -> bytes:
    """The audio of a finished job, from its ``chattts.synthesize`` result, whichever store holds it.

    ``audio_url`` names a file or an S3 object (read with ``s3_client``, or a boto3 client of
    ``s3_endpoint_url``, default ``CHATTTS_FARM_S3_ENDPOINT_URL``); a result without one has its audio
    in Redis under ``audio_key`` (``redis_url``, default ``CHATTTS_FARM_REDIS_URL``). Raises
    :class:`AudioExpired` when the audio is gone.
    """
    url = result.get("audio_url")
    if url is None:
        store: AudioStore = RedisStore(redis.Redis.from_url(redis_url or Settings.from_env().redis_url), ttl_s=0)
        key = result["audio_key"]
    elif url.startswith(S3_SCHEME):
        bucket, _, key = url.removeprefix(S3_SCHEME).partition("/")
        if s3_client is None:
            endpoint = Settings.from_env().s3_endpoint_url if s3_endpoint_url is None else s3_endpoint_url
            store = S3Store.connect(f"{S3_SCHEME}{bucket}", endpoint)
        else:
            store = S3Store(bucket, "", s3_client)
    elif url.startswith(FILE_SCHEME):
        try:
            return Path(unquote(urlsplit(url).path)).read_bytes()
        except FileNotFoundError:
            raise AudioExpired(f"job {result.get('job_id')}: no audio at {url} (any more)") from None
    else:
        raise ValueError(f"audio_url {url!r} is neither a file: nor an s3:// URL")
    audio = store.open(key)
    if audio is None:
        raise AudioExpired(f"job {result.get('job_id')}: no audio under {url or key} (any more)")
    with audio:
        return audio.read()
