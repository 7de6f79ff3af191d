"""Benchmark one GPT decode step: the eager DynamicCache loop against the engine's fixed-shape step.

    python bench/decode_step.py --model synthetic-full --device cuda --rows 1,64,512 --steps 256
    python bench/decode_step.py --model synthetic-tiny --device cpu --rows 1,8 --steps 24

For each row count, every row speaks the same kind of prompt and runs ``--steps`` steps with EOS
blocked (random weights never end on their own), after one untimed pass to warm up. Three ways:

- ``eager-dynamic``: transformers' LlamaModel called step by step with a DynamicCache and the farm's
  sampling, reading a stop flag back to the host every step, as the farm's loop did before the engine;
- ``engine-eager``: the engine (all rows in its slots), its step run op by op;
- ``engine-graph``: the same step replayed as CUDA graphs (CUDA only; captured in the warm-up pass).

``--matmul-dtypes model,fp8`` runs the engine's ways once more with ``CHATTTS_FARM_MATMUL_DTYPE=fp8``
(``engine-graph fp8-matmuls``): its steps of at least 256 rows multiply in float8, and the table at
rows either side of that says where float8 starts to pay.

ms/step is the decode steps' wall time over their number (the engine's first step, with the
prompts' prefill, is not in it);
audio-s/wall-s is the audio those steps make (rows x steps / 46.875 tokens a second) over that time.

On CUDA, ``--attention-rows`` (default 1,64,512,1024) adds a table of the decode attention kernel alone
(one layer, the GPT's heads and head size, each row's ``--context`` positions in blocks scattered over
one pool by its block table, as the engine's are) at the standard workload's contexts: each row's new
position drawn from 70 + U(0, 478), a mean of ~310. GB/s is the cache it reads (every row's keys and
values up to its position) over the kernel's time, replayed 20
calls to a CUDA graph; the copy bandwidth it is set against is measured first, in the same process, as
the bytes read and written by ``dst.copy_(src)`` of 2 GiB over its time (as a GPU's copy bandwidth is
counted).

``--sweep`` (CUDA) times the kernel at 1,024 rows under each launch setting (tile, warps; products on
the CUDA cores or the tensor cores) and prints the three fastest of each per cache dtype: how
``worker.engine.attention._LAUNCH`` was chosen. Pipeline stages are not swept: the kernel's loads go
through the block table, so Triton pipelines none of them, and every stage count compiles to the same
code (the same PTX for 1-4 stages, Triton 3.8 for sm_90a).

``--join-rows`` (any device; e.g. ``--join-rows 512,1024 --joining 64``) starts that many segments, times
``--join-rounds`` engine steps of them, then ``--joining`` more prompts join: the step they join at runs their
prefill before its decode steps, and the running rows wait for it. The table sets that step against the
steps after it, which run the same rows without a prefill: the spike a join puts into the running rows'
steps (issue 21). Every step is timed from an idle device to an idle device.

``--overlap-rows`` (CUDA) asks how much of a step's two kinds of work the GPU runs side by side: the
attention, bound by its reads of the cache, and the rest of each layer (its matmuls and the fused
elementwise work, compiled as the runner compiles them), bound by arithmetic. At each row count it
times, over all the GPT's layers and replayed from CUDA graphs: each kind alone; both one after the
other; both on two streams at once; and the rows cut in two halves, each half's attention beside the
other half's layer parts, a layer at a time (the two streams joined after each pair), against the same
halves in turn. The halves side by side against in turn are what a step split that way would gain
(as NanoFlow splits a batch); the attention reads the standard workload's contexts from an fp8 cache.

``--matmul-rows`` (CUDA) times a layer's four matmuls alone at each row count, 20 calls a CUDA graph: as
the runner runs them (``F.linear`` of the (out, in) weights, cuBLAS's "TN"); the same on cuBLASLt
(``torch.backends.cuda.preferred_blas_library``), which chooses its kernels by heuristics of its own; and
the same weights stored transposed ((in, out), ``x @ w``, "NN"), whose kernel cuBLAS chooses apart (on an
H100 it was faster at some row counts and slower at others: docs/performance.md); with
``--matmul-autotune``, also inductor's max-autotune of the matmul compiled for that static shape (its
Triton templates and cuBLAS, the fastest kept; each shape and row count tuned apart, ~a minute each).
A full-load profile found two of the four (likely the output and down projections, the two with 768
outputs) at 300-400 TFLOPS where gate-up ran at ~620: whether another kernel does better at those shapes.

``--profile-rows`` (CUDA) runs, under ``torch.profiler`` at each row count, one prefill of that many
prompts (its wall time too) and the engine's decode step op by op (compiled parts and all, no graph),
and prints their kernels, their GPU time, and the costliest.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import inspect
import itertools
import logging
import statistics
import time
from collections.abc import Callable, Iterator

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first
import torch.nn.utils.parametrize as parametrize  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

from bench.device import free_memory, synchronize  # noqa: E402
from chattts_farm.contract import SynthesisRequest  # noqa: E402
from chattts_farm.settings import Settings, SettingsError  # noqa: E402
from chattts_farm.speech_length import TOKENS_PER_SECOND  # noqa: E402
from worker.engine import attention  # noqa: E402
from worker.engine.attention import decode_attention, triton_available  # noqa: E402
from worker.engine.blocks import BLOCK_POSITIONS, blocks_for  # noqa: E402
from worker.engine.engine import SYNC_EVERY, Engine, embed_prompts, encode_prompt, row_sampling  # noqa: E402
from worker.engine.layers import (  # noqa: E402
    LayerShape,
    LayerWeights,
    after_attention,
    before_attention,
    fuse_layers,
)
from worker.engine.runner import rotary_table  # noqa: E402
from worker.engine.sampler import REPETITION_WINDOW, sample  # noqa: E402
from worker.engine.segment import Segment  # noqa: E402
from worker.engine.sizing import matmul_dtype  # noqa: E402
from worker.model.loading import LoadedModel, load_model  # noqa: E402

TEXT = "The farm reads this sentence aloud, again and again, to time one step of its GPT."


def segments_for(model: LoadedModel, rows: int, steps: int, first: int = 0) -> list[Segment]:
    """``rows`` segments of ``steps`` tokens each (EOS blocked), owners and seeds from ``first`` on."""
    width = model.chat.config.gpt.hidden_size
    request = SynthesisRequest.from_arguments({"text": TEXT}, max_text_chars=len(TEXT))
    return [
        Segment(
            owner=row,
            index=0,
            text=TEXT,
            request=request,
            speaker=torch.randn(width, generator=torch.Generator().manual_seed(row)),
            seed=row,
            expected_tokens=steps,
            max_tokens=steps,
            pinned=True,
        )
        for row in range(first, first + rows)
    ]


@torch.inference_mode()
def eager_dynamic(model: LoadedModel, segments: list[Segment], steps: int) -> float:
    """The seconds of ``steps`` decode steps of the pre-engine loop (transformers called directly)."""
    chat = model.chat
    llama = chat.gpt.gpt
    eos_token = chat.config.gpt.num_audio_tokens - 1
    embeddings, attention_mask = embed_prompts(model, segments)
    sampling = row_sampling(segments, model.device)
    eos_blocked = torch.ones(len(segments), dtype=torch.bool, device=model.device)
    with parametrize.cached():
        head_weights = torch.stack([head.weight for head in chat.embed.head_code]).float()
    cache_keyword = "cache" if "cache" in inspect.signature(llama.forward).parameters else "past_key_values"
    cache = DynamicCache()
    mask = attention_mask.bool()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    step_input = embeddings.to(llama.dtype)
    history = []
    started = None
    for step in range(steps + 1):
        if step == 1:  # step 0 is the prefill
            synchronize(model.device)
            started = time.perf_counter()
        hidden = llama(
            inputs_embeds=step_input,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_keyword: cache},
        ).last_hidden_state[:, -1]
        logits = torch.einsum("bh,qvh->bqv", hidden.float(), head_weights)
        recent = torch.stack(history[-REPETITION_WINDOW:], dim=1) if history else logits.new_zeros(0).long()
        recent = recent.view(len(segments), -1, logits.shape[1])
        tokens = sample(logits, recent, sampling, step, eos_token, eos_blocked)
        history.append(tokens)
        bool(tokens.eq(eos_token).any())  # the loop's per-step look at which rows ended
        step_input = (
            torch.stack([chat.embed.emb_code[q](tokens[:, q]) for q in range(tokens.shape[1])], dim=2)
            .sum(dim=2)
            .unsqueeze(1)
            .to(llama.dtype)
        )
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        positions = positions[:, -1:] + 1
    synchronize(model.device)
    return time.perf_counter() - started


def engine_for(
    model: LoadedModel, rows: int, steps: int, capture_graphs: bool, matmul_dtype: torch.dtype | None = None
) -> Engine:
    return Engine(
        model,
        slots=rows,
        max_admissions=rows,
        max_prompt_tokens=128,
        max_new_tokens=steps + SYNC_EVERY,
        capture_graphs=capture_graphs,
        matmul_dtype=matmul_dtype,
    )


def engine(engine: Engine, segments: list[Segment], steps: int) -> float:
    """The seconds of the engine's steps after the first (which runs the prefill), ``steps`` decode steps in all."""
    engine.add(segments)
    engine.step()
    synchronize(engine.model.device)
    started = time.perf_counter()
    for _ in range(steps // SYNC_EVERY):
        engine.step()
    synchronize(engine.model.device)
    elapsed = time.perf_counter() - started
    while engine.has_work:
        engine.step()
    return elapsed


def print_timed(model: LoadedModel, rows: int, steps: int, way: str, run: Callable[[list[Segment]], float]) -> None:
    """The decode table's row of one way: ``run`` once to warm up (kernels, allocator, graphs), then timed,
    on segments long enough that no row ends within the timed steps."""
    run(segments_for(model, rows, steps + 2 * SYNC_EVERY))
    seconds = run(segments_for(model, rows, steps + 2 * SYNC_EVERY))
    audio_s = rows * steps / TOKENS_PER_SECOND
    print(f"| {way} | {rows} | {1000 * seconds / steps:.2f} | {audio_s / seconds:.1f} |", flush=True)


def row_counts(text: str) -> list[int]:
    """A comma-separated list of row counts (the empty string: none)."""
    return [int(rows) for rows in text.split(",") if rows]


def matmul_dtypes(text: str) -> list[tuple[str, torch.dtype | None]]:
    """A comma-separated list of CHATTTS_FARM_MATMUL_DTYPE's values, each with the dtype it gives the engine."""
    try:
        return [(name, matmul_dtype(Settings.from_env(matmul_dtype=name))) for name in text.split(",")]
    except SettingsError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def timed_step(engine: Engine) -> float:
    """The wall seconds of one engine step (SYNC_EVERY decode steps, and whatever it admits), from an idle
    device to an idle device."""
    synchronize(engine.model.device)
    started = time.perf_counter()
    engine.step()
    synchronize(engine.model.device)
    return time.perf_counter() - started


@dataclasses.dataclass(frozen=True)
class Join:
    """An engine step at which prompts joined ``rows`` running ones, and the steps either side of it."""

    rows: int
    joining: int
    prompt_tokens: int  # the joining prompts' tokens, which the step's prefill runs
    before_s: float  # a step of the running rows alone (the mean of the rounds before the join)
    joined_s: float  # the step they joined at: its prefill, then its decode steps over every row
    after_s: float  # a step of every row after (the mean of the rounds after)
    running_after: int  # segments running after the join's step

    @property
    def spike_s(self) -> float:
        """What the join's step took beyond a step of the same rows without a prefill."""
        return self.joined_s - self.after_s


def join_spike(model: LoadedModel, rows: int, joining: int, rounds: int) -> Join:
    """``joining`` prompts join ``rows`` running segments: the engine step they join at against the steps
    before and after it. A first pass, untimed, compiles and captures what the second one times."""
    steps = (2 * rounds + 4) * SYNC_EVERY  # every segment outlives the timed steps
    engine = engine_for(model, rows + joining, steps, capture_graphs=model.device.type == "cuda")
    if engine.runner.use_graphs:
        engine.runner.capture_every_bucket()
    for _ in range(2):
        engine.add(segments_for(model, rows, steps))
        engine.step()  # their prefill
        before = [timed_step(engine) for _ in range(rounds)]
        joiners = segments_for(model, joining, steps, first=rows)
        engine.add(joiners)
        joined = timed_step(engine)
        running_after = engine.running
        after = [timed_step(engine) for _ in range(rounds)]
        while engine.has_work:
            engine.step()
    prompt_tokens = sum(len(encode_prompt(model, segment)) for segment in joiners)
    return Join(rows, joining, prompt_tokens, statistics.mean(before), joined, statistics.mean(after), running_after)


def join_table(model: LoadedModel, rows_list: list[int], joining: int, rounds: int) -> None:
    """Issue 21's "the step-time spike when 64 prompts join": what a prefill adds to the step it runs in."""
    print(f"\n{joining} prompts join the running rows (each step {SYNC_EVERY} decode steps; means of {rounds} steps):")
    print(
        "| rows running | prompts joining | their prompt tokens | step before ms | the step they join at ms "
        "| step after ms | spike ms | running after |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in rows_list:
        join = join_spike(model, rows, joining, rounds)
        print(
            f"| {join.rows} | {join.joining} | {join.prompt_tokens} | {1000 * join.before_s:.2f} "
            f"| {1000 * join.joined_s:.2f} | {1000 * join.after_s:.2f} | {1000 * join.spike_s:.2f} "
            f"| {join.running_after} |",
            flush=True,
        )


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read and written a second by ``copy_`` of 2 GiB, the best of five."""
    source = torch.empty(2**30, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return 2 * source.numel() * source.element_size() / best


def standard_columns(rows: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Each row's new position at the standard workload's contexts: 70 + U(0, 478)."""
    return (70 + torch.randint(0, 479, (rows,), generator=generator)).to(device)


def graph_seconds(work: Callable[[], None], replays: int = 5) -> float:
    """Seconds a replay of ``work`` captured in a CUDA graph takes, the mean of ``replays`` after one more."""
    work()  # compiles, tunes and allocates outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / replays


def time_attention(inputs: dict, calls: int = 20) -> float:
    """Seconds a call of ``decode_attention(**inputs)``, replayed ``calls`` at a time from a CUDA graph."""
    return graph_seconds(lambda: [decode_attention(**inputs) for _ in range(calls)], replays=1) / calls


def attention_inputs(model: LoadedModel, rows: int, context: int, kv_dtype: torch.dtype, generator) -> dict:
    config = model.chat.config.gpt
    heads = config.num_attention_heads
    kv_heads = model.chat.gpt.gpt.config.num_key_value_heads
    dim = config.hidden_size // heads
    rotary = rotary_table(model.chat.gpt.gpt, torch.arange(context, device=model.device))
    return attention_inputs_of(heads, kv_heads, dim, rows, context, kv_dtype, model.device, generator, rotary)


def attention_inputs_of(
    heads: int,
    kv_heads: int,
    dim: int,
    rows: int,
    context: int,
    kv_dtype: torch.dtype,
    device,
    generator,
    rotary: torch.Tensor,
) -> dict:
    """``decode_attention``'s keyword arguments at the runner's layout, random (on the meta device: shapes
    alone); as the runner's decode step calls it, the query and the new key unrotated, with ``rotary``, the
    table of every position's cos and sin (:func:`~worker.engine.runner.rotary_table`) that the kernel
    rotates them by."""
    query = torch.randn(rows, heads, 1, dim, device=device, dtype=torch.bfloat16)
    new_key, new_value = torch.randn(2, rows, kv_heads, 1, dim, device=device, dtype=torch.bfloat16)
    width = blocks_for(context)
    # Every row's blocks, in an order of no use to the kernel: a pool that has served for a while.
    table = torch.randperm(rows * width, generator=generator).view(rows, width).to(device)
    keys = torch.randn(rows * width, kv_heads, BLOCK_POSITIONS, dim, device=device).to(kv_dtype)
    values = torch.randn(rows * width, kv_heads, BLOCK_POSITIONS, dim, device=device).to(kv_dtype)
    columns = standard_columns(rows, device, generator)
    return dict(
        query=query,
        new_key=new_key,
        new_value=new_value,
        keys=keys,
        values=values,
        block_table=table,
        columns=columns,
        scale=dim**-0.5,
        rotary=rotary,
    )


def read_bytes(inputs: dict) -> int:
    """What a call reads: every row's keys and values up to its new position."""
    new_key, keys = inputs["new_key"], inputs["keys"]
    return int(inputs["columns"].sum()) * new_key.shape[1] * new_key.shape[3] * keys.element_size() * 2


@contextlib.contextmanager
def launch_settings(size: int, launch: dict) -> Iterator[None]:
    """The decode attention launched with ``launch`` for caches of ``size`` bytes a value inside the
    block; its own settings back after it."""
    chosen = attention._LAUNCH
    attention._LAUNCH = {**chosen, size: launch}
    try:
        yield
    finally:
        attention._LAUNCH = chosen


def launch_sweep(model: LoadedModel, context: int) -> None:
    """The three fastest launch settings per cache dtype and way of multiplying, at 1,024 rows (see the
    module's doc)."""
    print("\n| kv cache | tensor cores | us/call | GB/s read | tile | warps |")
    print("|---|---|---:|---:|---:|---:|")
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        inputs = attention_inputs(model, 1024, context, kv_dtype, torch.Generator().manual_seed(0))
        size = inputs["keys"].element_size()
        name, read = str(kv_dtype).removeprefix("torch."), read_bytes(inputs)
        for tensor_cores in (False, True):
            timings = []
            for tile, warps in itertools.product((32, 64, 128, 256), (1, 2, 4)):
                launch = {**attention._LAUNCH[size], "TILE": tile, "num_warps": warps, "TENSOR_CORES": tensor_cores}
                with launch_settings(size, launch):
                    timings.append((time_attention(inputs, calls=10), tile, warps))
            timings.sort()
            for seconds, tile, warps in timings[:3]:
                speed = f"{1e6 * seconds:.1f} | {read / seconds / 1e9:.0f}"
                print(f"| {name} | {tensor_cores} | {speed} | {tile} | {warps} |", flush=True)
        del inputs


def attention_table(model: LoadedModel, rows_list: list[int], context: int, kv_dtypes: list[torch.dtype]) -> None:
    """The decode attention kernel's time and read bandwidth at each row count (see the module's doc)."""
    copy = copy_bandwidth(model.device)
    print(f"\ncopy bandwidth (bytes read and written by copy_ of 2 GiB): {copy / 1e9:.0f} GB/s")
    print("| kv cache | rows | mean context | us/call | GB/s read | of copy |")
    print("|---|---:|---:|---:|---:|---:|")
    generator = torch.Generator().manual_seed(0)
    for kv_dtype in kv_dtypes:
        for rows in rows_list:
            inputs = attention_inputs(model, rows, context, kv_dtype, generator)
            seconds = time_attention(inputs)
            read = read_bytes(inputs)
            print(
                f"| {str(kv_dtype).removeprefix('torch.')} | {rows} | {float(inputs['columns'].float().mean()):.0f} "
                f"| {1e6 * seconds:.1f} | {read / seconds / 1e9:.0f} | {read / seconds / copy:.0%} |",
                flush=True,
            )
            del inputs


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Seconds of all the GPT's layers at ``rows`` rows, each way of running its two kinds of work."""

    rows: int
    attention_s: float
    parts_s: float
    in_turn_s: float
    two_streams_s: float
    halves_in_turn_s: float
    halves_side_by_side_s: float


def overlap(
    model: LoadedModel,
    rows: int,
    context: int,
    fused: tuple[list[LayerWeights], LayerShape],
    generator: torch.Generator,
) -> Overlap:
    """The attention and the layer parts at ``rows`` rows, each way (see the module's doc); ``fused`` is
    what :func:`~worker.engine.layers.fuse_layers` made of the model's layers."""
    llama = model.chat.gpt.gpt
    weights, shape = fused
    before, after = torch.compile(before_attention), torch.compile(after_attention)
    side = torch.cuda.Stream(model.device)

    def kinds(count: int) -> tuple[Callable[[], None], Callable[[int], None]]:
        """The attention of ``count`` rows (one layer's call) and their layer parts (of a given layer)."""
        # As the runner's decode step splits the work: the attention rotates the query and the new key;
        # the layer parts hand them over unrotated.
        inputs = attention_inputs(model, count, context, torch.float8_e4m3fn, generator)
        query = inputs["query"]
        hidden = torch.randn(count, 1, llama.config.hidden_size, device=model.device, dtype=llama.dtype)

        def parts(layer: int) -> None:
            layer_weights = weights[layer]
            before(hidden, hidden, layer_weights.input_norm, layer_weights.qkv, None, None, shape)
            after(
                hidden,
                query,
                layer_weights.output,
                layer_weights.post_attention_norm,
                layer_weights.gate_up,
                layer_weights.down,
                shape.norm_eps,
            )

        return lambda: decode_attention(**inputs), parts

    def side_by_side(on_side: Callable[[], None], here: Callable[[], None]) -> None:
        main = torch.cuda.current_stream(model.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            on_side()
        here()
        main.wait_stream(side)

    layers = range(len(weights))
    attend, parts = kinds(rows)
    (attend_first, parts_first), (attend_second, parts_second) = kinds(rows // 2), kinds(rows - rows // 2)

    def every_layer(work: Callable[[int], None]) -> Callable[[], None]:
        return lambda: [work(layer) for layer in layers]

    def halves_in_turn(layer: int) -> None:
        attend_first()
        parts_second(layer)
        attend_second()
        parts_first(layer)

    def halves_side_by_side(layer: int) -> None:
        side_by_side(attend_first, lambda: parts_second(layer))
        side_by_side(attend_second, lambda: parts_first(layer))

    return Overlap(
        rows,
        attention_s=graph_seconds(every_layer(lambda _: attend())),
        parts_s=graph_seconds(every_layer(parts)),
        in_turn_s=graph_seconds(every_layer(lambda layer: (attend(), parts(layer)))),
        two_streams_s=graph_seconds(lambda: side_by_side(every_layer(lambda _: attend()), every_layer(parts))),
        halves_in_turn_s=graph_seconds(every_layer(halves_in_turn)),
        halves_side_by_side_s=graph_seconds(every_layer(halves_side_by_side)),
    )


def overlap_table(model: LoadedModel, rows_list: list[int], context: int) -> None:
    """How much of the layer parts the GPU runs beside the attention (see the module's doc)."""
    print("\nA step's attention (fp8 cache) and the rest of its layers, over all layers, each way (ms):")
    print(
        "| rows | attention | layer parts | in turn | on two streams | halves in turn | halves side by side "
        "| side by side vs in turn |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    fused, generator = fuse_layers(model.chat.gpt.gpt), torch.Generator().manual_seed(0)
    for rows in rows_list:
        found = overlap(model, rows, context, fused, generator)
        print(
            f"| {rows} | {1000 * found.attention_s:.3f} | {1000 * found.parts_s:.3f} | {1000 * found.in_turn_s:.3f} "
            f"| {1000 * found.two_streams_s:.3f} | {1000 * found.halves_in_turn_s:.3f} "
            f"| {1000 * found.halves_side_by_side_s:.3f} "
            f"| {found.halves_side_by_side_s / found.halves_in_turn_s - 1:+.1%} |",
            flush=True,
        )


def matmul_table(model: LoadedModel, rows_list: list[int], autotune: bool) -> None:
    """A layer's four matmuls alone, each way (see the module's doc)."""
    weights = fuse_layers(model.chat.gpt.gpt)[0][0]
    print("\nA layer's matmuls alone (us a call, TFLOPS):")
    print("| matmul | rows | (out, in) weights: F.linear | same, cuBLASLt | (in, out) weights: x @ w | max-autotune |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("qkv", "output", "gate_up", "down"):
        weight = getattr(weights, name)
        for rows in rows_list:
            inputs = torch.randn(rows, weight.shape[1], device=model.device, dtype=weight.dtype)
            flops = 2 * rows * weight.numel()
            cells = []
            for way in matmul_ways(inputs, weight, autotune):
                seconds = graph_seconds(lambda way=way: [way() for _ in range(20)], replays=3) / 20
                cells.append(f"{1e6 * seconds:.1f} ({flops / seconds / 1e12:.0f})")
            print(f"| {name} {tuple(weight.shape)} | {rows} | " + " | ".join(cells + ["-"] * (4 - len(cells))) + " |")
            torch._dynamo.reset()


def matmul_ways(inputs: torch.Tensor, weight: torch.Tensor, autotune: bool) -> list[Callable[[], torch.Tensor]]:
    """``inputs`` times the (out, in) ``weight`` transposed: as the runner multiplies, the same with
    cuBLASLt's choice of kernel, with the weight stored transposed, and (``autotune``) compiled by
    inductor's max-autotune for this static shape."""
    stored_transposed = weight.t().contiguous()

    def on_cublaslt() -> torch.Tensor:
        # The library is chosen on the host at each call: the capture records cuBLASLt's kernel.
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            return torch.nn.functional.linear(inputs, weight)
        finally:
            torch.backends.cuda.preferred_blas_library(previous)

    ways = [lambda: torch.nn.functional.linear(inputs, weight), on_cublaslt, lambda: inputs @ stored_transposed]
    if autotune:
        tuned = torch.compile(
            lambda x: torch.nn.functional.linear(x, weight), mode="max-autotune-no-cudagraphs", dynamic=False
        )
        ways.append(lambda: tuned(inputs))
    return ways


def profiled_kernels(work: Callable[[], None], device: torch.device) -> tuple[float, list]:
    """The wall seconds of ``work()`` (synchronised) and the GPU kernels it launched."""
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        work()
        synchronize(device)
        wall = time.perf_counter() - started
    return wall, [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def print_kernels(title: str, kernels: list, times: int) -> None:
    by_name, calls = collections.Counter(), collections.Counter()
    for event in kernels:
        by_name[event.name] += event.device_time
        calls[event.name] += 1
    total_us = sum(by_name.values()) / times
    # Every figure is one run's, the mean of ``times``.
    print(f"\n{title}; each: {len(kernels) / times:.0f} kernels, {total_us / 1000:.2f} ms on the GPU")
    # The calls tell which matmul a kernel runs when one kernel runs several.
    print("| kernel | calls | us | share |")
    print("|---|---:|---:|---:|")
    for name, micros in by_name.most_common(12):
        print(f"| {name[:90]} | {calls[name] / times:g} | {micros / times:.1f} | {micros / times / total_us:.0%} |")


def profile_table(model: LoadedModel, rows_list: list[int], steps: int) -> None:
    """What one prefill and one decode step launch on the GPU, op by op, at each row count (see the
    module's doc)."""
    for rows in rows_list:
        profile_rows(model, rows, steps)


def profile_rows(model: LoadedModel, rows: int, steps: int) -> None:
    engine = engine_for(model, rows, steps + 2 * SYNC_EVERY, capture_graphs=True)
    runner = engine.runner
    runner.capture_every_bucket()
    engine.add(segments_for(model, rows, steps + 2 * SYNC_EVERY))
    engine.step()  # a prefill, and the decode step's compilation
    while engine.has_work:
        engine.step()
    engine.add(segments_for(model, rows, steps + 2 * SYNC_EVERY))
    admitted = engine._admit()
    wall, kernels = profiled_kernels(lambda: engine._prefill(admitted), model.device)
    print_kernels(f"prefill of {rows} prompts, {1000 * wall:.2f} ms wall", kernels, 1)
    for _ in range(3):
        runner._decode(rows, runner.context)
    profiled = 8

    def decode_steps():
        for _ in range(profiled):
            runner._decode(rows, runner.context)

    _, kernels = profiled_kernels(decode_steps, model.device)
    print_kernels(f"decode step of {rows} rows, op by op", kernels, profiled)
    while engine.has_work:
        engine.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rows", type=row_counts, default="1,64,512", help="Row counts of one pass.")
    parser.add_argument("--steps", type=int, default=256, help="Decode steps timed per pass.")
    parser.add_argument(
        "--attention-rows", type=row_counts, default="1,64,512,1024", help="Row counts of the kernel's table (CUDA)."
    )
    parser.add_argument(
        "--matmul-dtypes",
        type=matmul_dtypes,
        default="model",
        help="The engine's matmuls, comma-separated: model (the GPT's dtype), fp8 (CHATTTS_FARM_MATMUL_DTYPE=fp8).",
    )
    parser.add_argument("--sweep", action="store_true", help="Sweep the kernel's launch settings (CUDA).")
    parser.add_argument("--profile-rows", type=row_counts, default="", help="Row counts to profile a step at (CUDA).")
    parser.add_argument("--overlap-rows", type=row_counts, default="", help="Row counts of the overlap table (CUDA).")
    parser.add_argument("--matmul-rows", type=row_counts, default="", help="Row counts of the matmul table (CUDA).")
    parser.add_argument("--matmul-autotune", action="store_true", help="Add max-autotune to the matmul table.")
    parser.add_argument("--context", type=int, default=2464, help="Columns of a slot's cache in the kernel's table.")
    parser.add_argument(
        "--join-rows",
        type=row_counts,
        default="",
        help="Running row counts that prompts join, for the join table (any device).",
    )
    parser.add_argument("--joining", type=int, default=64, help="Prompts that join, in the join table.")
    parser.add_argument("--join-rounds", type=int, default=5, help="Steps timed before and after a join.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    # Each way and row count builds a runner of its own, and their compiled layer parts share dynamo's
    # cache of those functions; at the default limit (8) the later runners fell back to op by op.
    torch._dynamo.config.recompile_limit = 64
    model = load_model(Settings.from_env(model=arguments.model, device=arguments.device))
    steps = arguments.steps // SYNC_EVERY * SYNC_EVERY
    graphs = [False, True] if model.device.type == "cuda" else [False]

    print(f"model {model.info.as_dict()}, torch {torch.__version__}, {steps} decode steps per pass")
    print("| way | rows | ms/step | audio-s/wall-s |")
    print("|---|---:|---:|---:|")
    for rows in arguments.rows:
        print_timed(model, rows, steps, "eager-dynamic", lambda segments: eager_dynamic(model, segments, steps))
        for (matmuls, dtype), capture_graphs in itertools.product(arguments.matmul_dtypes, graphs):
            # One engine at a time: each holds a KV cache for its rows, and at 1,024 rows four at once ran
            # an H100 out of memory (thirty-sixth session).
            runs_on = engine_for(model, rows, steps + 2 * SYNC_EVERY, capture_graphs, dtype)
            way = ("engine-graph" if capture_graphs else "engine-eager") + (" fp8-matmuls" if matmuls == "fp8" else "")
            print_timed(model, rows, steps, way, lambda segments, e=runs_on: engine(e, segments, steps))
            del runs_on
            free_memory(model.device)
    # The kernel's own tables: its Triton kernels on a GPU.
    kernel_runs = model.device.type == "cuda" and triton_available()
    if kernel_runs and arguments.attention_rows:
        attention_table(model, arguments.attention_rows, arguments.context, [torch.bfloat16, torch.float8_e4m3fn])
    if kernel_runs and arguments.sweep:
        launch_sweep(model, arguments.context)
    if kernel_runs and arguments.overlap_rows:
        overlap_table(model, arguments.overlap_rows, arguments.context)
    if model.device.type == "cuda" and arguments.matmul_rows:
        matmul_table(model, arguments.matmul_rows, arguments.matmul_autotune)
    if model.device.type == "cuda" and arguments.profile_rows:
        profile_table(model, arguments.profile_rows, steps)
    if arguments.join_rows:
        join_table(model, arguments.join_rows, arguments.joining, arguments.join_rounds)


if __name__ == "__main__":
    main()
