"""The audio stores: a directory, Redis and S3, each on a real server of its kind.

S3 is moto's stand-alone server (``moto_server``, the ``s3_endpoint`` fixture of tests/conftest.py),
started by the tests on a free port: no real S3 server installs from the package registries this
project's CI reaches, and moto's is the most faithful one that does (it speaks S3's REST protocol over
HTTP, with ranges, conditional reads, listing and multi-object deletes, to an unmodified boto3).
"""

import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from chattts_farm.audio_store import AudioExpired, FileStore, RedisStore, S3Store, fetch_audio, from_settings
from chattts_farm.settings import Settings
from tests.support import S3_BUCKET as BUCKET

# A few pieces' worth, not a whole number of them: ranges cross and end inside pieces.
AUDIO = bytes(range(256)) * 2500 + b"tail"


@pytest.fixture
def redis_client(redis_url):
    # A database no worker of the session reads.
    with redis.Redis.from_url(f"{redis_url.rsplit('/', 1)[0]}/12") as connection:
        yield connection


def s3_store(endpoint):
    # A prefix of its own per test: tests share the bucket.
    location = f"s3://{BUCKET}/jobs-{uuid.uuid4().hex[:8]}"
    return from_settings(Settings.from_env({}, audio_store=location, s3_endpoint_url=endpoint))


