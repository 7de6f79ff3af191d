"""Where one of the ASR listener's batches spends its time: Whisper's spectrograms, its encoder (op by op as
Whisper runs it, and compiled as the decoder runs it on CUDA), and the rest of the batch (the decoding
steps and the text), each timed alone; then the kernels of one whole batch, the busiest first.

    python -m bench.asr_listener --device cuda --clips 68 --whisper-model synthetic-tiny
    python -m bench.asr_listener --device cpu --clips 2 --repeat 1

From the repository root (``bench`` is not an installed package). The gate's cost beside the engine is the
GPU time of the listener's kernels (docs/quality-gate.md): this says which of them to make cheaper, without
an engine beside. The clips are noise of the standard workload's lengths (5-15 s, ``--seconds``) and its
texts; with random weights (``synthetic-tiny``, ``synthetic-base``) each decode ends after its text's
tokens, as ``bench.asr_cost``'s do. 68 clips is the listener's batch on an H100 beside the engine.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.device import operations_table, synchronize
from bench.standard import seconds_range
from bench.workload import standard_requests
from chattts_farm.settings import Settings
from worker.asr.backends import SYNTHETIC_WHISPER_DIMS, Whisper, load_whisper
from worker.asr.greedy import CompiledEncoder
from worker.audio import SAMPLE_RATE
from worker.model.loading import pick_device


def ms_each(device: torch.device, repeat: int, work: Callable[[], object]) -> float:
    """Milliseconds of wall a call of ``work`` takes, the device's work included, after one call to warm up."""

    with torch.no_grad():
        work()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeat):
            work()
        synchronize(device)
    return (time.perf_counter() - start) / repeat * 1000


def noise_clips(count: int, seconds: tuple[float, float], seed: int = 0) -> list[np.ndarray]:
    draw = np.random.default_rng(seed)
    return [
        (0.1 * draw.standard_normal(int(draw.uniform(*seconds) * SAMPLE_RATE))).astype(np.float32) for _ in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--whisper-model", default="synthetic-tiny", help="ASR_WHISPER_MODEL, as bench.asr_cost.")
    parser.add_argument("--clips", type=int, default=68, help="Clips of the batch.")
    parser.add_argument("--seconds", type=seconds_range, default=(5.0, 15.0), help="Speech per clip, LOW-HIGH s.")
    parser.add_argument("--repeat", type=int, default=5, help="Calls timed of each phase (after one to warm up).")
    parser.add_argument("--kernels", type=int, default=25, help="Rows of the whole batch's kernel table.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    settings = Settings.from_env(device=arguments.device, asr="whisper", asr_whisper_model=arguments.whisper_model)
    device = pick_device(settings.device)
    model = load_whisper(settings.asr_whisper_model, device)
    stand_in = settings.asr_whisper_model in SYNTHETIC_WHISPER_DIMS
    backend = Whisper(model, device, arguments.clips, stand_in=stand_in)
    clips = noise_clips(arguments.clips, arguments.seconds)
    texts = [request.text for request in standard_requests(arguments.clips)]
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    mels = backend.log_mels(clips, SAMPLE_RATE)
    compiled = CompiledEncoder(model, dtype)

    def op_by_op() -> torch.Tensor:
        return model.encoder(mels.to(dtype))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{arguments.whisper_model} on {name} (torch {torch.__version__}), {arguments.clips} clips a batch\n")
    steps_before = backend.decoding_steps
    batch_ms = ms_each(device, arguments.repeat, lambda: backend.transcribe_batch(clips, SAMPLE_RATE, texts))
    steps = (backend.decoding_steps - steps_before) / (arguments.repeat + 1)
    phases = {
        "spectrograms": ms_each(device, arguments.repeat, lambda: backend.log_mels(clips, SAMPLE_RATE)),
        "encoder, op by op": ms_each(device, arguments.repeat, op_by_op),
        "encoder, compiled": ms_each(device, arguments.repeat, lambda: compiled(mels)),
    }
    # The decoder encodes compiled on CUDA, op by op elsewhere (worker.asr.greedy).
    encoder_used = phases["encoder, compiled" if device.type == "cuda" else "encoder, op by op"]
    print("| phase | ms a batch |\n|---|---:|")
    print(f"| the whole batch (what the listener runs) | {batch_ms:.2f} |")
    for phase, ms in phases.items():
        print(f"| {phase} | {ms:.2f} |")
    rest = batch_ms - phases["spectrograms"] - encoder_used
    print(f"| the rest: {steps:.1f} decoding steps, the text | {rest:.2f} |")
    if rest < 0:
        print("\nThe rest is the batch less phases timed alone. Below zero, the machine is busy: raise --repeat.")

    def transcribe() -> None:
        with torch.no_grad():
            backend.transcribe_batch(clips, SAMPLE_RATE, texts)

    sort_by, table = operations_table(transcribe, device, arguments.kernels, name_width=70)
    print(f"\nthe whole batch's operations and kernels, by {sort_by}:")
    print(table)


if __name__ == "__main__":
    main()
