"""The engine process's record of a request on its way through the pipeline: a *synthesis*.

Made by ``prepare``, held by the pipeline while the engine and the vocoder work on its segments, and
read by ``finish`` into the request's result. A job's handle (worker.engine_process.batcher) lives
from the job's arrival to its outcome; each time its request goes through the synthesizer (again,
in isolation, after a failed step) is a new synthesis of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from chattts_farm.contract import SynthesisRequest
from worker.engine.segment import Segment
from worker.engine.segment import SegmentStatus as Status
from worker.engine_process.streaming import RequestStream


@dataclass(eq=False)
class Synthesis:
    """One request's way through the synthesizer: its segments, voice and audio seed, and what it has cost so far."""

    request: SynthesisRequest
    number: int  # unique within the synthesizer: its segments' ``owner``
    seed: int
    embedding: str | None  # the speaker embedding it speaks in; None for a reference clip's speaker sample
    segments: list[Segment]
    # Samples of silence before each segment and after the last (see worker.results.joined).
    silences: list[int]
    started: float = field(default_factory=time.perf_counter)
    text_s: float = 0.0
    decode_s: float = 0.0
    generated_at: float | None = None
    shared_with: int = 1  # the most requests in flight together while this one was
    stream: RequestStream | None = None  # how its audio goes out as it is drawn, when it streams

    @property
    def segments_done(self) -> int:
        return sum(1 for segment in self.segments if segment.quality is not None and segment.status is Status.FINISHED)
