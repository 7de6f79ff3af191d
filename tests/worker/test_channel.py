"""The channel between a worker's Celery side and its engine process: plain messages on a real socket pair."""

import threading

import numpy as np
import pytest

from chattts_farm.contract import EngineLost, InvalidRequest, SynthesisFailed
from worker.channel import Channel, error_fields, error_from


@pytest.fixture
def ends():
    ours, theirs_socket = Channel.pair()
    theirs = Channel.from_fd(theirs_socket.detach())
    yield ours, theirs
    ours.close()
    theirs.close()


def test_a_message_arrives_whole_with_its_bytes_and_numbers(ends):
    ours, theirs = ends
    pcm = np.linspace(-1, 1, 24_000, dtype=np.float32).tobytes()
    ours.send("audio", job="job-1", segment=2, pcm=pcm, level=np.float32(0.5), started_at=None)
    assert theirs.receive() == {
        "kind": "audio",
        "job": "job-1",
        "segment": 2,
        "pcm": pcm,
        "level": 0.5,
        "started_at": None,
    }


def test_messages_from_many_threads_arrive_whole_and_in_each_threads_order(ends):
    ours, theirs = ends
    senders = [
        threading.Thread(target=lambda name=name: [ours.send("status", sender=name, n=n) for n in range(200)])
        for name in range(4)
    ]
    for sender in senders:
        sender.start()
    received = [theirs.receive() for _ in range(800)]
    for sender in senders:
        sender.join()
    for name in range(4):
        assert [message["n"] for message in received if message["sender"] == name] == list(range(200))


def test_a_value_that_is_no_plain_value_is_refused_at_the_sender(ends):
    ours, _ = ends
    with pytest.raises(TypeError, match="cannot send a object"):
        ours.send("status", oops=object())


def test_the_other_side_gone_is_an_end_of_file_to_a_reader_and_an_os_error_to_a_writer(ends):
    ours, theirs = ends
    theirs.close()
    with pytest.raises(EOFError):
        ours.receive()
    with pytest.raises(OSError):
        ours.send("cancel", job="job-1")


def test_a_farm_error_comes_back_as_its_own_type_with_its_field():
    rebuilt = error_from(error_fields(InvalidRequest("voice", "is not a seed")))
    assert isinstance(rebuilt, InvalidRequest) and rebuilt.field == "voice" and str(rebuilt) == "voice: is not a seed"
    assert isinstance(error_from(error_fields(EngineLost("died twice"))), EngineLost)


def test_any_other_error_comes_back_as_synthesis_failed_naming_its_type():
    rebuilt = error_from(error_fields(RuntimeError("CUDA error: an illegal memory access")))
    assert type(rebuilt) is SynthesisFailed
    assert str(rebuilt) == "RuntimeError: CUDA error: an illegal memory access"
