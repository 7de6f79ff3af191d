"""One batched GPT pass with a preallocated KV cache and a fixed-shape decode step.

The eager loop in transformers spends most of an H200 step on Python, kernel launches and host
syncs. Here every tensor a decode step touches is allocated once for the pass (rows x (prompt +
max steps)), rows that end stay in the batch (masked, their output cut at their end), and the step
index lives on the device. So the whole step -- embedding the 4 codes, the Llama layers, the code
heads and the sampling -- has static shapes, and on CUDA it is captured once as a CUDA graph and
replayed. Nothing in a step reads back to the host; the caller reads the small ``finished`` flags
every few steps.

The attention is our own (over the model's weights, norms, MLPs and rotary module), rather than
transformers' StaticCache: the StaticCache constructor changed across transformers 5.x and its
attention always runs over the whole cache, while this one attends over the filled part of the cache
rounded up to a bucket, with one graph per bucket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from worker.model import LoadedModel
from worker.sampling import NO_TOKEN, REPETITION_WINDOW, RowSampling, sample

# The attention of a decode step reads the KV cache up to the next multiple of this many columns:
# short passes do not pay for the whole cache, long ones capture a graph per bucket.
KV_BUCKET = 256

STILL_RUNNING, ENDED_BY_EOS, ENDED_BY_LIMIT, INTERRUPTED = range(4)


class DecodeRunner:
    """The decode state of one batched pass: KV cache, per-row sampling state, outputs, graphs.

    ``prefill`` runs the prompts and draws step 0; each ``decode_step`` draws the next step for every
    row. A row finishes when it draws EOS (its output excludes that step) or reaches ``end_at``
    tokens; ``interrupt`` finishes rows from the host. ``lengths[row]`` is the number of hidden states
    (and of codes, the tokens drawn with them) of a finished row, ``ended_by[row]`` why it finished. On
    CUDA each decode step is a CUDA graph replay, unless ``capture_graphs`` is false (to measure the same
    step eagerly).
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        sampling: RowSampling,
        min_tokens: torch.Tensor,
        end_at: torch.Tensor,
        prompt_length: int,
        max_steps: int,
        capture_graphs: bool = True,
    ) -> None:
        chat = model.chat
        self.llama = chat.gpt.gpt
        self.code_embeddings = chat.embed.emb_code
        self.device = model.device
        self.use_graphs = capture_graphs and model.device.type == "cuda"
        config = self.llama.config
        rows = len(end_at)
        self.eos_token = chat.config.gpt.num_audio_tokens - 1
        self.sampling = sampling
        self.min_tokens = min_tokens
        self.end_at = end_at
        self.prompt_length = prompt_length
        # The code heads are weight-normalised: compute their weights once, not on every step.
        with parametrize.cached():
            self.head_weights = torch.stack([head.weight for head in chat.embed.head_code]).float()

        attention = self.llama.layers[0].self_attn
        self.capacity = prompt_length + max_steps
        cache_shape = (len(self.llama.layers), rows, config.num_key_value_heads, self.capacity, attention.head_dim)
        # Zeros, not empty: a step's attention reads the unwritten columns of its bucket too (masked,
        # weight 0), and 0 x NaN left over in the memory would still be NaN.
        self.keys = torch.zeros(cache_shape, dtype=self.llama.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.attendable = torch.zeros(rows, self.capacity, dtype=torch.bool, device=self.device)
        self.last_prompt_position = torch.zeros(rows, dtype=torch.long, device=self.device)

        self.step = torch.zeros((), dtype=torch.long, device=self.device)  # the step the next draw makes
        self.tokens = torch.zeros(rows, chat.config.gpt.num_vq, dtype=torch.long, device=self.device)
        # The last REPETITION_WINDOW steps' tokens as a ring (slot = step % window), for the penalty.
        self.recent = torch.full(
            (rows, REPETITION_WINDOW, chat.config.gpt.num_vq), NO_TOKEN, dtype=torch.long, device=self.device
        )
        self.hiddens = torch.zeros(rows, max_steps, config.hidden_size, dtype=torch.float32, device=self.device)
        self.codes = torch.zeros(rows, max_steps, chat.config.gpt.num_vq, dtype=torch.long, device=self.device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.ended_by = torch.full((rows,), STILL_RUNNING, dtype=torch.long, device=self.device)

        self.steps_drawn = 0  # the host's copy of self.step, to pick the KV bucket without a sync
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # The graphs of the pass share one memory pool: they hold no outputs of their own (every result
        # goes to the buffers above), and run one bucket after the other, never side by side.
        self.graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_stream = torch.cuda.Stream(self.device) if self.use_graphs else None

    def prefill(self, embeddings: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        """Run the left-padded prompts (rows, prompt_length, width) through the GPT and draw step 0."""
        length = self.prompt_length
        prompt_mask = prompt_mask.bool()
        positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        self.last_prompt_position.copy_(positions[:, -1])
        self.attendable[:, :length] = prompt_mask
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
        # Each position may also see itself, so that the padding ahead of a short prompt attends to
        # something (a row of nothing gives NaN, which would leak through the values); real
        # positions never see the padding.
        itself = torch.eye(length, dtype=torch.bool, device=self.device)
        attend = ((causal & prompt_mask.unsqueeze(1)) | itself).unsqueeze(1)
        columns = torch.arange(length, device=self.device)
        hidden = self._forward(embeddings.to(self.llama.dtype), positions, columns, attend)
        self._draw(hidden[:, -1].float())

    def decode_step(self) -> None:
        """Draw the next step of every row (finished rows too: the shapes stay fixed)."""
        self.steps_drawn += 1
        filled = self.prompt_length + self.steps_drawn  # the columns this step's attention reads
        kv_length = min(self.capacity, -(-filled // KV_BUCKET) * KV_BUCKET)
        if not self.use_graphs:
            self._decode(kv_length)
            return
        graph = self.graphs.get(kv_length)
        if graph is not None:
            graph.replay()
            return
        # The first step of a bucket runs eagerly on the capture stream, which warms up what the
        # capture records there (cuBLAS workspaces, kernel choices); capturing runs nothing, so the
        # state advances exactly once.
        self.capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.capture_stream):
            self._decode(kv_length)
        torch.cuda.current_stream(self.device).wait_stream(self.capture_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool, stream=self.capture_stream):
            self._decode(kv_length)
        self.graphs[kv_length] = graph

    def interrupt(self, rows: list[int]) -> None:
        """Finish the given running rows now, keeping the steps drawn so far (call between steps)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        running = ~self.finished[index]
        self.lengths[index] = torch.where(running, self.step, self.lengths[index])
        self.ended_by[index] = torch.where(running, INTERRUPTED, self.ended_by[index])
        self.finished[index] = True

    def _decode(self, kv_length: int) -> None:
        # The column of the cache that the previous step's tokens fill.
        column = (self.prompt_length - 1 + self.step).view(1)
        self.attendable.index_fill_(1, column, True)
        step_input = (
            torch.stack([self.code_embeddings[q](self.tokens[:, q]) for q in range(self.tokens.shape[1])], dim=2)
            .sum(dim=2)
            .unsqueeze(1)
            .to(self.llama.dtype)
        )
        positions = (self.last_prompt_position + self.step).unsqueeze(1)
        attend = self.attendable[:, None, None, :kv_length]
        hidden = self._forward(step_input, positions, column, attend)
        self._draw(hidden[:, -1].float())

    def _forward(
        self, inputs: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor, attend: torch.Tensor
    ) -> torch.Tensor:
        """The Llama layers on (rows, length, width) inputs whose keys and values go to ``columns``.

        ``attend`` (rows, 1, length, kv length) says which cache columns each input position sees.
        """
        rows, length, _ = inputs.shape
        kv_length = attend.shape[-1]
        hidden = inputs
        cos, sin = self.llama.rotary_emb(hidden, positions)
        for index, layer in enumerate(self.llama.layers):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            heads = (rows, length, -1, attention.head_dim)
            query = attention.q_proj(normed).view(heads).transpose(1, 2)
            key = attention.k_proj(normed).view(heads).transpose(1, 2)
            value = attention.v_proj(normed).view(heads).transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            self.keys[index].index_copy_(2, columns, key)
            self.values[index].index_copy_(2, columns, value)
            keys = self.keys[index, :, :, :kv_length]
            values = self.values[index, :, :, :kv_length]
            if attention.num_key_value_groups > 1:
                keys = keys.repeat_interleave(attention.num_key_value_groups, dim=1)
                values = values.repeat_interleave(attention.num_key_value_groups, dim=1)
            attended = F.scaled_dot_product_attention(query, keys, values, attn_mask=attend, scale=attention.scaling)
            hidden = hidden + attention.o_proj(attended.transpose(1, 2).reshape(rows, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.llama.norm(hidden)

    def _draw(self, hidden: torch.Tensor) -> None:
        """Record the hidden state of ``self.step`` for every row, draw its tokens, note rows that end."""
        step = self.step
        self.hiddens.index_copy_(1, step.view(1), hidden.unsqueeze(1))
        logits = torch.einsum("bh,qvh->bqv", hidden, self.head_weights)
        tokens = sample(logits, self.recent, self.sampling, step, self.eos_token, self.min_tokens > step)
        self.recent.index_copy_(1, (step % REPETITION_WINDOW).view(1), tokens.unsqueeze(1))
        self.codes.index_copy_(1, step.view(1), tokens.unsqueeze(1))
        self.tokens.copy_(tokens)

        ended_by_eos = tokens.eq(self.eos_token).any(dim=1) & ~self.finished
        reached_end = self.end_at.eq(step + 1) & ~self.finished & ~ended_by_eos
        self.lengths.copy_(torch.where(ended_by_eos, step, torch.where(reached_end, step + 1, self.lengths)))
        self.ended_by.copy_(
            torch.where(ended_by_eos, ENDED_BY_EOS, torch.where(reached_end, ENDED_BY_LIMIT, self.ended_by))
        )
        self.finished.logical_or_(ended_by_eos | reached_end)
        self.step.add_(1)
