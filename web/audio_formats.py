"""The formats the web sends audio in, encoded chunk by chunk as the samples come (libsndfile, through
``soundfile``, as the workers encode): 16-bit mono PCM in, each format's bytes out as soon as its encoder
gives them up, so a client can play the audio while the job still runs.

Encoding and decoding are CPU work, and the web serves under gevent: one long call on its event loop
would hold up every other request of the process. So every libsndfile call runs on a native thread
(:func:`web.off_loop.off_loop`), and no call is handed more than about a second of audio: compressed
stored audio is spooled to a temporary file and decoded from there a second at a time, and FLAC is
encoded into a temporary file, so a reader's memory does not grow with its audio."""

from __future__ import annotations

import functools
import io
import struct
import tempfile
import wave
from collections.abc import Iterable, Iterator
from typing import IO, Any

import soundfile

from chattts_farm.audio_store import CHUNK_BYTES
from chattts_farm.contract import MIME_TYPES as JOB_MIME_TYPES
from web.off_loop import off_loop

# Raw samples: 16-bit little-endian mono, at the rate the answer's X-Sample-Rate header says.
MIME_TYPES = {**JOB_MIME_TYPES, "pcm": "audio/pcm"}
FORMATS = ("pcm", "wav", "mp3", "ogg", "flac")
assert set(FORMATS) == set(MIME_TYPES), "every format has a MIME type"
# (libsndfile container, codec, settings) of what libsndfile encodes as it comes. MP3 at a constant
# 64 kb/s: without the header a file gets once it is whole, a decoder can tell a constant bitrate stream's
# length from its size, and 64 kb/s carries 24 kHz mono speech well. Ogg carries Opus, sent a page
# (about a second) at a time.
_STREAMED_CODECS = {
    "mp3": ("MP3", "MPEG_LAYER_III", {"bitrate_mode": "CONSTANT", "compression_level": 0.6}),
    "ogg": ("OGG", "OPUS", {}),
}
# A WAV file's sizes are unknown while it streams: the largest ones, as streaming WAV servers write them.
_UNKNOWN_SIZE = 0xFFFFFFFF
BYTES_PER_SAMPLE = 2


