"""The synthesis core: load ChatTTS once, then turn batches of requests into encoded audio.

Plain Python: no Celery, no Flask. Tasks, the CLI and the benchmark are thin adapters around
:class:`Synthesizer`.

One :meth:`Synthesizer.synthesize` call runs every request it is given together: each request's text
is split into segments, all segments of all requests are generated in as few batched GPT passes as
``max_rows_per_pass`` allows (every sampling setting is per row, so any requests can share a pass), decoded,
checked by the quality gate, joined and encoded. A bad request gets its own error; the others go on.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from chattts_farm.contract import (
    MIME_TYPES,
    FarmError,
    InvalidRequest,
    JobCancelled,
    SynthesisRequest,
)
from chattts_farm.settings import Settings
from chattts_farm.speech_length import expected_tokens
from chattts_farm.text import NOTHING_SPEAKABLE, is_speakable
from worker import audio, generation, quality, voices
from worker.engine.vocoder import Vocoder
from worker.generation import Segment
from worker.model import SAMPLE_RATE, LoadedModel, load_model
from worker.sampling import segment_seed
from worker.segmenting import split_segments

logger = logging.getLogger(__name__)

# Progress callbacks fire at most this often, however fast the steps are.
PROGRESS_INTERVAL_S = 0.5

# on_progress(request index, fraction 0..1, segments done, segments in all)
ProgressCallback = Callable[[int, float, int, int], None]
# cancelled() -> indices of the requests to stop now
CancelledCheck = Callable[[], Collection[int]]


@dataclass
class SynthesisResult:
    request_id: str
    audio: bytes = field(repr=False)
    format: str
    mime_type: str
    sample_rate: int
    duration_s: float
    tokens: int
    segments: int
    seed: int  # the audio seed used: passing it again reproduces this audio
    voice_embedding: str = field(repr=False)
    batch_size: int
    timings: dict[str, float]
    quality: dict
    model: dict
    memory: dict

    def summary(self) -> dict:
        """Everything but the audio bytes, JSON-able."""
        summary = asdict(self)
        del summary["audio"]
        return summary


@dataclass
class _PreparedRequest:
    """A request split into segments, with its voice resolved and its audio seed drawn."""

    request: SynthesisRequest
    seed: int
    embedding: str
    segments: list[Segment]


class Synthesizer:
    def __init__(self, model: LoadedModel, settings: Settings):
        self.model = model
        self.settings = settings
        self.vocoder = Vocoder(model, settings.max_rows_per_pass)

    @classmethod
    def load(cls, settings: Settings, *, progress: Callable[[str, int, int], None] | None = None) -> Synthesizer:
        """Load the configured model and warm it up, ready for the first real request."""
        synthesizer = cls(load_model(settings, progress=progress), settings)
        synthesizer.warm_up()
        return synthesizer

    def warm_up(self) -> None:
        """Pay one-time costs (numba compilation in ChatTTS's normaliser, kernel selection) up front."""
        started = time.perf_counter()
        # Mixed scripts, a control tag and a dropped character reach every numba-compiled path.
        warm_up = SynthesisRequest(text="Warm up! [uv_break] 你好。", seed=0, request_id="warm-up")
        outcome = self.synthesize([warm_up])[0]
        if isinstance(outcome, Exception):
            raise outcome
        logger.info("warmed up in %.2f s", time.perf_counter() - started)

    def synthesize(
        self,
        requests: Sequence[SynthesisRequest],
        *,
        on_progress: ProgressCallback | None = None,
        cancelled: CancelledCheck | None = None,
    ) -> list[SynthesisResult | FarmError]:
        """Synthesise all requests together; each gets a result or its own error, in order."""
        started = time.perf_counter()
        self._reset_memory_stats()
        outcomes: list[SynthesisResult | FarmError | None] = [None] * len(requests)
        prepared: dict[int, _PreparedRequest] = {}
        for index, request in enumerate(requests):
            try:
                prepared[index] = self._prepare(index, request)
            except InvalidRequest as error:
                logger.info("request %s refused: %s", request.request_id, error)
                outcomes[index] = error
        self._refine(prepared)
        text_done = time.perf_counter()

        stopped: set[int] = set()
        timings = {"text_s": text_done - started, "generate_s": 0.0, "decode_s": 0.0}
        self._generate(prepared, on_progress, cancelled, stopped, timings)
        for index in stopped:
            outcomes[index] = JobCancelled(f"request {requests[index].request_id} was cancelled")
            del prepared[index]

        memory = self._memory_report()
        for index, entry in prepared.items():
            outcomes[index] = self._finish(entry, len(requests), timings, memory)
            if on_progress is not None:
                on_progress(index, 1.0, len(entry.segments), len(entry.segments))
        return outcomes

    def _prepare(self, index: int, request: SynthesisRequest) -> _PreparedRequest:
        if len(request.text) > self.settings.max_text_chars:
            raise InvalidRequest(
                "text", f"has {len(request.text)} characters; the maximum is {self.settings.max_text_chars}"
            )
        embedding, speaker = voices.resolve(self.model.chat.speaker, request.voice)
        audio_seed = request.seed if request.seed is not None else secrets.randbits(32)
        texts = [self._normalise(piece) for piece in split_segments(request.text, self.settings.max_segment_chars)]
        texts = [text for text in texts if is_speakable(text)]
        if not texts:
            raise InvalidRequest("text", NOTHING_SPEAKABLE)
        segments = [
            Segment(
                owner=index,
                index=number,
                text=text,
                request=request,
                speaker=speaker,
                seed=segment_seed(audio_seed, number),
                expected_tokens=expected_tokens(text, request.speed),
                max_tokens=self.settings.max_new_tokens,
                pinned=self.model.is_synthetic,
            )
            for number, text in enumerate(texts)
        ]
        return _PreparedRequest(request, audio_seed, embedding, segments)

    def _normalise(self, text: str) -> str:
        return self.model.chat.normalizer(text, do_text_normalization=True, do_homophone_replacement=True).strip()

    def _refine(self, prepared: dict[int, _PreparedRequest]) -> None:
        """Run ChatTTS's refine-text step on the segments of the requests that asked for it.

        ChatTTS refines a list of texts under one prompt, so requests are grouped by their levels.
        """
        import ChatTTS

        groups: dict[str, list[Segment]] = {}
        for entry in prepared.values():
            if entry.request.refine_text is not None:
                groups.setdefault(entry.request.refine_text.prompt, []).extend(entry.segments)
        chat = self.model.chat
        for prompt, segments in groups.items():
            texts = [segment.text for segment in segments]
            # Random weights never end a text on their own: the length rule pins it to the input's length.
            pinned = (
                max(len(chat.tokenizer._tokenizer.tokenize(text)) for text in texts) if self.model.is_synthetic else 0
            )
            params = ChatTTS.Chat.RefineTextParams(
                prompt=prompt,
                show_tqdm=False,
                manual_seed=prepared[segments[0].owner].seed,
                min_new_token=pinned,
                max_new_token=pinned or 384,
            )
            for chunk_start in range(0, len(texts), self.settings.max_rows_per_pass):
                chunk = segments[chunk_start : chunk_start + self.settings.max_rows_per_pass]
                refined = chat._refine_text([segment.text for segment in chunk], self.model.device, params)
                ids = [tokens[tokens.less(chat.tokenizer.break_0_ids)] for tokens in refined.ids]
                for segment, text in zip(chunk, chat.tokenizer.decode(ids), strict=True):
                    # Refining can drop everything speakable; the plain text is better than silence.
                    if is_speakable(text):
                        segment.text = text
                        segment.expected_tokens = expected_tokens(text, segment.request.speed)
                refined.destroy()

    def _generate(
        self,
        prepared: dict[int, _PreparedRequest],
        on_progress: ProgressCallback | None,
        cancelled: CancelledCheck | None,
        stopped: set[int],
        timings: dict[str, float],
    ) -> None:
        """Generate every segment, then regenerate those the quality gate flags, up to the retry limit."""
        pending = [segment for entry in prepared.values() for segment in entry.segments]
        for attempt in range(self.settings.quality_retries + 1):
            if attempt:
                for segment in pending:
                    seed = prepared[segment.owner].seed
                    segment.seed = segment_seed(seed, segment.index, attempt)
                logger.info("quality gate: generating %d flagged segment(s) again", len(pending))
            started = time.perf_counter()
            self._generate_segments(prepared, pending, on_progress, cancelled, stopped)
            generated = time.perf_counter()
            self._decode_and_assess([s for s in pending if s.owner not in stopped], retried=attempt > 0)
            timings["generate_s"] += generated - started
            timings["decode_s"] += time.perf_counter() - generated
            pending = [s for s in pending if s.owner not in stopped and not s.quality.ok]
            if not pending:
                return

    def _generate_segments(
        self,
        prepared: dict[int, _PreparedRequest],
        segments: list[Segment],
        on_progress: ProgressCallback | None,
        cancelled: CancelledCheck | None,
        stopped: set[int],
    ) -> None:
        # Longest first, so the rows of one pass end at similar times.
        ordered = sorted(segments, key=lambda s: s.expected_tokens, reverse=True)
        tracker = _ProgressTracker(prepared, on_progress)
        for start in range(0, len(ordered), self.settings.max_rows_per_pass):
            batch = [s for s in ordered[start : start + self.settings.max_rows_per_pass] if s.owner not in stopped]
            if not batch:
                continue

            def rows_to_stop(batch=batch) -> list[int]:
                if cancelled is None:
                    return []
                stopped.update(cancelled())
                return [i for i, segment in enumerate(batch) if segment.owner in stopped]

            def on_step(active: list[int], step: int, batch=batch) -> None:
                tracker.step(batch, active, step)

            outputs = generation.generate(self.model, batch, on_step=on_step, rows_to_stop=rows_to_stop)
            for segment, output in zip(batch, outputs, strict=True):
                segment.output = output
                tracker.finished(segment)

    def _decode_and_assess(self, segments: list[Segment], retried: bool) -> None:
        decoded = self.vocoder.decode([s.output.hiddens for s in segments])
        for segment, samples in zip(segments, decoded, strict=True):
            segment.samples = samples
            segment.quality = quality.assess(
                samples, segment.output.tokens, segment.expected_tokens, segment.output.ended_by
            )
            segment.quality.retried = retried
            segment.output.hiddens = segment.output.hiddens[:0]  # the hidden states are no longer needed

    def _finish(
        self, entry: _PreparedRequest, batch_size: int, timings: dict[str, float], memory: dict
    ) -> SynthesisResult:
        encode_started = time.perf_counter()
        pause = np.zeros(int(self.settings.segment_pause_s * SAMPLE_RATE), dtype=np.float32)
        pieces: list[np.ndarray] = []
        for segment in entry.segments:
            if pieces:
                pieces.append(pause)
            pieces.append(np.nan_to_num(segment.samples.astype(np.float32)))
        samples = np.concatenate(pieces)
        encoded = audio.encode(samples, SAMPLE_RATE, entry.request.format)
        flags = sorted({flag for s in entry.segments for flag in s.quality.flags})
        return SynthesisResult(
            request_id=entry.request.request_id,
            audio=encoded,
            format=entry.request.format,
            mime_type=MIME_TYPES[entry.request.format],
            sample_rate=SAMPLE_RATE,
            duration_s=round(samples.size / SAMPLE_RATE, 3),
            tokens=sum(s.output.tokens for s in entry.segments),
            segments=len(entry.segments),
            seed=entry.seed,
            voice_embedding=entry.embedding,
            batch_size=batch_size,
            timings={
                **{k: round(v, 4) for k, v in timings.items()},
                "encode_s": round(time.perf_counter() - encode_started, 4),
            },
            quality={
                "ok": not flags,
                "flags": flags,
                "retried_segments": sum(s.quality.retried for s in entry.segments),
                "segments": [asdict(s.quality) for s in entry.segments],
            },
            model=self.model.info.as_dict(),
            memory=memory,
        )

    def _reset_memory_stats(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.model.device)

    def _memory_report(self) -> dict:
        """Peak GPU memory of this call; fragmentation is the share of reserved memory not in use."""
        if self.model.device.type != "cuda":
            return {}
        allocated = torch.cuda.memory_allocated(self.model.device)
        reserved = torch.cuda.memory_reserved(self.model.device)
        return {
            "peak_allocated_mb": round(torch.cuda.max_memory_allocated(self.model.device) / 2**20, 1),
            "peak_reserved_mb": round(torch.cuda.max_memory_reserved(self.model.device) / 2**20, 1),
            "fragmentation": round(1 - allocated / reserved, 4) if reserved else 0.0,
        }


class _ProgressTracker:
    """Turns per-step generation progress into per-request fractions, at most every PROGRESS_INTERVAL_S."""

    def __init__(self, prepared: dict[int, _PreparedRequest], on_progress: ProgressCallback | None):
        self.prepared = prepared
        self.on_progress = on_progress
        self.tokens: dict[tuple[int, int], int] = {}
        self.last_report = 0.0

    def step(self, batch: list[Segment], active: list[int], step: int) -> None:
        for position in active:
            segment = batch[position]
            self.tokens[(segment.owner, segment.index)] = step + 1
        self._report()

    def finished(self, segment: Segment) -> None:
        self.tokens[(segment.owner, segment.index)] = segment.expected_tokens

    def _report(self) -> None:
        now = time.monotonic()
        if self.on_progress is None or now - self.last_report < PROGRESS_INTERVAL_S:
            return
        self.last_report = now
        for index, entry in self.prepared.items():
            expected = sum(s.expected_tokens for s in entry.segments)
            done_tokens = sum(min(self.tokens.get((index, s.index), 0), s.expected_tokens) for s in entry.segments)
            segments_done = sum(1 for s in entry.segments if s.output is not None)
            # Generation is most of the work; decoding and encoding take the last 5%.
            self.on_progress(index, min(0.95, 0.95 * done_tokens / expected), segments_done, len(entry.segments))
