"""The ASR gate's thread beside the engine: segments' audio in, what was heard in it out.

Recognising a segment takes far longer than one engine step (pocketsphinx ~0.1 s a sentence on a
core, Whisper a forward pass of its own), so it must not run on the engine's thread: the pipeline
hands each finished attempt over with ``submit`` and goes on stepping; the thread recognises them one
at a time, in order, and ``collect`` gives the verdicts back on the engine's thread. Recognising
several segments in one batch (Whisper's forward pass over padded rows) is not done yet.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

from worker.asr.backends import Backend
from worker.asr.text import error_rate, normalise
from worker.audio import SAMPLE_RATE
from worker.engine.segment import AsrCheck, Attempt, Segment

logger = logging.getLogger(__name__)


@dataclass
class Heard:
    """An attempt at a segment, back from the listener; ``check`` is None when the recogniser failed."""

    segment: Segment
    attempt: Attempt
    check: AsrCheck | None


class Listener:
    def __init__(self, backend: Backend, max_error_rate: float):
        self.backend = backend
        self.max_error_rate = max_error_rate
        self._asked: queue.SimpleQueue[tuple[Segment, Attempt]] = queue.SimpleQueue()
        self._heard: queue.SimpleQueue[Heard] = queue.SimpleQueue()
        self.pending = 0  # attempts submitted and not yet collected
        threading.Thread(target=self._listen, name="asr", daemon=True).start()

    def hears(self, text: str) -> bool:
        """Whether a segment of this text can be checked: something to say, in a language the backend knows."""
        return bool(normalise(text)) and self.backend.hears(text)

    def submit(self, segment: Segment, attempt: Attempt) -> None:
        self.pending += 1
        self._asked.put((segment, attempt))

    def collect(self, wait_s: float = 0.0) -> list[Heard]:
        """The attempts heard since the last call; with ``wait_s``, waits that long for the first."""
        heard = []
        try:
            heard.append(self._heard.get(timeout=wait_s) if wait_s else self._heard.get_nowait())
            while True:
                heard.append(self._heard.get_nowait())
        except queue.Empty:
            pass
        self.pending -= len(heard)
        return heard

    def _listen(self) -> None:
        while True:
            segment, attempt = self._asked.get()
            self._heard.put(Heard(segment, attempt, self._check(segment, attempt)))

    def _check(self, segment: Segment, attempt: Attempt) -> AsrCheck | None:
        try:
            heard = self.backend.transcribe(attempt.samples, SAMPLE_RATE, segment.text)
        except Exception:  # noqa: BLE001 - a recogniser's failure leaves the segment unchecked, never fails its job
            logger.exception("ASR failed on segment %d of request %s", segment.index, segment.request.request_id)
            return None
        rate = error_rate(normalise(segment.text), normalise(heard))
        return AsrCheck(self.backend.name, segment.text, heard, round(rate, 4), rate <= self.max_error_rate)
