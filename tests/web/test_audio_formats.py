"""The web's encoders: 16-bit samples in, each format's bytes out as soon as its encoder gives them up."""

import io
import struct
import tracemalloc

import numpy as np
import pytest
import soundfile

from chattts_farm.audio_store import CHUNK_BYTES
from tests.web.streams import SAMPLE_RATE, pieces_of, samples
from web.audio_formats import FORMATS, encoder, pcm_of_pieces, wav_header

PCM = samples(2.0, seed=7)
# A long job's samples (a minute): what a reader must never hold whole in memory.
LONG_PCM = samples(60.0, seed=8)
SECOND_BYTES = 2 * SAMPLE_RATE
# What a reader may hold at once: a piece or two of what the store hands out and a second of samples,
# a quarter of LONG_PCM's 2.9 MB.
READER_BYTES = 3 * CHUNK_BYTES


def encode_in_pieces(audio_format: str, count: int = 10) -> list[bytes]:
    """What the encoder gives up after each of ``count`` pieces of PCM, and last what finishing gives."""
    encoding = encoder(audio_format, SAMPLE_RATE)
    given = [encoding.encode(piece) for piece in pieces_of(PCM, count)]
    given.append(b"".join(encoding.finish()))
    encoding.close()
    return given


@pytest.mark.parametrize("audio_format", ["pcm", "wav", "mp3", "ogg"])
def test_streamable_formats_give_up_bytes_before_the_audio_ends(audio_format):
    given = encode_in_pieces(audio_format)
    assert given[0] and sum(map(len, given[:-1])) > len(b"".join(given)) / 2


@pytest.mark.parametrize("audio_format", [name for name in FORMATS if name != "pcm"])
def test_what_is_given_up_decodes_to_the_samples(audio_format):
    decoded, rate = soundfile.read(io.BytesIO(b"".join(encode_in_pieces(audio_format))), dtype="int16")
    assert rate == SAMPLE_RATE
    if audio_format in ("wav", "flac"):
        assert decoded.tobytes() == PCM
    else:  # lossy: an encoder's padding of a frame or two
        assert abs(len(decoded) - len(PCM) // 2) < 0.1 * SAMPLE_RATE


def test_pcm_is_the_samples_as_they_come():
    assert encode_in_pieces("pcm", count=3) == [*pieces_of(PCM, 3), b""]


def test_wav_is_one_header_of_unknown_sizes():
    header = wav_header(16_000)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[36:40] == b"data"
    assert struct.unpack("<I", header[4:8])[0] == struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    assert b"".join(encode_in_pieces("wav")) == wav_header(SAMPLE_RATE) + PCM


def test_mp3_is_sent_at_a_constant_bitrate():
    data = b"".join(encode_in_pieces("mp3"))
    kilobits_a_second = len(data) * 8 / (len(PCM) / 2 / SAMPLE_RATE) / 1000
    assert 60 < kilobits_a_second < 70


@pytest.mark.parametrize("piece_bytes", [1, 1000, 10**7])
def test_a_stored_wav_is_read_back_as_samples_a_piece_at_a_time(piece_bytes):
    stored = io.BytesIO()
    soundfile.write(stored, np.frombuffer(PCM, "<i2"), SAMPLE_RATE, format="WAV")
    data = stored.getvalue()
    pieces = (data[start : start + piece_bytes] for start in range(0, len(data), piece_bytes))
    pcm, rate = pcm_of_pieces("wav", pieces)
    assert rate == SAMPLE_RATE and b"".join(pcm) == PCM


def stored_as(stored_format: str, pcm: bytes) -> bytes:
    stored = io.BytesIO()
    soundfile.write(stored, np.frombuffer(pcm, "<i2"), SAMPLE_RATE, format=stored_format.upper())
    return stored.getvalue()


def store_pieces(data: bytes):
    """``data`` as the audio store hands it out: a piece at a time."""
    return (data[start : start + CHUNK_BYTES] for start in range(0, len(data), CHUNK_BYTES))


@pytest.mark.parametrize("stored_format", ["wav", "flac", "ogg", "mp3"])
def test_stored_audio_of_any_worker_format_is_read_back_as_samples(stored_format):
    pcm, rate = pcm_of_pieces(stored_format, store_pieces(stored_as(stored_format, PCM)))
    pcm = b"".join(pcm)
    assert rate == SAMPLE_RATE and abs(len(pcm) - len(PCM)) < 0.1 * SAMPLE_RATE * 2
    if stored_format in ("wav", "flac"):
        assert pcm == PCM


def peak_bytes_while(work) -> int:
    """The most memory Python (numpy's and cffi's buffers too) held at once for what ``work()`` allocated."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("stored_format", ["flac", "ogg"])
def test_long_stored_audio_is_decoded_a_second_at_a_time_never_whole_in_memory(stored_format):
    stored = stored_as(stored_format, LONG_PCM)
    sizes = []

    def decode():
        pcm, _ = pcm_of_pieces(stored_format, store_pieces(stored))
        sizes.extend(len(piece) for piece in pcm)

    peak = peak_bytes_while(decode)
    assert max(sizes) <= SECOND_BYTES and abs(sum(sizes) - len(LONG_PCM)) < 0.1 * SECOND_BYTES
    assert peak < READER_BYTES, f"decoding {len(LONG_PCM)} bytes of samples held {peak} bytes at once"


def test_long_flac_is_encoded_into_a_file_and_handed_out_in_bounded_pieces(tmp_path):
    sent = tmp_path / "sent.flac"
    sizes = []

    def encode():
        encoding = encoder("flac", SAMPLE_RATE)
        with sent.open("wb") as out:
            for start in range(0, len(LONG_PCM), SECOND_BYTES):  # a second at a time, as a stream's chunks come
                piece = LONG_PCM[start : start + SECOND_BYTES]
                out.write(encoding.encode(piece))
            for piece in encoding.finish():
                sizes.append(len(piece))
                out.write(piece)
        encoding.close()

    peak = peak_bytes_while(encode)
    assert len(sizes) > 1 and max(sizes) <= CHUNK_BYTES
    assert peak < READER_BYTES, f"encoding {len(LONG_PCM)} bytes of samples held {peak} bytes at once"
    decoded, rate = soundfile.read(sent, dtype="int16")
    assert rate == SAMPLE_RATE and decoded.tobytes() == LONG_PCM
