"""What the ASR gate costs the engine: the standard workload with the gate off and on, side by side, in one run.

    python -m bench.asr_cost --model synthetic-full --device cuda --jobs 1024 --asr off,whisper \\
        --whisper-model synthetic-tiny
    python -m bench.asr_cost --model synthetic-tiny --device cpu --jobs 2 --seconds 1-2 \\
        --asr off,whisper --whisper-model synthetic-tiny

From the repository root (``bench`` is not an installed package; ``python -m`` puts the root on the path).

The recognisers (``--asr``: ``off``, ``whisper``, ``offline``, comma-separated, in the order run) are
loaded first, on the engine's device, so that the engine sizes its cache around them as a worker's
does; then the model. For each: the synthesizer gets that recogniser's listener (none for ``off``),
warms up on a workload of other jobs, and runs the workload in one synthesize call, as
``bench.standard``'s "engine alone" does. A request is done once its segments are heard, so the
listener's time past the engine's last step counts in the wall.

Whisper's weights cannot be had everywhere: ``--whisper-model synthetic-tiny`` (or ``synthetic-base``)
is the real architecture with random weights, which costs what the real one costs per forward pass
and hears garbage. Every segment is then heard wrong; quality retries are off (as in
``bench.standard``), so it is reported, not generated again: the figures are the cost of listening.
Random weights never end a clip themselves, so how many tokens each decodes is a rule's
(``--whisper-length``, comma-separated, a run each): ``text`` (the default) ends each clip after its
text's tokens, as real weights end a segment said right; ``limit`` runs every decode to its limit (twice
the text's tokens and ten more), as real weights would only if every segment were heard as garbage
that goes on: the most the gate can cost.

``--timeline`` prints, for each run, ``bench.engine_phases``' timeline of the engine's thread (its steps by
the segments running when each began; within them, its decode step launches, its waits, the prefill's
and the vocoder's launches and the garbage collector's pauses): which of the thread's parts the
listener beside it lengthens.

``--runtime-calls`` records each run's timed workload with torch.profiler's CUDA activity and prints
the CUDA runtime's calls (graph launches, copies, event records and waits, ...) by thread: how many
and how long each took on the host. The engine's thread spends longer on the
host beside the listener without the listener holding the interpreter's lock (docs/performance.md);
this says whether its calls into the driver are what got slower. Beside them it prints the GPU's work
(kernels, copies, sets) by stream: how much, how long, its busiest kernels, and how long any stream
was busy: whether the gate's cost is the GPU time the listener's kernels take from the engine's, or the
host's. (On a CPU there are none.)

``--py-spy DIR`` samples this process with py-spy over each run's workload (native stacks, into DIR) and
prints where each thread was (bench.py_spy): whether the engine's thread's extra host time beside the
listener is its own Python, the driver's, or waiting for the interpreter's lock.

``--rounds N`` runs every choice N times in turn, then the gate off once more, and prints each gated run
against the mean of the runs with the gate off on either side of it, and the median over the rounds: one
pair of runs moves by a percent or two from call to call, which is the size of what the gate is judged by.

``--asr-batch`` (comma-separated) runs each recogniser once per most segments its listener hears at
once: ``--asr-batch 32,128`` says what a larger batch buys, in the same call.

Prints one Markdown table: the engine's audio-s/s with each choice and its ratio to the first
choice's, and what the listener did in the timed run: the segments it heard (one a job: none is
generated again), its batches, segments a batch, Whisper's decoding steps a batch (each a pass over
the batch's rows; a batch decodes until its longest clip ends), ms a batch, segments/s while busy, the share of
the wall it was busy, and how much of the wall came after the engine and the vocoder had finished
(the gate's tail, where it holds up the last requests; the rest of its cost is what it took from the
engine beside it). Of the engine's thread's wall, it prints the seconds spent waiting for the GPU's
work and the rest: what the listener takes from the engine shows as more waiting where it takes the
GPU, and as more of the rest where it takes the host's side (the interpreter's lock, the driver).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import platform
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first

from bench import py_spy  # noqa: E402
from bench.engine_phases import PhaseTimer, print_timeline, timeline  # noqa: E402
from bench.standard import WARM_UP_JOBS, cell, progress, run_engine, seconds_range, synthesize_timed  # noqa: E402
from bench.workload import STANDARD_SEGMENT_CHARS, standard_requests  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from worker.asr.backends import Backend, Whisper, load_backend  # noqa: E402
from worker.asr.listener import MAX_BATCH, Listener, ListenerFigures  # noqa: E402
from worker.engine import device_waits  # noqa: E402
from worker.engine_process.pipeline import Synthesizer  # noqa: E402
from worker.interpreter import SWITCH_INTERVAL_S  # noqa: E402
from worker.model.loading import pick_device  # noqa: E402

WORKLOAD_SEED = 0
WARM_UP_SEED = 1
CHOICES = ("off", "whisper", "offline")
WHISPER_LENGTHS = ("text", "limit")


@dataclasses.dataclass
class Run:
    asr: str
    jobs: int
    done: int
    audio_per_wall: float
    wall_s: float
    heard: ListenerFigures | None  # what the listener did in the timed run; None with the gate off
    decoding_steps: int | None  # Whisper's decoding steps in the timed run; None for another recogniser
    past_engine_s: float  # the wall after the engine and the vocoder had nothing left: the listener's tail
    waiting_for_device_s: float  # of the wall, the engine's thread waiting for the GPU's work
    timeline: PhaseTimer | None  # with --timeline, the engine's thread's parts over the timed run
    runtime_calls: RuntimeCalls | None  # with --runtime-calls, the CUDA runtime's calls over the timed run
    samples: list[Path]  # with --py-spy, py-spy's samples of this process over the timed run


def asr_choices(text: str) -> list[str]:
    choices = [choice.strip() for choice in text.split(",") if choice.strip()]
    unknown = [choice for choice in choices if choice not in CHOICES]
    if not choices or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: want some of {', '.join(CHOICES)}, comma-separated")
    return choices


def whisper_lengths(text: str) -> list[str]:
    lengths = [length.strip() for length in text.split(",") if length.strip()]
    if not lengths or any(length not in WHISPER_LENGTHS for length in lengths):
        raise argparse.ArgumentTypeError(f"{text!r}: want some of {', '.join(WHISPER_LENGTHS)}, comma-separated")
    return lengths


def comma_separated_numbers(text: str, number: type, acceptable: Callable[[float], bool], want: str) -> list:
    try:
        numbers = [number(part) for part in text.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers or not all(map(acceptable, numbers)):
        raise argparse.ArgumentTypeError(f"{text!r}: want {want}, comma-separated")
    return numbers


def switch_intervals(text: str) -> list[float]:
    return comma_separated_numbers(text, float, lambda interval: interval > 0, "milliseconds above 0")


def batch_sizes(text: str) -> list[int]:
    return comma_separated_numbers(text, int, lambda size: size >= 1, "whole numbers of 1 or more")


def rounds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want a whole number of 1 or more")
    return int(text)


@dataclasses.dataclass(frozen=True)
class DeviceWork:
    """A kernel, copy or set the GPU ran, as the profiler traced it (microseconds on its clock)."""

    stream: int  # the profiler's id of the stream it ran on
    name: str
    start_us: float
    end_us: float


def busy_s(work: list[DeviceWork]) -> float:
    """How long any of ``work`` was running: where two streams ran at once, that time counts once."""
    busy, end = 0.0, float("-inf")
    for item in sorted(work, key=lambda item: item.start_us):
        if item.end_us > end:
            busy += item.end_us - max(item.start_us, end)
            end = item.end_us
    return busy / 1e6


class RuntimeCalls:
    """The CUDA runtime's calls made over a stretch of work, by thread and call: how many, and how long
    each took on the host; and the GPU's work over it, by stream (torch.profiler's CUDA activity).
    Threads go by the ids the profiler gives them; the recording thread's own ids are printed beside
    them, to tell the engine's from the others."""

    def __init__(self):
        self.engine_thread = (threading.get_native_id(), threading.get_ident())
        self.calls: collections.Counter[tuple[int, str]] = collections.Counter()
        self.micros: collections.Counter[tuple[int, str]] = collections.Counter()
        self.device_work: list[DeviceWork] = []

    @contextlib.contextmanager
    def recording(self, device: torch.device):
        if device.type != "cuda":
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            yield
        for event in profiler.events():
            if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("cu"):
                self.calls[event.thread, event.name] += 1
                self.micros[event.thread, event.name] += event.cpu_time_total
            elif event.device_type == torch.autograd.DeviceType.CUDA:
                span = event.time_range
                self.device_work.append(DeviceWork(event.device_resource_id, event.name, span.start, span.end))

    def print(self, title: str, most: int = 8) -> None:
        native, ident = self.engine_thread
        print(f"\n{title} (the engine's thread: native id {native}, Python's {ident})")
        print("| thread | call | calls | host ms | mean us |")
        print("|---|---|---:|---:|---:|")
        by_thread: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for (thread, name), micros in self.micros.items():
            by_thread[thread][name] = micros
        for thread, calls in sorted(by_thread.items(), key=lambda item: -item[1].total()):
            for name, micros in calls.most_common(most):
                count = self.calls[thread, name]
                print(f"| {thread} | {name} | {count} | {micros / 1000:.1f} | {micros / count:.1f} |")

    def print_device_work(self, title: str, wall_s: float, most: int = 3) -> None:
        """The GPU's work by stream, the busiest first, and how long any stream was busy."""
        print(f"\n{title}: any stream busy {busy_s(self.device_work):.2f} s of the {wall_s:.2f} s wall")
        print("| stream | kernels, copies, sets | busy s | its busiest: name (s) |")
        print("|---|---:|---:|---|")
        by_stream: dict[int, list[DeviceWork]] = collections.defaultdict(list)
        for item in self.device_work:
            by_stream[item.stream].append(item)
        busy = {stream: busy_s(work) for stream, work in by_stream.items()}
        for stream, work in sorted(by_stream.items(), key=lambda item: -busy[item[0]]):
            seconds: collections.Counter[str] = collections.Counter()
            for item in work:
                seconds[item.name] += (item.end_us - item.start_us) / 1e6
            busiest = "; ".join(f"{name[:60]} ({spent:.3f})" for name, spent in seconds.most_common(most))
            print(f"| {stream} | {len(work)} | {busy[stream]:.3f} | {busiest} |")


