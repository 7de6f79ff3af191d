"""Voice strings built the way ChatTTS writes speaker embeddings (float16 values, raw LZMA2, base16384
text), for the tests of every entry point that takes a voice. Torch-free."""

import functools
import lzma
import os

import pybase16384

# ChatTTS's own preset (Speaker._encode) and the farm's (worker.engine_process.voices).
CHATTTS_PRESET = 9 | lzma.PRESET_EXTREME
FARM_PRESET = 1


def compress(raw: bytes, preset: int = CHATTTS_PRESET) -> bytes:
    """Raw LZMA2 data, as inside an embedding string."""
    return lzma.compress(raw, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": preset}])


def embedding_text(raw: bytes, preset: int = CHATTTS_PRESET) -> str:
    """Bytes written as ChatTTS writes an embedding."""
    return pybase16384.encode_to_string(compress(raw, preset))


@functools.cache
def voice_bomb(mebibytes: int) -> str:
    """An embedding string that expands to ``mebibytes`` MiB of zeros: a few thousand characters at most
    (the probe's 400 MiB one took 105 KB). Zeros compress alike at every preset: the fast one builds it."""
    return embedding_text(b"\0" * (mebibytes << 20), preset=0)


def incompressible_embedding(dimensions: int, preset: int) -> str:
    """The longest string an embedding of this many float16 values can be: random bytes do not compress."""
    return embedding_text(os.urandom(2 * dimensions), preset)
