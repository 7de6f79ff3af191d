"""The channel between a worker's Celery side and its engine process: plain messages on a real socket pair."""

import os
import threading

import numpy as np
import pytest

from chattts_farm.contract import EngineLost, InvalidRequest, SynthesisFailed
from worker.channel import Channel, error_fields, error_from, float32_bytes


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


def test_samples_travel_as_float32_bytes_in_frames_of_their_own_read_where_they_lie(ends):
    ours, theirs = ends
    samples = np.linspace(-1, 1, 24_000, dtype=np.float32)
    other = np.linspace(-1, 1, 5, dtype=np.float64)[::2]  # another dtype, not in one block: converted
    held = float32_bytes(samples)
    assert np.shares_memory(np.frombuffer(held.data, dtype=np.float32), samples)  # no copy before the socket
    ours.send(
        "finished",
        result={"pieces": [held, float32_bytes(other)], "summary": {"duration_s": 1.0}},
        empty=float32_bytes(np.zeros(0, dtype=np.float32)),
        level=np.float32(0.5),
    )
    ours.send("status", n=1)
    assert theirs.receive() == {
        "kind": "finished",
        "result": {"pieces": [samples.tobytes(), other.astype(np.float32).tobytes()], "summary": {"duration_s": 1.0}},
        "empty": b"",
        "level": 0.5,
    }
    assert theirs.receive() == {"kind": "status", "n": 1}


def test_messages_from_many_threads_arrive_whole_and_in_each_threads_order(ends):
    ours, theirs = ends
    senders = [
        threading.Thread(
            target=lambda name=name: [
                ours.send("audio", sender=name, n=n, pcm=float32_bytes(np.full(n * 100, name, dtype=np.float32)))
                for n in range(200)
            ]
        )
        for name in range(4)
    ]
    for sender in senders:
        sender.start()
    received = [theirs.receive() for _ in range(800)]
    for sender in senders:
        sender.join()
    for name in range(4):
        assert [message["n"] for message in received if message["sender"] == name] == list(range(200))
    # Each message's frames follow it, whatever the other threads send meanwhile.
    for message in received:
        assert message["pcm"] == np.full(message["n"] * 100, message["sender"], dtype=np.float32).tobytes()


def test_messages_sent_together_arrive_as_if_sent_one_by_one(ends):
    ours, theirs = ends
    messages = [
        ("audio", {"job": f"job-{n}", "segment": n, "pcm": float32_bytes(np.full(n * 3_000, n, dtype=np.float32))})
        for n in range(6)  # frames of 0 bytes to 60 kB, either side of multiprocessing's 16 kB split
    ] + [("finished", {"job": "job-5", "result": {"pieces": [float32_bytes(np.ones(7, dtype=np.float32))]}})]
    ours.send_all(messages)
    ours.send("status", n=1)
    for kind, fields in messages[:-1]:
        assert theirs.receive() == {"kind": kind, **fields, "pcm": bytes(fields["pcm"].data)}
    assert theirs.receive() == {
        "kind": "finished",
        "job": "job-5",
        "result": {"pieces": [np.ones(7, np.float32).tobytes()]},
    }
    assert theirs.receive() == {"kind": "status", "n": 1}


def test_a_write_that_takes_only_part_is_gone_on_with_from_where_it_stopped(ends, monkeypatch):
    # A socket may take part of a write (a signal, a full buffer): here every write takes at most 1,000 bytes.
    ours, theirs = ends
    write = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, buffers: write(fd, [bytes(buffers[0][:1000])]))
    rows = [np.full(700 * n, n, dtype=np.float32) for n in range(5)]
    ours.send_all([("audio", {"n": n, "pcm": float32_bytes(row)}) for n, row in enumerate(rows)])
    received = [theirs.receive() for _ in rows]
    assert [message["pcm"] for message in received] == [row.tobytes() for row in rows]


def test_more_than_the_socket_holds_goes_out_whole_as_the_reader_takes_it(ends):
    ours, theirs = ends
    rows = [np.full(2**20 + n, n, dtype=np.float32) for n in range(12)]  # 48 MB, socket buffers of 8 MB
    messages = [("audio", {"n": n, "pcm": float32_bytes(row)}) for n, row in enumerate(rows)]
    sender = threading.Thread(target=ours.send_all, args=(messages,))
    sender.start()
    received = [theirs.receive() for _ in rows]
    sender.join()
    assert [message["n"] for message in received] == list(range(12))
    assert all(message["pcm"] == row.tobytes() for message, row in zip(received, rows, strict=True))


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
