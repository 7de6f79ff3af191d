"""A real worker process writes each job's audio to the store it is given, names it in the result, and
fetch_audio reads it back: S3 (moto's stand-alone server, see tests/conftest.py) and Redis. (The
directory store, the default, is what every other worker test writes to.)"""

import uuid

import pytest

from chattts_farm.audio_store import fetch_audio
from chattts_farm.contract import TASK_NAME
from tests.support import S3_BUCKET, Workers
from worker.audio import decode

# Databases of the session's Redis that no other worker reads: these workers have queues of their own.
S3_DATABASE, REDIS_STORE_DATABASE = 13, 14


def speak(workers: Workers) -> dict:
    return workers.client.send_task(TASK_NAME, kwargs={"text": "Kept in the store.", "format": "ogg"}).get(timeout=120)


def assert_is_its_audio(audio: bytes, result: dict) -> None:
    samples, rate = decode(audio)
    assert rate == result["sample_rate"] and abs(len(samples) / rate - result["duration_s"]) < 0.05


@pytest.fixture
def own_workers(redis_url, data_dir, tmp_path):
    started = []

    def start(database: int, **settings: str) -> Workers:
        url = f"{redis_url.rsplit('/', 1)[0]}/{database}"
        started.append(Workers.start(url, data_dir, tmp_path / f"workers-{database}.log", count=1, **settings))
        return started[-1]

    yield start
    for workers in started:
        workers.stop()


def test_a_worker_with_an_s3_store_puts_the_audio_in_the_bucket(own_workers, s3_endpoint):
    prefix = f"farm-{uuid.uuid4().hex[:8]}"
    workers = own_workers(
        S3_DATABASE,
        CHATTTS_FARM_AUDIO_STORE=f"s3://{S3_BUCKET}/{prefix}",
        CHATTTS_FARM_S3_ENDPOINT_URL=s3_endpoint,
    )
    result = speak(workers)
    assert result["audio_key"] == f"{prefix}/{result['job_id']}.ogg"
    assert result["audio_url"] == f"s3://{S3_BUCKET}/{prefix}/{result['job_id']}.ogg"
    assert_is_its_audio(fetch_audio(result, s3_endpoint_url=s3_endpoint), result)


def test_a_worker_with_the_redis_store_keeps_the_audio_in_redis_as_before(own_workers, redis_url):
    workers = own_workers(REDIS_STORE_DATABASE, CHATTTS_FARM_AUDIO_STORE="redis", CHATTTS_FARM_AUDIO_TTL_S="600")
    result = speak(workers)
    assert result["audio_key"] == f"chattts:audio:{result['job_id']}" and result["audio_url"] is None
    assert 590 < workers.client.backend.client.ttl(result["audio_key"]) <= 600
    assert_is_its_audio(fetch_audio(result, redis_url=workers.redis_url), result)