def run(
    synthesizer: Synthesizer,
    asr: str,
    backend: Backend | None,
    max_batch: int,
    jobs: int,
    seconds,
    label: str,
    with_timeline: bool,
    with_runtime_calls: bool,
    py_spy_dir: Path | None = None,
) -> Run:
    listener = Listener(backend, synthesizer.settings.asr_max_error_rate, max_batch) if backend else None
    synthesizer.listener = listener
    progress(f"ASR {label}: warming up")
    synthesize_timed(synthesizer, standard_requests(min(jobs, WARM_UP_JOBS), seed=WARM_UP_SEED, seconds=seconds))
    before = dataclasses.replace(listener.figures) if listener else None
    steps_before = getattr(backend, "decoding_steps", None)
    progress(f"ASR {label}: the workload")
    tail = EngineTail(synthesizer)
    timer = timeline(synthesizer) if with_timeline else None
    runtime_calls = RuntimeCalls() if with_runtime_calls else None
    waited_before = device_waits.waited_s()
    slug = re.sub(r"\W+", "-", label)
    sampled = py_spy.recording([os.getpid()], py_spy_dir, f"asr-{slug}") if py_spy_dir else contextlib.nullcontext([])
    try:
        with (
            runtime_calls.recording(synthesizer.model.device) if runtime_calls else contextlib.nullcontext(),
            sampled as samples,
        ):
            result = run_engine(
                synthesizer, f"ASR {label}", standard_requests(jobs, seed=WORKLOAD_SEED, seconds=seconds)
            )
    finally:
        if timer is not None:
            timer.remove()
        tail.remove()
    heard = None
    if listener is not None:
        after = listener.figures
        heard = ListenerFigures(
            after.batches - before.batches, after.attempts - before.attempts, after.busy_s - before.busy_s
        )
    waited = device_waits.waited_s() - waited_before
    return Run(
        label,
        result.jobs,
        result.done,
        result.audio_per_wall,
        result.wall_s,
        heard,
        None if steps_before is None else backend.decoding_steps - steps_before,
        tail.seconds,
        waited,
        timer,
        runtime_calls,
        samples,
    )


