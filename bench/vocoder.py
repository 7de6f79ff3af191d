"""The vocoder at speed: today's fp32 windows against the farm's path, and what it costs the GPT beside it.

    python -m bench.vocoder --model synthetic-full --device cuda --rows 256 --per-call 8,256 --slots 512
    python -m bench.vocoder --model synthetic-tiny --device cpu --rows 8 --per-call 4 --slots 8

Rows of the standard workload's lengths (5-15 s, random unit-scale hidden states, as the GPT's norm
gives) are decoded in calls of ``--per-call`` rows, one after another, then synchronised; each way
runs once untimed (the graphs' capture) and its median of three is printed:

- ``fp32, 4-context windows (before)``: the vocoder before issue 21: ChatTTS's modules in float32
  (``torch.istft``, which waits for the host), every row in windows of 4 receptive fields, half kept;
- ``fp32 / bf16, few windows, eager``: the farm's windows (a row of up to 16 receptive fields whole, padded
  to the window step; a longer one in few windows), ChatTTS's modules op by op;
- ``bf16, few windows, graphs``: those in CUDA graphs (the farm's path before the fused ConvNeXt blocks);
- ``bf16, fused, eager / graphs``: the ConvNeXt blocks channels-last with the fused Triton kernel
  (worker.vocoder.convnext), op by op and in CUDA graphs (the farm's path on CUDA).

decoded audio-s/s counts every window's frames, kept audio-s/s the rows' own; max abs diff is against
the first way's audio. With ``--launch-sweep``, the fused eager way again under each launch setting of
the fused kernel (frames a program, warps), fastest first. Then the GPT's decode step alone and while
the farm's vocoder decodes ``--per-call`` rows before each step on a stream of its own, as the
engine's thread does.

With ``--batch-costs``, only what one call of the farm's vocoder costs for a batch of windows of each
size and count (rows of exactly a window's frames, so that each call is one batch), and the least-squares
fit of those times to a cost a batch and a cost a frame decoded (graph buckets' padding included):
what a batch costs in frames (worker.vocoder.vocoder's choice of shared window sizes rests on it).

    python -m bench.vocoder --model synthetic-full --device cuda --batch-costs

With ``--profile``, only one call of the farm's vocoder over the first ``--per-call`` rows under
torch.profiler. On CUDA, its GPU kernels (the call run once before, for its graphs) and the rate of its
matrix products: the networks' linear layers and dense convolutions (the depthwise ones are the fused
kernel's) in FLOPs a mel frame, times the windows' mel frames (their graph buckets' padding not counted),
over the time of the kernels that run them (cuBLAS's and cuDNN's: names with gemm, nvjet, xmma or
cutlass; not the fused kernel, convolve_and_normalise). Where the vocoder's GPU time goes: arithmetic,
memory traffic, or neither. Then, on any device, the same call op by op (no graphs), its ATen operations
by their time: the names a graph's kernels do not carry.

    python -m bench.vocoder --model synthetic-full --device cuda --profile --per-call 24 --batch-costs
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import time
from collections.abc import Callable
from unittest import mock

from worker.cuda import configure_allocator

configure_allocator()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.decode_step import print_kernels, profiled_kernels  # noqa: E402
from bench.device import operations_table, synchronize  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from chattts_farm.speech_length import TOKENS_PER_SECOND  # noqa: E402
from worker.engine_process.pipeline import Synthesizer  # noqa: E402
from worker.vocoder import convnext  # noqa: E402
from worker.vocoder.convnext import ChannelsLastBlock  # noqa: E402
from worker.vocoder.vocoder import WINDOW_STEP_FRAMES, Vocoder, Window, batch_bucket  # noqa: E402

BEFORE_WINDOW_CONTEXTS = 4


def windows_before(frames: int, size: int, context: int) -> list[Window]:
    """The plan of the vocoder before issue 21 (at e4fca89): windows of ``size``, half of each kept."""
    if frames <= size:
        return [Window(0, frames, 0, frames, frames)] if frames else []
    windows = [Window(0, size, 0, size - context, size)]
    while windows[-1].keep_stop < frames:
        keep_start = windows[-1].keep_stop
        start = keep_start - context
        if start + size >= frames:
            windows.append(Window(frames - size, frames, keep_start, frames, size))
        else:
            windows.append(Window(start, start + size, keep_start, start + size - context, size))
    return windows


@torch.inference_mode()
def decode_before(synthesizer: Synthesizer, rows: list[torch.Tensor], per_batch: int) -> tuple[list[np.ndarray], int]:
    """The rows' audio as the vocoder before issue 21 made it, and the frames it decoded."""
    chat, vocoder = synthesizer.model.chat, synthesizer.vocoder
    size, context, per_frame = (
        BEFORE_WINDOW_CONTEXTS * vocoder.context_frames,
        vocoder.context_frames,
        vocoder.samples_per_frame,
    )
    plans = [windows_before(states.shape[0], size, context) for states in rows]
    by_length: dict[int, list[tuple[int, int, Window]]] = {}
    for row, plan in enumerate(plans):
        for index, window in enumerate(plan):
            by_length.setdefault(window.stop - window.start, []).append((row, index, window))
    pieces: list[list[np.ndarray | None]] = [[None] * len(plan) for plan in plans]
    for windows in by_length.values():
        for first in range(0, len(windows), per_batch):
            batch = windows[first : first + per_batch]
            stacked = torch.stack([rows[row][window.start : window.stop] for row, _, window in batch]).float()
            audio = chat.vocos.decode(chat.decoder(stacked.transpose(1, 2).contiguous())).float().cpu().numpy()
            for (row, index, window), samples in zip(batch, audio, strict=True):
                keep = slice(
                    (window.keep_start - window.start) * per_frame, (window.keep_stop - window.start) * per_frame
                )
                pieces[row][index] = samples[keep]
    decoded = sum(window.stop - window.start for plan in plans for window in plan)
    return [np.concatenate(row_pieces) for row_pieces in pieces], decoded


