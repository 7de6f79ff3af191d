"""Voices: an integer seed, a ChatTTS speaker-embedding string or a blend of them, resolved to an embedding;
or a reference clip's speaker sample, made from the clip and decoded into the codes its prompt carries.

ChatTTS's ``sample_random_speaker`` draws from the global RNG on the model's device, so one seed gives
different voices on the CPU and on CUDA. Here a seed is drawn on the CPU from a generator seeded with
it: "seed 42" is one voice on every device and in every run.

ChatTTS scales every speaker embedding to unit length before it enters the GPT (``Speaker.apply``; the
engine's ``_with_speakers`` does the same), so only an embedding's direction is the voice. A blend is
mixed in that space: each part's embedding scaled to unit length, then their weighted mean (weights
divided by their sum), written as an embedding string of its own, which the engine scales to unit
length in turn. A blend is one embedding string, so a blend kept in the catalog (that string) and the
same blend given again speak alike.

A voice from a reference clip is ChatTTS's speaker sample of it (``Chat.sample_audio_speaker``: the DVAE
encoder's codes of the clip's 24 kHz mel spectrogram, written as ``Speaker.encode_prompt`` writes them)
with the clip's words. It has no embedding: ChatTTS puts its codes after the text of the prompt instead
(see worker.engine.segment), so it never mixes into a blend.
"""

from __future__ import annotations

import functools
import lzma
import weakref
from dataclasses import dataclass

import numpy as np
import pybase16384
import torch
import torch.nn.functional as F
from ChatTTS.model.speaker import Speaker

from chattts_farm.contract import MAX_SAMPLE_CODES, Blend, InvalidRequest, SpeakerSample, Voice

# ChatTTS compresses embeddings with LZMA2 preset 9e: 40 ms a voice, mostly setting up a 64 MiB
# dictionary for 1.5 KB of data. Preset 1 gives the same size in under 1 ms, and ChatTTS's own
# decoder (preset 9e, a larger dictionary) reads it unchanged.
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 1}]
# LZMA's smallest dictionary. Only the dictionary size of a raw LZMA2 filter matters to a decoder, and
# data never refers further back than its own length: one the size of the largest output allowed
# decodes an embedding exactly as ChatTTS's preset-9e dictionary (64 MiB) does, without allocating it.
_SMALLEST_DICTIONARY = 4096


@functools.lru_cache(maxsize=4096)
def _embedding_for_seed(seed: int, std: tuple[float, ...], mean: tuple[float, ...]) -> str:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(len(std), generator=generator, dtype=torch.float32)
    return _embedding_string(noise * torch.tensor(std) + torch.tensor(mean))


