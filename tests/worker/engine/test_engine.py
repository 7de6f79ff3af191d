"""The engine (worker.engine): segments join and leave a running batch, and each draws what it would alone.

``eager_reference`` is the farm's generation loop as it was before the engine: transformers' LlamaModel
with a DynamicCache, rows leaving the batch as they end, the host looking at every step. The engine
must draw the same tokens (hence the same lengths and endings) and the same hidden states, whatever
its batch mates, its slot and the step at which it joined.
"""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from transformers.cache_utils import DynamicCache

from worker.engine import runner
from worker.engine.blocks import BLOCK_POSITIONS, blocks_for
from worker.engine.engine import (
    SYNC_EVERY,
    Engine,
    embed_prompts,
    encode_prompt,
    encode_prompts,
    row_sampling,
    tokenise_prompts,
)
from worker.engine.sampler import sample
from worker.engine.scheduler import PASSES_FOR_DUE
from worker.engine.segment import Segment, SegmentOutput, SegmentStatus


@torch.inference_mode()
def eager_reference(model, segments, stop_after=None):
    """The pre-engine loop; stop_after {row: step} interrupts a row after drawing that step."""
    chat = model.chat
    device = model.device
    num_vq = chat.config.gpt.num_vq
    eos_token = chat.config.gpt.num_audio_tokens - 1
    llama = chat.gpt.gpt
    stop_after = stop_after or {}

    embeddings, attention_mask = embed_prompts(model, segments)
    sampling = row_sampling(segments, device)
    min_tokens = torch.tensor([segment.pinned_tokens or 0 for segment in segments], device=device)
    ends = [min(segment.pinned_tokens or segment.max_tokens, segment.max_tokens) for segment in segments]
    end_at = torch.tensor(ends, device=device)
    max_steps = max(ends)
    history = torch.zeros(len(segments), max_steps, num_vq, dtype=torch.long, device=device)
    hiddens = torch.zeros(len(segments), max_steps, llama.config.hidden_size, dtype=llama.dtype, device=device)

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
        hidden = llama(
            inputs_embeds=step_input,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_keyword: cache},
        ).last_hidden_state[:, -1]
        hiddens[active, step] = hidden
        logits = torch.einsum("bh,qvh->bqv", hidden.float(), head_weights)
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
    """Segments of different prompt lengths, voices, sampling settings, seeds and lengths, pinned or not."""

    def make():
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

    return make


class NotThereUntilWaitedFor:
    """A snapshot's copy as a GPU makes it: there only once the host waits for it, while the next
    step's decode steps run. On the CPU the copy is made at once; this stands in for the GPU, which
    cannot run here."""

    def query(self):
        return False

    def synchronize(self):
        pass


def new_engine(model, slots, *, state_read="at once", **options):
    """An engine; ``state_read="a step late"`` makes it read each step's state during the next, as on a GPU."""
    engine = Engine(model, slots=slots, max_admissions=slots, max_prompt_tokens=128, max_new_tokens=160, **options)
    if state_read == "a step late":
        snapshot_state = engine.runner.snapshot_state
        engine.runner.snapshot_state = lambda rows, clock: dataclasses.replace(
            snapshot_state(rows, clock), done=NotThereUntilWaitedFor()
        )
    return engine


STATE_READS = pytest.mark.parametrize("state_read", ["at once", "a step late"])


def run(engine, segments, join_at_step=None, joining=()):
    """Step the engine until every segment is out; ``joining`` segments are added at step ``join_at_step``."""
    engine.add([segment for segment in segments if segment not in joining])
    steps = 0
    while engine.has_work or steps <= (join_at_step or 0):
        if steps == join_at_step:
            engine.add(joining)
        engine.step()
        steps += 1
    return [segment.output for segment in segments]


