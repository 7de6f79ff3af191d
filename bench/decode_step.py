"""Benchmark one GPT decode step: the eager DynamicCache loop against the engine's fixed-shape step.

    python bench/decode_step.py --model synthetic-full --device cuda --rows 1,64,512 --steps 256
    python bench/decode_step.py --model synthetic-tiny --device cpu --rows 1,8 --steps 24

For each row count, every row speaks the same kind of prompt and runs ``--steps`` steps with EOS
blocked (random weights never end on their own), after one untimed pass to warm up. Three ways:

- ``eager-dynamic``: transformers' LlamaModel called step by step with a DynamicCache and the farm's
  sampling, reading a stop flag back to the host every step, as the farm's loop did before the engine;
- ``engine-eager``: the engine (all rows in its slots), its step run op by op;
- ``engine-graph``: the same step replayed as CUDA graphs (CUDA only; captured in the warm-up pass).

ms/step is the decode steps' wall time over their number (the engine's first step, with the
prompts' prefill, is not in it);
audio-s/wall-s is the audio those steps make (rows x steps / 46.875 tokens a second) over that time.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import time

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first
import torch.nn.utils.parametrize as parametrize  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

from chattts_farm.contract import SynthesisRequest  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from chattts_farm.speech_length import TOKENS_PER_SECOND  # noqa: E402
from worker.engine.engine import SYNC_EVERY, Engine, embed_prompts, row_sampling  # noqa: E402
from worker.engine.segment import Segment  # noqa: E402
from worker.model import LoadedModel, load_model  # noqa: E402
from worker.sampling import REPETITION_WINDOW, sample  # noqa: E402

TEXT = "The farm reads this sentence aloud, again and again, to time one step of its GPT."


def segments_for(model: LoadedModel, rows: int, steps: int) -> list[Segment]:
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
        for row in range(rows)
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def engine_for(model: LoadedModel, rows: int, steps: int, capture_graphs: bool) -> Engine:
    return Engine(
        model,
        slots=rows,
        max_admissions=rows,
        max_prompt_tokens=128,
        max_new_tokens=steps + SYNC_EVERY,
        capture_graphs=capture_graphs,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rows", default="1,64,512", help="Row counts of one pass.")
    parser.add_argument("--steps", type=int, default=256, help="Decode steps timed per pass.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    model = load_model(Settings.from_env(model=arguments.model, device=arguments.device))
    steps = arguments.steps // SYNC_EVERY * SYNC_EVERY
    graphs = [False, True] if model.device.type == "cuda" else [False]

    print(f"model {model.info.as_dict()}, torch {torch.__version__}, {steps} decode steps per pass")
    print("| way | rows | ms/step | audio-s/wall-s |")
    print("|---|---:|---:|---:|")
    for rows in (int(r) for r in arguments.rows.split(",") if r):
        # Long enough that no row ends within the timed steps.
        ways = {"eager-dynamic": lambda segments: eager_dynamic(model, segments, steps)}
        for capture_graphs in graphs:
            runs_on = engine_for(model, rows, steps + 2 * SYNC_EVERY, capture_graphs)
            ways["engine-graph" if capture_graphs else "engine-eager"] = lambda segments, e=runs_on: engine(
                e, segments, steps
            )
        for way, run in ways.items():
            run(segments_for(model, rows, steps + 2 * SYNC_EVERY))  # warm up: kernels, allocator, graphs
            seconds = run(segments_for(model, rows, steps + 2 * SYNC_EVERY))
            audio_s = rows * steps / TOKENS_PER_SECOND
            print(f"| {way} | {rows} | {1000 * seconds / steps:.2f} | {audio_s / seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
