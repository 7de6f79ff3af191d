"""Where the synthesizer's time goes on the standard workload: prefill, decode steps, vocoder, finishing.

    python -m bench.engine_phases --model synthetic-full --device cuda --jobs 1536 --kv-dtypes model,fp8
    python -m bench.engine_phases --model synthetic-tiny --device cpu --jobs 8 --kv-dtypes model --seconds 1-2

For each KV cache dtype: loads the model, warms up on a workload of other jobs, runs the workload once
untimed by phase (its audio-s per wall-s) and once with every phase timed (each phase call is
bracketed by device synchronisations, which serialise what would overlap, so the phases add up to
a little more than the untimed wall), then times the decode step alone at 1, 64 and all slots. The
untimed pass also keeps a timeline of host timestamps (no synchronisation): how long ``add`` took, and
the wall its synthesizer steps took by how many segments were running when each began (0: the first
step, which admits the first segments, and the steps after the last segment, with only the
vocoder's and the finishing's work left), with their decode steps and how long the engine's thread
waited in them for the device (reading the steps' snapshots; collecting the vocoder's audio, its
handling on the host included), the host's time in two of its own tasks (launching the prefill
passes; handing finished rows to the vocoder, which launches their decoding) and the garbage
collector's pauses: a row whose steps cost more than their decode steps should, with little of it
waiting, is the host's.

``--streamed`` gives every request a callback for its audio (which drops it), as the farm's streamed jobs
have: the vocoder then decodes each segment a piece at a time while it is drawn, beside the decode
steps, instead of whole once it has ended (most of them in the workload's tail, with fewer rows
running). Against a run without, it says what decoding audio as it is drawn costs or saves the engine.

``--profile-run`` adds, after the untimed pass, two more whole workloads: the first (on CUDA) in
torch's synchronisation debug mode (every place the host waited for the device without asking to,
by count: the host waiting so lets the GPU run dry behind it); the second under ``cProfile`` from
the first step that begins with fewer segments running than a step before it: the host's functions
over the workload's tail, where fewer rows leave the GPU less to do beside the host's work for each
segment that ends.

``--profile-steps N`` adds, between the two passes, a look at N synthesizer steps in the middle of
another workload (after 20 steps, with the slots taken): on CUDA the GPU's kernels under
``torch.profiler`` (their GPU time per step beside the steps' wall time), then the host's
Python functions under ``cProfile`` over the next N steps (by their own time, then with their
callees'): what a step spends beside the device; and on CUDA, the attention of the first layer
timed at the slots' state of that moment under other launch settings (tile, warps, stages, products
on the tensor cores or not, split width, programs a slot and head) against the one chosen, each with
the largest difference of its output from the chosen one's (over the largest output).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import itertools
import logging
import pstats
import sys
import time
import types
import warnings
from collections.abc import Callable

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first

from bench.decode_step import (  # noqa: E402
    copy_bandwidth,
    launch_settings,
    print_kernels,
    profiled_kernels,
    time_attention,
)
from bench.device import free_memory, synchronize  # noqa: E402
from bench.standard import seconds_range  # noqa: E402
from bench.workload import STANDARD_SEGMENT_CHARS, standard_requests  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from worker.engine import attention  # noqa: E402
from worker.engine.blocks import BLOCK_POSITIONS  # noqa: E402
from worker.engine.engine import encode_prompt  # noqa: E402
from worker.engine_process import pipeline  # noqa: E402
from worker.engine_process.pipeline import Synthesizer  # noqa: E402


class PhaseTimer:
    """Wraps methods of live objects so that each call's wall time adds to its phase (a name, or a
    function that names the phase as the call begins); ``synchronised``, each call is bracketed by
    device synchronisations."""

    def __init__(self, device: torch.device, *, synchronised: bool = True):
        self.device = device
        self.synchronised = synchronised
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._wrapped: list[tuple[object, str]] = []
        self._collector_callbacks: list[Callable] = []

    def time(self, owner: object, method: str, phase: str | Callable[[], str]) -> None:
        real = getattr(owner, method)

        def timed(*arguments, **keywords):
            name = phase if isinstance(phase, str) else phase()
            if self.synchronised:
                synchronize(self.device)
            started = time.perf_counter()
            try:
                return real(*arguments, **keywords)
            finally:
                if self.synchronised:
                    synchronize(self.device)
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        # Another wrapper may have put the method on the object itself: removing this one puts that one back.
        own = isinstance(owner, types.ModuleType) or method in vars(owner)
        setattr(owner, method, timed)
        self._wrapped.append((owner, method, real, own))

    def time_collections(self, phase: Callable[[], str]) -> None:
        """Add the garbage collector's pauses to the phase ``phase()`` names as each ends (as "<phase> gc"),
        counting the full ones (generation 2) as calls."""
        started = 0.0

        def note(event: str, info: dict) -> None:
            nonlocal started
            if event == "start":
                started = time.perf_counter()
                return
            name = f"{phase()} gc"
            self.seconds[name] += time.perf_counter() - started
            self.calls[name] += info["generation"] == 2

        gc.callbacks.append(note)
        self._collector_callbacks.append(note)

    def remove(self) -> None:
        """Unwrap every method this timer wrapped (an object's own method falls back to its class's, or to
        what the object held before) and stop timing the garbage collector."""
        for note in self._collector_callbacks:
            gc.callbacks.remove(note)
        self._collector_callbacks.clear()
        for owner, method, real, own in reversed(self._wrapped):
            if own:
                setattr(owner, method, real)
            else:
                delattr(owner, method)
        self._wrapped.clear()


def count_prompt_tokens(synthesizer: Synthesizer) -> collections.Counter:
    """Counts, as the engine cuts its prefill passes, their prompts, their tokens and the tokens they
    take with each pass padded to its token bucket."""
    engine, runner = synthesizer.engine, synthesizer.engine.runner
    counts: collections.Counter[str] = collections.Counter()
    cut = engine._prefill_passes

    def counted(admitted):
        passes = cut(admitted)
        for prefill_pass in passes:
            lengths = [len(encode_prompt(engine.model, segment)) for segment in prefill_pass]
            counts["prompts"] += len(lengths)
            counts["tokens"] += sum(lengths)
            counts["padded"] += runner.prefill_bucket(sum(lengths))
        return passes

    engine._prefill_passes = counted
    return counts


# The timeline's rows: synthesizer steps by the segments running when they began, up to each bound.
TIMELINE_BOUNDS = (0, 64, 256, 512, 1024, 1536, 2048, 4096)


def running_label(index: int) -> str:
    """The timeline's row for steps that began with segments running up to TIMELINE_BOUNDS[index]."""
    return "0" if index == 0 else f"{TIMELINE_BOUNDS[index - 1] + 1}-{TIMELINE_BOUNDS[index]}"


