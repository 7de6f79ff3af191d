"""The recognisers the ASR gate listens with, and which one the settings choose.

- ``whisper``: OpenAI's Whisper (``openai-whisper``), Chinese and English, on the engine's device
  (on a CUDA stream of its own there), drawing the tokens ``whisper.decode`` draws greedily but over a
  static KV cache whose steps replay as CUDA graphs (:mod:`worker.asr.greedy`). Its weights are read
  from Whisper's own cache (``$XDG_CACHE_HOME/whisper``, else ``~/.cache/whisper``, where
  ``whisper.load_model`` leaves them) or a checkpoint's path, and never downloaded: a farm's hosts may
  not reach the internet, and a check that fetches 70 MB on its first segment is worse than none.
  ``synthetic-tiny`` and ``synthetic-base`` build the real architectures with random weights instead,
  for benchmarks of the gate's cost where no weights can be had (bench/asr_cost.py): what they hear is
  meaningless.
- ``offline``: pocketsphinx's English model from its wheel, needing nothing but PyPI. Its general
  language model hears synthetic speech as other words, so it decodes against a grammar made from the
  expected text (docs/quality-gate.md has the measurements): it catches wrong or missing speech, and
  only some skipped or repeated words.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
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

    def transcribe_batch(
        self, clips: Sequence[np.ndarray], sample_rate: int, expected_texts: Sequence[str]
    ) -> list[str]:
        """What ``transcribe`` hears in each clip, all at once: the same texts as one at a time."""


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

    def transcribe_batch(
        self, clips: Sequence[np.ndarray], sample_rate: int, expected_texts: Sequence[str]
    ) -> list[str]:
        # pocketsphinx decodes one utterance at a time, each against its own grammar.
        return [self.transcribe(clip, sample_rate, text) for clip, text in zip(clips, expected_texts, strict=True)]


class Whisper:
    """Whisper, told the language the expected text is in, decoding greedily and no further than the
    expected text could need (:func:`token_limit`).

    Clips of up to 30 s are decoded by :class:`~worker.asr.greedy.GreedyDecoder`, which draws the tokens
    ``whisper.decode`` would; its buffers (and on CUDA its graphs) are made here, before the engine sizes
    its cache from the memory left free. A longer clip goes through Whisper's own ``transcribe``."""

    name = "whisper"

    def __init__(self, model, device: torch.device, max_batch: int, *, stand_in: bool = False):
        """``model``: a ``whisper.model.Whisper`` (see :func:`load_whisper`), on ``device``; ``max_batch``:
        the most clips of a language decoded at once (the listener's largest batch; more take several passes).

        ``stand_in``: the model has random weights (:func:`synthetic_whisper`), which hear nothing and never
        end a clip of their own accord. So that it costs what real weights cost hearing a segment said
        right, it ends each clip after as many tokens as the expected text takes (:func:`text_tokens`),
        as the synthetic speech model's length rule ends each segment; with ``ends_with_text`` set
        False (a benchmark's worst case) every clip runs on to its limit, as real weights would only if
        they heard garbage in every segment."""
        import whisper

        from worker.asr.greedy import GreedyDecoder

        self._whisper = whisper
        self._model = model
        self._fp16 = device.type == "cuda"
        self._device = device
        self.stand_in = stand_in
        self.ends_with_text = stand_in
        # Beside the engine's stream, not behind it (nor it behind this one).
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._greedy = GreedyDecoder(model, max_batch, self._stream, ends_by_length=stand_in)
        logger.info(
            "Whisper decodes up to %d clips at once in %.0f MiB of buffers",
            max_batch,
            self._greedy.buffer_bytes / 2**20,
        )
        self._resamplers: dict[int, torchaudio.transforms.Resample] = {}  # by the rate resampled from

    def hears(self, text: str) -> bool:
        return True

    @property
    def decoding_steps(self) -> int:
        """The decoding steps run so far, for clips of up to 30 s: most of what listening costs."""
        return self._greedy.steps_run

    def transcribe(self, samples: np.ndarray, sample_rate: int, expected_text: str) -> str:
        return self.transcribe_batch([samples], sample_rate, [expected_text])[0]

    def transcribe_batch(
        self, clips: Sequence[np.ndarray], sample_rate: int, expected_texts: Sequence[str]
    ) -> list[str]:
        """Clips of up to 30 s (Whisper's window) as one padded batch of log-mel spectrograms a language;
        a longer one alone, window by window."""
        heard: list[str | None] = [None] * len(clips)
        batches: dict[str, list[int]] = {}
        window_samples = self._whisper.audio.CHUNK_LENGTH * sample_rate
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            for index, (clip, text) in enumerate(zip(clips, expected_texts, strict=True)):
                if clip.size > window_samples:
                    heard[index] = self._transcribe_long(at_16k(clip, sample_rate), text)
                else:
                    batches.setdefault(_language(text), []).append(index)
            for language, indices in batches.items():
                mels = self.log_mels([clips[i] for i in indices], sample_rate)
                texts = self._decode(language, mels, [expected_texts[i] for i in indices])
                for index, text in zip(indices, texts, strict=True):
                    heard[index] = text
        return heard

    def log_mels(self, clips: Sequence[np.ndarray], sample_rate: int) -> torch.Tensor:
        """Clips of up to 30 s as Whisper's log-mel spectrograms of its 30-s window, each as
        ``log_mel_spectrogram(pad_or_trim(clip at 16 kHz))`` makes it, all at once on the model's device.

        Beside the engine, one clip at a time on the CPU, resampling and the spectrograms took a
        third of the listener's thread (py-spy, H200, 2026-12-03) and its interpreter's lock from the
        engine's thread; a batch is a few kernels. Zero padding before resampling is zero padding
        after: resampling pads with zeros itself.
        """
        audio = self._whisper.audio
        padded = torch.zeros(len(clips), audio.CHUNK_LENGTH * sample_rate, device=self._device)
        for row, clip in zip(padded, clips, strict=True):
            row[: clip.size].copy_(torch.from_numpy(np.ascontiguousarray(clip, np.float32)))
        if sample_rate != ASR_SAMPLE_RATE:
            if sample_rate not in self._resamplers:
                self._resamplers[sample_rate] = torchaudio.transforms.Resample(sample_rate, ASR_SAMPLE_RATE).to(
                    self._device
                )
            padded = self._resamplers[sample_rate](padded)
        window = torch.hann_window(audio.N_FFT, device=self._device)
        spectrum = torch.stft(
            padded[:, : audio.N_SAMPLES], audio.N_FFT, audio.HOP_LENGTH, window=window, return_complex=True
        )
        mel = audio.mel_filters(self._device, self._model.dims.n_mels) @ spectrum[..., :-1].abs() ** 2
        log_mel = torch.clamp(mel, min=1e-10).log10()
        # Each clip scaled by its own loudest value, as alone: a batch's loudest clip must not change
        # how the others are heard.
        log_mel = torch.maximum(log_mel, log_mel.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (log_mel + 4.0) / 4.0

    def _decode(self, language: str, mels: torch.Tensor, expected_texts: list[str]) -> list[str]:
        tokenizer = self._tokenizer(language)
        # Each text tokenised once: on the listener's thread, whose Python takes the interpreter from the engine's.
        tokens = [text_tokens(tokenizer, text) for text in expected_texts]
        limits = [token_limit_of(count) for count in tokens]
        rows = self._greedy.decode(mels, language, max(limits), tokens if self.ends_with_text else None)
        # A row decoded past its own limit (the batch ran to the longest's) is cut where it would have stopped alone.
        return [tokenizer.decode(tokens[:limit]).strip() for tokens, limit in zip(rows, limits, strict=True)]

    def _transcribe_long(self, audio: np.ndarray, expected_text: str) -> str:
        language = _language(expected_text)
        heard = self._model.transcribe(
            audio,
            language=language,
            temperature=0.0,
            sample_len=token_limit(self._tokenizer(language), expected_text),
            fp16=self._fp16,
            # One segment is one utterance; carrying text over between its windows invites repetition.
            condition_on_previous_text=False,
        )
        return heard["text"]

    def _tokenizer(self, language: str):
        from worker.asr.greedy import transcribing_tokenizer

        return transcribing_tokenizer(self._model, language)


def token_limit(tokenizer, expected_text: str) -> int:
    """The most tokens Whisper may decode for a segment of this text (:func:`token_limit_of` its tokens)."""
    return token_limit_of(text_tokens(tokenizer, expected_text))


def token_limit_of(tokens: int) -> int:
    """The most tokens Whisper may decode for a text of ``tokens`` tokens: twice as many, and ten more.
    Past that it is no longer hearing the text (a hallucinated loop, or random weights' garbage, which
    would run on to Whisper's own limit of 224 tokens a window)."""
    return 2 * tokens + 10


def text_tokens(tokenizer, expected_text: str) -> int:
    """The tokens of a segment's text as :func:`~worker.asr.text.normalise` leaves it: about what Whisper
    writes hearing it said right. Normalised, it holds no special token ("<|endoftext|>" loses its
    punctuation), so it is encoded without tiktoken's search for them, four fifths of ``encode``'s time."""
    return len(tokenizer.encoding.encode_ordinary(normalise(expected_text)))


def _language(text: str) -> str:
    return "zh" if is_chinese(text) else "en"


# The real architectures of Whisper tiny and base (their checkpoints' ``dims``), for random weights.
SYNTHETIC_WHISPER_DIMS = {
    "synthetic-tiny": {"n_audio_state": 384, "n_audio_head": 6, "n_audio_layer": 4},
    "synthetic-base": {"n_audio_state": 512, "n_audio_head": 8, "n_audio_layer": 6},
}


def synthetic_whisper(name: str):
    """Whisper tiny or base as the architecture goes, with random weights (the same each time): a
    benchmark's stand-in that costs what the real one costs and hears nothing meaningful."""
    from whisper.model import ModelDimensions
    from whisper.model import Whisper as WhisperModel

    audio = SYNTHETIC_WHISPER_DIMS[name]
    dims = ModelDimensions(
        n_mels=80,
        n_audio_ctx=1500,
        n_vocab=51865,
        n_text_ctx=448,
        n_text_state=audio["n_audio_state"],
        n_text_head=audio["n_audio_head"],
        n_text_layer=audio["n_audio_layer"],
        **audio,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WhisperModel(dims)
        # Whisper leaves its decoder's positional embedding as torch.empty made it (a checkpoint fills
        # it): whatever the memory held, NaN included.
        torch.nn.init.normal_(model.decoder.positional_embedding, std=0.01)
    return model


def load_whisper(model: str, device: torch.device):
    """The Whisper model ASR_WHISPER_MODEL names: random weights for a synthetic one, else its
    checkpoint's (:func:`whisper_checkpoint`, which must exist); its weights frozen, as the speech
    model's are (worker.model.loading)."""
    import whisper

    if model in SYNTHETIC_WHISPER_DIMS:
        return synthetic_whisper(model).to(device).requires_grad_(False)
    return whisper.load_model(str(whisper_checkpoint(model)), device=device).requires_grad_(False)


def whisper_checkpoint(model: str) -> Path:
    """Where the Whisper model named by ASR_WHISPER_MODEL is: a path as given, a name in Whisper's cache."""
    if model.endswith(".pt"):
        return Path(model).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whisper"
    return cache / f"{model}.pt"


def load_backend(settings: Settings, *, synthetic: bool, device: torch.device, max_batch: int) -> Backend | None:
    """The recogniser ASR (the setting) asks for, or None for no ASR check; ``max_batch``: the most clips
    its listener hands it at once."""
    choice = settings.asr
    if choice == "off" or (choice == "auto" and synthetic):
        return None
    if choice == "offline":
        return Offline()
    if settings.asr_whisper_model in SYNTHETIC_WHISPER_DIMS:
        if choice == "auto":  # random weights hear nothing: only a benchmark asks for them, outright
            logger.info("Whisper %s has random weights: the ASR check is off", settings.asr_whisper_model)
            return None
        logger.warning("Whisper %s has random weights: its verdicts are meaningless", settings.asr_whisper_model)
        return Whisper(load_whisper(settings.asr_whisper_model, device), device, max_batch, stand_in=True)
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
    return Whisper(load_whisper(settings.asr_whisper_model, device), device, max_batch)


def at_16k(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    if sample_rate == ASR_SAMPLE_RATE:
        return samples.astype(np.float32, copy=False)
    resampled = torchaudio.functional.resample(
        torch.from_numpy(np.ascontiguousarray(samples, np.float32)), sample_rate, ASR_SAMPLE_RATE
    )
    return resampled.numpy()