def assert_same_outputs(outputs, expected):
    for row, (output, reference) in enumerate(zip(outputs, expected, strict=True)):
        assert (output.tokens, output.ended_by) == (reference.tokens, reference.ended_by), row
        assert torch.equal(output.codes, reference.codes), row
        torch.testing.assert_close(output.hiddens, reference.hiddens, atol=1e-4, rtol=1e-4)


@STATE_READS
@pytest.mark.parametrize(
    ("slots", "kv_bucket"),
    [(8, runner.KV_BUCKET), (8, 32), (2, runner.KV_BUCKET), (1, 32)],
    ids=["all-at-once", "small-attention-buckets", "two-slots", "one-at-a-time"],
)
def test_each_segment_draws_what_the_eager_loop_drew_whatever_its_batch(
    synthesizer, mixed_segments, slots, kv_bucket, monkeypatch, state_read
):
    # Small buckets make the attention's window grow several times while a segment runs.
    monkeypatch.setattr(runner, "KV_BUCKET", kv_bucket)
    expected = eager_reference(synthesizer.model, mixed_segments())
    outputs = run(new_engine(synthesizer.model, slots, state_read=state_read), mixed_segments())
    assert_same_outputs(outputs, expected)
    # The mix covers every way a segment can end.
    assert {output.ended_by for output in expected} >= {"length_rule", "token_limit", "eos"}


@STATE_READS
def test_segments_that_join_mid_flight_draw_what_they_would_alone(synthesizer, mixed_segments, state_read):
    expected = eager_reference(synthesizer.model, mixed_segments())
    segments = mixed_segments()
    engine = new_engine(synthesizer.model, 8, state_read=state_read)
    outputs = run(engine, segments, join_at_step=3, joining=[segments[1], segments[4]])
    assert_same_outputs(outputs, expected)


def test_segments_due_already_join_in_several_prefill_passes_of_one_step_and_draw_what_they_would_alone(
    synthesizer, mixed_segments
):
    expected = eager_reference(synthesizer.model, mixed_segments())
    segments = mixed_segments()
    # Two prompts a prefill pass: the six segments, all due when added, take three passes of the first step.
    engine = Engine(synthesizer.model, slots=8, max_admissions=2, max_prompt_tokens=128, max_new_tokens=160)
    engine.add(segments)
    engine.step()
    assert engine.running == len(segments) and not engine.scheduler.waiting
    while engine.has_work:
        engine.step()
    assert_same_outputs([segment.output for segment in segments], expected)


def test_a_steps_prompts_go_to_prefill_passes_in_their_order_of_admission_as_many_as_a_pass_takes(
    synthesizer, mixed_segments
):
    segments = mixed_segments()
    lengths = [len(encode_prompt(synthesizer.model, segment)) for segment in segments]
    assert lengths != sorted(lengths)  # the six come in no order of length
    two_a_pass = Engine(synthesizer.model, slots=8, max_admissions=2, max_prompt_tokens=128, max_new_tokens=160)
    assert two_a_pass._prefill_passes(segments) == [segments[0:2], segments[2:4], segments[4:6]]
    # Eight a pass: the six prompts in one pass, whatever their lengths.
    assert new_engine(synthesizer.model, 8)._prefill_passes(segments) == [segments]


def test_prompts_of_any_lengths_share_a_pass_padded_only_at_its_end(synthesizer, mixed_segments):
    segments = mixed_segments()
    # Two of the eight prompts three times as long as the longest of the others.
    long_text = TEXTS[1] * 3
    segments += [
        dataclasses.replace(segment, text=long_text, owner=6 + row) for row, segment in enumerate(segments[:2])
    ]
    engine = new_engine(synthesizer.model, 8)
    passes = engine._prefill_passes(segments)
    assert passes == [segments]
    tokens = sum(len(segment.prompt_ids) for segment in segments)
    assert tokens <= engine.runner.prefill_bucket(tokens) < tokens + 512