def timeline(synthesizer: Synthesizer) -> PhaseTimer:
    """An unsynchronised timer of the synthesizer's ``add`` and its steps by the segments running when each
    began; within each row, its decode steps (launches), the engine thread's two waits for the device:
    reading a step's snapshot (the decode steps') and collecting the vocoder's audio (with its handling
    on the host, and, with the engine out of work, the wait for the oldest launch), two of the host's
    tasks: the prefill passes' launches and the vocoder's (handing it finished rows), and the garbage
    collector's pauses."""
    row = "0"

    def step_began() -> str:
        nonlocal row
        running = synthesizer.engine.running
        row = running_label(next(i for i, bound in enumerate(TIMELINE_BOUNDS) if running <= bound))
        return row

    timer = PhaseTimer(synthesizer.model.device, synchronised=False)
    timer.time(synthesizer, "add", "add")
    timer.time(synthesizer, "step", step_began)
    timer.time(synthesizer.engine, "_decode_step", lambda: f"{row} decode")
    timer.time(synthesizer.engine.runner, "read_snapshot", lambda: f"{row} snapshot")
    timer.time(synthesizer.decoder, "collect", lambda: f"{row} audio")
    timer.time(synthesizer.engine, "_prefill", lambda: f"{row} prefill")
    timer.time(synthesizer.decoder, "submit", lambda: f"{row} submit")
    timer.time_collections(lambda: row)
    return timer


