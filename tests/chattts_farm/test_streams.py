"""A streaming job's Redis stream: what the worker appends is what a caller reads, in order, on a real Redis
(no worker here: the test writes the entries as the worker's publisher does)."""

import threading
import time
import uuid

import pytest
import redis

from chattts_farm import redis_keys, streams
from chattts_farm.contract import InvalidRequest, JobCancelled, JobTimeout, SynthesisFailed


@pytest.fixture
def client(redis_url):
    # A database no worker of the session reads.
    with redis.Redis.from_url(f"{redis_url.rsplit('/', 1)[0]}/11") as connection:
        yield connection


def job_id() -> str:
    return str(uuid.uuid4())


def write(client, job, entries, ttl_s=600, max_entries=4096):
    streams.append(client, job, entries, ttl_s=ttl_s, max_entries=max_entries)


def test_every_entry_reads_back_as_it_was_written(client):
    job = job_id()
    written = [
        streams.AudioChunk(0, 0, 24_000, b"\x01\x00\xff\x7f", run="a1"),
        streams.AudioChunk(1, 1, 24_000, b"", run="a1"),
        streams.StreamFailed.of(2, InvalidRequest("voice", "must be a seed"), run="a1"),
        streams.StreamEnd(3, {"duration_s": 1.5, "segments": 2}, run="a1"),
    ]
    write(client, job, written)
    assert [entry for _, entry in streams.read(client, job)] == written


def test_stream_audio_yields_the_chunks_in_order_then_keeps_the_summary(client):
    job = job_id()
    write(client, job, [streams.AudioChunk(seq, 0, 24_000, bytes([seq, 0])) for seq in range(3)])
    chunks = streams.stream_audio(job, client=client, timeout_s=5)
    heard = iter(chunks)
    before_first = time.time()
    assert next(heard).pcm == b"\x00\x00"
    # The chunk's stream id: when Redis appended it, by its clock (this host's).
    appended_ms = int(chunks.last_id.split(b"-")[0])
    assert before_first - 5 < appended_ms / 1000 <= time.time() + 0.01
    # More arrives while the caller listens, and the end closes the stream.
    later = threading.Timer(0.2, write, (client, job, [streams.StreamEnd(3, {"duration_s": 0.1})]))
    later.start()
    assert [chunk.seq for chunk in heard] == [1, 2]
    assert chunks.summary == {"duration_s": 0.1}
    later.join()  # it may still be setting the stream's expiry on the connection the fixture closes


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequest("text", "is empty"),
        JobCancelled("job x was revoked"),
        JobTimeout("job x ran past the soft time limit"),
        SynthesisFailed("synthesis failed"),
    ],
)
def test_an_error_entry_raises_the_jobs_own_typed_error(client, error):
    job = job_id()
    write(client, job, [streams.AudioChunk(0, 0, 24_000, b"\x00\x00"), streams.StreamFailed.of(1, error)])
    with pytest.raises(type(error)) as raised:
        list(streams.stream_audio(job, client=client, timeout_s=5))
    assert str(raised.value) == str(error)
    if isinstance(error, InvalidRequest):
        assert raised.value.field == "text"


def test_a_stream_restarted_by_a_new_run_interrupts_its_reader_and_a_new_reader_hears_the_new_run(client):
    job = job_id()
    write(client, job, [streams.AudioChunk(seq, 0, 24_000, b"\x01\x00", run="first") for seq in range(2)])
    heard = iter(streams.stream_audio(job, client=client, timeout_s=5))
    assert [next(heard).seq, next(heard).seq] == [0, 1]
    streams.restart(client, job)
    write(client, job, [streams.AudioChunk(0, 0, 24_000, b"\x02\x00", run="second")])
    with pytest.raises(streams.StreamInterrupted, match="restarted"):
        next(heard)
    write(client, job, [streams.StreamEnd(1, {"duration_s": 0.1}, run="second")])
    assert [chunk.pcm for chunk in streams.stream_audio(job, client=client, timeout_s=5)] == [b"\x02\x00"]


def test_a_reader_that_missed_entries_is_interrupted_rather_than_handed_a_gap(client):
    job = job_id()
    write(client, job, [streams.AudioChunk(seq, 0, 24_000, b"\x00\x00", run="r") for seq in (0, 2)])
    heard = iter(streams.stream_audio(job, client=client, timeout_s=5))
    next(heard)
    with pytest.raises(streams.StreamInterrupted):
        next(heard)


def test_a_stream_that_never_ends_times_out_instead_of_hanging(client):
    with pytest.raises(TimeoutError, match="no audio"):
        list(streams.stream_audio(job_id(), client=client, timeout_s=0.3, block_ms=100))


def test_a_stream_expires_and_is_trimmed_to_its_cap(client):
    job = job_id()
    write(
        client, job, [streams.AudioChunk(seq, 0, 24_000, b"\x00\x00") for seq in range(500)], ttl_s=60, max_entries=16
    )
    key = redis_keys.stream(job)
    assert 0 < client.ttl(key) <= 60
    assert client.xlen(key) < 500  # trimmed (approximately, as Redis trims whole nodes)