def test_prompts_past_the_prefill_budget_run_in_passes_within_it_and_draw_what_they_would_alone(
    synthesizer, mixed_segments, monkeypatch
):
    expected = eager_reference(synthesizer.model, mixed_segments())
    segments = mixed_segments()
    # A budget of 128 tokens (a prompt's longest) for the six prompts' 226: passes of up to 8 prompts take
    # three and three (a clip voice's long prompts go a few to a pass on a GPU, where 512 of them in one
    # pass would not fit in memory).
    engine = new_engine(synthesizer.model, 8, prefill_tokens=128)
    lengths = {segment.owner: len(encode_prompt(synthesizer.model, segment)) for segment in segments}
    assert sum(lengths.values()) == 226
    passes = []
    prefill = engine.runner.prefill
    monkeypatch.setattr(
        engine.runner,
        "prefill",
        lambda slots, embeddings, *rest, **named: (
            passes.append(len(embeddings)),
            prefill(slots, embeddings, *rest, **named),
        ),
    )
    engine.add(segments)
    while engine.has_work:
        engine.step()
    assert passes == [lengths[0] + lengths[1] + lengths[2], lengths[3] + lengths[4] + lengths[5]]
    assert max(passes) <= 128
    assert_same_outputs([segment.output for segment in segments], expected)


def test_more_segments_than_slots_wait_their_turn_in_arrival_order(synthesizer, mixed_segments):
    engine = new_engine(synthesizer.model, 2)
    segments = mixed_segments()
    engine.add(segments)
    admitted_order = []
    while engine.has_work:
        assert engine.running <= 2
        before = {id(segment) for segment in engine.scheduler.waiting}
        engine.step()
        admitted_order += [s for s in segments if id(s) in before and s not in engine.scheduler.waiting]
    assert [segment.owner for segment in admitted_order] == [0, 1, 2, 3, 4, 5]
    assert all(segment.output is not None for segment in segments)


def test_a_cancelled_segment_keeps_what_it_drew_and_frees_its_slot(synthesizer, mixed_segments):
    engine = new_engine(synthesizer.model, 8)
    segments = mixed_segments()
    engine.add(segments)
    engine.step()
    engine.step()
    engine.cancel(lambda segment: segment.owner == 5)
    left = engine.step()
    stopped = next(segment for segment in left if segment.owner == 5)
    # Stopped between steps: it keeps the 2 * SYNC_EVERY + 1 steps drawn by then (prefill + decode steps).
    assert stopped.output.ended_by == "interrupted"
    assert stopped.output.tokens == 2 * SYNC_EVERY + 1
    expected = eager_reference(synthesizer.model, mixed_segments())[5]
    assert torch.equal(stopped.output.codes, expected.codes[: stopped.output.tokens])
    assert 5 not in {segment.owner for segment in engine.scheduler.running.values()}


def test_read_a_step_late_a_segment_leaves_a_step_after_it_ended_and_counts_only_steps_read(
    synthesizer, mixed_segments
):
    segments = mixed_segments()
    at_once, late = (new_engine(synthesizer.model, 8, state_read=read) for read in ("at once", "a step late"))
    at_once.add(segments[:1])
    late.add(mixed_segments()[:1])
    late.step()
    # Nothing of the first step is known yet: its prefill and decode steps may still be running.
    assert late.tokens_drawn(late.running_segments[0]) == 0
    late.step()
    assert late.tokens_drawn(late.running_segments[0]) == 1 + SYNC_EVERY
    at_once_steps = late_steps = 0
    while at_once.has_work:
        at_once.step()
        at_once_steps += 1
    late_steps = 2
    while late.has_work:
        late.step()
        late_steps += 1
    assert late_steps == at_once_steps + 1


def test_prompts_encoded_one_by_one_and_ahead_are_the_tokenizers_batch(synthesizer, mixed_segments):
    model = synthesizer.model
    segments = mixed_segments()
    expected = model.chat.tokenizer.encode([s.prompt for s in segments], model.chat.config.gpt.num_vq, device="cpu")
    for got, want in zip(encode_prompts(model, segments), expected, strict=True):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    # Each segment keeps its encoding, so that the engine tokenises waiting prompts while the device works.
    assert all(segment.prompt_ids is not None for segment in segments)


