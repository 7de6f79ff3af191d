"""One segment of a request's text, as the engine runs it, and the verdict of the quality gate on its audio.

Torch-free at import (its tensors are only named in annotations), so that the scheduler, which
reads segments, is too. Every step of the engine process's pipeline takes segments from here: the
engine writes a segment while it runs, the vocoder's stream and the pipeline after.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chattts_farm.contract import DEFAULT_PRIORITY, DEFAULT_SPEED, FarmError, SynthesisRequest

if TYPE_CHECKING:
    import numpy as np
    import torch


# Seeds are 32-bit: the sampler hashes them as such.
_SEED_MASK = 0xFFFFFFFF


class SegmentStatus(enum.Enum):
    WAITING = "waiting"  # added, waiting for a free slot
    RUNNING = "running"  # holds a slot, drawing one step per decode step
    FINISHED = "finished"  # out of the engine, with its output


@dataclass(eq=False)
class Segment:
    """One piece of a request's text, spoken by one slot of the engine."""

    owner: int  # which request it belongs to, as its submitter numbers them
    index: int  # its place in that request's text
    text: str
    request: SynthesisRequest  # sampling settings
    speaker: torch.Tensor | None  # (gpt width,) raw speaker embedding; None for a speaker sample's voice
    seed: int
    expected_tokens: int
    max_tokens: int
    # The synthetic model's length rule: end after exactly expected_tokens (EOS blocked before).
    pinned: bool = False
    status: SegmentStatus = SegmentStatus.WAITING
    slot: int | None = None
    output: SegmentOutput | None = None
    error: FarmError | None = None  # why it could not run, instead of an output
    attempt: int = 0  # 0, then 1, 2, ... for each regeneration the quality gate asks for
    samples: np.ndarray | None = None
    quality: SegmentQuality | None = None
    # The best attempt heard so far while another seed tries to better it (see the ASR gate).
    best_attempt: Attempt | None = None
    prompt_ids: torch.Tensor | None = None  # its prompt's token ids, once encoded (on the CPU)
    # When its audio is wanted (monotonic seconds): waiting segments are admitted earliest due first.
    due: float = 0.0
    # A voice from a reference clip: its speaker sample's codes (codebooks x steps), which end the prompt,
    # and the clip's words, which go before the text.
    sample: torch.Tensor | None = None
    transcript: str = ""
    # Its request's priority (chattts_farm.contract.PRIORITIES): which waiting segments go first.
    priority: str = DEFAULT_PRIORITY
    # Its piece of the request's text as the caller wrote it (``text`` is what the model reads: normalised,
    # perhaps refined): what its caption shows.
    caption: str = ""
    # ChatTTS's speed for it: its request's, or an SSML <prosody rate>'s around its text.
    speed: int = DEFAULT_SPEED

    @property
    def pinned_tokens(self) -> int | None:
        return self.expected_tokens if self.pinned else None

    @property
    def end_at(self) -> int:
        """How many tokens the segment draws at most."""
        return min(self.pinned_tokens or self.max_tokens, self.max_tokens)

    @property
    def prompt(self) -> str:
        """The prompt's text as ChatTTS's ``Speaker.decorate_code_prompts`` writes it: the speaker's slot
        (``[empty_spk]`` with a speaker sample), the sample's words, the speed, the text. A sample's codes
        follow it (``Tokenizer.encode``'s ``prompt``)."""
        speaker = "[spk_emb]" if self.speaker is not None else "[empty_spk]"
        return f"[Stts]{speaker}{self.transcript}[speed_{self.speed}]{self.text}[Ptts]"

    @property
    def sample_steps(self) -> int:
        """How many steps of a speaker sample's codes end its prompt."""
        return 0 if self.sample is None else self.sample.shape[1]


@dataclass
class SegmentOutput:
    hiddens: torch.Tensor  # (tokens, gpt width) in the GPT's dtype: what the vocoder turns into audio
    codes: torch.Tensor  # (tokens, codebooks) the audio tokens drawn at those steps
    tokens: int
    ended_by: str  # "eos" | "length_rule" | "token_limit" | "interrupted"


@dataclass
class SegmentQuality:
    """The quality gate's verdict on a segment's audio (see worker.vocoder.quality)."""

    tokens: int
    expected_tokens: int
    ended_by: str  # "eos" | "length_rule" | "token_limit" | "interrupted"
    flags: list[str] = field(default_factory=list)
    retried: bool = False
    asr: AsrCheck | None = None  # what the ASR gate heard, when it listened

    @property
    def ok(self) -> bool:
        return not self.flags


@dataclass
class AsrCheck:
    """What the ASR gate (worker.asr) heard in a segment's audio, against the text it was to say."""

    backend: str
    said: str  # the segment's text as the engine was given it (split, normalised, refined if asked)
    heard: str
    error_rate: float
    passed: bool


@dataclass
class Attempt:
    """One attempt at a segment's audio, with its verdicts."""

    output: SegmentOutput
    # None for a streamed segment's audio, which went out as it was drawn (unless the ASR gate hears it).
    samples: np.ndarray | None
    quality: SegmentQuality


def segment_seed(audio_seed: int, segment: int, attempt: int = 0) -> int:
    """The sampling seed of one segment of a request: distinct per segment and per quality retry."""
    return (audio_seed + segment * 0x9E3779B1 + attempt * 0x85EBCA6B) & _SEED_MASK