def _embedding_string(embedding: torch.Tensor) -> str:
    """An embedding as ChatTTS writes one: float16 values, LZMA2-compressed, in base16384."""
    half = embedding.to(torch.float16).numpy().tobytes()
    return pybase16384.encode_to_string(lzma.compress(half, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


def embedding_for_seed(speaker: Speaker, seed: int) -> str:
    """The speaker-embedding string of the voice a seed names (the speaker statistics scale it)."""
    return _embedding_for_seed(seed, *_host_statistics(speaker))


# Each model's speaker statistics, read from its device once: a copy from the GPU waits for all the
# work queued there, and every request named by a seed needs them (on an H200 at full load, each
# request added waited for the decode steps in flight, and the GPU then idled while the host went on).
_statistics: weakref.WeakKeyDictionary[Speaker, tuple[tuple[float, ...], tuple[float, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _host_statistics(speaker: Speaker) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if speaker not in _statistics:
        _statistics[speaker] = (tuple(speaker.std.float().cpu().tolist()), tuple(speaker.mean.float().cpu().tolist()))
    return _statistics[speaker]


def embedding_tensor(speaker: Speaker, embedding: str) -> torch.Tensor:
    """Decode an embedding string for this model; :class:`InvalidRequest` names ``voice`` when it is unusable."""
    return torch.from_numpy(_embedding_values(embedding, speaker.dim).astype(np.float32))


# Requests mostly speak in voices already heard (a seed, the catalog's): decoded and checked once, 64
# requests of the standard workload were prepared in 2.6 ms instead of 4.8 (median, the CPU machine).
@functools.lru_cache(maxsize=4096)
def _embedding_values(embedding: str, dim: int) -> np.ndarray:
    values = np.frombuffer(_decompress(embedding, max_bytes=2 * dim), dtype=np.float16)
    if values.shape != (dim,):
        raise InvalidRequest("voice", f"the speaker embedding has {values.size} values; this model needs {dim}")
    if not np.isfinite(values).all():
        raise InvalidRequest("voice", "the speaker embedding holds values that are not finite")
    return values


def _decompress(text: str, max_bytes: int, *, skip: int = 0, what: str = "speaker embedding") -> bytes:
    """The 16-bit values inside an embedding string (or a speaker sample, its first ``skip`` bytes stored as
    they are), decoded as ChatTTS's ``Speaker._decode`` (``decode_prompt``) does, but never past
    ``max_bytes``: a few hundred characters of LZMA data can expand to gigabytes."""
    # pybase16384 and lzma each raise their own types on malformed input.
    try:
        data = pybase16384.decode_from_string(text)
        filters = [{"id": lzma.FILTER_LZMA2, "dict_size": max(_SMALLEST_DICTIONARY, max_bytes)}]
        decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=filters)
        values = decompressor.decompress(data[skip:], max_length=max_bytes + 1)
    except Exception as error:  # noqa: BLE001
        raise InvalidRequest("voice", f"is not a valid ChatTTS {what} ({error})") from None
    if len(values) > max_bytes:
        raise InvalidRequest("voice", f"the {what} expands to more than {max_bytes // 2} values")
    if not decompressor.eof:
        raise InvalidRequest("voice", f"the {what}'s data ends early")
    if decompressor.unused_data:
        raise InvalidRequest("voice", f"the {what} holds data after its end")
    if len(values) % 2:
        raise InvalidRequest("voice", f"the {what} holds an odd number of bytes, not 16-bit values")
    return values


def embedding_of(speaker: Speaker, voice: Voice) -> str:
    """The embedding string of a voice (seed, embedding string or blend)."""
    if isinstance(voice, SpeakerSample):
        raise InvalidRequest("voice", "a voice from a reference clip is a speaker sample: it has no embedding")
    if isinstance(voice, Blend):
        return _blend_embedding(speaker, voice)
    return embedding_for_seed(speaker, voice) if isinstance(voice, int) else voice


# A mix shorter than this (its parts at unit length) is parts that cancel out.
BLEND_SMALLEST_NORM = 1e-3


def _blend_embedding(speaker: Speaker, blend: Blend) -> str:
    # Each part scaled to unit length as the engine scales an embedding (float16, on the CPU).
    units = torch.stack(
        [
            F.normalize(embedding_tensor(speaker, embedding_of(speaker, part.voice)).half(), p=2.0, dim=0).float()
            for part in blend.mix
        ]
    )
    weights = torch.tensor([part.weight for part in blend.mix], dtype=torch.float32)
    mixed = (weights / weights.sum()) @ units
    # The engine scales the mix to unit length in its turn: parts that cancel out would leave it no
    # direction to scale (NaN audio).
    if float(mixed.norm()) < BLEND_SMALLEST_NORM:
        raise InvalidRequest("voice", "the blend's parts cancel out: it has no voice left")
    return _embedding_string(mixed)


@dataclass(frozen=True)
class SpokenVoice:
    """A voice as the engine speaks it: a speaker embedding (its string, reported with the result, and its
    tensor), or a reference clip's speaker sample (its codes, codebooks x steps) with the clip's words."""

    embedding: str | None = None
    speaker: torch.Tensor | None = None
    sample: torch.Tensor | None = None
    transcript: str = ""


def resolve(speaker: Speaker, voice: Voice) -> tuple[str, torch.Tensor]:
    """The embedding string and tensor of a voice (seed, embedding string or blend)."""
    embedding = embedding_of(speaker, voice)
    return embedding, embedding_tensor(speaker, embedding)


def spoken_voice(chat, voice: Voice) -> SpokenVoice:
    """How the engine speaks a voice (seed, embedding string, blend or speaker sample) on ``chat``'s model."""
    if isinstance(voice, SpeakerSample):
        return SpokenVoice(sample=sample_codes(chat, voice.spk_smp), transcript=voice.txt_smp)
    embedding, speaker = resolve(chat.speaker, voice)
    return SpokenVoice(embedding=embedding, speaker=speaker)


def speaker_sample(chat, pcm: bytes) -> str:
    """ChatTTS's speaker sample of a clip (:data:`chattts_farm.contract.CLIP_PCM`), as ``Chat.sample_audio_speaker``
    makes it from the clip's samples as floats (what ChatTTS's own ``load_audio`` gives it)."""
    wav = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    return chat.sample_audio_speaker(wav)


def sample_codes(chat, spk_smp: str) -> torch.Tensor:
    """A speaker sample's codes (codebooks x steps), as ChatTTS's ``Speaker.decode_prompt`` reads them, with
    its output bounded and its codes checked against this model: :class:`InvalidRequest` names ``voice``."""
    codebooks, audio_tokens = chat.config.gpt.num_vq, chat.config.gpt.num_audio_tokens
    try:
        shape = tuple(int(n) for n in np.frombuffer(pybase16384.decode_from_string(spk_smp)[:4], dtype="<u2"))
    except Exception as error:  # noqa: BLE001 - pybase16384 raises its own types
        raise InvalidRequest("voice", f"is not a valid ChatTTS speaker sample ({error})") from None
    if len(shape) != 2 or shape[0] != codebooks or not 1 <= shape[1] <= MAX_SAMPLE_CODES:
        raise InvalidRequest(
            "voice", f"the speaker sample's shape {shape} is not {codebooks} codebooks of 1 to {MAX_SAMPLE_CODES} steps"
        )
    values = _decompress(spk_smp, 2 * codebooks * MAX_SAMPLE_CODES, skip=4, what="speaker sample")
    codes = np.frombuffer(values, dtype="<u2")
    if codes.size != shape[0] * shape[1]:
        raise InvalidRequest("voice", f"the speaker sample holds {codes.size} codes; its shape says {shape}")
    if int(codes.max()) >= audio_tokens - 1:  # the last audio token ends speech
        raise InvalidRequest("voice", f"the speaker sample holds codes this model lacks (it has {audio_tokens - 1})")
    return torch.from_numpy(codes.astype(np.int32)).view(*shape)