def test_a_burst_is_tokenised_as_far_as_its_passes_go_and_the_next_admission_while_the_steps_run(
    synthesizer, mixed_segments
):
    engine = Engine(synthesizer.model, slots=1, max_admissions=1, max_prompt_tokens=128, max_new_tokens=160)
    segments = mixed_segments()  # six, all due
    engine.add(segments)
    engine.step()
    # Admitting the first, the engine tokenised what a round's passes for segments due may take, at once.
    assert [segment.prompt_ids is not None for segment in segments] == [True] * PASSES_FOR_DUE + [False] * 2
    while segments[3].status is SegmentStatus.WAITING:
        engine.step()
    # The fourth admitted: the fifth, next in line, was tokenised while the steps ran; the sixth waits.
    assert segments[4].prompt_ids is not None and segments[5].prompt_ids is None


def as_a_cuda_graph_runs_it(engine: Engine, monkeypatch) -> None:
    """Make the engine's prefill passes take the shapes of the CUDA graph of their bucket (rows for every
    prompt a pass of its tokens may hold, the padding rows drawing for the scratch slot; the reference's
    windows as long as any prompt may be), run op by op: the CPU has no graphs."""
    monkeypatch.setattr(engine.runner, "use_graphs", True)
    monkeypatch.setattr(engine.runner, "_run", lambda shape, graphs, work: work(*shape))


PASS_SHAPES = pytest.mark.parametrize("shapes", ["its own", "its graph's"])


def prefilled(model, segments, monkeypatch, shapes) -> Engine:
    """A new engine of eight slots once it has run one prefill pass of ``segments``."""
    engine = new_engine(model, 8)
    if shapes == "its graph's":
        as_a_cuda_graph_runs_it(engine, monkeypatch)
    engine.add(segments)
    admitted = engine._admit()
    assert engine._prefill_passes(admitted) == [admitted]
    engine._prefill(admitted)
    return engine


