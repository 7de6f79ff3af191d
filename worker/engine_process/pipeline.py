"""The engine process's pipeline: load ChatTTS once, then turn requests into audio as they come.

Plain Python: no Celery, no Flask. The engine process (worker.engine_process.main, through its
batcher), the CLI and the benchmarks are thin adapters around :class:`Synthesizer`, which takes each
request one way, calling each step in turn:

1. prepare (worker.engine_process.prepare): each request's text split into segments, normalised,
   refined: a :class:`~worker.engine_process.synthesis.Synthesis`;
2. generate (worker.engine): the segments of every request in flight share the engine's running
   batch (every sampling setting is per row, so any requests can share it), and a request added
   while others run joins it at the next step; streaming requests are cut as they are drawn
   (worker.engine_process.streaming);
3. vocode (worker.vocoder): segments that come out become audio beside the next steps, and the
   quality gate sends a flagged one back with another seed;
4. listen (worker.asr), when an ASR backend is on: a thread beside the engine hears each segment's
   audio, and one heard saying something else goes back with another seed too, the attempt heard
   best kept;
5. finish (worker.engine_process.finish): a request whose segments are all done is a result; whoever
   reads its audio (the worker's Celery side) joins and encodes it.

A bad request gets its own error; the others go on.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection, Sequence

from chattts_farm.contract import FarmError, InvalidRequest, JobCancelled, SynthesisRequest
from chattts_farm.settings import Settings
from worker.asr.backends import load_backend
from worker.asr.listener import MAX_BATCH, Heard, Listener
from worker.audio import SAMPLE_RATE
from worker.engine.engine import Engine
from worker.engine.segment import Attempt, Segment, segment_seed
from worker.engine.sizing import (
    describe_memory,
    engine_capacity,
    kv_dtype,
    matmul_dtype,
    max_prompt_tokens,
    prefill_tokens,
)
from worker.engine_process.finish import finish, memory_report, reset_memory_stats
from worker.engine_process.prepare import Preparer
from worker.engine_process.streaming import Deliver, RequestStream
from worker.engine_process.synthesis import Synthesis
from worker.engine_report import GateCounts
from worker.interpreter import freeze_start_up_heap, share_promptly
from worker.model.loading import LoadedModel, load_model
from worker.results import SynthesisResult
from worker.vocoder.piece import Piece
from worker.vocoder.stream import Decoded, Decoder, judge
from worker.vocoder.vocoder import Vocoder

logger = logging.getLogger(__name__)

# Progress callbacks fire at most this often, however fast the steps are.
PROGRESS_INTERVAL_S = 0.5
# on_progress(request index, fraction 0..1, segments done, segments in all)
ProgressCallback = Callable[[int, float, int, int], None]
# cancelled() -> indices of the requests to stop now
CancelledCheck = Callable[[], Collection[int]]
# With nothing else to do but wait for the ASR gate, a step waits this long for it: short enough
# that the batcher sees arrivals and cancellations at once.
LISTEN_WAIT_S = 0.05


class Synthesizer:
    """Requests in, results out, on one model: ``add`` requests, call ``step`` until they come out.

    Each step runs the engine one step (segments of any request join and leave its running batch)
    and hands the segments that came out to the vocoder's stream (:mod:`worker.vocoder.stream`); of those
    it has decoded, it sends the ones the quality gate flags back with another seed, and finishes
    every request whose segments are all done. ``synthesize`` does all of it for a
    list of requests.
    """

    def __init__(self, model: LoadedModel, settings: Settings):
        self.model = model
        self.settings = settings
        # Whatever holds GPU memory for good comes before the engine sizes its KV cache from what is left
        # free: a recogniser on the GPU, and the vocoder with its windows' graphs (captured last, they
        # ran an H200 out of memory at warm-up: bench.engine_phases --jobs 1, 2026-12-03).
        backend = load_backend(settings, synthetic=model.is_synthetic, device=model.device, max_batch=MAX_BATCH)
        self.vocoder = Vocoder(model, settings.max_segments_per_pass)
        self.stream_context_frames = (
            min(settings.stream_context_frames, self.vocoder.context_frames) or self.vocoder.measure_stream_context()
        )
        logger.info(
            "streamed chunks decode with %d frames of context each side (receptive field: %d)",
            self.stream_context_frames,
            self.vocoder.context_frames,
        )
        self._capture_vocoder()
        self.engine = Engine(
            model,
            **engine_capacity(model, settings),
            max_admissions=settings.max_segments_per_pass,
            max_prompt_tokens=max_prompt_tokens(settings),
            max_new_tokens=settings.max_new_tokens,
            kv_dtype=kv_dtype(settings),
            matmul_dtype=matmul_dtype(settings),
            prefill_tokens=prefill_tokens(settings),
        )
        self.decoder = Decoder(self.vocoder, model.device)
        self.preparer = Preparer(model, settings)
        self.listener = Listener(backend, settings.asr_max_error_rate) if backend is not None else None
        self.gates = GateCounts()
        self.in_flight: dict[int, Synthesis] = {}
        self._numbers = itertools.count()

    @classmethod
    def load(cls, settings: Settings, *, progress: Callable[[str, int, int], None] | None = None) -> Synthesizer:
        """Load the configured model and warm it up, ready for the first real request. The process that
        hosts it runs other threads beside its steps (the engine process's channel, the ASR gate's
        listener): they get the interpreter promptly, and what start-up leaves is kept out of the garbage
        collector's passes (see worker.interpreter)."""
        share_promptly()
        synthesizer = cls(load_model(settings, progress=progress), settings)
        synthesizer.warm_up()
        freeze_start_up_heap()
        return synthesizer

    def _capture_vocoder(self) -> None:
        started = time.perf_counter()
        windows = self.vocoder.capture_windows()
        if windows:
            logger.info(
                "captured the vocoder's windows of %d (size, batch) buckets in %.2f s; %s",
                windows,
                time.perf_counter() - started,
                describe_memory(self.model.device),
            )

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
            logger.info(
                "captured the decode step and the prefill of %d buckets; %s", graphs, describe_memory(self.model.device)
            )
        logger.info("warmed up in %.2f s", time.perf_counter() - started)

    def synthesize(
        self,
        requests: Sequence[SynthesisRequest],
        *,
        on_progress: ProgressCallback | None = None,
        cancelled: CancelledCheck | None = None,
        on_audio: Sequence[Deliver | None] | None = None,
        already_sent: Sequence[int] | None = None,
    ) -> list[SynthesisResult | FarmError]:
        """Synthesise all requests together; each gets a result or its own error, in order (streaming
        to its ``on_audio`` callback, as ``add`` does, ``already_sent`` as there).

        The requests are added a prefill pass's worth (``max_segments_per_pass``) at a time, one batch a
        step, so that the engine starts on the first while the host prepares the rest (preparing 1,536
        requests at once kept an H200 idle for 0.65 s). The engine itself would admit up to four passes
        a step of segments due already (worker.engine.scheduler): a call of more requests than a pass
        reaches the slots a pass a step, as it was measured.
        """
        reset_memory_stats(self.model.device)
        outcomes: list[SynthesisResult | FarmError | None] = [None] * len(requests)
        deliveries = list(on_audio) if on_audio is not None else [None] * len(requests)
        sent = list(already_sent) if already_sent is not None else [0] * len(requests)
        index_of: dict[int, int] = {}  # request number -> its index in ``requests``
        added_up_to = 0
        last_report = 0.0
        while added_up_to < len(requests) or any(number in self.in_flight for number in index_of):
            stopping = set(cancelled()) if cancelled is not None else set()
            if added_up_to < len(requests):
                batch = range(added_up_to, min(added_up_to + self.settings.max_segments_per_pass, len(requests)))
                added_up_to = batch.stop
                for index in batch:
                    if index in stopping:
                        outcomes[index] = _cancelled(requests[index])
                batch = [index for index in batch if index not in stopping]
                added = (
                    self.add([requests[i] for i in batch], [deliveries[i] for i in batch], [sent[i] for i in batch])
                    if batch
                    else []
                )
                for index, entry in zip(batch, added, strict=True):
                    if isinstance(entry, Synthesis):
                        index_of[entry.number] = index
                    else:
                        outcomes[index] = entry
            for number, index in index_of.items():
                if index in stopping and number in self.in_flight:
                    self.cancel(number)
                    outcomes[index] = _cancelled(requests[index])
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
        self,
        requests: Sequence[SynthesisRequest],
        on_audio: Sequence[Deliver | None] | None = None,
        already_sent: Sequence[int] | None = None,
    ) -> list[Synthesis | FarmError]:
        """Prepare requests (split, normalise, refine) and queue their segments in the engine.

        A request given an ``on_audio`` callback streams: the callback gets its audio, in order, as
        the engine draws it (see :mod:`worker.engine_process.streaming`), and its result describes that
        audio without carrying it. ``already_sent``: for each request, the samples of its audio that went
        out on an earlier run (one whose engine process died): its stream counts them as played.
        """
        started = time.perf_counter()
        added: list[Synthesis | FarmError] = []
        sent = already_sent or [0] * len(requests)
        for request, deliver, sent_samples in zip(requests, on_audio or [None] * len(requests), sent, strict=True):
            try:
                entry = self.preparer.prepare(next(self._numbers), request)
            except InvalidRequest as error:
                logger.info("request %s refused: %s", request.request_id, error)
                added.append(error)
                continue
            if deliver is not None:
                entry.stream = RequestStream(
                    entry.segments,
                    deliver=deliver,
                    silences=entry.silences,
                    frames_per_second=self.frames_per_second,
                    context_frames=self.stream_context_frames,
                    keep_audio=self.listener is not None,  # for the ASR gate to hear
                    already_sent=sent_samples,
                )
            added.append(entry)
        prepared = [entry for entry in added if isinstance(entry, Synthesis)]
        self.preparer.refine(prepared)
        text_s = time.perf_counter() - started
        now = time.monotonic()
        for entry in prepared:
            entry.text_s = text_s
            self.in_flight[entry.number] = entry
            self._set_due(entry, now)
            self.engine.add(entry.segments)
        self._note_sharing()
        return added

    def step(self) -> list[tuple[Synthesis, SynthesisResult | FarmError]]:
        """Run the engine one step and take back what the vocoder decoded meanwhile; returns the
        requests that finished, with their outcomes.

        With nothing left for the engine, waits for the vocoder's oldest launch instead of spinning.
        """
        finished: list[tuple[Synthesis, SynthesisResult | FarmError]] = []
        if self.engine.has_work:
            finished.extend(self._run_engine())
        for decoded in self.decoder.collect(wait=not self.engine.has_work):
            finished.extend(self._take_decoded(decoded))
        if self.listener is not None and self.listener.pending:
            idle = not (self.engine.has_work or self.decoder.pending or finished)
            finished.extend(self._take_heard(self.listener.collect(LISTEN_WAIT_S if idle else 0.0)))
        return finished

    def _run_engine(self) -> list[tuple[Synthesis, FarmError]]:
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
        streaming = any(entry.stream for entry in self.in_flight.values())
        if not (pieces or streaming):
            return failed
        # Their hidden states are copied, and decoded, beside the decode steps launched since they were drawn;
        # the stream is entered once a round, not once a piece (~2,000 pieces a level of 256 streams).
        with self.engine.copying_outputs():
            if streaming:
                pieces.extend(self._cut_streams())
            if pieces:
                self.decoder.submit(pieces)
        return failed

    def _cut_streams(self) -> list[Piece]:
        """The next pieces of the running segments of streaming requests."""
        pieces = []
        engine, in_flight = self.engine, self.in_flight
        for segment in engine.running_segments:
            entry = in_flight.get(segment.owner)
            if entry is not None and entry.stream is not None:
                pieces.extend(entry.stream.cut(segment, engine.tokens_drawn(segment), engine.hidden_states))
        return pieces

    def _take_decoded(self, decoded: Decoded) -> list[tuple[Synthesis, SynthesisResult]]:
        """Give the decoded pieces to their segments (and streams); regenerate the segments the quality
        gate flags, hand the others to the ASR gate or keep them, finish complete requests."""
        owners = {piece.segment.owner for piece in decoded.pieces} & self.in_flight.keys()
        if decoded.error is not None:
            if owners:  # else every request it served has gone (cancelled or abandoned)
                raise decoded.error
            return []
        complete = []
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
                assessed = judge(segment, entry.stream.stats(segment))
            # The hidden states are no longer needed: an empty tensor of their own, not a view that would keep
            # their memory (and that of the segments retired with them, gathered in one block) alive.
            segment.output.hiddens = segment.output.hiddens.new_empty((0, *segment.output.hiddens.shape[1:]))
            attempt = Attempt(segment.output, samples, assessed)
            if not assessed.ok and self._may_regenerate(entry, segment):
                self._regenerate(entry, segment)
            elif self.listener is not None and self.listener.hears(segment.text):
                self.listener.submit(segment, attempt)
            elif self._keep(entry, segment, attempt):
                complete.append(entry)
        return self._finish(complete)

    def _take_heard(self, heard: list[Heard]) -> list[tuple[Synthesis, SynthesisResult]]:
        """Take the ASR gate's verdicts: a segment heard saying something else goes back with another
        seed while retries are left; then the attempt heard best is kept."""
        complete = []
        for item in heard:
            segment, attempt, check = item.segment, item.attempt, item.check
            entry = self.in_flight.get(segment.owner)
            if entry is None:  # cancelled or abandoned while it was heard
                continue
            attempt.quality.asr = check
            self.gates.asr_checks += check is not None
            if check is not None and not check.passed:
                self.gates.asr_mismatches += 1
                attempt.quality.flags.append("asr_mismatch")
                if segment.best_attempt is None or _heard_better(attempt, segment.best_attempt):
                    segment.best_attempt = attempt
                if self._may_regenerate(entry, segment):
                    self._regenerate(entry, segment)
                    continue
                attempt = segment.best_attempt
            if self._keep(entry, segment, attempt):
                complete.append(entry)
        return self._finish(complete)

    def _may_regenerate(self, entry: Synthesis, segment: Segment) -> bool:
        # A streamed segment is never generated again: its audio has gone out.
        return segment.attempt < self.settings.quality_retries and entry.stream is None

    def _keep(self, entry: Synthesis, segment: Segment, attempt: Attempt) -> bool:
        """Make an attempt the segment's audio; returns whether its request is complete."""
        segment.output, segment.samples, segment.quality = attempt.output, attempt.samples, attempt.quality
        segment.quality.retried = segment.attempt > 0
        segment.best_attempt = None
        return entry.segments_done == len(entry.segments)

    def _finish(self, complete: list[Synthesis]) -> list[tuple[Synthesis, SynthesisResult]]:
        """The results of complete requests, which leave the synthesizer."""
        if not complete:
            return []
        now = time.perf_counter()
        memory = memory_report(self.model.device)  # one report for every request finished together
        model = self.model.info.as_dict()
        finished = []
        for entry in complete:
            entry.generated_at = now
            del self.in_flight[entry.number]
            finished.append((entry, finish(entry, model=model, memory=memory)))
        return finished

    def _set_due(self, entry: Synthesis, now: float) -> None:
        """When each segment's audio is wanted: all of an unstreamed request's now; a stream's segment
        when the audio before it will have played (its expected length), so that the first segments of
        streams that arrive later go before it."""
        if entry.stream is None:
            for segment in entry.segments:
                segment.due = now
            return
        starts_after = 0.0
        for segment, silence in zip(entry.segments, entry.silences[:-1], strict=True):
            starts_after += silence / SAMPLE_RATE
            segment.due = now + starts_after
            starts_after += segment.expected_tokens / self.frames_per_second

    @property
    def frames_per_second(self) -> float:
        return SAMPLE_RATE / self.vocoder.samples_per_frame

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

    def progress(self, entry: Synthesis) -> tuple[float, int, int]:
        """(fraction 0..1, segments done, segments in all) of a request in flight."""
        expected = sum(segment.expected_tokens for segment in entry.segments)
        drawn = sum(
            segment.expected_tokens if segment.output is not None else self.engine.tokens_drawn(segment)
            for segment in entry.segments
        )
        # Generation is most of the work; decoding and encoding take the last 5%.
        fraction = min(0.95, 0.95 * min(drawn, expected) / expected)
        return fraction, entry.segments_done, len(entry.segments)

    def _regenerate(self, entry: Synthesis, segment: Segment) -> None:
        """Send a segment the quality gate flagged back to the engine with another seed."""
        self.gates.regenerated += 1
        segment.attempt += 1
        segment.seed = segment_seed(entry.seed, segment.index, segment.attempt)
        segment.output = segment.samples = segment.quality = None
        logger.info("quality gate: generating segment %d of %s again", segment.index, entry.request.request_id)
        self.engine.add([segment])

    def _note_sharing(self) -> None:
        for entry in self.in_flight.values():
            entry.shared_with = max(entry.shared_with, len(self.in_flight))


def _heard_better(attempt: Attempt, than: Attempt) -> bool:
    """Whether an attempt heard wrong is a better one to keep: one the other checks passed first (noise
    can be heard as a few right words), then the fewer errors."""

    def rank(candidate: Attempt) -> tuple[bool, float]:
        other_flags = any(flag != "asr_mismatch" for flag in candidate.quality.flags)
        return other_flags, candidate.quality.asr.error_rate

    return rank(attempt) < rank(than)


def _cancelled(request: SynthesisRequest) -> JobCancelled:
    return JobCancelled(f"request {request.request_id} was cancelled")