class PcmEncoder:
    """Raw samples, as they come."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def finish(self) -> Iterable[bytes]:
        """What is left to send once the last samples are in, a piece at a time."""
        return ()

    def close(self) -> None:
        """Let go of the encoder, finished or not (a client that hung up)."""


class WavEncoder(PcmEncoder):
    """One WAV header with the sizes unknown, then raw samples."""

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate)
        self.header: bytes | None = wav_header(sample_rate)

    def encode(self, pcm: bytes) -> bytes:
        header, self.header = self.header or b"", None
        return header + pcm


class _SndfileEncoder(PcmEncoder):
    """A libsndfile encoder writing into ``sink``, every call off the event loop."""

    def __init__(self, sample_rate: int, sink: IO[bytes], container: str, codec: str, **settings: Any):
        super().__init__(sample_rate)
        self.sink = sink
        self.file = off_loop(
            soundfile.SoundFile,
            sink,
            "w",
            samplerate=sample_rate,
            channels=1,
            format=container,
            subtype=codec,
            **settings,
        )

    def encode(self, pcm: bytes) -> bytes:
        off_loop(self.file.buffer_write, pcm, dtype="int16")
        return b""

    def close(self) -> None:
        off_loop(self.file.close)


class StreamedEncoder(_SndfileEncoder):
    """MP3 or Ogg Opus, handed on as libsndfile writes it: a forward-only sink, drained after every write."""

    def __init__(self, sample_rate: int, audio_format: str):
        container, codec, settings = _STREAMED_CODECS[audio_format]
        super().__init__(sample_rate, _ForwardOnly(), container, codec, **settings)

    def encode(self, pcm: bytes) -> bytes:
        super().encode(pcm)
        return self.sink.take()

    def finish(self) -> Iterable[bytes]:
        self.close()
        return (self.sink.take(),)


class FlacEncoder(_SndfileEncoder):
    """FLAC, sent once the last samples are in: a FLAC stream of unknown length is valid, but libsndfile
    (and so the farm's own tools) cannot read one back. Encoded as the samples come into a temporary
    file, then sent from it a piece at a time: on disk, not in memory, until it is whole."""

    def __init__(self, sample_rate: int):
        # Closed with the encoder.
        super().__init__(sample_rate, tempfile.TemporaryFile(), "FLAC", "PCM_16")  # noqa: SIM115

    def finish(self) -> Iterator[bytes]:
        off_loop(self.file.close)  # libsndfile writes the stream's header last
        self.sink.seek(0)
        return iter(functools.partial(self.sink.read, CHUNK_BYTES), b"")

    def close(self) -> None:
        super().close()
        self.sink.close()


class _ForwardOnly(io.RawIOBase):
    """A file for libsndfile that hands on what is written to it, once. On closing, LAME goes back to the
    start to fill in its Info frame (the length and the encoder's delay, for decoders): a stream cannot
    take back what it has sent, so that write is dropped and the frame stays as LAME began it, silent, as
    in any MP3 stream."""

    def __init__(self):
        self.pending = bytearray()
        self.sent = 0  # bytes handed on before ``pending``
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        skipped = min(len(data), max(0, self.sent - self.position))  # what falls on bytes already sent
        start = self.position + skipped - self.sent
        self.pending[start : start + len(data) - skipped] = data[skipped:]
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.sent + len(self.pending)}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def take(self) -> bytes:
        """What was written since the last take."""
        taken = bytes(self.pending)
        self.sent += len(taken)
        self.pending.clear()
        return taken


def encoder(audio_format: str, sample_rate: int) -> PcmEncoder:
    """A fresh encoder of 16-bit mono samples at ``sample_rate`` into ``audio_format`` (one of FORMATS)."""
    if audio_format == "pcm":
        return PcmEncoder(sample_rate)
    if audio_format == "wav":
        return WavEncoder(sample_rate)
    if audio_format == "flac":
        return FlacEncoder(sample_rate)
    return StreamedEncoder(sample_rate, audio_format)


def wav_header(sample_rate: int) -> bytes:
    """The 44-byte header of a 16-bit mono WAV file whose length is unknown."""
    byte_rate = sample_rate * BYTES_PER_SAMPLE
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, BYTES_PER_SAMPLE, 8 * BYTES_PER_SAMPLE)
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


def pcm_of_pieces(audio_format: str, pieces: Iterator[bytes]) -> tuple[Iterator[bytes], int]:
    """The 16-bit mono samples of stored audio (any format a worker writes), a second at a time, and
    their rate. A WAV (16-bit mono, as workers write it) is read as its pieces come; a compressed
    format, which libsndfile reads only from a file it can seek in, is first spooled to a temporary
    file. Neither is ever whole in memory."""
    if audio_format != "wav":
        return _decoded(pieces)
    # Read on by the generator below; closing it would close nothing but the pieces' iterator.
    reader = wave.open(io.BufferedReader(_PiecesReader(pieces)))  # noqa: SIM115
    if (reader.getsampwidth(), reader.getnchannels()) != (BYTES_PER_SAMPLE, 1):
        raise ValueError("the stored WAV is not 16-bit mono, as workers write it")
    return _frames(reader), reader.getframerate()


def _decoded(pieces: Iterator[bytes]) -> tuple[Iterator[bytes], int]:
    # Closed by the generator, or here when it is not made.
    spool = tempfile.TemporaryFile()  # noqa: SIM115
    decoder = None
    try:
        for piece in pieces:
            spool.write(piece)
        spool.seek(0)
        decoder = off_loop(soundfile.SoundFile, spool)
        if decoder.channels != 1:
            raise ValueError("the stored audio is not mono, as workers write it")
    except BaseException:
        if decoder is not None:
            off_loop(decoder.close)
        spool.close()
        raise
    return _blocks(decoder, spool), decoder.samplerate


def _blocks(decoder: soundfile.SoundFile, spool: IO[bytes]) -> Iterator[bytes]:
    try:
        while block := off_loop(_read_second, decoder):
            yield block
    finally:
        off_loop(decoder.close)
        spool.close()


def _read_second(decoder: soundfile.SoundFile) -> bytes:
    return bytes(decoder.buffer_read(decoder.samplerate, dtype="int16"))


def _frames(reader: wave.Wave_read) -> Iterator[bytes]:
    while frames := reader.readframes(reader.getframerate()):  # a second at a time
        yield frames


class _PiecesReader(io.RawIOBase):
    """A file to read from, over an iterator of byte pieces (no seeking)."""

    def __init__(self, pieces: Iterator[bytes]):
        self.pieces = pieces
        self.left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.left:
            piece = next(self.pieces, None)
            if piece is None:
                return 0
            self.left = memoryview(piece)
        size = min(len(buffer), len(self.left))
        buffer[:size] = self.left[:size]
        self.left = self.left[size:]
        return size
