"""The recognisers the ASR gate listens with, and which one the settings choose.

- ``whisper``: OpenAI's Whisper (``openai-whisper``), Chinese and English, on the engine's device.
  Its weights are read from Whisper's own cache (``$XDG_CACHE_HOME/whisper``, else
  ``~/.cache/whisper``, where ``whisper.load_model`` leaves them) or a checkpoint's path, and never
  downloaded: a farm's hosts may not reach the internet, and a check that fetches 70 MB on its first
  segment is worse than none.
- ``offline``: pocketsphinx's English model from its wheel, needing nothing but PyPI. Its general
  language model hears synthetic speech as other words, so it decodes against a grammar made from the
  expected text (docs/quality-gate.md has the measurements): it catches wrong or missing speech, and
  only some skipped or repeated words.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torchaudio

from chattts_farm.settings import ENV_PREFIX, Settings, SettingsError
from worker.asr.text import is_chinese, normalise

logger = logging.getLogger(__name__)

# Both recognisers take 16 kHz audio.
ASR_SAMPLE_RATE = 16_000


class Backend(Protocol):
    name: str

    def hears(self, text: str) -> bool:
        """Whether it can check speech of this text (its language)."""

    def transcribe(self, samples: np.ndarray, sample_rate: int, expected_text: str) -> str:
        """The text heard in mono float samples; ``expected_text`` is what they should say."""


class Offline:
    """pocketsphinx, hearing the audio as any sequence of the expected words (so skipped and repeated
    words can be heard as such, and other speech as few of them)."""

    name = "offline"

    def __init__(self):
        from pocketsphinx import Decoder, get_model_path

        model = Path(get_model_path()) / "en-us"
        self._decoder = Decoder(
            hmm=str(model / "en-us"),
            dict=str(model / "cmudict-en-us.dict"),
            lm=None,
            samprate=ASR_SAMPLE_RATE,
            loglevel="FATAL",
        )

    def hears(self, text: str) -> bool:
        return not is_chinese(text)

    def transcribe(self, samples: np.ndarray, sample_rate: int, expected_text: str) -> str:
        # A word outside its dictionary has no pronunciation to listen for: it counts as unheard.
        words = [word for word in normalise(expected_text).split() if self._decoder.lookup_word(word)]
        if not words:
            return ""
        # Not the words in order, each optional: that grammar's search took 20 s on a 13-word sentence.
        loop = " | ".join(sorted(set(words)))
        self._decoder.add_jsgf_string("expected", f"#JSGF V1.0;\ngrammar expected;\npublic <s> = ( {loop} )* ;\n")
        self._decoder.activate_search("expected")
        pcm = np.clip(at_16k(samples, sample_rate) * 32767, -32768, 32767).astype(np.int16)
        self._decoder.start_utt()
        self._decoder.process_raw(pcm.tobytes(), full_utt=True)
        self._decoder.end_utt()
        hypothesis = self._decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""


class Whisper:
    """Whisper, told the language the expected text is in."""

    name = "whisper"

    def __init__(self, checkpoint: Path, device: torch.device):
        import whisper

        self._model = whisper.load_model(str(checkpoint), device=device)
        self._fp16 = device.type == "cuda"

    def hears(self, text: str) -> bool:
        return True

    def transcribe(self, samples: np.ndarray, sample_rate: int, expected_text: str) -> str:
        heard = self._model.transcribe(
            at_16k(samples, sample_rate),
            language="zh" if is_chinese(expected_text) else "en",
            fp16=self._fp16,
            # One segment is one utterance; carrying text over between its windows invites repetition.
            condition_on_previous_text=False,
        )
        return heard["text"]


def whisper_checkpoint(model: str) -> Path:
    """Where the Whisper model named by ASR_WHISPER_MODEL is: a path as given, a name in Whisper's cache."""
    if model.endswith(".pt"):
        return Path(model).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whisper"
    return cache / f"{model}.pt"


def load_backend(settings: Settings, *, synthetic: bool, device: torch.device) -> Backend | None:
    """The recogniser ASR (the setting) asks for, or None for no ASR check."""
    choice = settings.asr
    if choice == "off" or (choice == "auto" and synthetic):
        return None
    if choice == "offline":
        return Offline()
    checkpoint = whisper_checkpoint(settings.asr_whisper_model)
    if not checkpoint.is_file():
        if choice == "auto":
            logger.info("no Whisper weights at %s: the ASR check is off (see %sASR)", checkpoint, ENV_PREFIX)
            return None
        raise SettingsError(
            f"{ENV_PREFIX}ASR=whisper needs Whisper's weights, and {checkpoint} is not there: set "
            f"{ENV_PREFIX}ASR_WHISPER_MODEL to a checkpoint's path, or fetch it once where the internet is "
            f"reachable (python -c 'import whisper; whisper.load_model(\"{settings.asr_whisper_model}\")')"
        )
    return Whisper(checkpoint, device)


def at_16k(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    if sample_rate == ASR_SAMPLE_RATE:
        return samples.astype(np.float32, copy=False)
    resampled = torchaudio.functional.resample(
        torch.from_numpy(np.ascontiguousarray(samples, np.float32)), sample_rate, ASR_SAMPLE_RATE
    )
    return resampled.numpy()
