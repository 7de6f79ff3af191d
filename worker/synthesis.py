"""The synthesis core: load ChatTTS once, then turn requests into encoded audio as they come.

Plain Python: no Celery, no Flask. Tasks, the CLI and the benchmark are thin adapters around
:class:`Synthesizer`.

Each request's text is split into segments; the segments of every request in flight share the
engine's running batch (every sampling setting is per row, so any requests can share it), and a
request added while others run joins it at the next step. Segments that come out are decoded,
checked by the quality gate, and a request whose segments are all done is joined and encoded. A
bad request gets its own error; the others go on.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field, fields

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
from worker import audio, voices
from worker.decoding import Decoded, Decoder, Piece, assess
from worker.engine.engine import Engine
from worker.engine.runner import ModelRunner
from worker.engine.segment import Segment
from worker.engine.segment import SegmentStatus as Status
from worker.engine.vocoder import Vocoder
from worker.model import SAMPLE_RATE, LoadedModel, load_model
from worker.sampling import segment_seed
from worker.segmenting import split_segments
from worker.streaming import Deliver, RequestStream
from worker.text_normaliser import TextNormaliser

logger = logging.getLogger(__name__)

# Progress callbacks fire at most this often, however fast the steps are.
PROGRESS_INTERVAL_S = 0.5
# Without a MAX_RUNNING_ROWS setting: the CPU's slots, and on CUDA the share of free memory the
# slots take, less room for the prefill, the vocoder and the graphs' scratch.
CPU_RUNNING_ROWS = 64
GPU_MEMORY_SHARE = 0.85
GPU_WORKSPACE_BYTES = 6 * 2**30
MAX_AUTO_RUNNING_ROWS = 512

# on_progress(request index, fraction 0..1, segments done, segments in all)
ProgressCallback = Callable[[int, float, int, int], None]
# cancelled() -> indices of the requests to stop now
CancelledCheck = Callable[[], Collection[int]]


@dataclass
class SynthesisResult:
    """One request's audio and its description. The segments' audio is joined when ``samples`` is first
    read and encoded when ``audio`` is, by whoever reads them: a worker's job thread, not the thread
    that drives the GPU."""

    request_id: str
    pieces: list[np.ndarray] = field(repr=False)  # the segments' samples, float32 at sample_rate
    pause_samples: int  # the silence between two segments
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

    @functools.cached_property
    def samples(self) -> np.ndarray:
        pause = np.zeros(self.pause_samples, dtype=np.float32)
        joined: list[np.ndarray] = []
        for piece in self.pieces:
            if joined:
                joined.append(pause)
            joined.append(np.nan_to_num(piece.astype(np.float32, copy=False)))
        return np.concatenate(joined)

    @functools.cached_property
    def audio(self) -> bytes:
        started = time.perf_counter()
        encoded = audio.encode(self.samples, self.sample_rate, self.format)
        self.timings["encode_s"] = round(time.perf_counter() - started, 4)
        return encoded

    def summary(self) -> dict:
        """Everything but the audio, JSON-able (encode_s is there once the audio has been read)."""
        unsaid = {"pieces", "pause_samples"}
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in unsaid}


@dataclass(eq=False)
class RequestInFlight:
    """A request inside the synthesizer: its segments, voice and audio seed, and what it has cost so far."""

    request: SynthesisRequest
    number: int  # unique within the synthesizer: its segments' ``owner``
    seed: int
    embedding: str
    segments: list[Segment]
    started: float = field(default_factory=time.perf_counter)
    text_s: float = 0.0
    decode_s: float = 0.0
    generated_at: float | None = None
    shared_with: int = 1  # the most requests in flight together while this one was
    stream: RequestStream | None = None  # how its audio goes out as it is drawn, when it streams

    @property
    def segments_done(self) -> int:
        return sum(1 for segment in self.segments if segment.quality is not None and segment.status is Status.FINISHED)


class Synthesizer:
    """Requests in, results out, on one model: ``add`` requests, call ``step`` until they come out.

    Each step runs the engine one step (segments of any request join and leave its running batch)
    and hands the segments that came out to the vocoder's stream (:mod:`worker.decoding`); of those
    it has decoded, it sends the ones the quality gate flags back with another seed, and finishes
    every request whose segments are all done. ``synthesize`` does all of it for a
    list of requests.
    """

    def __init__(self, model: LoadedModel, settings: Settings):
        self.model = model
        self.settings = settings
        self.engine = Engine(
            model,
            slots=engine_slots(model, settings),
            max_admissions=settings.max_rows_per_pass,
            max_prompt_tokens=max_prompt_tokens(settings),
            max_new_tokens=settings.max_new_tokens,
            kv_dtype=kv_dtype(settings),
        )
        self.vocoder = Vocoder(model, settings.max_rows_per_pass)
        self.decoder = Decoder(self.vocoder, model.device)
        self._normalise = TextNormaliser(model.chat.normalizer)
        self.stream_context_frames = (
            min(settings.stream_context_frames, self.vocoder.context_frames) or self.vocoder.measure_stream_context()
        )
        logger.info(
            "streamed chunks decode with %d frames of context each side (receptive field: %d)",
            self.stream_context_frames,
            self.vocoder.context_frames,
        )
        self.in_flight: dict[int, RequestInFlight] = {}
        self._numbers = itertools.count()

    @classmethod
    def load(cls, settings: Settings, *, progress: Callable[[str, int, int], None] | None = None) -> Synthesizer:
        """Load the configured model and warm it up, ready for the first real request."""
        synthesizer = cls(load_model(settings, progress=progress), settings)
        synthesizer.warm_up()
        return synthesizer

    def warm_up(self) -> None:
        """Pay one-time costs (first calls of torch's kernels, compilation, the decode step's and the
        prefill's CUDA graphs) up front."""
        started = time.perf_counter()
        warm_up = SynthesisRequest(text="Warm up! [uv_break] 你好。", seed=0, request_id="warm-up")
        outcome = self.synthesize([warm_up])[0]
        if isinstance(outcome, Exception):
            raise outcome
        graphs = self.engine.runner.capture_every_bucket()
        if graphs:
            logger.info("captured the decode step and the prefill of %d buckets", graphs)
        logger.info("warmed up in %.2f s", time.perf_counter() - started)

    def synthesize(
        self,
        requests: Sequence[SynthesisRequest],
        *,
        on_progress: ProgressCallback | None = None,
        cancelled: CancelledCheck | None = None,
        on_audio: Sequence[Deliver | None] | None = None,
    ) -> list[SynthesisResult | FarmError]:
        """Synthesise all requests together; each gets a result or its own error, in order (streaming
        to its ``on_audio`` callback, as ``add`` does)."""
        self._reset_memory_stats()
        outcomes: list[SynthesisResult | FarmError | None] = [None] * len(requests)
        index_of: dict[int, int] = {}
        for index, added in enumerate(self.add(requests, on_audio)):
            if isinstance(added, RequestInFlight):
                index_of[added.number] = index
            else:
                outcomes[index] = added
        last_report = 0.0
        while any(number in self.in_flight for number in index_of):
            if cancelled is not None:
                stopping = set(cancelled())
                for number, index in index_of.items():
                    if index in stopping and number in self.in_flight:
                        self.cancel(number)
                        outcomes[index] = JobCancelled(f"request {requests[index].request_id} was cancelled")
            for entry, outcome in self.step():
                outcomes[index_of[entry.number]] = outcome
                if on_progress is not None and not isinstance(outcome, Exception):
                    on_progress(index_of[entry.number], 1.0, len(entry.segments), len(entry.segments))
            if on_progress is not None and time.monotonic() - last_report >= PROGRESS_INTERVAL_S:
                last_report = time.monotonic()
                for number, index in index_of.items():
                    if number in self.in_flight:
                        on_progress(index, *self.progress(self.in_flight[number]))
        return outcomes

    def add(
        self, requests: Sequence[SynthesisRequest], on_audio: Sequence[Deliver | None] | None = None
    ) -> list[RequestInFlight | FarmError]:
        """Prepare requests (split, normalise, refine) and queue their segments in the engine.

        A request given an ``on_audio`` callback streams: the callback gets its audio, in order, as
        the engine draws it (see :mod:`worker.streaming`); the result holds the same audio whole.
        """
        started = time.perf_counter()
        added: list[RequestInFlight | FarmError] = []
        for request, deliver in zip(requests, on_audio or [None] * len(requests), strict=True):
            try:
                entry = self._prepare(next(self._numbers), request)
            except InvalidRequest as error:
                logger.info("request %s refused: %s", request.request_id, error)
                added.append(error)
                continue
            if deliver is not None:
                entry.stream = RequestStream(
                    entry.segments,
                    deliver=deliver,
                    pause_samples=self.pause_samples,
                    frames_per_second=SAMPLE_RATE / self.vocoder.samples_per_frame,
                    context_frames=self.stream_context_frames,
                )
            added.append(entry)
        prepared = [entry for entry in added if isinstance(entry, RequestInFlight)]
        self._refine(prepared)
        text_s = time.perf_counter() - started
        for entry in prepared:
            entry.text_s = text_s
            self.in_flight[entry.number] = entry
            self.engine.add(entry.segments)
        self._note_sharing()
        return added

    def step(self) -> list[tuple[RequestInFlight, SynthesisResult | FarmError]]:
        """Run the engine one step and take back what the vocoder decoded meanwhile; returns the
        requests that finished, with their outcomes.

        With nothing left for the engine, waits for the vocoder's oldest launch instead of spinning.
        """
        finished: list[tuple[RequestInFlight, SynthesisResult | FarmError]] = []
        if self.engine.has_work:
            finished.extend(self._run_engine())
        for decoded in self.decoder.collect(wait=not self.engine.has_work):
            finished.extend(self._take_decoded(decoded))
        return finished

    def _run_engine(self) -> list[tuple[RequestInFlight, FarmError]]:
        failed, pieces = [], []
        for segment in self.engine.step():
            entry = self.in_flight.get(segment.owner)
            if entry is None:  # cancelled meanwhile
                continue
            if segment.error is not None:
                self.cancel(entry.number)
                failed.append((entry, segment.error))
            else:
                pieces.append(entry.stream.last_piece(segment) if entry.stream else Piece.whole(segment))
        if any(entry.stream for entry in self.in_flight.values()):
            pieces.extend(self._cut_streams())
        if pieces:
            self.decoder.submit(pieces)
        return failed

    def _cut_streams(self) -> list[Piece]:
        """The next pieces of the running segments of streaming requests."""
        pieces = []
        for segment in self.engine.running_segments:
            entry = self.in_flight.get(segment.owner)
            if entry is None or entry.stream is None:
                continue
            pieces.extend(
                entry.stream.cut(
                    segment,
                    self.engine.tokens_drawn(segment),
                    lambda start, stop, segment=segment: self.engine.hidden_states(segment, start, stop),
                )
            )
        return pieces

    def _take_decoded(self, decoded: Decoded) -> list[tuple[RequestInFlight, SynthesisResult]]:
        """Give the decoded pieces to their segments (and streams); regenerate the segments the quality
        gate flags, finish complete requests."""
        owners = {piece.segment.owner for piece in decoded.pieces} & self.in_flight.keys()
        if decoded.error is not None:
            if owners:  # else every request it served has gone (cancelled or abandoned)
                raise decoded.error
            return []
        finished = []
        now = time.perf_counter()
        for piece, samples, assessed in zip(decoded.pieces, decoded.samples, decoded.qualities, strict=True):
            segment = piece.segment
            entry = self.in_flight.get(segment.owner)
            if entry is None:
                continue
            entry.decode_s += decoded.seconds / len(decoded.pieces)
            if entry.stream is not None:
                entry.stream.take(piece, samples)
                if not piece.last:
                    continue
                samples = entry.stream.samples(segment)
                assessed = assess(segment, samples)
            segment.samples, segment.quality = samples, assessed
            segment.quality.retried = segment.attempt > 0
            segment.output.hiddens = segment.output.hiddens[:0]  # the hidden states are no longer needed
            # A streamed segment is never generated again: its audio has gone out.
            if not segment.quality.ok and segment.attempt < self.settings.quality_retries and entry.stream is None:
                self._regenerate(entry, segment)
            elif entry.segments_done == len(entry.segments):
                entry.generated_at = now
                del self.in_flight[entry.number]
                finished.append((entry, self._finish(entry)))
        return finished

    @property
    def pause_samples(self) -> int:
        """The silence between two segments of a request, streamed or joined."""
        return int(self.settings.segment_pause_s * SAMPLE_RATE)

    def cancel(self, number: int) -> None:
        """Stop a request in flight: its waiting segments leave the engine, its running ones end."""
        self.in_flight.pop(number, None)
        self.engine.cancel(lambda segment: segment.owner == number)

    def abandon(self) -> list[SynthesisRequest]:
        """Drop everything in flight (after a failed step); returns the requests dropped."""
        self.engine.reset()
        requests = [entry.request for entry in self.in_flight.values()]
        self.in_flight.clear()
        return requests

    def progress(self, entry: RequestInFlight) -> tuple[float, int, int]:
        """(fraction 0..1, segments done, segments in all) of a request in flight."""
        expected = sum(segment.expected_tokens for segment in entry.segments)
        drawn = sum(
            segment.expected_tokens if segment.output is not None else self.engine.tokens_drawn(segment)
            for segment in entry.segments
        )
        # Generation is most of the work; decoding and encoding take the last 5%.
        fraction = min(0.95, 0.95 * min(drawn, expected) / expected)
        return fraction, entry.segments_done, len(entry.segments)

    def _prepare(self, number: int, request: SynthesisRequest) -> RequestInFlight:
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
                owner=number,
                index=index,
                text=text,
                request=request,
                speaker=speaker,
                seed=segment_seed(audio_seed, index),
                expected_tokens=expected_tokens(text, request.speed),
                max_tokens=self.settings.max_new_tokens,
                pinned=self.model.is_synthetic,
            )
            for index, text in enumerate(texts)
        ]
        return RequestInFlight(request, number, audio_seed, embedding, segments)

    def _refine(self, prepared: list[RequestInFlight]) -> None:
        """Run ChatTTS's refine-text step on the segments of the requests that asked for it.

        ChatTTS refines a list of texts under one prompt, so requests are grouped by their levels.
        """
        import ChatTTS

        groups: dict[str, list[tuple[RequestInFlight, Segment]]] = {}
        for entry in prepared:
            if entry.request.refine_text is not None:
                groups.setdefault(entry.request.refine_text.prompt, []).extend((entry, s) for s in entry.segments)
        chat = self.model.chat
        for prompt, members in groups.items():
            texts = [segment.text for _, segment in members]
            # Random weights never end a text on their own: the length rule pins it to the input's length.
            pinned = (
                max(len(chat.tokenizer._tokenizer.tokenize(text)) for text in texts) if self.model.is_synthetic else 0
            )
            params = ChatTTS.Chat.RefineTextParams(
                prompt=prompt,
                show_tqdm=False,
                manual_seed=members[0][0].seed,
                min_new_token=pinned,
                max_new_token=pinned or 384,
            )
            for chunk_start in range(0, len(members), self.settings.max_rows_per_pass):
                chunk = [segment for _, segment in members[chunk_start : chunk_start + self.settings.max_rows_per_pass]]
                refined = chat._refine_text([segment.text for segment in chunk], self.model.device, params)
                ids = [tokens[tokens.less(chat.tokenizer.break_0_ids)] for tokens in refined.ids]
                for segment, text in zip(chunk, chat.tokenizer.decode(ids), strict=True):
                    # Refining can drop everything speakable; the plain text is better than silence.
                    if is_speakable(text):
                        segment.text = text
                        segment.expected_tokens = expected_tokens(text, segment.request.speed)
                refined.destroy()

    def _regenerate(self, entry: RequestInFlight, segment: Segment) -> None:
        """Send a segment the quality gate flagged back to the engine with another seed."""
        segment.attempt += 1
        segment.seed = segment_seed(entry.seed, segment.index, segment.attempt)
        segment.output = segment.samples = segment.quality = None
        logger.info("quality gate: generating segment %d of %s again", segment.index, entry.request.request_id)
        self.engine.add([segment])

    def _note_sharing(self) -> None:
        for entry in self.in_flight.values():
            entry.shared_with = max(entry.shared_with, len(self.in_flight))

    def _finish(self, entry: RequestInFlight) -> SynthesisResult:
        pieces = [segment.samples for segment in entry.segments]
        total_samples = sum(piece.size for piece in pieces) + self.pause_samples * (len(pieces) - 1)
        flags = sorted({flag for s in entry.segments for flag in s.quality.flags})
        timings = {
            "text_s": entry.text_s,
            "generate_s": entry.generated_at - entry.started - entry.text_s - entry.decode_s,
            "decode_s": entry.decode_s,
        }
        return SynthesisResult(
            request_id=entry.request.request_id,
            pieces=pieces,
            pause_samples=self.pause_samples,
            format=entry.request.format,
            mime_type=MIME_TYPES[entry.request.format],
            sample_rate=SAMPLE_RATE,
            duration_s=round(total_samples / SAMPLE_RATE, 3),
            tokens=sum(s.output.tokens for s in entry.segments),
            segments=len(entry.segments),
            seed=entry.seed,
            voice_embedding=entry.embedding,
            batch_size=entry.shared_with,
            timings={name: round(max(0.0, value), 4) for name, value in timings.items()},
            quality={
                "ok": not flags,
                "flags": flags,
                "retried_segments": sum(s.quality.retried for s in entry.segments),
                "segments": [asdict(s.quality) for s in entry.segments],
            },
            model=self.model.info.as_dict(),
            memory=self._memory_report(),
        )

    def _reset_memory_stats(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.model.device)

    def _memory_report(self) -> dict:
        """Peak GPU memory since the last reset; fragmentation is the share of reserved memory not in use."""
        if self.model.device.type != "cuda":
            return {}
        allocated = torch.cuda.memory_allocated(self.model.device)
        reserved = torch.cuda.memory_reserved(self.model.device)
        return {
            "peak_allocated_mb": round(torch.cuda.max_memory_allocated(self.model.device) / 2**20, 1),
            "peak_reserved_mb": round(torch.cuda.max_memory_reserved(self.model.device) / 2**20, 1),
            "fragmentation": round(1 - allocated / reserved, 4) if reserved else 0.0,
        }


