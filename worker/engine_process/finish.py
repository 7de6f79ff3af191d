"""A request's result, made from its synthesis once every segment of it is done.

The last step of the engine process's pipeline (worker.engine_process.pipeline): the segments' audio
(joined and encoded later, by whoever reads it: the worker's Celery side; a streamed request's went out
as it was drawn, and its result carries none), the timings of its phases,
the quality gate's verdicts, and the GPU memory the step that finished it saw.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from chattts_farm.contract import MIME_TYPES
from worker.audio import SAMPLE_RATE
from worker.engine_process.synthesis import Synthesis
from worker.results import SynthesisResult, timeline


def finish(entry: Synthesis, *, model: dict, memory: dict) -> SynthesisResult:
    """A synthesis whose segments are all done, as its request's result (``model``: the model's
    description, ``memory``: :func:`memory_report`)."""
    if entry.stream is None:
        pieces = [segment.samples for segment in entry.segments]
        sizes = [piece.size for piece in pieces]
    else:  # its audio went out as it was drawn: the receiver has it
        pieces, sizes = None, entry.stream.sizes()
    segment_times = timeline(sizes, entry.silences, SAMPLE_RATE, [segment.caption for segment in entry.segments])
    flags = sorted({flag for s in entry.segments for flag in s.quality.flags})
    timings = {
        "text_s": entry.text_s,
        "generate_s": entry.generated_at - entry.started - entry.text_s - entry.decode_s,
        "decode_s": entry.decode_s,
    }
    return SynthesisResult(
        request_id=entry.request.request_id,
        pieces=pieces,
        silences=entry.silences,
        format=entry.request.format,
        mime_type=MIME_TYPES[entry.request.format],
        sample_rate=SAMPLE_RATE,
        duration_s=round((sum(sizes) + sum(entry.silences)) / SAMPLE_RATE, 3),
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
        model=model,
        memory=memory,
        timeline=segment_times,
    )


def reset_memory_stats(device: torch.device) -> None:
    """Start the peaks :func:`memory_report` reads afresh."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_report(device: torch.device) -> dict:
    """Peak GPU memory since the last reset; fragmentation is the share of reserved memory not in use.

    Read once for all the requests that finish together: each read of torch's statistics builds
    them all (~0.25 ms on an H200's host), and at full load hundreds of requests finish a second.
    """
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    allocated, reserved = stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]
    return {
        "peak_allocated_mb": round(stats["allocated_bytes.all.peak"] / 2**20, 1),
        "peak_reserved_mb": round(stats["reserved_bytes.all.peak"] / 2**20, 1),
        "fragmentation": round(1 - allocated / reserved, 4) if reserved else 0.0,
    }
