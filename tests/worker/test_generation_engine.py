"""The fixed-shape GPT pass (worker.engine) against the eager DynamicCache loop it replaced.

``eager_reference`` is the farm's generation loop as it was before the engine: transformers' LlamaModel
with a DynamicCache, rows leaving the batch as they end, the host looking at every step. The engine
must draw the same tokens (hence the same lengths and endings) and the same hidden states.
"""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from transformers.cache_utils import DynamicCache

from worker import generation
from worker.engine import runner
from worker.generation import SYNC_EVERY, Segment, SegmentOutput
from worker.sampling import sample


@torch.inference_mode()
def eager_reference(model, segments, stop_after=None):
    """The pre-engine loop; stop_after {row: step} interrupts a row after drawing that step."""
    chat = model.chat
    device = model.device
    num_vq = chat.config.gpt.num_vq
    eos_token = chat.config.gpt.num_audio_tokens - 1
    llama = chat.gpt.gpt
    stop_after = stop_after or {}

    embeddings, attention_mask = generation.embed_prompts(model, segments)
    sampling = generation.row_sampling(segments, device)
    min_tokens = torch.tensor([segment.pinned_tokens or 0 for segment in segments], device=device)
    ends = [min(segment.pinned_tokens or segment.max_tokens, segment.max_tokens) for segment in segments]
    end_at = torch.tensor(ends, device=device)
    max_steps = max(ends)
    history = torch.zeros(len(segments), max_steps, num_vq, dtype=torch.long, device=device)
    hiddens = torch.zeros(len(segments), max_steps, llama.config.hidden_size, dtype=torch.float32, device=device)

    outputs = [None] * len(segments)
    active = torch.arange(len(segments), device=device)
    mask = attention_mask.bool()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    cache_keyword = "cache" if "cache" in inspect.signature(llama.forward).parameters else "past_key_values"
    step_input = embeddings.to(llama.dtype)
    with parametrize.cached():
        head_weights = torch.stack([head.weight for head in chat.embed.head_code]).float()

    for step in range(max_steps):
        hidden = (
            llama(
                inputs_embeds=step_input,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{cache_keyword: cache},
            )
            .last_hidden_state[:, -1]
            .float()
        )
        hiddens[active, step] = hidden
        logits = torch.einsum("bh,qvh->bqv", hidden, head_weights)
        eos_blocked = min_tokens[active] > step
        tokens = sample(logits, history[active, :step], sampling.select(active), step, eos_token, eos_blocked)
        history[active, step] = tokens

        ended_eos = tokens.eq(eos_token).any(dim=1)
        reached_end = end_at[active].eq(step + 1)
        active_list = active.tolist()
        stopped = torch.tensor([stop_after.get(i) == step for i in active_list], dtype=torch.bool, device=device)
        done = ended_eos | reached_end | stopped
        if bool(done.any()):
            for position in done.nonzero().flatten().tolist():
                index = active_list[position]
                if bool(ended_eos[position]):
                    count, ended_by = step, "eos"
                elif bool(stopped[position]):
                    count, ended_by = step + 1, "interrupted"
                else:
                    count = step + 1
                    ended_by = "length_rule" if count == segments[index].pinned_tokens else "token_limit"
                outputs[index] = SegmentOutput(
                    hiddens=hiddens[index, :count].clone(),
                    codes=history[index, :count].clone(),
                    tokens=count,
                    ended_by=ended_by,
                )
            keep = (~done).nonzero().flatten()
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            active, mask, positions, tokens = active[keep], mask[keep], positions[keep], tokens[keep]
        step_input = (
            torch.stack([chat.embed.emb_code[q](tokens[:, q]) for q in range(num_vq)], dim=2)
            .sum(dim=2)
            .unsqueeze(1)
            .to(llama.dtype)
        )
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        positions = positions[:, -1:] + 1
    return outputs


TEXTS = [
    "Hello.",
    "The farm reads long documents aloud without cutting them off, one segment at a time.",
    "Short one here.",
    "A middle sized sentence about queues and workers.",
    "Speech, batched.",
    "Tokens, voices and seeds all differ between these rows of one pass.",
]


@pytest.fixture
def mixed_segments(make_request):
    """Rows of different prompt lengths, voices, sampling settings, seeds and lengths, pinned or not."""
    segments = []
    for row, text in enumerate(TEXTS):
        request = make_request(
            text,
            temperature=0.2 + 0.15 * row,
            top_p=0.5 + 0.08 * row,
            top_k=5 + 4 * row,
            repetition_penalty=1.0 + 0.05 * row,
        )
        pinned = row % 2 == 0
        segments.append(
            Segment(
                owner=row,
                index=0,
                text=text,
                request=request,
                speaker=torch.randn(64, generator=torch.Generator().manual_seed(100 + row)),
                seed=1000 + 7 * row,
                expected_tokens=12 + 9 * row,
                max_tokens=40 if pinned else 30 + 25 * row,
                pinned=pinned,
            )
        )
    return segments


def assert_same_outputs(outputs, expected):
    for row, (output, reference) in enumerate(zip(outputs, expected, strict=True)):
        assert (output.tokens, output.ended_by) == (reference.tokens, reference.ended_by), row
        assert torch.equal(output.codes, reference.codes), row
        torch.testing.assert_close(output.hiddens, reference.hiddens, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_bucket", [runner.KV_BUCKET, 32])
def test_the_engine_draws_what_the_eager_loop_drew(synthesizer, mixed_segments, kv_bucket, monkeypatch):
    # Small buckets make the attention's window grow several times within the pass.
    monkeypatch.setattr(runner, "KV_BUCKET", kv_bucket)
    expected = eager_reference(synthesizer.model, mixed_segments)
    outputs = generation.generate(synthesizer.model, mixed_segments)
    assert_same_outputs(outputs, expected)
    # The mix covers every way a row can end.
    assert {output.ended_by for output in expected} >= {"length_rule", "token_limit", "eos"}


def test_a_stopped_row_keeps_what_it_drew_up_to_the_next_sync(synthesizer, mixed_segments):
    stopped_row = 3
    steps_seen = []

    def rows_to_stop():
        # Ask at the first sync after step SYNC_EVERY - 1 was reported: the row ends after step
        # 2 * SYNC_EVERY - 1, the next sync.
        return [stopped_row] if steps_seen and steps_seen[-1] >= SYNC_EVERY - 1 else []

    outputs = generation.generate(
        synthesizer.model,
        mixed_segments,
        on_step=lambda running, step: steps_seen.append(step),
        rows_to_stop=rows_to_stop,
    )
    expected = eager_reference(synthesizer.model, mixed_segments, stop_after={stopped_row: 2 * SYNC_EVERY - 1})
    assert outputs[stopped_row].ended_by == "interrupted"
    assert outputs[stopped_row].tokens == 2 * SYNC_EVERY
    assert_same_outputs(outputs, expected)
    assert steps_seen[:2] == [SYNC_EVERY - 1, 2 * SYNC_EVERY - 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
def test_the_cuda_graphs_draw_what_the_eager_loop_drew(tiny_settings, mixed_segments, monkeypatch):
    from worker.model import load_model

    # fp32, so that the graphs' kernels and the eager loop's agree to the last token.
    model = load_model(dataclasses.replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    monkeypatch.setattr(runner, "KV_BUCKET", 32)  # several buckets, so several graphs in one pass
    expected = eager_reference(model, mixed_segments)
    outputs = generation.generate(model, mixed_segments)
    assert_same_outputs(outputs, expected)