def max_prompt_tokens(settings: Settings) -> int:
    """The longest prompt a slot holds: a segment of text, or what refine-text makes of it (up to
    384 tokens), with the prompt's tags."""
    return max(settings.max_segment_chars, 384) + 16


def kv_dtype(settings: Settings) -> torch.dtype | None:
    """The KV cache's dtype when it is not the model's own."""
    return torch.float8_e4m3fn if settings.kv_dtype == "fp8" else None


def engine_slots(model: LoadedModel, settings: Settings) -> int:
    """How many segments the engine runs at once: the setting, or what the free GPU memory holds."""
    if settings.max_running_rows:
        return settings.max_running_rows
    if model.device.type != "cuda":
        return CPU_RUNNING_ROWS
    free, _ = torch.cuda.mem_get_info(model.device)
    per_slot = ModelRunner.bytes_per_slot(
        model,
        max_prompt_tokens=max_prompt_tokens(settings),
        max_new_tokens=settings.max_new_tokens,
        kv_bytes=torch.finfo(kv_dtype(settings) or model.chat.gpt.gpt.dtype).bits // 8,
    )
    budget = free * GPU_MEMORY_SHARE - GPU_WORKSPACE_BYTES
    slots = max(1, min(MAX_AUTO_RUNNING_ROWS, int(budget // per_slot)))
    logger.info("engine: %d slots (%.0f MiB each) in %.0f MiB free", slots, per_slot / 2**20, free / 2**20)
    return slots
