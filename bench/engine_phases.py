"""Where the synthesizer's time goes on the standard workload: prefill, decode steps, vocoder, finishing.

    python -m bench.engine_phases --model synthetic-full --device cuda --jobs 1536 --kv-dtypes model,fp8
    python -m bench.engine_phases --model synthetic-tiny --device cpu --jobs 8 --kv-dtypes model --seconds 1-2

For each KV cache dtype: loads the model, warms up on part of the workload, runs the workload once
untimed by phase (its audio-s per wall-s) and once with every phase timed (each phase call is
bracketed by device synchronisations, which serialise what would overlap, so the phases add up to
a little more than the untimed wall), then times the decode step alone at 1, 64 and all slots.
"""

from __future__ import annotations

import argparse
import collections
import gc
import logging
import time

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first

from bench.standard import seconds_range  # noqa: E402
from bench.workload import STANDARD_SEGMENT_CHARS, standard_requests  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from worker.synthesis import Synthesizer  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Wraps methods of live objects so that each call's wall time adds to its phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def time(self, owner: object, method: str, phase: str) -> None:
        real = getattr(owner, method)

        def timed(*arguments, **keywords):
            synchronize(self.device)
            started = time.perf_counter()
            try:
                return real(*arguments, **keywords)
            finally:
                synchronize(self.device)
                self.seconds[phase] += time.perf_counter() - started
                self.calls[phase] += 1

        setattr(owner, method, timed)


def audio_per_wall(synthesizer: Synthesizer, jobs: int, seed: int, seconds: tuple[float, float]) -> tuple[float, float]:
    started = time.perf_counter()
    outcomes = synthesizer.synthesize(standard_requests(jobs, seed=seed, seconds=seconds))
    wall = time.perf_counter() - started
    return wall, sum(outcome.duration_s for outcome in outcomes) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=1536)
    parser.add_argument("--slots", type=int, default=512)
    parser.add_argument("--kv-dtypes", default="model,fp8", help="KV cache dtypes to run, comma-separated.")
    parser.add_argument("--seconds", type=seconds_range, default=(5.0, 15.0), help="Speech per job, LOW-HIGH s.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    for kv_dtype in arguments.kv_dtypes.split(","):
        settings = Settings.from_env(
            model=arguments.model,
            device=arguments.device,
            max_segment_chars=STANDARD_SEGMENT_CHARS,
            quality_retries=0,
            max_running_rows=arguments.slots,
            max_rows_per_pass=arguments.slots,
            kv_dtype=kv_dtype,
        )
        synthesizer = Synthesizer.load(settings)
        device = synthesizer.model.device
        runner = synthesizer.engine.runner
        print(
            f"KV cache {kv_dtype}: {runner.slots} slots of {runner.context} positions, "
            f"attention reads each slot's own columns: {runner.reads_own_columns}",
            flush=True,
        )
        synthesizer.synthesize(standard_requests(min(arguments.jobs, 256), seed=7, seconds=arguments.seconds))
        wall, rate = audio_per_wall(synthesizer, arguments.jobs, 1, arguments.seconds)
        print(f"  {arguments.jobs} jobs: {wall:.2f} s, {rate:.1f} audio-s per wall-s (phases untimed)")

        timer = PhaseTimer(device)
        timer.time(synthesizer.engine, "_prefill", "prefill")
        timer.time(synthesizer.engine, "_decode_step", "decode step")
        # Timed with the device synchronised around it: the GPU time of the vocoder's work, which
        # untimed runs beside the decode steps on its own stream.
        timer.time(synthesizer.vocoder, "launch", "vocoder")
        timer.time(synthesizer, "_finish", "finish")
        timer.time(synthesizer, "step", "synthesizer step, in all")
        wall, rate = audio_per_wall(synthesizer, arguments.jobs, 2, arguments.seconds)
        print(f"  {arguments.jobs} jobs: {wall:.2f} s, {rate:.1f} audio-s per wall-s (phases timed)")
        print("  | phase | s | calls | ms per call |\n  |---|---:|---:|---:|")
        for phase, seconds in timer.seconds.most_common():
            calls = timer.calls[phase]
            print(f"  | {phase} | {seconds:.2f} | {calls} | {1000 * seconds / calls:.2f} |")

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
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
