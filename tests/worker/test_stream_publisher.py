"""The stream publisher (real Redis): a job's audio in its stream in order, whatever the entries it takes."""

import numpy as np
import redis

from chattts_farm.streams import stream_audio
from worker.audio import pcm16
from worker.stream_publisher import StreamPublisher, merged


def test_pieces_of_one_segment_that_waited_together_are_one_piece_and_nothing_else_moves():
    first, second, third = (np.full(n, n / 10, dtype=np.float32) for n in (2, 3, 4))
    end = {"duration_s": 1.0}
    items = merged([(0, first), (0, second), (1, third), end])
    assert [type(item) for item in items] == [tuple, tuple, dict]
    assert items[0][0] == 0 and np.array_equal(items[0][1], np.concatenate([first, second]))
    assert items[1][0] == 1 and items[1][1] is third  # a piece alone is not copied
    assert items[2] is end


def test_a_jobs_stream_holds_its_samples_in_order_by_segment_whatever_its_entries(redis_url):
    publisher = StreamPublisher(redis.Redis.from_url(redis_url), ttl_s=60, max_entries=4096)
    generator = np.random.default_rng(7)
    pieces = [(segment, generator.uniform(-1.2, 1.2, 500).astype(np.float32)) for segment in (0, 0, 0, 1, 1, 2)]
    publisher.begin("publisher-1")
    for segment, samples in pieces:
        publisher.audio("publisher-1", segment, samples)
    publisher.end("publisher-1", {"duration_s": 0.125})

    chunks = stream_audio("publisher-1", redis_url=redis_url, timeout_s=10)
    heard = list(chunks)
    assert chunks.summary == {"duration_s": 0.125}
    assert b"".join(chunk.pcm for chunk in heard) == pcm16(np.concatenate([samples for _, samples in pieces]))
    for segment in (0, 1, 2):
        said = pcm16(np.concatenate([samples for of, samples in pieces if of == segment]))
        assert b"".join(chunk.pcm for chunk in heard if chunk.segment == segment) == said
    assert [chunk.segment for chunk in heard] == sorted(chunk.segment for chunk in heard)
