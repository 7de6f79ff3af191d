"""An engine process that answers every job at once: the worker's Celery side measured without a GPU.

``CHATTTS_FARM_ENGINE_MODULE=bench.instant_engine`` makes a worker start this instead of
worker.engine_process.main. It speaks the same channel (worker.channel): it says ``ready``, and answers
each ``submit`` at once with a result of the speech its text is expected to last (a quiet tone), a
streaming job's audio in chunks of CHUNK_S instead. No model, no torch: what the worker then spends on
a job (its thread, Redis, the audio store, encoding) is the Celery side's own cost, which
bench/celery_side.py reports.

With ``BENCH_INSTANT_ENGINE_HOLD_S`` set, each answer goes out that many seconds after its job arrived, as
a GPU's engine answers none of a burst's jobs in its first seconds: the burst's delivery to the engine is
then measured alone, without results flowing back beside it.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from chattts_farm.contract import MIME_TYPES, SynthesisRequest
from chattts_farm.settings import Settings
from chattts_farm.speech_length import TOKENS_PER_SECOND, expected_tokens
from worker.audio import SAMPLE_RATE
from worker.channel import Channel, float32_bytes, listen
from worker.results import SynthesisResult, timeline

CHUNK_S = 0.5
HOLD_ENV = "BENCH_INSTANT_ENGINE_HOLD_S"
MODEL = {"kind": "instant", "scale": None, "source": "bench.instant_engine", "device": "cpu", "dtype": "fp32"}
# A quiet 220 Hz tone, long enough for any job: each result is a slice of it.
TONE = (0.1 * np.sin(2 * np.pi * 220 * np.arange(120 * SAMPLE_RATE) / SAMPLE_RATE)).astype(np.float32)


def result_for(request: SynthesisRequest) -> SynthesisResult:
    tokens = expected_tokens(request.text, request.speed)
    samples = TONE[: int(tokens / TOKENS_PER_SECOND * SAMPLE_RATE)]
    return SynthesisResult(
        request_id=request.request_id,
        pieces=[samples],
        silences=[0, 0],
        format=request.format,
        mime_type=MIME_TYPES[request.format],
        sample_rate=SAMPLE_RATE,
        duration_s=round(samples.size / SAMPLE_RATE, 3),
        tokens=tokens,
        segments=1,
        seed=request.seed or 0,
        voice_embedding="",
        batch_size=1,
        timings={"text_s": 0.0, "generate_s": 0.0, "decode_s": 0.0},
        quality={"ok": True, "flags": [], "retried_segments": 0, "segments": []},
        model=MODEL,
        memory={},
        timeline=timeline([samples.size], [0, 0], SAMPLE_RATE, [request.text]),
    )


class Held:
    """Answers that go out ``hold_s`` after their jobs arrived, in the order they arrived, on one thread."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self._due: collections.deque[tuple[float, Callable[[], None]]] = collections.deque()
        self._waiting = threading.Condition()
        threading.Thread(target=self._answer, name="held-answers", daemon=True).start()

    def later(self, answer: Callable[[], None]) -> None:
        with self._waiting:
            self._due.append((time.monotonic() + self.hold_s, answer))
            self._waiting.notify()

    def _answer(self) -> None:
        while True:
            with self._waiting:
                while not self._due:
                    self._waiting.wait()
                due, answer = self._due[0]
                if time.monotonic() < due:
                    self._waiting.wait(due - time.monotonic())
                    continue
                self._due.popleft()
            answer()


def serve(channel: Channel, held: Held | None) -> None:
    """Answer the channel's jobs until the Celery process at its other end goes."""
    channel.send("ready", model=MODEL, pid=os.getpid())
    while True:
        try:
            message = channel.receive()
        except EOFError:
            return
        if message["kind"] != "submit":
            continue
        now, wall = time.monotonic(), time.time()
        request = SynthesisRequest.from_arguments(message["arguments"], max_text_chars=10**6, request_id=message["job"])
        answer = functools.partial(_answer, channel, message, request, now, wall)
        if held is None:
            answer()
        else:
            held.later(answer)


def _answer(channel: Channel, message: dict, request: SynthesisRequest, now: float, wall: float) -> None:
    """A submitted job's result (a streaming job's audio first), started at ``now`` (monotonic) and ``wall``."""
    job, result = message["job"], result_for(request)
    if message["stream"]:
        # As the engine does: a stream's audio goes out in chunks, and its result carries none.
        samples, chunk = result.pieces[0], int(CHUNK_S * SAMPLE_RATE)
        for start in range(message["sent_samples"], samples.size, chunk):
            channel.send("audio", job=job, segment=0, pcm=float32_bytes(samples[start : start + chunk]))
        result.pieces = None
    channel.send("finished", job=job, started_at=now, started_wall=wall, result=result.as_message())


def accept(listener, held: Held | None) -> None:
    while True:
        threading.Thread(target=serve, args=(Channel.accept(listener), held), daemon=True).start()


def main(argv: list[str]) -> None:
    hold_s = float(os.environ.get(HOLD_ENV) or 0)
    held = Held(hold_s) if hold_s > 0 else None
    # The GPU's other Celery processes, if any, connect where the worker's settings say.
    socket_path = Settings.from_env().engine_socket
    if socket_path:
        threading.Thread(target=accept, args=(listen(socket_path), held), daemon=True).start()
    serve(Channel.from_fd(int(argv[0])), held)


if __name__ == "__main__":
    main(sys.argv[1:])