class EngineTail:
    """Watches a synthesizer's steps: how long its last ones ran after the engine and the vocoder had
    nothing left (only verdicts of the ASR gate to wait for): what the gate added at the workload's end,
    as opposed to what it took from the engine beside it."""

    def __init__(self, synthesizer: Synthesizer):
        self.synthesizer = synthesizer
        self._engine_done_at: float | None = None
        self._last_step_end = 0.0
        step = synthesizer.step

        def watched():
            finished = step()
            self._last_step_end = time.perf_counter()
            if synthesizer.engine.has_work or synthesizer.decoder.pending:
                self._engine_done_at = None
            elif self._engine_done_at is None:
                self._engine_done_at = self._last_step_end
            return finished

        synthesizer.step = watched

    @property
    def seconds(self) -> float:
        return self._last_step_end - self._engine_done_at if self._engine_done_at is not None else 0.0

    def remove(self) -> None:
        del self.synthesizer.step


def print_table(runs: list[Run]) -> None:
    print(
        "| ASR | jobs | done | wall s | audio-s/s | vs the last run off | segments heard | listener batches "
        "| segments a batch | decoding steps a batch | ms a batch | listener segments/s | listener busy "
        "| past the engine s | engine waiting for the GPU s | engine's other s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    # Each run against the last run with the gate off before it (or the first run): runs of one setting
    # are compared with each other, and a repeated off,whisper pair with its own off.
    baseline = runs[0]
    for r in runs:
        heard = r.heard
        if heard is None:
            baseline = r
        batches = heard.batches if heard else 0
        cells = (
            r.asr,
            r.jobs,
            r.done,
            cell(r.wall_s, 2),
            cell(r.audio_per_wall, 1),
            cell(r.audio_per_wall / baseline.audio_per_wall, 3),
            heard.attempts if heard else "-",
            batches if heard else "-",
            cell(heard.attempts / batches if batches else None, 1),
            cell(r.decoding_steps / batches if batches and r.decoding_steps is not None else None, 1),
            cell(1000 * heard.busy_s / batches if batches else None, 1),
            cell(heard.attempts / heard.busy_s if heard and heard.busy_s else None, 1),
            cell(heard.busy_s / r.wall_s if heard else None, 3),
            cell(r.past_engine_s, 2),
            cell(r.waiting_for_device_s, 2),
            cell(r.wall_s - r.waiting_for_device_s, 2),
        )
        print("| " + " | ".join(str(c) for c in cells) + " |")


def shares_beside_the_gate_off(runs: list[Run]) -> dict[str, list[float]]:
    """Each gated run's throughput against the mean of the runs with the gate off on either side of it (the
    one before alone where none came after), by label, in the order run: a machine's drift over a call
    (its clocks, its heat, what it compiled) falls on both sides alike."""
    shares: dict[str, list[float]] = collections.defaultdict(list)
    offs = [index for index, r in enumerate(runs) if r.heard is None]
    for index, r in enumerate(runs):
        before = [i for i in offs if i < index]
        if r.heard is None or not before:
            continue
        beside = [runs[before[-1]]] + [runs[i] for i in offs if i > index][:1]
        shares[r.asr].append(r.audio_per_wall / statistics.mean(off.audio_per_wall for off in beside))
    return shares


def print_rounds(runs: list[Run]) -> None:
    print("\nthe gate against the gate off beside it, over the rounds (each run against the mean of the runs off")
    print("on either side of it):\n")
    print("| ASR | rounds | each round | median | least | most |")
    print("|---|---:|---|---:|---:|---:|")
    for label, shares in shares_beside_the_gate_off(runs).items():
        each = ", ".join(f"{share:.3f}" for share in shares)
        print(
            f"| {label} | {len(shares)} | {each} | {statistics.median(shares):.3f} | {min(shares):.3f} "
            f"| {max(shares):.3f} |"
        )


def ways(arguments: argparse.Namespace, backends: dict[str, Backend | None]):
    """(choice, its backend, the listener's largest batch, the run's label) of each run, in order: every
    round's, then with several rounds the gate off once more; a stand-in Whisper's backend is told where
    its decodes end just before its run (so this is read as it runs)."""
    several = len(arguments.asr_batch) > 1
    for _ in range(arguments.rounds):
        for asr in arguments.asr:
            backend = backends[asr]
            if backend is None:
                yield asr, None, arguments.asr_batch[0], asr
                continue
            stand_in = isinstance(backend, Whisper) and backend.stand_in
            for length in arguments.whisper_length if stand_in else [None]:
                for max_batch in arguments.asr_batch:
                    if length is not None:
                        backend.ends_with_text = length == "text"
                    parts = [asr]
                    if length == "limit":
                        parts.append("every decode to its limit")
                    if several:
                        parts.append(f"batches of {max_batch}")
                    yield asr, backend, max_batch, ", ".join(parts)
    if arguments.rounds > 1 and "off" in arguments.asr:
        yield "off", None, arguments.asr_batch[0], "off"  # what the last round's gated runs are set against


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=1024, help="Jobs of the workload, all submitted at once.")
    parser.add_argument(
        "--slots", type=int, default=0, help="Segments the engine runs at once (0: as many as the memory holds)."
    )
    parser.add_argument("--seconds", type=seconds_range, default=(5.0, 15.0), help="Speech per job, LOW-HIGH s.")
    parser.add_argument("--asr", type=asr_choices, default=["off", "whisper"], help="off, whisper, offline.")
    parser.add_argument(
        "--whisper-model",
        default="synthetic-tiny",
        help="ASR_WHISPER_MODEL for whisper: synthetic-tiny or synthetic-base (random weights), a name in "
        "Whisper's cache or a checkpoint's path.",
    )
    parser.add_argument(
        "--whisper-length",
        type=whisper_lengths,
        default=["text"],
        help="For random Whisper weights: where each decode ends, text (after the text's tokens) or limit "
        "(at its limit); several, comma-separated, run each.",
    )
    parser.add_argument(
        "--asr-batch",
        type=batch_sizes,
        default=[MAX_BATCH],
        help="Most segments the listener hears at once; several, comma-separated, run each.",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=switch_intervals,
        default=[SWITCH_INTERVAL_S * 1000],
        help="How long a thread that waits for the interpreter's lock waits before asking for it (sys."
        "setswitchinterval; the farm's own by default); several, comma-separated, run every choice with each.",
    )
    parser.add_argument(
        "--rounds",
        type=rounds,
        default=1,
        help="Run every choice this many times in turn, then the gate off once more, and print each gated "
        "run against the runs off on either side of it, and their median.",
    )
    parser.add_argument(
        "--timeline", action="store_true", help="Print the engine thread's timeline of each run (bench.engine_phases)."
    )
    parser.add_argument(
        "--runtime-calls",
        action="store_true",
        help="Print the CUDA runtime's calls of each run's workload, by thread (torch.profiler).",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="Sample this process with py-spy (native stacks) over each run's workload, into DIR, and print "
        "where each thread was (bench.py_spy); the sampling slows the runs.",
    )
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    settings = Settings.from_env(
        model=arguments.model,
        device=arguments.device,
        slots=arguments.slots,
        max_segment_chars=STANDARD_SEGMENT_CHARS,
        quality_retries=0,
        asr="off",
        asr_whisper_model=arguments.whisper_model,
    )
    device = pick_device(settings.device)
    backends = {
        asr: load_backend(
            dataclasses.replace(settings, asr=asr),
            synthetic=arguments.model.startswith("synthetic"),
            device=device,
            max_batch=max(arguments.asr_batch),
        )
        for asr in dict.fromkeys(arguments.asr)
    }
    progress(f"loading {arguments.model}")
    synthesizer = Synthesizer.load(settings)
    runs = []
    for interval_ms in arguments.switch_interval_ms:
        # After Synthesizer.load, which sets the farm's own.
        sys.setswitchinterval(interval_ms / 1000)
        runs.extend(
            run(
                synthesizer,
                asr,
                backend,
                max_batch,
                arguments.jobs,
                arguments.seconds,
                label=label if len(arguments.switch_interval_ms) == 1 else f"{label}, switch {interval_ms:g} ms",
                with_timeline=arguments.timeline,
                with_runtime_calls=arguments.runtime_calls,
                py_spy_dir=arguments.py_spy,
            )
            for asr, backend, max_batch, label in ways(arguments, backends)
        )

    info = synthesizer.model.info
    whisper_weights = (
        " (random weights: each decode ends after its text's tokens, unless its row says it ran to its limit)"
        if isinstance(backends.get("whisper"), Whisper) and backends["whisper"].stand_in
        else ""
    )
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    seconds = arguments.seconds
    print(
        f"\nmodel {info.source} ({info.kind}, {info.scale or 'real'}), device {info.device} ({gpu}), "
        f"torch {torch.__version__}; {arguments.jobs} jobs of {seconds[0]:g}-{seconds[1]:g} s of speech, "
        f"{synthesizer.engine.runner.slots} slots; Whisper {arguments.whisper_model}{whisper_weights}, the "
        f"listener's batches up to {', '.join(map(str, arguments.asr_batch))}; quality retries off\n"
    )
    print_table(runs)
    if arguments.rounds > 1:
        print_rounds(runs)
    for r in runs:
        if r.timeline is not None:
            print(f"\nthe engine's thread, ASR {r.asr}:")
            print_timeline(r.timeline)
        if r.runtime_calls is not None:
            r.runtime_calls.print(f"the CUDA runtime's calls over ASR {r.asr}'s workload, by thread")
            r.runtime_calls.print_device_work(f"the GPU's work over ASR {r.asr}'s workload, by stream", r.wall_s)
        for path in r.samples:
            print(f"\nwhere this process's threads were over ASR {r.asr}'s workload (py-spy):\n")
            print(py_spy.summary(path))


if __name__ == "__main__":
    main()
