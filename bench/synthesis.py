"""Benchmark the synthesis core: serial vs batched, against stock ChatTTS, on one model and device.

    python -m bench.synthesis --model synthetic-full --batches 1,8,32,128 --serial 4 --stock 2

Run it from the repository root (``bench`` is not an installed package; ``python -m`` puts the root on
the path, or set ``PYTHONPATH``).

Every request speaks a text the synthetic length rule turns into ``--tokens`` audio tokens, so all
rows of a batch run the same number of GPT steps (random weights never end on their own; stock
ChatTTS gets ``min_new_token == max_new_token`` for the same reason). Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from dataclasses import dataclass

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first

from bench.device import synchronize  # noqa: E402
from bench.workload import stock_infer, text_for_tokens  # noqa: E402
from chattts_farm.contract import SynthesisRequest  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from chattts_farm.speech_length import expected_tokens  # noqa: E402
from worker.engine_process.pipeline import Synthesizer  # noqa: E402


@dataclass
class Measurement:
    mode: str
    requests: int
    audio_s: float
    wall_s: float
    steps: int
    generate_s: float | None  # the GPT loop's share of wall_s (farm runs)
    peak_allocated_mib: float
    peak_reserved_mib: float

    @property
    def audio_per_wall(self) -> float:
        return self.audio_s / self.wall_s

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.wall_s / self.steps

    @property
    def gpt_ms_per_step(self) -> float | None:
        return None if self.generate_s is None else 1000 * self.generate_s / self.steps


def measure(device: torch.device, mode: str, requests: int, steps: int, run) -> Measurement:
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    audio_s, generate_s = run()
    synchronize(device)
    wall_s = time.perf_counter() - started
    allocated = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    reserved = torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else 0.0
    return Measurement(mode, requests, audio_s, wall_s, steps, generate_s, allocated, reserved)


def farm_requests(count: int, tokens: int, first_voice: int) -> list[SynthesisRequest]:
    return [
        SynthesisRequest(text=text_for_tokens(tokens, i), voice=first_voice + i, seed=i, request_id=f"bench-{i}")
        for i in range(count)
    ]


def run_farm(synthesizer: Synthesizer, requests: list[SynthesisRequest]) -> tuple[float, float]:
    """One synthesize call: (audio seconds, seconds in the GPT loop)."""
    outcomes = synthesizer.synthesize(requests)
    failures = [o for o in outcomes if isinstance(o, Exception)]
    if failures:
        raise RuntimeError(f"benchmark request failed: {failures[0]}")
    return sum(o.duration_s for o in outcomes), outcomes[0].timings["generate_s"]


def run_farm_serially(synthesizer: Synthesizer, requests: list[SynthesisRequest]) -> tuple[float, float]:
    totals = [run_farm(synthesizer, [request]) for request in requests]
    return sum(audio for audio, _ in totals), sum(gpt for _, gpt in totals)


def run_stock(synthesizer: Synthesizer, count: int, tokens: int) -> tuple[float, None]:
    """Stock ChatTTS: one ``Chat.infer`` call per request, as its own web UI and API run it."""
    requests = [SynthesisRequest(text=text_for_tokens(tokens, i), voice=1000 + i, seed=i) for i in range(count)]
    return sum(stock_infer(synthesizer.model.chat, request, tokens) for request in requests), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-tiny")
    parser.add_argument("--batches", default="1,8,32,128", help="Requests per call for the batched runs.")
    parser.add_argument("--serial", type=int, default=4, help="Requests run one per call (0 to skip).")
    parser.add_argument("--stock", type=int, default=2, help="Requests through stock ChatTTS (0 to skip).")
    parser.add_argument("--tokens", type=int, default=235, help="Audio tokens per request (235 = 5 s).")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", help="Also write the measurements to this file.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    batches = [int(b) for b in arguments.batches.split(",") if b]
    settings = Settings.from_env(
        model=arguments.model,
        device=arguments.device,
        max_segments_per_pass=max(batches + [1]),
        slots=max(batches + [1]),
        quality_retries=0,
    )
    synthesizer = Synthesizer.load(settings)
    info = synthesizer.model.info
    device = synthesizer.model.device
    tokens = expected_tokens(text_for_tokens(arguments.tokens, 0), 5)
    run_farm(synthesizer, farm_requests(max(batches + [1]), tokens, 500))  # warm up at the largest size

    results: list[Measurement] = []
    if arguments.stock:
        run_stock(synthesizer, 1, tokens)  # its own warm-up
        results.append(
            measure(
                device,
                "stock ChatTTS, serial",
                arguments.stock,
                arguments.stock * tokens,
                lambda: run_stock(synthesizer, arguments.stock, tokens),
            )
        )
    if arguments.serial:
        requests = farm_requests(arguments.serial, tokens, 0)
        results.append(
            measure(
                device,
                "farm, serial (1 per call)",
                arguments.serial,
                arguments.serial * tokens,
                lambda: run_farm_serially(synthesizer, requests),
            )
        )
    for batch in batches:
        # Each batch size runs twice with new voices and seeds: the first call meets new tensor
        # shapes (kernel selection), the second shows the steady state.
        for attempt, label in enumerate(("first call", "repeat")):
            requests = farm_requests(batch, tokens, 1000 * (attempt + 1))
            results.append(
                measure(
                    device,
                    f"farm, batched ({batch} per call, {label})",
                    batch,
                    tokens,
                    lambda requests=requests: run_farm(synthesizer, requests),
                )
            )

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"\nmodel {info.source} ({info.kind}, {info.scale or 'real'}), device {info.device} ({gpu}), "
        f"GPT dtype {info.dtype}, torch {torch.__version__}, {tokens} tokens = "
        f"{tokens / 46.875:.2f} s of audio per request\n"
    )
    print(
        "| mode | requests | audio s | wall s | audio-s per wall-s | wall ms per step | GPT-loop ms per step "
        "| peak alloc MiB | peak reserved MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for m in results:
        gpt = "-" if m.gpt_ms_per_step is None else f"{m.gpt_ms_per_step:.1f}"
        print(
            f"| {m.mode} | {m.requests} | {m.audio_s:.1f} | {m.wall_s:.2f} | {m.audio_per_wall:.1f} | "
            f"{m.ms_per_step:.1f} | {gpt} | {m.peak_allocated_mib:.0f} | {m.peak_reserved_mib:.0f} |"
        )
    if arguments.json:
        with open(arguments.json, "w") as handle:
            json.dump(
                {
                    "model": info.as_dict(),
                    "gpu": gpu,
                    "tokens": tokens,
                    "results": [
                        {
                            **m.__dict__,
                            "audio_per_wall": m.audio_per_wall,
                            "ms_per_step": m.ms_per_step,
                            "gpt_ms_per_step": m.gpt_ms_per_step,
                        }
                        for m in results
                    ],
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
