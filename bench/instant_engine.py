"""An engine process that answers every job at once: the worker's Celery side measured without a GPU.

``CHATTTS_FARM_ENGINE_MODULE=bench.instant_engine`` makes a worker start this instead of
worker.engine_process.main. It speaks the same channel (worker.channel): it says ``ready``, and answers
each ``submit`` at once with a result of the speech its text is expected to last (a quiet tone), a
streaming job's audio in chunks of CHUNK_S instead. No model, no torch: what the worker then spends on
a job (its thread, Redis, the audio store, encoding) is the Celery side's own cost, which
bench/celery_side.py reports.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from chattts_farm.contract import MIME_TYPES, SynthesisRequest
from chattts_farm.settings import Settings
from chattts_farm.speech_length import TOKENS_PER_SECOND, expected_tokens
from worker.audio import SAMPLE_RATE
from worker.channel import Channel, float32_bytes, listen
from worker.results import SynthesisResult, timeline

CHUNK_S = 0.5
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


def serve(channel: Channel) -> None:
    """Answer the channel's jobs until the Celery process at its other end goes."""
    channel.send("ready", model=MODEL, pid=os.getpid())
    chunk = int(CHUNK_S * SAMPLE_RATE)
    while True:
        try:
            message = channel.receive()
        except EOFError:
            return
        if message["kind"] != "submit":
            continue
        job, now, wall = message["job"], time.monotonic(), time.time()
        request = SynthesisRequest.from_arguments(message["arguments"], max_text_chars=10**6, request_id=job)
        result = result_for(request)
        if message["stream"]:
            # As the engine does: a stream's audio goes out in chunks, and its result carries none.
            samples = result.pieces[0]
            for start in range(message["sent_samples"], samples.size, chunk):
                channel.send("audio", job=job, segment=0, pcm=float32_bytes(samples[start : start + chunk]))
            result.pieces = None
        channel.send("finished", job=job, started_at=now, started_wall=wall, result=result.as_message())


def accept(listener) -> None:
    while True:
        threading.Thread(target=serve, args=(Channel.accept(listener),), daemon=True).start()


def main(argv: list[str]) -> None:
    # The GPU's other Celery processes, if any, connect where the worker's settings say.
    socket_path = Settings.from_env().engine_socket
    if socket_path:
        threading.Thread(target=accept, args=(listen(socket_path),), daemon=True).start()
    serve(Channel.from_fd(int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