@pytest.fixture(params=["file", "redis", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "audio")
    if request.param == "redis":
        return RedisStore(request.getfixturevalue("redis_client"), ttl_s=3600)
    return s3_store(request.getfixturevalue("s3_endpoint"))


def job_id() -> str:
    return str(uuid.uuid4())


def test_written_audio_reads_back_whole_and_in_any_range(store):
    key = store.key(job_id(), "wav")
    store.write(key, AUDIO)
    assert store.size(key) == len(AUDIO)
    with store.open(key) as stored:
        assert stored.size == len(AUDIO)
        assert stored.read() == AUDIO
        for start, stop in [(0, 1), (10, 300_000), (len(AUDIO) - 4, len(AUDIO)), (5, 5), (100, 10**9)]:
            assert b"".join(stored.chunks(start, stop)) == AUDIO[start:stop], (start, stop)


def test_a_rewrite_replaces_the_audio_and_its_entity_tag(store):
    key = store.key(job_id(), "mp3")
    store.write(key, b"first run")
    with store.open(key) as first:
        tag = first.etag
    store.write(key, b"the re-run's audio")
    with store.open(key) as second:
        assert second.read() == b"the re-run's audio"
        assert tag is None or second.etag != tag


def test_missing_audio_is_none_and_deleting_it_twice_is_harmless(store):
    key = store.key(job_id(), "wav")
    assert store.open(key) is None and store.size(key) is None
    store.write(key, AUDIO)
    assert store.delete(key) is True
    assert store.open(key) is None and store.delete(key) is False


def test_fetch_audio_reads_a_result_from_whichever_store_holds_it(store, redis_url):
    job = job_id()
    key = store.key(job, "flac")
    store.write(key, AUDIO)
    result = {"job_id": job, "audio_key": key, "audio_url": store.url(key)}
    redis_url = f"{redis_url.rsplit('/', 1)[0]}/12"
    endpoint = store.client.meta.endpoint_url if isinstance(store, S3Store) else None
    assert fetch_audio(result, redis_url=redis_url, s3_endpoint_url=endpoint) == AUDIO
    store.delete(key)
    with pytest.raises(AudioExpired, match=job):
        fetch_audio(result, redis_url=redis_url, s3_endpoint_url=endpoint)


def test_expire_deletes_what_was_written_before_the_cutoff_and_keeps_the_rest(tmp_path, s3_endpoint):
    for store in (FileStore(tmp_path), s3_store(s3_endpoint)):
        old, new = store.key(job_id(), "wav"), store.key(job_id(), "wav")
        store.write(old, AUDIO)
        # S3 lists write times to the second: a second apart on either side of the cutoff.
        time.sleep(1.1)
        cutoff = time.time()
        time.sleep(1.1)
        store.write(new, AUDIO)
        assert store.expire(cutoff) == 1
        assert store.size(old) is None and store.size(new) == len(AUDIO)


def test_redis_audio_expires_by_itself(redis_client):
    store = RedisStore(redis_client, ttl_s=600)
    key = store.key(job_id(), "wav")
    store.write(key, AUDIO)
    assert 590 < redis_client.ttl(key) <= 600
    assert store.expire(time.time() + 3600) == 0 and store.size(key) == len(AUDIO)


def test_a_file_reader_sees_the_old_audio_or_the_new_never_half_of_either(tmp_path):
    store = FileStore(tmp_path)
    key = store.key(job_id(), "wav")
    versions = [bytes([n]) * (1_000_000 + n * 1000) for n in range(4)]
    store.write(key, versions[0])
    seen, done = set(), threading.Event()

    def rewrite():
        for round_ in range(40):
            store.write(key, versions[round_ % len(versions)])
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    while not done.is_set():
        with store.open(key) as stored:
            data = stored.read()
        assert data in versions
        seen.add(data[0])
    writer.join()
    assert len(seen) > 1, "the reader never overlapped a rewrite"
    assert [path.name for path in (tmp_path / key).parent.iterdir()] == [Path(key).name]


def test_an_open_file_is_read_to_its_end_though_gc_deletes_it_meanwhile(tmp_path):
    store = FileStore(tmp_path)
    key = store.key(job_id(), "wav")
    store.write(key, AUDIO)
    with store.open(key) as stored:
        assert store.expire(time.time() + 1) == 1
        assert stored.read() == AUDIO


def test_a_dead_writers_temporary_file_expires_but_is_not_counted_as_audio(tmp_path):
    store = FileStore(tmp_path)
    key = store.key(job_id(), "wav")
    store.write(key, AUDIO)
    leftover = (tmp_path / key).parent / f".{Path(key).name}.x1y2.partial"
    leftover.write_bytes(AUDIO[:100])
    assert store.expire(time.time() + 1) == 1
    assert not leftover.exists()


@pytest.mark.parametrize("hostile", ["../../etc/passwd", "/abs/path", "a/b", ".hidden", "x" * 500, "naïve"])
def test_a_job_id_that_is_not_a_plain_name_is_stored_under_its_hash_inside_the_store(tmp_path, hostile):
    store = FileStore(tmp_path / "audio")
    key = store.key(hostile, "wav")
    store.write(key, AUDIO)
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(written) == 1 and written[0].parent.parent == tmp_path / "audio"
    assert store.key(hostile, "wav") == key != store.key(hostile + "!", "wav")


def test_a_key_outside_the_store_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a key"):
        FileStore(tmp_path / "audio").open("../../secret")


def test_the_store_setting_names_a_directory_a_bucket_or_redis(tmp_path):
    default = Settings.from_env({"CHATTTS_FARM_DATA_DIR": str(tmp_path)})
    assert isinstance(from_settings(default), FileStore)
    assert from_settings(default).directory == (tmp_path / "audio").resolve()
    as_url = Settings.from_env({"CHATTTS_FARM_AUDIO_STORE": f"file://{tmp_path}/shared"})
    assert from_settings(as_url).directory == (tmp_path / "shared").resolve()
    assert isinstance(from_settings(Settings.from_env({"CHATTTS_FARM_AUDIO_STORE": "redis"})), RedisStore)
    s3 = from_settings(Settings.from_env({"CHATTTS_FARM_AUDIO_STORE": "s3://bucket/some/prefix/"}))
    assert isinstance(s3, S3Store) and s3.key("job", "ogg") == "some/prefix/job.ogg"
    assert s3.url(s3.key("job", "ogg")) == "s3://bucket/some/prefix/job.ogg"


@pytest.mark.parametrize("value", ["file:", "s3://", "memcached", "redis://localhost"])
def test_an_unusable_store_setting_is_refused_naming_the_variable(value):
    from chattts_farm.settings import SettingsError

    with pytest.raises(SettingsError, match="CHATTTS_FARM_AUDIO_STORE"):
        Settings.from_env({"CHATTTS_FARM_AUDIO_STORE": value})


def test_the_file_store_writes_files_others_may_read(tmp_path):
    store = FileStore(tmp_path)
    key = store.key(job_id(), "wav")
    store.write(key, AUDIO)
    assert os.stat(tmp_path / key).st_mode & 0o777 == 0o644
