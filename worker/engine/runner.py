"""The model runner: the GPT's weights, a paged KV cache, fixed slots, and one decode step for all of them.

Everything a decode step touches is allocated once per worker: the KV cache (one pool of blocks of
BLOCK_POSITIONS positions, per layer), each slot's block table (which blocks hold its positions, in
order: worker.engine.blocks decides, :meth:`set_blocks` writes it here), and per slot its prompt
length, step, last tokens, recent tokens (for the repetition penalty), sampling settings, hidden
states and codes. A segment takes a slot with ``prefill`` (the prompts admitted together run as one
pass, one after another with no padding between them, padded at its end to a bucket of tokens, and draw
step 0); then every ``decode_step`` draws the next step of the first ``rows`` slots, each at its own
position. Slots that finished (or hold nothing) stay in the step, frozen: their step stops advancing
and their output is cut at their end (on CUDA their attention reads nothing; elsewhere a slot that
holds nothing writes to the scratch block, where its table points). So the decode step's shapes depend
only on (rows, attended columns), and on CUDA it is captured as one CUDA graph per such bucket, kept
for the life of the worker and replayed, each layer's parts around its attention compiled into a few
kernels (worker.engine.layers), and so are the step's input and its draw (:func:`step_input`,
:func:`draw`: pure functions, the runner writing what they return). Nothing in a step reads back to the
host; the engine reads the small ``finished`` / ``lengths`` / ``ended_by`` state every few steps.

The attention is our own (over the model's weights, norms, MLPs and rotary module), rather than
transformers' StaticCache: its constructor changed across transformers 5.x, and it attends over the
whole cache, while this step attends over the columns in use rounded up to a bucket.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize

from chattts_farm.settings import SettingsError
from worker.engine import device_waits
from worker.engine.attention import decode_attention, prefill_attention, triton_available
from worker.engine.blocks import BLOCK_POSITIONS, blocks_for
from worker.engine.layers import (
    LayerWeights,
    after_attention,
    before_attention,
    fp8_after_attention,
    fp8_before_attention,
    fp8_layer,
    fuse_layers,
    rms_norm,
)
from worker.engine.sampler import NO_TOKEN, REPETITION_WINDOW, RowSampling, sample
from worker.model.loading import LoadedModel

# A decode step attends over the cache up to the next multiple of this many columns.
KV_BUCKET = 256
# Slots moved by one copy of each per-slot buffer when the engine packs its running slots.
MOVES_PER_COPY = 64

# With fp8 matmuls on, the passes of at least this many tokens (a decode step's rows, a prefill's tokens
# with its padding) multiply in float8; smaller ones keep the GPT's dtype. Below it a pass is bound by
# reading the weights and by its launches, and quantising its inputs costs more than the fp8 tensor cores
# save: on an H100 one row's step was 24% longer with them. Past it they paid at first (the full-load step
# 11% shorter, twenty-ninth session), but once the step in the model's dtype got cheaper they cost 3-8% at
# every row count from 256 to 2,047 (thirty-sixth session, docs/performance.md): off by default.
FP8_MATMULS_FROM_TOKENS = 256
# The compute capability of the first GPUs with fp8 tensor cores (Ada; Hopper is 9.0).
FP8_MATMUL_CAPABILITY = (8, 9)

STILL_RUNNING, ENDED_BY_EOS, ENDED_BY_LIMIT, INTERRUPTED = range(4)

# attend(layer index, query, key, value) -> attended values, for the prefill or the decode step
_Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def to_device(values: torch.Tensor | list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (a host tensor, or numbers) as a tensor on ``device``, copied without waiting for the
    work queued there.

    A plain copy to a GPU waits until its stream has run everything queued before it. The engine
    queues a step's decode steps and prepares the next (retires, admits, fills the block tables,
    encodes prompts) while they run; one such copy, and the host sat idle until the GPU was done (on
    an H200 at full load, 66 ms of a 100 ms synthesizer step), and the GPU idled while the host
    prepared. From pinned memory the copy takes its place in the stream, and the host goes on."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def check_fp8_matmuls(capability: tuple[int, int]) -> None:
    """Refuse fp8 matmuls on a GPU of ``capability`` without fp8 tensor cores."""
    if capability < FP8_MATMUL_CAPABILITY:
        needed, found = (".".join(map(str, version)) for version in (FP8_MATMUL_CAPABILITY, capability))
        raise SettingsError(
            f"CHATTTS_FARM_MATMUL_DTYPE=fp8 needs a GPU with fp8 tensor cores (compute capability {needed} or "
            f"later); this one's is {found}: set CHATTTS_FARM_MATMUL_DTYPE=model"
        )


def prefill_token_buckets(most: int) -> list[int]:
    """The token counts a prefill pass is padded to: steps of 64 up to 512, then of 512, then ``most``. A pass
    of a few hundred tokens is bound by its launches and its reads of the weights, not by its tokens; past
    that a pass computes fewer than 512 tokens that take no part (at the standard workload's passes of
    ~84,000 tokens, under 0.6%)."""
    buckets = [tokens for tokens in (*range(64, 512, 64), *range(512, most, 512)) if tokens < most]
    return [*buckets, most]


# Prefill passes of up to this many tokens are captured as CUDA graphs, a bucket each (23 of them); longer
# ones run their compiled parts without a graph. Such a pass keeps the GPU busy for 10 ms and more (a
# burst's passes ran ~580k tokens a second on an H200, docs/performance.md), which hides the launches of
# its few hundred kernels (an estimate: not measured), while graphs of every bucket up to a pass of 512
# prompts would be over 400, each captured at start.
PREFILL_GRAPH_TOKENS = 8192


def bucket_for(buckets: list[int], size: int) -> int:
    """The smallest of the sorted ``buckets`` that holds ``size``."""
    return buckets[bisect.bisect_left(buckets, size)]


# Above this many rows, the row counts a decode step is captured for go up in steps of it: a step then
# computes at most 63 rows that take no part. With steps of 256 (up to 255 such rows, in every layer's
# matmuls and the draw) the standard workload ran 0.8% slower on an H100 (docs/performance.md).
DECODE_ROW_STEP = 64


def row_buckets(most: int, step: int) -> list[int]:
    """The row counts a decode step is run (and on CUDA captured) for: powers of two up to ``step``, then
    multiples of ``step`` (with steps of 256, a step of 1,300 rows computes 1,536, not 2,048), then
    ``most``."""
    buckets, rows = [], 1
    while rows < min(most, step):
        buckets.append(rows)
        rows *= 2
    buckets.extend(range(rows, most, step))
    return [*buckets, most]


@dataclass
class StateSnapshot:
    """The first ``rows`` slots' finished flags, lengths and endings as they stand once the decode steps
    launched before it (``clock`` of them) have run: copied to host memory without waiting for them."""

    clock: int
    rows: int
    host: torch.Tensor  # (3, rows): finished, lengths, ended_by
    done: torch.cuda.Event | None  # None: the copy is there already (off CUDA)

    def ready(self) -> bool:
        return self.done is None or self.done.query()


class _LayerPass(NamedTuple):
    """How a pass runs the layers: the parts of a layer before and after its attention, and every layer's
    weights for them."""

    before: Callable
    after: Callable
    weights: list[LayerWeights]


class ModelRunner:
    """The GPT of one worker over ``slots`` preallocated slots of up to ``context`` positions each,
    whose keys and values share a pool of ``kv_blocks`` blocks. With ``matmul_dtype`` float8_e4m3fn the
    passes of at least FP8_MATMULS_FROM_TOKENS tokens multiply in float8 (None: all in the model's dtype)."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        slots: int,
        max_prompt_tokens: int,
        max_new_tokens: int,
        max_admissions: int,
        kv_blocks: int,
        kv_dtype: torch.dtype | None = None,
        matmul_dtype: torch.dtype | None = None,
        capture_graphs: bool = True,
        prefill_tokens: int | None = None,
    ) -> None:
        chat = model.chat
        self.llama = chat.gpt.gpt
        self.device = model.device
        self.use_graphs = capture_graphs and model.device.type == "cuda"
        # On CUDA with Triton each slot's attention reads its own filled columns (worker.engine.attention),
        # and the step's width stops mattering; elsewhere it attends over a masked common width.
        self.reads_own_columns = model.device.type == "cuda" and triton_available()
        fp8_matmuls = matmul_dtype == torch.float8_e4m3fn
        if fp8_matmuls and model.device.type == "cuda":
            check_fp8_matmuls(torch.cuda.get_device_capability(model.device))
        layer_weights, self.layer_shape = fuse_layers(self.llama)
        # On the GPU each layer's two parts run compiled (a few kernels each, worker.engine.layers), as do a
        # decode step's input and every draw, in the captured steps and the prefill alike (their rows and
        # length symbolic); the CPU runs them op by op.
        compiled = self.use_graphs and self.reads_own_columns
        maybe_compiled = torch.compile if compiled else lambda function: function
        self._model_pass = _LayerPass(maybe_compiled(before_attention), maybe_compiled(after_attention), layer_weights)
        self._fp8_pass = (
            _LayerPass(
                maybe_compiled(fp8_before_attention),
                maybe_compiled(fp8_after_attention),
                [fp8_layer(weights) for weights in layer_weights],
            )
            if fp8_matmuls
            else None
        )
        self._choose = compiled_exactly(draw) if compiled else draw
        self._step_input = compiled_exactly(step_input) if compiled else step_input
        config = self.llama.config
        self.slots = slots
        self.decode_row_buckets = row_buckets(slots, DECODE_ROW_STEP)
        # One slot more than the engine's: the prefill's padding (its tokens, its rows' draws) writes there
        # (see prefill).
        self.scratch_slot = slots
        self.max_admissions = max_admissions
        self.max_prompt_tokens = max_prompt_tokens
        self.context = max_prompt_tokens + max_new_tokens
        self.eos_token = chat.config.gpt.num_audio_tokens - 1
        num_vq = chat.config.gpt.num_vq
        device = self.device
        # The code heads are weight-normalised: compute their weights once, not on every step.
        with parametrize.cached():
            head_weights = torch.stack([head.weight for head in chat.embed.head_code]).float()
        self.heads = split_heads(head_weights) if self.llama.dtype == torch.bfloat16 else head_weights

        attention = self.llama.layers[0].self_attn
        self.kv_dtype = kv_dtype or self.llama.dtype
        # One block more than the pool's: what writes must land somewhere but is never read (a
        # prefill's padding, a free slot's frozen step off CUDA) goes to this scratch block.
        self.kv_blocks = kv_blocks
        self.scratch_block = kv_blocks
        cache_shape = (
            len(self.llama.layers),
            kv_blocks + 1,
            config.num_key_value_heads,
            BLOCK_POSITIONS,
            attention.head_dim,
        )
        # Zeros, not empty: off CUDA a step's attention reads unwritten positions of its bucket too
        # (masked, weight 0), and 0 x NaN left over in the memory would still be NaN.
        self.keys = torch.zeros(cache_shape, dtype=self.kv_dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.table_width = blocks_for(self.context)
        # int64: a layer's pool may pass 2**31 elements, and the kernel's addresses are block x stride.
        self.block_table = torch.full(
            (slots + 1, self.table_width), self.scratch_block, dtype=torch.long, device=device
        )

        # Every per-slot buffer, in one list too: a segment moved to another slot takes them all along.
        self._slot_state: list[torch.Tensor] = []

        def per_slot(fill, dtype, *shape):
            self._slot_state.append(torch.full((slots + 1, *shape), fill, dtype=dtype, device=device))
            return self._slot_state[-1]

        self.slot_index = torch.arange(slots, device=device)
        self.columns = torch.arange(self.table_width * BLOCK_POSITIONS, device=device)
        # A pass gathers its positions' cos and sin from this table in one kernel, where computing them
        # took eight. Per position, so the same values.
        self.rotary = rotary_table(self.llama, self.columns)
        self.code_embeddings = torch.stack([embedding.weight.detach() for embedding in chat.embed.emb_code])
        # An empty slot has a prompt of 1 so that its frozen step writes and attends column 0.
        self.prompt_length = per_slot(1, torch.long)
        self.step = per_slot(0, torch.long)  # the step the slot's next draw makes
        self.tokens = per_slot(0, torch.long, num_vq)
        # The last REPETITION_WINDOW steps' tokens as a ring (slot = step % window), for the penalty.
        self.recent = per_slot(NO_TOKEN, torch.long, REPETITION_WINDOW, num_vq)
        # One more step than a segment may draw: a finished slot keeps writing at its frozen step. Kept in
        # the GPT's dtype, the final norm's: on a GPU bfloat16, half the memory of float32 and no rounding.
        self.hiddens = per_slot(0.0, self.llama.dtype, max_new_tokens + 1, config.hidden_size)
        self.codes = per_slot(0, torch.int32, max_new_tokens + 1, num_vq)
        self.finished = per_slot(True, torch.bool)
        self.lengths = per_slot(0, torch.long)
        self.ended_by = per_slot(STILL_RUNNING, torch.long)
        self.min_tokens = per_slot(0, torch.long)
        self.end_at = per_slot(1, torch.long)
        self.sampling = RowSampling(
            temperature=per_slot(1.0, torch.float32),
            top_p=per_slot(1.0, torch.float64),
            top_k=per_slot(1, torch.long),
            repetition_penalty=per_slot(1.0, torch.float32),
            seed=per_slot(0, torch.long),
        )

        # The prefill's inputs: its prompts' embeddings one after another, and per row (prompt) its slot and
        # its length, the same buffers for every pass, so that each token bucket's pass is one CUDA graph.
        # The most tokens one pass takes (its activations' memory): by default every row the longest
        # prompt; a smaller budget runs long prompts (a clip voice's) a few to a pass.
        self.prefill_tokens = max(prefill_tokens or self.max_admissions * max_prompt_tokens, max_prompt_tokens)
        self.prefill_token_buckets = prefill_token_buckets(self.prefill_tokens)
        self.prefill_embeddings = torch.zeros(
            (self.prefill_tokens, config.hidden_size), dtype=self.llama.dtype, device=device
        )
        self.prefill_token_index = torch.arange(self.prefill_tokens, device=device)
        self.prefill_slots = torch.full((self.max_admissions,), self.scratch_slot, dtype=torch.long, device=device)
        self.prefill_lengths = torch.zeros(self.max_admissions, dtype=torch.long, device=device)

        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        # All graphs share one memory pool: they keep no outputs of their own (every result goes to
        # the buffers above) and never run side by side, so each uses the pool as scratch.
        self.graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_stream = torch.cuda.Stream(device) if self.use_graphs else None
        # Where a snapshot of the slots' state lands (pinned: copied while the steps run), and the
        # stream the finished slots' outputs are copied on: it waits only for the steps a snapshot
        # covers, so that those copies and the vocoder behind them need not wait for the steps
        # launched since (see Engine.step).
        on_cuda = device.type == "cuda"
        # Flat, so that the first rows' snapshot is one contiguous block: a copy into a strided view
        # of pinned memory goes through pageable memory and waits for the device.
        self._snapshot_host = torch.empty(3 * (slots + 1), dtype=torch.long, pin_memory=on_cuda)
        self.output_stream = torch.cuda.Stream(device) if on_cuda else None

    @staticmethod
    def bytes_per_block(model: LoadedModel, *, kv_bytes: int) -> int:
        """The memory one block of the KV cache takes (every layer's keys and values)."""
        config = model.chat.gpt.gpt.config
        head_dim = config.hidden_size // config.num_attention_heads
        return BLOCK_POSITIONS * 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * kv_bytes

    @staticmethod
    def fp8_weight_bytes(model: LoadedModel) -> int:
        """The memory the float8 copies of every layer's matmul weights take with their scales (fp8
        matmuls keep the model's own weights too, for the small passes)."""
        config = model.chat.gpt.gpt.config
        head_dim = config.hidden_size // config.num_attention_heads
        attention_width = config.num_attention_heads * head_dim
        qkv_width = attention_width + 2 * config.num_key_value_heads * head_dim
        # (out, in) of the qkv, output, gate-and-up and down projections
        shapes = [
            (qkv_width, config.hidden_size),
            (config.hidden_size, attention_width),
            (2 * config.intermediate_size, config.hidden_size),
            (config.hidden_size, config.intermediate_size),
        ]
        # A byte a weight, and a float32 scale an output channel.
        return config.num_hidden_layers * sum(out * (width + 4) for out, width in shapes)

    @staticmethod
    def bytes_per_slot(model: LoadedModel, *, max_new_tokens: int) -> int:
        """The memory one slot's own state takes, outside the KV cache (its hidden states dominate)."""
        llama = model.chat.gpt.gpt
        return (max_new_tokens + 1) * llama.config.hidden_size * llama.dtype.itemsize

    def set_blocks(self, entries: list[tuple[int, int, int]]) -> None:
        """Write (slot, index in its table, block) entries into the block tables."""
        if entries:
            slots, indices, blocks = to_device(entries, self.device, torch.long).T
            self.block_table[slots, indices] = blocks

    def move_slots(self, moves: list[tuple[int, int]]) -> None:
        """Move running segments from slot to slot (the targets free): every per-slot buffer and the
        block table's row go with them; the sources are left finished, their tables at the scratch block."""
        if not moves:
            return
        self._after_output_copies()
        sources, targets = to_device(moves, self.device, torch.long).T
        # A slot's hidden states are 3 MiB at full scale (bfloat16): a late workload's few hundred moves copied at
        # once would take a temporary of GiBs beside the KV cache.
        for first in range(0, len(moves), MOVES_PER_COPY):
            chunk = slice(first, first + MOVES_PER_COPY)
            for state in self._slot_state:
                state.index_copy_(0, targets[chunk], state.index_select(0, sources[chunk]))
        self.block_table[targets] = self.block_table[sources]
        self.block_table.index_fill_(0, sources, self.scratch_block)
        self.finished.index_fill_(0, sources, True)

    def clear_blocks(self, slots: list[int]) -> None:
        """Point the slots' tables at the scratch block: their blocks have gone back to the pool."""
        if slots:
            # index_fill_, not [index] = value: cProfile on the H200 found that assignment waiting 18 ms
            # a synthesizer step for the device.
            self.block_table.index_fill_(0, to_device(slots, self.device, torch.long), self.scratch_block)

    def prefill(
        self,
        slots: list[int],
        embeddings: torch.Tensor,
        prompt_lengths: list[int],
        sampling: RowSampling,
        min_tokens: torch.Tensor,
        end_at: torch.Tensor,
    ) -> None:
        """Start segments in ``slots``: run their prompts, one after another in the order of ``slots``
        (``embeddings`` (tokens, width), ``prompt_lengths`` tokens each), as one pass, and draw step 0."""
        self._after_output_copies()
        index = to_device(slots, self.device, torch.long)
        lengths = to_device(prompt_lengths, self.device, torch.long)
        for name in sampling.__dataclass_fields__:
            getattr(self.sampling, name)[index] = getattr(sampling, name).to(getattr(self.sampling, name).dtype)
        self.prompt_length[index] = lengths
        self.min_tokens[index] = min_tokens
        self.end_at[index] = end_at
        # index_fill_, not [index] = number: on CUDA that assignment waits for the device (torch's sync
        # debug mode found each of these five in every prefill pass on an H200).
        for state, value in (
            (self.step, 0),
            (self.recent, NO_TOKEN),
            (self.finished, False),
            (self.lengths, 0),
            (self.ended_by, STILL_RUNNING),
        ):
            state.index_fill_(0, index, value)

        tokens = embeddings.shape[0]
        bucket = self.prefill_bucket(tokens)
        # The tokens past the prompts keep what earlier passes left there: each attends to itself alone, its
        # keys and values go to the scratch block, and no draw reads it.
        self.prefill_embeddings[:tokens] = embeddings
        graphed = self.use_graphs and bucket <= PREFILL_GRAPH_TOKENS
        # A graph serves every pass of its bucket: as many rows as a pass of its tokens may hold, prompts as
        # long as any may be. A pass run without one takes its own.
        if graphed:
            shape = (bucket, min(self.max_admissions, bucket), self.max_prompt_tokens)
        else:
            shape = (bucket, len(slots), max(prompt_lengths))
        rows = shape[1]
        self.prefill_slots[:rows] = self.scratch_slot
        self.prefill_slots[: len(slots)] = index
        self.prefill_lengths[:rows] = 0
        self.prefill_lengths[: len(slots)] = lengths
        if graphed:
            self._run(shape, self.prefill_graphs, self._prefill_pass)
        else:
            self._prefill_pass(*shape)

    def _prefill_pass(self, tokens: int, rows: int, longest: int) -> None:
        """The prompts of the prefill buffers' first ``rows`` rows (none of more than ``longest`` tokens),
        one after another in their first ``tokens`` tokens: the cache filled, step 0 drawn. A row of length
        0 holds no prompt, and draws for the scratch slot."""
        lengths = self.prefill_lengths[:rows]
        ends = lengths.cumsum(0)
        token = self.prefill_token_index[:tokens]
        # Each token's row, where its prompt starts in the pass and its position in that prompt, worked out
        # on the device, so that a graph holds the work for any prompts of its bucket. A token past the last
        # prompt is padding: a prompt of its own, at position 0 of the scratch slot, whose table holds only
        # the scratch block.
        row = torch.searchsorted(ends, token, right=True)
        in_prompt = row < rows
        row = row.clamp(max=rows - 1)
        starts = torch.where(in_prompt, ends[row] - lengths[row], token)
        positions = torch.where(in_prompt, token - starts, 0)
        slots = torch.where(in_prompt, self.prefill_slots[row], self.scratch_slot)
        blocks = self.block_table[slots, positions // BLOCK_POSITIONS]
        places = positions % BLOCK_POSITIONS

        def attend(layer: int, query, key, value):
            self.keys[layer, blocks, :, places] = key[0].transpose(0, 1).to(self.kv_dtype)
            self.values[layer, blocks, :, places] = value[0].transpose(0, 1).to(self.kv_dtype)
            return prefill_attention(query[0], key[0], value[0], starts, self._scale, longest).unsqueeze(0)

        inputs = self.prefill_embeddings[:tokens].unsqueeze(0)
        hidden, mlp_out = self._forward(inputs, positions.unsqueeze(0), attend, self._layer_pass(tokens))
        # Step 0 is drawn from each prompt's last token (a row holding none, for the scratch slot, from the
        # last prompt's, or the first token).
        last = (ends - 1).clamp(min=0)
        self._draw(self.prefill_slots[:rows], hidden[0, last], mlp_out[0, last])

    def prefill_bucket(self, tokens: int) -> int:
        """The tokens a prefill pass of ``tokens`` prompt tokens is padded to."""
        return bucket_for(self.prefill_token_buckets, tokens)

    def prefill_fits(self, rows: int, tokens: int) -> bool:
        """Whether ``rows`` prompts of ``tokens`` tokens in all fit one prefill pass. Their tokens bound the
        attention's work and memory too: each token attends to its own prompt's tokens alone, and nothing
        of tokens x tokens is made (worker.engine.attention)."""
        return rows <= self.max_admissions and tokens <= self.prefill_tokens

    def decode_step(self, rows: int, kv_length: int) -> None:
        """Draw the next step of the first ``rows`` slots, attending over ``kv_length`` positions."""
        if self.reads_own_columns:
            kv_length = self.context
        self._run((rows, kv_length), self.graphs, self._decode)

    def _run(self, shape: tuple[int, int], graphs: dict, work: Callable[[int, int], None]) -> None:
        """``work(*shape)``: on CUDA the graph captured for that shape, captured now if it is new."""
        if not self.use_graphs:
            work(*shape)
            return
        graph = graphs.get(shape)
        if graph is not None:
            graph.replay()
            return
        # The first run of a shape is eager on the capture stream, which warms up what the capture
        # records there (compiled kernels, cuBLAS workspaces, kernel choices); capturing runs nothing,
        # so the state advances exactly once.
        self.capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.capture_stream):
            work(*shape)
        torch.cuda.current_stream(self.device).wait_stream(self.capture_stream)
        graph = torch.cuda.CUDAGraph()
        # Thread-local: a worker's other threads (its heartbeat asks the GPU for free memory) may
        # call CUDA while this thread captures; in the default global mode that breaks the capture.
        with torch.cuda.graph(
            graph, pool=self.graph_pool, stream=self.capture_stream, capture_error_mode="thread_local"
        ):
            work(*shape)
        graphs[shape] = graph

    # Without autograd, as the engine's steps run, and not in inference mode: dynamo compiles a variant of
    # each part for each grad mode, and for inference tensors (all that inference mode makes) apart from
    # the others (the runner's buffers); in a worker's warm-up the mixes took 7 of a part's 8 variants,
    # its recompile limit, past which the part runs op by op.
    @torch.no_grad()
    def capture_every_bucket(self) -> int:
        """Capture the decode step of every (rows, columns) bucket and the prefill of every token bucket up to
        PREFILL_GRAPH_TOKENS now, while no slot runs; returns how many graphs the runner holds.

        Captured on first use instead, a burst of new work pays them while its listeners wait: on the
        H200, 64 streams arriving at a warm worker found new buckets and waited 600 ms longer for their
        first audio than the next 64 (and a first compilation takes seconds). The steps run here draw
        for free slots only, whose state every prefill sets afresh; the prefills here write to the
        scratch slot alone. The budget's largest pass, past the graphs, runs once too: a burst's first
        pass finds its compiled parts ready, and a budget that does not fit in memory fails at start.
        """
        if not self.use_graphs:
            return 0
        if self.reads_own_columns:
            kv_lengths = [self.context]
        else:
            kv_lengths = sorted({self.kv_bucket(columns) for columns in range(1, self.context + 1)})
        for rows in self.decode_row_buckets:
            for kv_length in kv_lengths:
                self.decode_step(rows, kv_length)
        self.prefill_slots.fill_(self.scratch_slot)
        self.prefill_lengths.zero_()
        for tokens in self.prefill_token_buckets:
            shape = (tokens, min(self.max_admissions, tokens), self.max_prompt_tokens)
            if tokens <= PREFILL_GRAPH_TOKENS:
                self._run(shape, self.prefill_graphs, self._prefill_pass)
            elif tokens == self.prefill_tokens:
                self._prefill_pass(*shape)
        return len(self.graphs) + len(self.prefill_graphs)

    def kv_bucket(self, columns: int) -> int:
        """The cache columns a decode step attends over when its deepest slot has used ``columns``:
        rounded up to a multiple of KV_BUCKET, so that steps share few shapes (and graphs)."""
        return min(self.context, -(-columns // KV_BUCKET) * KV_BUCKET)

    def interrupt(self, slots: list[int]) -> None:
        """Finish the given slots now, keeping the steps drawn so far (call between steps)."""
        index = to_device(slots, self.device, torch.long)
        running = ~self.finished[index]
        self.lengths[index] = torch.where(running, self.step[index], self.lengths[index])
        self.ended_by[index] = torch.where(running, INTERRUPTED, self.ended_by[index])
        self.finished.index_fill_(0, index, True)

    def snapshot_state(self, rows: int, clock: int) -> StateSnapshot:
        """The first ``rows`` slots' state once the steps launched so far (``clock`` of them) have run.

        Read it (:meth:`read_snapshot`) before taking the next: there is one host buffer."""
        state = torch.stack([self.finished[:rows].long(), self.lengths[:rows], self.ended_by[:rows]])
        if self.output_stream is None:
            return StateSnapshot(clock, rows, state, None)
        host = self._snapshot_host[: 3 * rows].view(3, rows)
        host.copy_(state, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return StateSnapshot(clock, rows, host, done)

    def read_snapshot(self, snapshot: StateSnapshot) -> tuple[list[bool], list[int], list[int]]:
        """A snapshot's finished flags, lengths and endings (waiting for its steps); the outputs copied
        from now on are those of its steps."""
        if snapshot.done is not None:
            device_waits.wait_for(snapshot.done)
            if self.output_stream is not None:
                self.output_stream.wait_event(snapshot.done)
        finished, lengths, ended_by = snapshot.host.tolist()
        return [bool(flag) for flag in finished], lengths, ended_by

    @contextlib.contextmanager
    def copying_outputs(self) -> Iterator[None]:
        """Where copies of slots' outputs (and the work on them launched here) go: on CUDA the output
        stream, beside the steps launched after the last snapshot read."""
        if self.output_stream is None:
            yield
            return
        with torch.cuda.stream(self.output_stream):
            yield

    def outputs(self, slots: list[int], lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of finished slots' hidden states and codes, each of its length (the slots may be reused
        at once), gathered in one copy each for all of them: every torch call from the engine's thread
        lets go of the interpreter's lock, and beside the ASR gate's thread, taking it back after a copy
        and a cast a slot was ~11% of the engine's thread (py-spy, bench.asr_cost, H100, 2026-12-06).
        Each output is a view into those copies, so what keeps one alive keeps all of them: the pipeline
        lets go of a segment's hidden states once they are decoded."""
        if not slots:
            return []
        longest = max(lengths)
        with self.copying_outputs():
            index = to_device(slots, self.device, torch.long)
            hiddens = self.hiddens[:, :longest].index_select(0, index)
            codes = self.codes[:, :longest].index_select(0, index).long()
        return [(hiddens[row, :length], codes[row, :length]) for row, length in enumerate(lengths)]

    def copy_hiddens(self, slot: int, start: int, stop: int) -> torch.Tensor:
        """A copy of a slot's hidden states of steps [start, stop), drawn by the last snapshot read, on the
        current stream: the caller enters :meth:`copying_outputs` once for all the copies of a round."""
        return self.hiddens[slot, start:stop].clone()

    def _after_output_copies(self) -> None:
        """Make the steps' stream wait for the output copies launched so far before it writes a slot
        again: a retired slot's next segment, or a segment moved there, would overwrite what they read."""
        if self.output_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.output_stream)

    @property
    def _scale(self) -> float:
        return self.llama.layers[0].self_attn.scaling

    @property
    def _grouped(self) -> bool:
        return self.llama.layers[0].self_attn.num_key_value_groups > 1

    def _decode(self, rows: int, kv_length: int) -> None:
        inputs, column, taking_part = self._step_input(
            self.tokens[:rows],
            self.code_embeddings,
            self.prompt_length[:rows],
            self.step[:rows],
            self.finished[:rows],
            self.llama.dtype,
        )
        slots = self.slot_index[:rows]

        if self.reads_own_columns:

            def attend(layer: int, query, key, value):
                # The kernel rotates the query and the new key, and writes the new key and value into the
                # cache itself.
                return decode_attention(
                    query,
                    key,
                    value,
                    self.keys[layer],
                    self.values[layer],
                    self.block_table[:rows],
                    taking_part,
                    self._scale,
                    rotary=self.rotary,
                )

        else:
            # The reference: each row's first blocks gathered into one span, attended with a mask.
            read = self.block_table[:rows, : blocks_for(kv_length)]
            span = read.shape[1] * BLOCK_POSITIONS
            visible = (self.columns[:span].unsqueeze(0) <= column.unsqueeze(1))[:, None, None, :]
            block = self.block_table[slots, column // BLOCK_POSITIONS]
            place = column % BLOCK_POSITIONS

            def attend(layer: int, query, key, value):
                self.keys[layer, block, :, place] = key[:, :, 0].to(self.kv_dtype)
                self.values[layer, block, :, place] = value[:, :, 0].to(self.kv_dtype)
                # index_select of whole blocks: about twice as fast on the CPU as indexing by the table.
                keys, values = (
                    cache[layer]
                    .index_select(0, read.flatten())
                    .view(rows, read.shape[1], *cache.shape[2:])
                    .transpose(1, 2)
                    .reshape(rows, cache.shape[2], span, cache.shape[-1])
                    .to(query.dtype)
                    for cache in (self.keys, self.values)
                )
                return F.scaled_dot_product_attention(
                    query, keys, values, attn_mask=visible, scale=self._scale, enable_gqa=self._grouped
                )

        hidden, mlp_out = self._forward(
            inputs, column.unsqueeze(1), attend, self._layer_pass(rows), rotate=not self.reads_own_columns
        )
        self._draw(slots, hidden[:, -1], mlp_out[:, -1])

    def _layer_pass(self, tokens: int) -> _LayerPass:
        """How a pass of ``tokens`` tokens (a decode step's rows, a prefill's tokens) runs the layers: in
        float8 from FP8_MATMULS_FROM_TOKENS when fp8 matmuls are on, else in the model's dtype."""
        if self._fp8_pass is not None and tokens >= FP8_MATMULS_FROM_TOKENS:
            return self._fp8_pass
        return self._model_pass

    def _forward(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        attend: _Attention,
        layer_pass: _LayerPass,
        *,
        rotate: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Llama layers on (rows, length, width) inputs at ``positions`` (a decode step's rows of one
        token, or a prefill's one row of its prompts' tokens), as ``layer_pass`` runs them; ``attend`` reads
        and fills the cache, and rotates the queries and keys where ``rotate`` is false. The last layer's
        output comes as its two terms (see :func:`worker.engine.layers.after_attention`); the draw adds
        them, and applies the model's final norm (:func:`draw`)."""
        before, after, layer_weights = layer_pass
        # The first layer adds zeros: with None there, it would be a variant of the compiled part of its
        # own, and the decode steps' and the prefills' variants together would pass dynamo's recompile
        # limit (8), past which it runs the part op by op.
        hidden, mlp_out = inputs, torch.zeros_like(inputs)
        cos, sin = self.rotary[:, positions] if rotate else (None, None)
        for index, weights in enumerate(layer_weights):
            hidden, query, key, value = before(
                hidden, mlp_out, weights.input_norm, weights.qkv, cos, sin, self.layer_shape
            )
            attended = attend(index, query, key, value)
            hidden, mlp_out = after(
                hidden,
                attended,
                weights.output,
                weights.post_attention_norm,
                weights.gate_up,
                weights.down,
                self.layer_shape.norm_eps,
            )
        return hidden, mlp_out

    def _draw(self, slots: torch.Tensor, hidden: torch.Tensor, mlp_out: torch.Tensor) -> None:
        """Record each slot's hidden state at its step, draw its tokens, note the slots that end."""
        drawn = self._choose(
            slots,
            hidden,
            mlp_out,
            self.llama.norm.weight,
            self.layer_shape.norm_eps,
            self.heads,
            self.step,
            self.finished,
            self.recent,
            self.sampling,
            self.min_tokens,
            self.end_at,
            self.lengths,
            self.ended_by,
            self.eos_token,
        )
        self.hiddens[slots, drawn.step] = drawn.hidden
        self.codes[slots, drawn.step] = drawn.codes
        self.recent[slots, drawn.step % REPETITION_WINDOW] = drawn.tokens
        self.tokens[slots] = drawn.tokens
        self.lengths[slots] = drawn.lengths
        self.ended_by[slots] = drawn.ended_by
        self.finished[slots] = drawn.finished
        self.step[slots] = drawn.next_step


def rotary_table(llama, columns: torch.Tensor) -> torch.Tensor:
    """The cos and sin of each of ``columns``' positions as ``llama``'s rotary embedding gives them,
    (2, columns, head dim) in its dtype."""
    return torch.stack(llama.rotary_emb(columns.new_empty(0, dtype=llama.dtype), columns[None]))[:, 0]


def compiled_exactly(function: Callable) -> Callable:
    """``function`` compiled to compute what it computes op by op: rounded to a narrower dtype wherever
    it rounds (left to itself, inductor keeps the float32 of a bfloat16 norm's intermediate, and a
    token may come out otherwise)."""
    return torch.compile(function, options={"emulate_precision_casts": True})


class SplitWeights(NamedTuple):
    """Float32 weights (outputs, inputs) as two bfloat16 terms, each weight ``high + low`` (to 16 of its 24
    bits), side by side along their input: a bfloat16 input, twice over, times them in one matmul on
    tensor cores that adds in float32 (:func:`split_product`)."""

    terms: torch.Tensor  # (outputs, 2 x inputs) bfloat16: each row its high terms, then its low


def split_weights(weights: torch.Tensor) -> SplitWeights:
    """``weights`` (outputs, inputs) float32 as :class:`SplitWeights`."""
    high = weights.bfloat16()
    low = (weights - high.float()).bfloat16()
    return SplitWeights(torch.cat([high, low], dim=-1))


def split_product(x: torch.Tensor, weights: SplitWeights) -> torch.Tensor:
    """``x @ weights.T`` in float32 for bfloat16 ``x`` (rows, inputs), which each term multiplies exactly:
    the two terms' products summed in float32."""
    twice = torch.cat([x, x], dim=-1)
    if x.is_cuda:
        return torch.mm(twice, weights.terms.t(), out_dtype=torch.float32)
    # A float32 output of bfloat16 operands is CUDA's alone: widened first (exactly), the same sums.
    return torch.mm(twice.float(), weights.terms.float().t())


class SplitHeads(NamedTuple):
    """The code heads' float32 weights as :class:`SplitWeights`, their codebooks' rows one after another."""

    weights: SplitWeights  # (codebooks x vocab) outputs
    codebooks: int


def split_heads(head_weights: torch.Tensor) -> SplitHeads:
    """``head_weights`` (codebooks, vocab, width) float32 as :class:`SplitHeads`."""
    codebooks, vocab, width = head_weights.shape
    return SplitHeads(split_weights(head_weights.reshape(codebooks * vocab, width)), codebooks)


def code_logits(hidden: torch.Tensor, heads: torch.Tensor | SplitHeads) -> torch.Tensor:
    """The code heads' logits (rows, codebooks, vocab) in float32 from the final norm's ``hidden``
    (rows, width): over float32 heads, a float32 matmul; over :class:`SplitHeads` (bfloat16 hidden states),
    :func:`split_product`. The float32 matmul ran on CUDA cores, 1.6% of a full-load step on an H100;
    split, a step at 2,048 slots took 3.09 ms instead of 3.28 there (docs/performance.md)."""
    if not isinstance(heads, SplitHeads):
        return torch.einsum("bh,qvh->bqv", hidden.float(), heads)
    return split_product(hidden, heads.weights).view(len(hidden), heads.codebooks, -1)


class Drawn(NamedTuple):
    """What a draw decided for its slots, before any of it is written to their state."""

    hidden: torch.Tensor  # (rows, width) in the GPT's dtype: the hidden states the tokens were drawn from
    step: torch.Tensor  # the step each slot drew
    tokens: torch.Tensor  # (rows, codebooks) long
    codes: torch.Tensor  # the same, int32
    lengths: torch.Tensor
    ended_by: torch.Tensor
    finished: torch.Tensor
    next_step: torch.Tensor  # the step each slot draws next (a finished slot's stays)


def draw(
    slots: torch.Tensor,
    hidden: torch.Tensor,
    mlp_out: torch.Tensor,
    norm: torch.Tensor,
    norm_eps: float,
    heads: torch.Tensor | SplitHeads,
    steps: torch.Tensor,
    finished: torch.Tensor,
    recent: torch.Tensor,
    sampling: RowSampling,
    min_tokens: torch.Tensor,
    end_at: torch.Tensor,
    lengths: torch.Tensor,
    ended_by: torch.Tensor,
    eos_token: int,
) -> Drawn:
    """The tokens ``slots`` draw from the last layer's output, ``hidden + mlp_out`` (its two terms, added
    here, in the kernel of the model's final ``norm``, also applied here), and how that leaves them, from
    the per-slot state (every slot's; read, never written).

    A pure function, so that on a GPU it compiles into a few kernels (op by op, the draw was ~110
    small kernels of a one-slot step's ~390) while the runner's writes stay outside it: compiled
    writes into the per-slot buffers copied the whole buffer of hidden states (GiBs) each step.
    """
    hidden = rms_norm(hidden + mlp_out, norm, norm_eps)
    step = steps[slots]
    running = ~finished[slots]
    logits = code_logits(hidden, heads)
    tokens = sample(logits, recent[slots], sampling.select(slots), step, eos_token, min_tokens[slots] > step)
    ended_by_eos = tokens.eq(eos_token).any(dim=1) & running
    reached_end = end_at[slots].eq(step + 1) & running & ~ended_by_eos
    return Drawn(
        hidden=hidden,
        step=step,
        tokens=tokens,
        codes=tokens.to(torch.int32),
        lengths=torch.where(ended_by_eos, step, torch.where(reached_end, step + 1, lengths[slots])),
        ended_by=torch.where(ended_by_eos, ENDED_BY_EOS, torch.where(reached_end, ENDED_BY_LIMIT, ended_by[slots])),
        finished=~running | ended_by_eos | reached_end,
        next_step=step + running.long(),
    )


def step_input(
    tokens: torch.Tensor,
    code_embeddings: torch.Tensor,
    prompt_length: torch.Tensor,
    step: torch.Tensor,
    finished: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's input: each slot's last tokens embedded (ChatTTS's sum of its codebooks' code
    embeddings, ``code_embeddings`` stacked (codebooks, vocab, width)), (rows, 1, width) in ``dtype``;
    the column each slot's step writes (right-aligned prompts make it the token's position too); and
    that column, or -1 for a slot taking no part (finished or free: its step's output is never kept,
    and a slot retired but not yet reused would read its whole cache every step)."""
    embedded = torch.stack([code_embeddings[q][tokens[:, q]] for q in range(tokens.shape[1])], dim=2).sum(dim=2)
    column = prompt_length + step - 1
    return embedded.unsqueeze(1).to(dtype), column, torch.where(finished, -1, column)