def print_timeline(timer: PhaseTimer) -> None:
    print(f"  timeline: add {timer.seconds['add']:.2f} s; synthesizer steps by segments running when they began:")
    print(
        "  | running | steps | wall s | decode steps | wall ms a decode step | reading snapshots s "
        "| collecting audio s | prefill launches s | vocoder launches s | collecting garbage s (full passes) |\n"
        "  |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name in map(running_label, range(len(TIMELINE_BOUNDS))):
        if timer.calls[name]:
            decode_steps = timer.calls[f"{name} decode"]
            per_step = f"{1000 * timer.seconds[name] / decode_steps:.2f}" if decode_steps else "-"
            print(
                f"  | {name} | {timer.calls[name]} | {timer.seconds[name]:.2f} | {decode_steps} | {per_step} "
                f"| {timer.seconds[f'{name} snapshot']:.3f} | {timer.seconds[f'{name} audio']:.3f} "
                f"| {timer.seconds[f'{name} prefill']:.3f} | {timer.seconds[f'{name} submit']:.3f} "
                f"| {timer.seconds[f'{name} gc']:.3f} ({timer.calls[f'{name} gc']}) |"
            )


def audio_per_wall(
    synthesizer: Synthesizer,
    jobs: int,
    seed: int,
    seconds: tuple[float, float],
    bandwidth: float | None = None,
    *,
    streamed: bool = False,
) -> tuple[float, float]:
    """The workload's wall seconds and audio-s per wall-s, each request streamed or not; given the
    device's copy bandwidth (bytes a second), also prints what its KV cache reads alone allow
    (:func:`kv_cache_reads`)."""
    # Made before the clock starts: writing 1,536 texts is the client's work (~0.25 s), not the engine's.
    requests = standard_requests(jobs, seed=seed, seconds=seconds)
    started = time.perf_counter()
    outcomes = synthesizer.synthesize(requests, on_audio=dropping_audio(len(requests)) if streamed else None)
    wall = time.perf_counter() - started
    audio_s = sum(outcome.duration_s for outcome in outcomes)
    if bandwidth:
        reads = kv_cache_reads(synthesizer, requests, [outcome.tokens for outcome in outcomes])
        floor = reads / bandwidth
        print(
            f"  its decode steps read {reads / 1e12:.1f} TB of KV cache: {floor:.2f} s at the copy bandwidth "
            f"measured at start ({bandwidth / 1e9:,.0f} GB/s), so at most {audio_s / floor:,.0f} audio-s "
            "per wall-s with nothing else to do"
        )
    return wall, audio_s / wall


def dropping_audio(count: int) -> list:
    """A callback for each of ``count`` streamed requests that takes their audio and drops it."""

    def drop(index: int, samples) -> None:
        pass

    return [drop] * count


def kv_cache_reads(synthesizer: Synthesizer, requests: list, tokens: list[int]) -> int:
    """The bytes of KV cache the decode steps of requests that drew ``tokens`` each read: a segment's
    decode step t attends its prompt and the t positions after it (step 0 is the prefill's), which is
    all the attention reads. A request's tokens are shared among its segments by their expected lengths
    (the standard workload's requests are one segment each)."""
    keys = synthesizer.engine.runner.keys  # (layers, blocks, kv heads, block positions, head dim)
    per_position = 2 * keys.shape[0] * keys.shape[2] * keys.shape[4] * keys.element_size()
    positions = 0
    for number, (request, drawn) in enumerate(zip(requests, tokens, strict=True)):
        segments = synthesizer.preparer.prepare(number, request).segments
        expected = sum(segment.expected_tokens for segment in segments)
        for segment in segments:
            steps = round(drawn * segment.expected_tokens / expected) - 1
            prompt = len(encode_prompt(synthesizer.model, segment))
            positions += steps * prompt + steps * (steps + 1) // 2
    return positions * per_position


def profile_steps(synthesizer: Synthesizer, steps: int, jobs: int, seconds: tuple[float, float]) -> None:
    """The GPU kernels and the host's functions of ``steps`` synthesizer steps at full load (see the module's doc)."""
    device = synthesizer.model.device
    synthesizer.add(standard_requests(jobs, seed=3, seconds=seconds))
    for _ in range(20):
        synthesizer.step()
    if device.type == "cuda":

        def run_steps():
            for _ in range(steps):
                synthesizer.step()

        wall, kernels = profiled_kernels(run_steps, device)
        print_kernels(f"  {steps} synthesizer steps at full load, {1000 * wall / steps:.1f} ms each", kernels, steps)
        live_attention(synthesizer)
    host = cProfile.Profile()
    host.enable()
    for _ in range(steps):
        synthesizer.step()
    host.disable()
    for order, meaning in (("tottime", "own time"), ("cumulative", "time with callees")):
        print(f"  the host over {steps} steps (cProfile, by {meaning}):", flush=True)
        pstats.Stats(host).sort_stats(order).print_stats(25)
    while synthesizer.in_flight:
        synthesizer.step()


def profile_run(synthesizer: Synthesizer, jobs: int, seconds: tuple[float, float]) -> None:
    """A whole workload with the implicit synchronisations counted, then another under cProfile (see the
    module's doc)."""
    device = synthesizer.model.device
    if device.type == "cuda":
        places: collections.Counter[tuple] = collections.Counter()

        def note_sync(message, category, filename, lineno, file=None, line=None):
            # Frames, not traceback.extract_stack: that reads each frame's source line, too slow for a
            # warning that may come thousands of times.
            frame, ours = sys._getframe(1), []
            while frame is not None and len(ours) < 3:
                if _is_ours(frame.f_code.co_filename):
                    ours.append((_short(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name))
                frame = frame.f_back
            places[tuple(ours)] += 1

        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note_sync
            torch.cuda.set_sync_debug_mode("warn")
            try:
                synthesizer.synthesize(standard_requests(jobs, seed=4, seconds=seconds))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        print(
            f"  a whole workload in torch's sync debug mode ({time.perf_counter() - started:.2f} s): the host "
            f"waited for the device unasked {sum(places.values())} times; by place (innermost first):"
        )
        for frames, count in places.most_common(15):
            print(f"  | {count} | " + " < ".join(f"{name}:{line} {function}" for name, line, function in frames) + " |")
    host = cProfile.Profile()
    real_step, most_running, profiling = synthesizer.step, 0, False

    def step():
        nonlocal most_running, profiling
        running = synthesizer.engine.running
        if not profiling and running < most_running:
            host.enable()
            profiling = True
        most_running = max(most_running, running)
        return real_step()

    synthesizer.step = step
    try:
        synthesizer.synthesize(standard_requests(jobs, seed=5, seconds=seconds))
    finally:
        host.disable()
        del synthesizer.step
    for order, meaning in (("cumulative", "time with callees"), ("tottime", "own time")):
        print(f"  the host over the workload's tail (cProfile, by {meaning}):", flush=True)
        pstats.Stats(host).sort_stats(order).print_stats(40 if order == "cumulative" else 25)


def _is_ours(filename: str) -> bool:
    return any(f"/{package}/" in filename for package in ("worker", "bench", "chattts_farm"))


def _short(filename: str) -> str:
    return filename[max(filename.rfind(f"/{package}/") for package in ("worker", "bench", "chattts_farm")) + 1 :]


def live_attention(synthesizer: Synthesizer) -> None:
    """The first layer's decode attention at the slots' state now, under the chosen launch settings and
    others: microseconds a call and GB/s read (see the module's doc)."""
    runner, engine = synthesizer.engine.runner, synthesizer.engine
    rows = engine._bucket(engine.scheduler.rows_in_use)
    columns = torch.where(runner.finished[:rows], -1, runner.prompt_length[:rows] + runner.step[:rows] - 1)
    heads = runner.llama.config.num_attention_heads
    kv_heads, dim = runner.keys.shape[2], runner.keys.shape[4]
    query = torch.randn(rows, heads, 1, dim, device=runner.device, dtype=runner.llama.dtype)
    new_key, new_value = torch.randn(2, rows, kv_heads, 1, dim, device=runner.device, dtype=runner.llama.dtype)
    taking_part = columns[columns >= 0]
    read = int((taking_part + 1).sum()) * kv_heads * dim * runner.keys.element_size() * 2
    print(
        f"\n  layer 0's attention at the slots' state: {rows} rows, {taking_part.numel()} taking part, "
        f"mean context {float(taking_part.float().mean()) + 1:.0f}, {read / 1e9:.2f} GB read a call"
    )
    print(
        "  | split | programs a slot and head | tile | warps | stages | tensor cores | us a call | GB/s "
        "| largest difference |"
    )
    print("  |---:|---:|---:|---:|---:|---|---:|---:|---:|")
    size = min(runner.keys.element_size(), 2)
    table_context = runner.block_table.shape[1] * runner.keys.shape[3]
    chosen, chosen_split = attention._LAUNCH[size], attention.split_columns_for(rows, heads, table_context)
    # Rotating the query and the new key, as the runner's decode step calls the kernel.
    inputs = dict(
        query=query,
        new_key=new_key,
        new_value=new_value,
        keys=runner.keys[0],
        values=runner.values[0],
        block_table=runner.block_table[:rows],
        columns=columns,
        scale=runner._scale,
        rotary=runner.rotary,
    )
    # Each setting against the chosen one: what its way of multiplying and summing changes.
    chosen_output = attention.decode_attention(**inputs).float()

    def timed(split: int, programs: int | None, launch: dict) -> None:
        with launch_settings(size, launch):
            launched = {**inputs, "split_programs": programs, "split_columns": split}
            seconds = time_attention(launched, calls=10)
            shown = programs or attention.split_programs_for(rows, heads, attention.splits_for(table_context, split))
            output = attention.decode_attention(**launched).float()
        difference = float((output - chosen_output).abs().max() / chosen_output.abs().max())
        settings = f"{launch['TILE']} | {launch['num_warps']} | {launch['num_stages']} | {launch['TENSOR_CORES']}"
        print(
            f"  | {split} | {shown} | {settings} | {1e6 * seconds:.1f} | {read / seconds / 1e9:.0f} "
            f"| {difference:.1e} |",
            flush=True,
        )

    timed(chosen_split, None, chosen)
    tiles = [tile for tile in (32, 64, 128, 256) if tile <= chosen_split]
    for tensor_cores, tile, warps, stages in itertools.product((False, True), tiles, (1, 2, 4), (2, 3)):
        timed(
            chosen_split,
            None,
            {**chosen, "TILE": tile, "num_warps": warps, "num_stages": stages, "TENSOR_CORES": tensor_cores},
        )
    for split, programs in ((512, None), (256, None), (128, 1), (128, 2), (128, 4), (128, None), (64, None)):
        if split != chosen_split:
            timed(split, programs, {**chosen, "TILE": min(chosen["TILE"], split)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=1536)
    parser.add_argument("--slots", type=int, default=0, help="Engine slots (0: as many as the memory holds).")
    parser.add_argument(
        "--rows-per-pass", type=int, default=512, help="Most segments one prefill or vocoder pass takes."
    )
    parser.add_argument(
        "--kv-cache-gib", type=float, default=0.0, help="The KV cache's memory (0: the default budget)."
    )
    parser.add_argument("--kv-dtypes", default="model,fp8", help="KV cache dtypes to run, comma-separated.")
    parser.add_argument("--seconds", type=seconds_range, default=(5.0, 15.0), help="Speech per job, LOW-HIGH s.")
    parser.add_argument("--streamed", action="store_true", help="Every request streams its audio as it is drawn.")
    parser.add_argument("--profile-steps", type=int, default=0, help="Profile this many steps at full load.")
    parser.add_argument(
        "--profile-run", action="store_true", help="Profile whole workloads: the implicit syncs, the host."
    )
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # The engine's sizing and its warm-up's captures, each with the GPU memory it left.
    logging.getLogger("worker").setLevel(logging.INFO)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)
    # Measured before any model takes the memory it needs.
    bandwidth = (
        copy_bandwidth(torch.device("cuda"))
        if arguments.device in ("cuda", "auto") and torch.cuda.is_available()
        else None
    )

    for kv_dtype in arguments.kv_dtypes.split(","):
        settings = Settings.from_env(
            model=arguments.model,
            device=arguments.device,
            max_segment_chars=STANDARD_SEGMENT_CHARS,
            quality_retries=0,
            slots=arguments.slots,
            max_segments_per_pass=arguments.rows_per_pass,
            kv_cache_gib=arguments.kv_cache_gib,
            kv_dtype=kv_dtype,
        )
        # Compiled from nothing, as in a worker's own process: dynamo keeps a function's compiled variants
        # (at most 8, its recompile limit) across engines, and the second engine of a call ran its draw
        # op by op past that limit.
        torch._dynamo.reset()
        synthesizer = Synthesizer.load(settings)
        device = synthesizer.model.device
        runner = synthesizer.engine.runner
        cache_gib = (runner.keys.nbytes + runner.values.nbytes) / 2**30
        print(
            f"KV cache {kv_dtype}: {runner.slots} slots of up to {runner.context} positions sharing "
            f"{runner.kv_blocks} blocks ({runner.kv_blocks * BLOCK_POSITIONS} positions, {cache_gib:.1f} GiB), "
            f"attention reads each slot's own positions: {runner.reads_own_columns}",
            flush=True,
        )
        # Warmed up on a whole workload of other jobs: a first pass at full load still finds new sizes
        # (the allocator's, the vocoder's batches), and a worker lives in the steady state after it.
        streamed = arguments.streamed
        audio_per_wall(synthesizer, arguments.jobs, 7, arguments.seconds, streamed=streamed)
        streamed_note = ", streamed" if streamed else ""
        steps_timer = timeline(synthesizer)
        wall, rate = audio_per_wall(synthesizer, arguments.jobs, 1, arguments.seconds, bandwidth, streamed=streamed)
        print(f"  {arguments.jobs} jobs: {wall:.2f} s, {rate:.1f} audio-s per wall-s (phases untimed{streamed_note})")
        steps_timer.remove()
        print_timeline(steps_timer)
        print(f"  segments preempted so far: {synthesizer.engine.preemptions}")
        if arguments.profile_run:
            profile_run(synthesizer, arguments.jobs, arguments.seconds)
        if arguments.profile_steps:
            profile_steps(synthesizer, arguments.profile_steps, arguments.jobs, arguments.seconds)

        timer = PhaseTimer(device)
        timer.time(synthesizer.engine, "_prefill", "prefill")
        timer.time(synthesizer.engine, "_decode_step", "decode step")
        # Timed with the device synchronised around it: the GPU time of the vocoder's work, which
        # untimed runs beside the decode steps on its own stream.
        timer.time(synthesizer.vocoder, "launch", "vocoder")
        timer.time(pipeline, "finish", "finish")
        timer.time(synthesizer, "step", "synthesizer step, in all")
        prompts = count_prompt_tokens(synthesizer)
        wall, rate = audio_per_wall(synthesizer, arguments.jobs, 2, arguments.seconds, streamed=streamed)
        del synthesizer.engine._prefill_passes
        # Unwrapped at once: the module function it wraps would hold this synthesizer (and its cache) past
        # this dtype's pass, and the next dtype's would find no memory for its own.
        timer.remove()
        print(f"  {arguments.jobs} jobs: {wall:.2f} s, {rate:.1f} audio-s per wall-s (phases timed{streamed_note})")
        print("  | phase | s | calls | ms per call |\n  |---|---:|---:|---:|")
        for phase, seconds in timer.seconds.most_common():
            calls = timer.calls[phase]
            print(f"  | {phase} | {seconds:.2f} | {calls} | {1000 * seconds / calls:.2f} |")
        prefill_s = timer.seconds["prefill"]
        print(
            f"  prefill: {prompts['prompts']} prompts, {prompts['tokens']:,} tokens ({prompts['padded']:,} padded "
            f"to their passes' buckets), {prompts['tokens'] / prefill_s:,.0f} prompt tokens/s"
        )

        for rows in sorted({1, min(64, runner.slots), runner.slots}):
            runner.decode_step(rows, runner.context)
            synchronize(device)
            started = time.perf_counter()
            for _ in range(20):
                runner.decode_step(rows, runner.context)
            synchronize(device)
            print(f"  decode step of {rows} slot(s): {1000 * (time.perf_counter() - started) / 20:.2f} ms")
        if device.type == "cuda":
            stats = torch.cuda.memory_stats(device)
            print(
                f"  allocated {stats['allocated_bytes.all.current'] / 2**30:.1f} GiB, "
                f"reserved {stats['reserved_bytes.all.current'] / 2**30:.1f} GiB, "
                f"segments {stats['segment.all.current']}",
                flush=True,
            )
        del synthesizer, runner
        free_memory(device)


if __name__ == "__main__":
    main()