def cache_and_first_draw(engine: Engine, segment: Segment) -> list[torch.Tensor]:
    """A prefilled segment's keys and values at its prompt's positions in every layer, its first hidden
    state and its first codes."""
    state = engine.runner
    positions = torch.arange(len(segment.prompt_ids))
    blocks = state.block_table[segment.slot, positions // BLOCK_POSITIONS]
    places = positions % BLOCK_POSITIONS
    return [
        state.keys[:, blocks, :, places],
        state.values[:, blocks, :, places],
        state.hiddens[segment.slot, 0],
        state.codes[segment.slot, 0],
    ]


@PASS_SHAPES
def test_prompts_of_different_lengths_in_one_pass_each_get_the_cache_and_first_draw_they_get_alone(
    synthesizer, mixed_segments, monkeypatch, shapes
):
    segments = mixed_segments()
    together = prefilled(synthesizer.model, segments, monkeypatch, shapes)
    for segment, alone in zip(segments, mixed_segments(), strict=True):
        keys, values, hidden, codes = cache_and_first_draw(together, segment)
        keys_alone, values_alone, hidden_alone, codes_alone = cache_and_first_draw(
            prefilled(synthesizer.model, [alone], monkeypatch, shapes), alone
        )
        torch.testing.assert_close(keys, keys_alone)
        torch.testing.assert_close(values, values_alone)
        torch.testing.assert_close(hidden, hidden_alone)
        assert torch.equal(codes, codes_alone)


@PASS_SHAPES
def test_a_prefill_padded_to_its_bucket_touches_only_its_slots_blocks_and_the_scratch(
    synthesizer, mixed_segments, monkeypatch, shapes
):
    engine = new_engine(synthesizer.model, 8)
    if shapes == "its graph's":
        as_a_cuda_graph_runs_it(engine, monkeypatch)
    state = engine.runner
    before = {name: getattr(state, name).clone() for name in ("keys", "hiddens", "step", "finished", "tokens")}
    engine.add(mixed_segments()[:3])  # 101 tokens: a pass of 128, its last 27 padding
    engine._prefill(engine._admit())
    assert state.prefill_bucket(101) == 128
    held = {block for slot in (0, 1, 2) for block in engine.scheduler.pool.tables[slot]}
    untouched_blocks = torch.tensor([block for block in range(state.kv_blocks) if block not in held])
    untouched_slots = torch.tensor([3, 4, 5, 6, 7])
    for name, was in before.items():
        axis, untouched = (1, untouched_blocks) if name == "keys" else (0, untouched_slots)
        assert torch.equal(getattr(state, name).index_select(axis, untouched), was.index_select(axis, untouched)), name
    # The padding's keys went to the scratch block, past the pool; a graph's padding rows drew for the
    # scratch slot, past the slots any decode step covers, which stays finished.
    rows = 8 if shapes == "its graph's" else 3
    assert state.prefill_slots[:rows].tolist() == [0, 1, 2] + [state.scratch_slot] * (rows - 3)
    assert state.prefill_lengths[3:].eq(0).all() and bool(state.finished[state.scratch_slot])
    assert state.scratch_block == state.kv_blocks and set(state.block_table[8].tolist()) == {state.scratch_block}


def long_running(segments, *, greedy=False):
    """The segments drawing up to 150 steps (the pinned ones 90-140), sampled or greedy (top-k 1)."""
    return [
        dataclasses.replace(
            segment,
            max_tokens=150,
            expected_tokens=90 + 10 * segment.owner,
            request=dataclasses.replace(segment.request, top_k=1) if greedy else segment.request,
        )
        for segment in segments
    ]


@STATE_READS
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_segments_preempted_when_the_cache_runs_dry_start_over_and_draw_what_they_would_alone(
    synthesizer, mixed_segments, greedy, state_read
):
    expected = eager_reference(synthesizer.model, long_running(mixed_segments(), greedy=greedy))
    # Eight slots over a pool that holds the longest segment a slot may run: two or three of these at once.
    engine = new_engine(synthesizer.model, 8, kv_blocks=blocks_for(128 + 160), state_read=state_read)
    segments = long_running(mixed_segments(), greedy=greedy)
    outputs = run(engine, segments, join_at_step=3, joining=[segments[1], segments[4]])
    assert engine.preemptions > 0
    assert_same_outputs(outputs, expected)
    # Every block is back in the pool.
    assert engine.scheduler.pool.free == engine.scheduler.pool.blocks and not engine.scheduler.pool.tables
    assert set(engine.runner.block_table.flatten().tolist()) == {engine.runner.scratch_block}


@STATE_READS
def test_segments_moved_down_into_freed_slots_draw_what_they_would_alone(
    synthesizer, mixed_segments, monkeypatch, state_read
):
    expected = eager_reference(synthesizer.model, long_running(mixed_segments()))
    engine = new_engine(synthesizer.model, 8, state_read=state_read)
    moves = []
    compact = engine.scheduler.compact

    def noted():
        moved = compact()
        moves.extend(moved)
        return moved

    monkeypatch.setattr(engine.scheduler, "compact", noted)
    rows = []
    segments = long_running(mixed_segments())
    engine.add(segments)
    while engine.has_work:
        engine.step()
        rows.append((engine.scheduler.rows_in_use, engine.running))
    assert moves  # the short ones ended first, below longer ones
    assert_same_outputs([segment.output for segment in segments], expected)
    # After each step the running slots are packed as far as the step's row buckets tell apart.
    assert all(engine._bucket(in_use) == engine._bucket(running) for in_use, running in rows)


def test_moved_slots_take_every_per_slot_buffer_along_however_many_a_copy_carries(synthesizer, monkeypatch):
    monkeypatch.setattr(runner, "MOVES_PER_COPY", 2)
    slot_runner = new_engine(synthesizer.model, 8).runner
    generator = torch.Generator().manual_seed(0)
    for state in slot_runner._slot_state:
        state.copy_(torch.randint(0, 100, state.shape, generator=generator).to(state.dtype))
    before = [state.clone() for state in slot_runner._slot_state]
    moves = [(7, 0), (6, 1), (5, 2)]  # running slots down into free ones: two copies of at most two
    slot_runner.move_slots(moves)
    for state, old in zip(slot_runner._slot_state, before, strict=True):
        for source, target in moves:
            assert torch.equal(state[target], old[source])


def test_a_cache_that_cannot_hold_one_segment_is_refused_at_start(synthesizer):
    with pytest.raises(ValueError, match="cannot hold one segment"):
        new_engine(synthesizer.model, 2, kv_blocks=blocks_for(128 + 160) - 1)


def test_a_waiting_segment_that_is_cancelled_never_runs(synthesizer, mixed_segments):
    engine = new_engine(synthesizer.model, 1)
    segments = mixed_segments()
    engine.add(segments)
    dropped = engine.cancel(lambda segment: segment.owner == 3)
    assert [segment.owner for segment in dropped] == [3]
    run(engine, [])
    assert segments[3].output is None and all(s.output is not None for s in segments if s.owner != 3)


def test_a_prompt_longer_than_a_slot_fails_alone_naming_the_text(synthesizer, mixed_segments):
    engine = Engine(synthesizer.model, slots=4, max_admissions=4, max_prompt_tokens=24, max_new_tokens=160)
    segments = mixed_segments()[:3]
    run(engine, segments)
    assert segments[1].error is not None and segments[1].error.field == "text" and segments[1].output is None
    assert segments[0].output is not None and segments[2].output is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
@pytest.mark.parametrize("cache", ["every slot its longest", "runs dry"])
def test_the_cuda_graphs_draw_what_the_eager_loop_drew(tiny_settings, mixed_segments, monkeypatch, cache):
    from worker.model.loading import load_model

    # fp32, so that the graphs' kernels and the eager loop's agree to the last token.
    model = load_model(dataclasses.replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    monkeypatch.setattr(runner, "KV_BUCKET", 32)  # several buckets, so several graphs
    # Past dynamo's recompile limit (8 variants) a compiled part would run op by op, silently: warmed up,
    # captured ahead and run, each part stays within half of it.
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 4)
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
    prepare = long_running if cache == "runs dry" else list
    expected = eager_reference(model, prepare(mixed_segments()))
    segments = prepare(mixed_segments())
    engine = new_engine(model, 8, kv_blocks=blocks_for(128 + 160) if cache == "runs dry" else None)
    # A worker warms up on a request before it captures: the captures share the compiled variants it made.
    run(engine, mixed_segments()[:1])
    # Captured ahead, as a worker does at start, the steps run for free slots and the prefills for the
    # scratch slot change nothing drawn later.
    columns = 1 if engine.runner.reads_own_columns else -(-engine.runner.context // runner.KV_BUCKET)
    prefills = len([tokens for tokens in engine.runner.prefill_token_buckets if tokens <= runner.PREFILL_GRAPH_TOKENS])
    assert engine.runner.capture_every_bucket() == len(engine.runner.decode_row_buckets) * columns + prefills
    outputs = run(engine, segments, join_at_step=3, joining=[segments[1], segments[4]])
    assert_same_outputs(outputs, expected)
    assert (engine.preemptions > 0) == (cache == "runs dry")


def assert_close_up_to_the_first_different_token(outputs, expected, *, atol):
    """Rounding to 8 bits moves the hidden states a little; once that flips a token the two continue
    differently, as any change to sampling would make them: compared up to that token."""
    for output, reference in zip(outputs, expected, strict=True):
        same = (output.codes[: reference.tokens] == reference.codes[: output.tokens]).all(dim=1)
        first_difference = int(same.long().argmin()) if not same.all() else len(same)
        assert first_difference >= 2
        torch.testing.assert_close(
            output.hiddens[: first_difference + 1], reference.hiddens[: first_difference + 1], atol=atol, rtol=0
        )


def test_an_fp8_cache_takes_one_byte_a_value_and_speaks_close_to_the_model_dtype(synthesizer, mixed_segments):
    expected = eager_reference(synthesizer.model, mixed_segments())
    engine = new_engine(synthesizer.model, 8, kv_dtype=torch.float8_e4m3fn)
    assert engine.runner.keys.element_size() == 1
    assert_close_up_to_the_first_different_token(run(engine, mixed_segments()), expected, atol=2e-2)


def test_with_fp8_matmuls_a_lone_segment_whose_passes_are_all_small_draws_what_it_draws_without(
    synthesizer, mixed_segments
):
    # The mix's longest prompt: its prefill is one row of at most 128 tokens, its decode steps one row.
    expected = run(new_engine(synthesizer.model, 8), mixed_segments()[-1:])[0]
    output = run(new_engine(synthesizer.model, 8, matmul_dtype=torch.float8_e4m3fn), mixed_segments()[-1:])[0]
    assert (output.tokens, output.ended_by) == (expected.tokens, expected.ended_by)
    assert torch.equal(output.codes, expected.codes) and torch.equal(output.hiddens, expected.hiddens)


def test_with_every_pass_in_fp8_matmuls_the_hidden_states_stay_close_to_the_model_dtypes(
    synthesizer, mixed_segments, monkeypatch
):
    monkeypatch.setattr(runner, "FP8_MATMULS_FROM_TOKENS", 1)
    expected = eager_reference(synthesizer.model, mixed_segments())
    outputs = run(new_engine(synthesizer.model, 8, matmul_dtype=torch.float8_e4m3fn), mixed_segments())
    # Measured: within 0.016 of values up to 3.9 (one segment of six drew another token at its 17th step).
    assert_close_up_to_the_first_different_token(outputs, expected, atol=0.03)
    # The prefill ran in fp8 too: each segment's first hidden state, its prefill's, differs.
    assert not any(torch.equal(out.hiddens[0], ref.hiddens[0]) for out, ref in zip(outputs, expected, strict=True))


def test_prompts_embed_as_chattts_embeds_them_text_tokens_and_a_speaker_sample_s_codes(synthesizer, mixed_segments):
    model = synthesizer.model
    segments = mixed_segments()[:3]
    codes = torch.randint(0, model.chat.config.gpt.num_audio_tokens - 1, (model.chat.config.gpt.num_vq, 9))
    segments[1].sample, segments[1].speaker, segments[1].transcript = codes, None, "the clip's words"
    input_ids, _, text_mask = encode_prompts(model, segments)
    embeddings, _ = embed_prompts(model, segments)
    expected = model.chat.embed(input_ids, text_mask)
    assert (~text_mask[1]).sum() >= codes.shape[1]  # the sample's codes (and the padding) are code positions
    # Everywhere but the speaker slots, which take each segment's speaker afterwards.
    speaker_slots = input_ids[..., 0].eq(model.chat.tokenizer.spk_emb_ids)
    assert torch.equal(embeddings[~speaker_slots], expected[~speaker_slots])


def test_prompts_tokenised_together_are_each_as_chattts_encodes_it_alone(synthesizer, mixed_segments):
    model = synthesizer.model
    segments = mixed_segments()
    codes = torch.randint(0, model.chat.config.gpt.num_audio_tokens - 1, (model.chat.config.gpt.num_vq, 7))
    segments[2].sample, segments[2].speaker, segments[2].transcript = codes, None, "the clip's words"
    tokenise_prompts(model, segments)
    for segment in segments:
        alone, _, _ = model.chat.tokenizer.encode(
            [segment.prompt], model.chat.config.gpt.num_vq, prompt=segment.sample, device="cpu"
        )
        assert segment.prompt_ids.dtype == alone.dtype and torch.equal(segment.prompt_ids, alone[0])