def median_seconds(run: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    run()  # untimed: first shapes, graph captures
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def in_calls(rows: list[torch.Tensor], per_call: int) -> list[list[torch.Tensor]]:
    return [rows[first : first + per_call] for first in range(0, len(rows), per_call)]


def batch_costs(vocoder: Vocoder, width: int, dtype: torch.dtype, device: torch.device) -> None:
    """A call's time for one batch of each window size and count, and the fit of those times to
    ``a + b x frames decoded``."""
    step, longest = WINDOW_STEP_FRAMES, vocoder.max_window_frames  # a multiple of the step
    sizes = sorted({size for size in (step * 2, step * 4, step * 7, step * 11) if size < longest} | {longest})
    print("| window frames | windows | frames decoded | ms a call |\n|---:|---:|---:|---:|")
    frames, seconds = [], []
    generator = torch.Generator().manual_seed(1)
    for size in sizes:
        most = vocoder.windows_per_batch(size)
        for count in sorted({min(count, most) for count in (1, 3, 8, 24, 64)}):
            rows = [torch.randn(size, width, generator=generator).to(device, dtype) for _ in range(count)]
            plan = vocoder.plan(size)
            assert len(plan) == 1 and plan[0].size == size, "a row of a window's frames is that one window"
            taken = median_seconds(lambda rows=rows: vocoder.launch(rows).result(), device, repeats=5)
            # Graphs run a batch padded to its bucket; op by op, the windows there are.
            decoded = (batch_bucket(count, most) if vocoder.graphs is not None else count) * size
            frames.append(decoded)
            seconds.append(taken)
            print(f"| {size} | {count} | {decoded:,} | {1000 * taken:.2f} |", flush=True)
    (per_batch, per_frame), *_ = np.linalg.lstsq(
        np.stack([np.ones(len(frames)), np.array(frames, dtype=float)], axis=1), np.array(seconds), rcond=None
    )
    print(
        f"fit: {1000 * per_batch:.3f} ms a batch, {1e6 * per_frame:.3f} ms per 1,000 frames: a batch costs "
        f"{per_batch / per_frame:,.0f} frames",
        flush=True,
    )


MATMUL_KERNEL_MARKS = ("gemm", "nvjet", "xmma", "cutlass")
PROFILED_OPERATIONS = 25


def matmul_flops_per_mel_frame(network: torch.nn.Module) -> int:
    """Twice the weights a mel frame is multiplied by: every linear layer's and every dense convolution's
    (all of the vocoder's run at the mel rate); the depthwise convolutions are not matrix products."""
    weights = 0
    for module in network.modules():
        if isinstance(module, ChannelsLastBlock):
            weights += module.weight_in.numel() + module.weight_out.numel()
        elif isinstance(module, torch.nn.Linear) or (isinstance(module, torch.nn.Conv1d) and module.groups == 1):
            weights += module.weight.numel()
    return 2 * weights


def profile_call(vocoder: Vocoder, eager: Vocoder, rows: list[torch.Tensor], device: torch.device) -> None:
    """The GPU kernels of one call of ``vocoder`` over ``rows`` and its matrix products' rate (CUDA), then
    the operations of the same call run op by op by ``eager``, which name what the kernels ran."""
    frames = sum(window.size for states in rows for window in vocoder.plan(states.shape[0]))
    if device.type == "cuda":
        vocoder.launch(rows).result()  # first shapes, graph captures
        wall, kernels = profiled_kernels(lambda: vocoder.launch(rows).result(), device)
        title = f"one call of {len(rows)} rows, {frames:,} frames in windows, {1000 * wall:.2f} ms wall"
        print_kernels(title, kernels, 1)
        matmuls = [kernel for kernel in kernels if any(mark in kernel.name.lower() for mark in MATMUL_KERNEL_MARKS)]
        matmul_us = sum(kernel.device_time for kernel in matmuls)
        flops = matmul_flops_per_mel_frame(vocoder.network) * 2 * frames  # two mel frames a hidden state
        print(
            f"matrix products: {flops / 1e9:,.1f} GFLOP in {matmul_us / 1000:.2f} ms of kernels, "
            f"{flops / max(matmul_us, 1e-9) / 1e6:,.0f} TFLOPS",
            flush=True,
        )
    eager.launch(rows).result()
    sort_by, table = operations_table(lambda: eager.launch(rows).result(), device, PROFILED_OPERATIONS, name_width=60)
    print(f"\nthe same call op by op, its operations by {sort_by}:")
    print(table)


def launch_sweep(vocoder: Vocoder, rows: list[torch.Tensor], per_calls: list[int], device: torch.device) -> None:
    """The fused eager vocoder's kept audio-s/s under each launch setting of its kernel, fastest first."""
    kept_s = sum(states.shape[0] for states in rows) / TOKENS_PER_SECOND
    print("\n| rows per call | frames a program | warps | kept audio-s/s |\n|---:|---:|---:|---:|")
    for per_call in per_calls:
        calls = in_calls(rows, per_call)
        timings = []
        for tile, warps in itertools.product((4, 8, 16, 32), (1, 2, 4, 8)):
            with mock.patch.object(convnext, "_LAUNCH", {"TILE_T": tile, "num_warps": warps}):
                seconds = median_seconds(lambda calls=calls: [vocoder.launch(c).result() for c in calls], device)
            timings.append((seconds, tile, warps))
        for seconds, tile, warps in sorted(timings):
            print(f"| {per_call} | {tile} | {warps} | {kept_s / seconds:,.0f} |", flush=True)


def gpt_beside_vocoder(
    synthesizer: Synthesizer, slots: int, steps: int, rows_per_step: list[torch.Tensor]
) -> tuple[float, float]:
    """A decode step of ``slots`` slots, ``steps`` times; with ``rows_per_step``, the vocoder launches them
    before every step on a stream of its own, as the engine's thread does. The steps' milliseconds each
    (to the last step's end), and the vocoder's kept audio-s/s over the whole run (to its last audio)."""
    runner, device = synthesizer.engine.runner, synthesizer.model.device
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    launched = []
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        if rows_per_step and stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                launched.append(synthesizer.vocoder.launch(rows_per_step))
        elif rows_per_step:
            launched.append(synthesizer.vocoder.launch(rows_per_step))
        runner.decode_step(slots, runner.context)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    stepped = time.perf_counter() - started
    for decode in launched:
        decode.result()
    frames = steps * sum(states.shape[0] for states in rows_per_step)
    return 1000 * stepped / steps, frames / TOKENS_PER_SECOND / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rows", type=int, default=256, help="Rows decoded by each way.")
    parser.add_argument("--per-call", default="8,256", help="Rows per vocoder call, comma-separated.")
    parser.add_argument("--slots", type=int, default=512, help="The engine's slots (the GPT step's rows).")
    parser.add_argument("--steps", type=int, default=50, help="Decode steps timed alone and beside the vocoder.")
    parser.add_argument("--beside", default="1,8", help="Rows the vocoder decodes before each step, comma-separated.")
    parser.add_argument("--launch-sweep", action="store_true", help="Time the fused kernel's launch settings too.")
    parser.add_argument(
        "--batch-costs", action="store_true", help="Only time one batch of each window size and count, and fit."
    )
    parser.add_argument("--profile", action="store_true", help="Only profile one call of the first --per-call rows.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    settings = Settings.from_env(
        model=arguments.model,
        device=arguments.device,
        slots=arguments.slots,
        max_segments_per_pass=arguments.slots,
    )
    synthesizer = Synthesizer.load(settings)
    model, device = synthesizer.model, synthesizer.model.device
    width = model.chat.config.gpt.hidden_size
    if arguments.batch_costs:
        batch_costs(synthesizer.vocoder, width, model.chat.gpt.gpt.dtype, device)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(
        round(5 * TOKENS_PER_SECOND), round(15 * TOKENS_PER_SECOND) + 1, (arguments.rows,), generator=generator
    )
    rows = [
        torch.randn(int(frames), width, generator=generator).to(device, model.chat.gpt.gpt.dtype) for frames in lengths
    ]
    if arguments.profile:
        eager = Vocoder(model, settings.max_segments_per_pass, graphs=False)
        profile_call(synthesizer.vocoder, eager, rows[: int(arguments.per_call.split(",")[0])], device)
    if arguments.batch_costs or arguments.profile:
        return
    kept_frames = int(lengths.sum())
    per_batch = settings.max_segments_per_pass
    ways = {
        "fp32, few windows, eager": Vocoder(model, per_batch, dtype=torch.float32, graphs=False, fused=False),
        "bf16, few windows, eager": Vocoder(model, per_batch, dtype=torch.bfloat16, graphs=False, fused=False),
    }
    if device.type == "cuda":
        ways["bf16, few windows, graphs"] = Vocoder(model, per_batch, dtype=torch.bfloat16, fused=False)
        ways["bf16, fused, eager"] = Vocoder(model, per_batch, dtype=torch.bfloat16, graphs=False, fused=True)
        # The synthesizer's own, whose graphs the GPT's steps below then find captured.
        ways["bf16, fused, graphs"] = synthesizer.vocoder
    print(
        f"{arguments.rows} rows of {int(lengths.min())}-{int(lengths.max())} frames "
        f"({kept_frames / TOKENS_PER_SECOND:.0f} audio-s), context {synthesizer.vocoder.context_frames} frames, "
        f"{synthesizer.vocoder.network.dtype} network",
        flush=True,
    )
    print("| way | rows per call | decoded audio-s/s | kept audio-s/s | kept share | max abs diff (peak) |")
    print("|---|---:|---:|---:|---:|---:|")
    reference, decoded_before = decode_before(synthesizer, rows, per_batch)
    peak = max(float(np.abs(samples).max()) for samples in reference)
    for per_call in [int(count) for count in arguments.per_call.split(",")]:
        calls = in_calls(rows, per_call)
        seconds = median_seconds(
            lambda calls=calls: [decode_before(synthesizer, call, per_batch) for call in calls], device
        )
        print(
            f"| fp32, {BEFORE_WINDOW_CONTEXTS}-context windows (before) | {per_call} | "
            f"{decoded_before / TOKENS_PER_SECOND / seconds:,.0f} | {kept_frames / TOKENS_PER_SECOND / seconds:,.0f} | "
            f"{kept_frames / decoded_before:.2f} | 0 ({peak:.3f}) |",
            flush=True,
        )
        for name, vocoder in ways.items():
            decoded = sum(window.size for states in rows for window in vocoder.plan(states.shape[0]))

            def run(vocoder=vocoder, calls=calls):
                launched = [vocoder.launch(call) for call in calls]
                return [samples for decode in launched for samples in decode.result()]

            seconds = median_seconds(run, device)
            difference = max(float(np.abs(new - old).max()) for new, old in zip(run(), reference, strict=True))
            print(
                f"| {name} | {per_call} | {decoded / TOKENS_PER_SECOND / seconds:,.0f} | "
                f"{kept_frames / TOKENS_PER_SECOND / seconds:,.0f} | {kept_frames / decoded:.2f} | "
                f"{difference:.1e} ({peak:.3f}) |",
                flush=True,
            )
    if synthesizer.vocoder.graphs is not None:
        print(f"graphs captured: {len(synthesizer.vocoder.graphs)}")
    if arguments.launch_sweep and "bf16, fused, eager" in ways:
        per_calls = [int(count) for count in arguments.per_call.split(",")]
        launch_sweep(ways["bf16, fused, eager"], rows, per_calls, device)

    print("\n| GPT decode step | vocoder rows per step | ms per step | vocoder kept audio-s/s |\n|---|---:|---:|---:|")
    runner = synthesizer.engine.runner
    for slots in sorted({min(64, runner.slots), runner.slots}):
        gpt_beside_vocoder(synthesizer, slots, 5, [])
        for per_step in [0, *(int(count) for count in arguments.beside.split(","))]:
            step, audio = gpt_beside_vocoder(synthesizer, slots, arguments.steps, rows[:per_step])
            print(f"| {slots} slots | {per_step} | {step:.2f} | {audio:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
