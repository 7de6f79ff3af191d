"""Whisper's greedy decoding, as the ASR gate asks ``whisper.decode`` for it, over a static KV cache whose
steps replay as CUDA graphs.

Why: on an H200 beside the engine (docs/quality-gate.md), ``whisper.decode``'s token-by-token loop took half
of the listener thread's time, and the farm with the gate on kept 70-74% of its throughput without it
(the target is 90%). Each of its steps launches dozens of small kernels, casts Whisper's fp32 weights to
fp16 in every Linear call, grows its KV cache through Python hooks, applies its logit filters in Python
and reads the device (a host sync) to see whether every row has ended; all that Python holds the
interpreter's lock that the engine's thread needs too.

Here the weights are cast once, every buffer is allocated at construction, and a step reads nothing but
the device: the position it decodes is a tensor, its self-attention masked to the positions up to it. So
on CUDA one graph of STEPS_PER_GRAPH steps per bucket of rows serves every position, and the host replays
it and reads one flag a replay (whether every row has ended). The SOT sequence's pass runs op by op, once a
batch; on CUDA the encoder runs compiled (its own weights cast once), once a batch. On the CPU the encoder
and the steps run op by op, in fp32 (what CI tests).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from whisper.tokenizer import Tokenizer, get_tokenizer

from worker.engine.runner import bucket_for, compiled_exactly, row_buckets

# Steps one CUDA graph runs, between two looks at whether every row has ended (each look waits for the
# device): a batch runs at most this many steps less one past its last row's end. Not tuned by measurement.
STEPS_PER_GRAPH = 8

# Past this many rows a pass's rows go up in steps of it. Every step's cross-attention reads each row's
# 1,500 audio positions in every layer, at the memory's bandwidth (a third of a batch's GPU time on an H100,
# docs/performance.md): padded to the next power of two, the listener's batch of 68 read 128 rows of them,
# steps of 16 read 80, steps of 8 read 72.
ROW_STEP = 8

# The logits' projection has as many columns as the vocabulary (51,865 for every Whisper), an odd count
# whose rows of fp16 no aligned GEMM kernel takes: on an H100 cuBLAS ran a pre-Hopper kernel at 70 us a step.
# Padded with zero rows to a multiple of this, an aligned one runs; the padding's logits are never looked at.
VOCAB_ALIGNMENT = 64

# What attends to the self-attention's keys and values (and keeps them): (layer, query, key, value) -> output.
SelfAttention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _Linear:
    """A Linear layer's weights in the decoder's dtype, cast once (Whisper's own Linear casts them each call)."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def cast(cls, linear: torch.nn.Linear, dtype: torch.dtype) -> _Linear:
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(linear.weight.detach().to(dtype), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class _Attention:
    query: _Linear
    key: _Linear
    value: _Linear
    out: _Linear

    @classmethod
    def cast(cls, attention: torch.nn.Module, dtype: torch.dtype) -> _Attention:
        return cls(*(_Linear.cast(getattr(attention, name), dtype) for name in ("query", "key", "value", "out")))


@dataclass(frozen=True)
class _Block:
    """One of the text decoder's residual blocks. Its layer norms are Whisper's own modules: they compute in
    fp32 and give back the input's dtype, as whisper.decode runs them."""

    attention: _Attention
    attention_norm: torch.nn.Module
    cross_attention: _Attention
    cross_attention_norm: torch.nn.Module
    mlp_in: _Linear
    mlp_out: _Linear
    mlp_norm: torch.nn.Module

    @classmethod
    def cast(cls, block: torch.nn.Module, dtype: torch.dtype) -> _Block:
        mlp_in, _, mlp_out = block.mlp
        return cls(
            _Attention.cast(block.attn, dtype),
            block.attn_ln,
            _Attention.cast(block.cross_attn, dtype),
            block.cross_attn_ln,
            _Linear.cast(mlp_in, dtype),
            _Linear.cast(mlp_out, dtype),
            block.mlp_ln,
        )


class GreedyDecoder:
    """The tokens ``whisper.decode(model, mels, DecodingOptions(language=..., temperature=0.0,
    sample_len=..., without_timestamps=True, fp16=<on CUDA>))`` gives each clip, decoded here.

    ``model``: a ``whisper.model.Whisper``, on the device it decodes on (fp16 on CUDA, fp32 on the CPU).
    ``max_rows``: the most clips decoded at once, which the buffers hold; more are decoded that many at a
    time. ``stream``: the CUDA stream it decodes (and captures) on, by default one of its own. ``eager``:
    run the steps op by op on CUDA too (the graphs' reference in tests); the CPU always does. ``dtype``:
    what it computes in, by default fp16 on CUDA (as whisper.decode) and fp32 on the CPU. ``ends_by_length``:
    ``decode`` may tell it each clip's length, for a model that cannot hear where a clip's words end
    (random weights, which never draw the end token of their own accord).
    """

    def __init__(
        self,
        model,
        max_rows: int,
        stream: torch.cuda.Stream | None = None,
        *,
        eager: bool = False,
        dtype: torch.dtype | None = None,
        ends_by_length: bool = False,
    ) -> None:
        device = model.device
        dims = model.dims
        decoder = model.decoder
        self.max_rows = max_rows
        self._model = model
        self._device = device
        self._dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
        self._heads = dims.n_text_head
        self._context = dims.n_text_ctx
        self.row_buckets = row_buckets(max_rows, step=ROW_STEP)

        # Embedded in fp32 and then cast, as Whisper embeds; the logits' projection in the decoder's dtype.
        self._token_embedding = decoder.token_embedding.weight.detach()
        self._positional_embedding = decoder.positional_embedding.detach()
        self._vocabulary = dims.n_vocab
        aligned = -(-dims.n_vocab // VOCAB_ALIGNMENT) * VOCAB_ALIGNMENT
        self._unembedding = F.pad(self._token_embedding.to(self._dtype), (0, 0, 0, aligned - dims.n_vocab))
        self._blocks = [_Block.cast(block, self._dtype) for block in decoder.blocks]
        self._final_norm = decoder.ln

        # The suppressed tokens and the end token are the same whatever the language.
        tokenizer = transcribing_tokenizer(model, "en")
        self._end = tokenizer.eot
        suppressed = torch.zeros(dims.n_vocab, dtype=torch.bool)
        suppressed[suppressed_tokens(tokenizer)] = True
        self._suppressed = suppressed.to(device)
        self._blank = torch.tensor(blank_tokens(tokenizer), device=device)

        # Empty, not zeros: on the CPU a farm touches only the rows its batches use. A pass writes or zeroes
        # every row it reads (_encode, _decode_pass).
        layers, width = dims.n_text_layer, dims.n_text_state
        self._keys = torch.empty(layers, max_rows, self._context, width, dtype=self._dtype, device=device)
        self._values = torch.empty_like(self._keys)
        self._cross_keys = torch.empty(layers, max_rows, dims.n_audio_ctx, width, dtype=self._dtype, device=device)
        self._cross_values = torch.empty_like(self._cross_keys)
        # Each row's tokens, its SOT sequence first: the step at position p reads column p and writes p + 1.
        # Zeros: the graphs' warm-up embeds them.
        self._tokens = torch.zeros(max_rows, self._context + 1, dtype=torch.long, device=device)
        self._position = torch.zeros(1, dtype=torch.long, device=device)
        self._columns = torch.arange(self._context, device=device)
        self._all_ended = torch.zeros((), dtype=torch.bool, device=device)
        # With ends_by_length, the column of each row's tokens at which it draws the end token.
        self._end_columns = torch.zeros(max_rows, dtype=torch.long, device=device) if ends_by_length else None

        on_cuda = device.type == "cuda"
        self._stream = (stream if stream is not None else torch.cuda.Stream(device)) if on_cuda else None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.steps_run = 0  # decoding steps of every pass so far (the prompt's pass one of them): what it cost
        self._encoder: Callable[[torch.Tensor], torch.Tensor] = self._encode_op_by_op
        if on_cuda and not eager:
            with torch.cuda.stream(self._stream):  # CompiledEncoder compiles without gradients itself
                self._encoder = CompiledEncoder(model, self._dtype)
            self._capture()

    @property
    def buffer_bytes(self) -> int:
        """The memory its buffers take (the weights it cast and its graphs' pool aside)."""
        buffers = (self._keys, self._values, self._cross_keys, self._cross_values, self._tokens)
        return sum(buffer.numel() * buffer.element_size() for buffer in buffers)

    def decode(
        self, mels: torch.Tensor, language: str, sample_len: int, lengths: Sequence[int] | None = None
    ) -> list[list[int]]:
        """Each clip's tokens from log-mel spectrograms (clips x mels x 3,000 frames, on the model's device),
        up to their end token: at most ``sample_len``, as whisper.decode's ``DecodingResult.tokens``.

        ``lengths`` (a decoder made ``ends_by_length`` only): each clip ends after that many tokens, if its
        model has not ended it sooner. The tokens before are the model's own."""
        if lengths is not None and self._end_columns is None:
            raise ValueError("this decoder was not made to end clips by their lengths")
        prompt = transcribing_tokenizer(self._model, language).sot_sequence_including_notimestamps
        # whisper.decode stops there too: its tokens would outgrow the text context.
        samples = min(sample_len, self._context - len(prompt) + 1)
        with torch.no_grad(), self._on_stream():
            return [
                tokens
                for start in range(0, len(mels), self.max_rows)
                for tokens in self._decode_pass(
                    mels[start : start + self.max_rows],
                    prompt,
                    samples,
                    None if lengths is None else lengths[start : start + self.max_rows],
                )
            ]

    def _decode_pass(
        self, mels: torch.Tensor, prompt: Sequence[int], samples: int, lengths: Sequence[int] | None
    ) -> list[list[int]]:
        clips = len(mels)
        rows = bucket_for(self.row_buckets, clips)
        if self._end_columns is not None:
            # The first token drawn goes to column len(prompt); without lengths, no row reaches its end column.
            never = self._context + 1
            ends = [never] * rows if lengths is None else [len(prompt) + length for length in lengths]
            self._end_columns[: len(ends)].copy_(torch.tensor(ends))
        self._encode(mels, rows)
        # A cache as fresh as whisper.decode's: the positions past the one decoded are masked, but an
        # infinity another batch left there would still make NaN (a zero weight times infinity).
        self._keys[:, :rows].zero_()
        self._values[:, :rows].zero_()
        self._prompt(prompt, clips, rows)
        steps = samples - 1  # the prompt's pass drew the first
        room = self._context - len(prompt)  # steps the cache holds after the prompt
        graph = self._graphs.get(rows)
        done = 0
        while done < steps and not self._all_ended.item():
            # A graph's steps past the last one asked for draw tokens that are never read; past the cache's
            # end they could not run.
            if graph is not None and done + STEPS_PER_GRAPH <= room:
                graph.replay()
                done += STEPS_PER_GRAPH
            else:
                self._steps(rows, 1)
                done += 1
        self.steps_run += 1 + done
        drawn = self._tokens[:clips, len(prompt) : len(prompt) + samples].tolist()
        return [row[: row.index(self._end)] if self._end in row else row for row in drawn]

    def _encode(self, mels: torch.Tensor, rows: int) -> None:
        """The clips' audio features (Whisper's encoder: compiled on CUDA, else as whisper.decode runs it)
        and, from them, each layer's cross-attention keys and values, once a pass."""
        clips = len(mels)
        features = self._encoder(mels)
        for layer, block in enumerate(self._blocks):
            self._cross_keys[layer, :clips] = block.cross_attention.key(features)
            self._cross_values[layer, :clips] = block.cross_attention.value(features)
        # Padding rows attend to zeros, not to what the memory held (NaN, or denormals that slow a CPU down).
        self._cross_keys[:, clips:rows].zero_()
        self._cross_values[:, clips:rows].zero_()

    def _encode_op_by_op(self, mels: torch.Tensor) -> torch.Tensor:
        return self._model.encoder(mels.to(self._dtype))

    def _prompt(self, prompt: Sequence[int], clips: int, rows: int) -> None:
        """The SOT sequence's pass, op by op: its keys and values into the cache, each row's first token
        drawn (neither blank nor the end: Whisper's SuppressBlank); padding rows' is the end, so that they
        have ended."""
        length = len(prompt)
        self._tokens[:rows, :length] = torch.tensor(prompt, device=self._device)

        def keep_and_attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            self._keys[layer, :rows, :length] = key
            self._values[layer, :rows, :length] = value
            return self._attend(query, key, value, is_causal=length > 1)

        logits = self._logits(self._tokens[:rows, :length], self._positional_embedding[:length], rows, keep_and_attend)
        logits[:, self._blank] = float("-inf")
        logits.masked_fill_(self._suppressed, float("-inf"))
        first = self._tokens[:rows, length]
        first.copy_(self._ended_by_length(logits.argmax(dim=-1), length, rows))
        first[clips:] = self._end
        self._all_ended.copy_((first == self._end).all())
        self._position.fill_(length)

    def _steps(self, rows: int, count: int) -> None:
        """``count`` decoding steps of the first ``rows`` rows from the position on the device, then whether
        every row has ended, on the device too: the host reads nothing, so one CUDA graph of it serves
        every position."""
        for _ in range(count):
            drawn = self._step(rows)
        self._all_ended.copy_((drawn == self._end).all())

    def _step(self, rows: int) -> torch.Tensor:
        position = self._position
        previous = self._tokens[:rows].index_select(1, position)
        visible = (self._columns <= position).view(1, 1, 1, -1)

        def keep_and_attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            keys, values = self._keys[layer, :rows], self._values[layer, :rows]
            keys.index_copy_(1, position, key)
            values.index_copy_(1, position, value)
            return self._attend(query, keys, values, attn_mask=visible)

        logits = self._logits(previous, self._positional_embedding.index_select(0, position), rows, keep_and_attend)
        logits.masked_fill_(self._suppressed, float("-inf"))
        # A row that has ended draws the end again, as in Whisper's GreedyDecoder.
        drawn = torch.where(previous[:, 0] == self._end, self._end, logits.argmax(dim=-1))
        drawn = self._ended_by_length(drawn, position + 1, rows)
        self._tokens[:rows].index_copy_(1, position + 1, drawn[:, None])
        position += 1
        return drawn

    def _ended_by_length(self, drawn: torch.Tensor, column: int | torch.Tensor, rows: int) -> torch.Tensor:
        """The tokens drawn for ``column``, the end token where a row's length ends there or before."""
        if self._end_columns is None:
            return drawn
        return torch.where(self._end_columns[:rows] <= column, self._end, drawn)

    def _logits(
        self, tokens: torch.Tensor, positional: torch.Tensor, rows: int, attend_to_self: SelfAttention
    ) -> torch.Tensor:
        """The text decoder's logits (fp32) after the last of ``tokens`` (rows x length), which
        ``positional`` places; Whisper's TextDecoder.forward, its self-attention ``attend_to_self``."""
        x = (F.embedding(tokens, self._token_embedding) + positional).to(self._dtype)
        for layer, block in enumerate(self._blocks):
            normed = block.attention_norm(x)
            attention = block.attention
            attended = attend_to_self(layer, attention.query(normed), attention.key(normed), attention.value(normed))
            x = x + attention.out(attended)
            cross = block.cross_attention
            attended = self._attend(
                cross.query(block.cross_attention_norm(x)),
                self._cross_keys[layer, :rows],
                self._cross_values[layer, :rows],
            )
            x = x + cross.out(attended)
            x = x + block.mlp_out(F.gelu(block.mlp_in(block.mlp_norm(x))))
        return (self._final_norm(x) @ self._unembedding.T)[..., : self._vocabulary].float()[:, -1]

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **masking) -> torch.Tensor:
        """Whisper's attention (its scaled_dot_product_attention path) of (rows, positions, width) tensors."""

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(*x.shape[:2], self._heads, -1).permute(0, 2, 1, 3)

        attended = F.scaled_dot_product_attention(heads(query), heads(key), heads(value), **masking)
        return attended.permute(0, 2, 1, 3).flatten(start_dim=2)

    def _capture(self) -> None:
        """One graph of STEPS_PER_GRAPH steps a bucket of rows, the largest first. They share one memory
        pool, which the largest sizes and the others reuse: none keeps an output in it (every result goes to
        the buffers), and they replay one at a time on this decoder's stream."""
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad(), torch.cuda.stream(self._stream):
            for rows in reversed(self.row_buckets):
                # One step first, op by op on the capture's stream: cuBLAS's workspace and kernel choices for
                # these shapes, which a capture records but cannot make.
                self._steps(rows, 1)
                graph = torch.cuda.CUDAGraph()
                # Thread-local, as the engine's captures: another thread's CUDA calls (a worker's heartbeat
                # asks the GPU for free memory) would break a capture in the default global mode.
                with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"):
                    self._steps(rows, STEPS_PER_GRAPH)
                self._graphs[rows] = graph

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        # The spectrograms may have been made on the caller's stream.
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._stream):
            yield


class CompiledEncoder:
    """Whisper's audio encoder compiled, what the decoder runs on CUDA: on an H100 a batch of 68 clips took
    8.6 ms so, against 16.9 op by op (its layer norms, in fp32 as Whisper's, its GELUs and residual
    additions fused). Its convolutions' and linear layers' weights are cast to ``dtype`` once, in a copy of
    its own (Whisper's modules cast them every call; the model's stay as they are).

    One compiled graph serves every count of clips: the count is symbolic from the first call, made here
    (before the engine sizes its cache from the memory left), and at least two (torch.compile makes a
    count of one a constant; a lone clip is encoded beside silence)."""

    def __init__(self, model, dtype: torch.dtype) -> None:
        self._dtype = dtype
        encoder = copy.deepcopy(model.encoder)
        for module in encoder.modules():
            if isinstance(module, torch.nn.Linear | torch.nn.Conv1d):
                module.to(dtype)
        self._encoder = compiled_exactly(encoder)
        dims = model.dims
        with torch.no_grad():
            self(torch.zeros(1, dims.n_mels, 2 * dims.n_audio_ctx, device=model.device))

    def __call__(self, mels: torch.Tensor) -> torch.Tensor:
        """The clips' audio features (clips x audio positions x width, in ``dtype``) from their log-mel
        spectrograms (clips x mels x 3,000 frames)."""
        clips = len(mels)
        batch = mels.to(self._dtype)
        if clips == 1:
            batch = torch.cat([batch, torch.zeros_like(batch)])
        torch._dynamo.mark_dynamic(batch, 0)
        return self._encoder(batch)[:clips]


def transcribing_tokenizer(model, language: str) -> Tokenizer:
    """The tokenizer whisper.decode (and transcribe) take for a model transcribing the language."""
    return get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language, task="transcribe")


def suppressed_tokens(tokenizer: Tokenizer) -> list[int]:
    """The tokens never drawn (whisper.decode's default ``suppress_tokens="-1"``): the non-speech symbols,
    the special tokens of tasks and prompts, and no-speech."""
    special = [tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm]
    if tokenizer.no_speech is not None:
        special.append(tokenizer.no_speech)
    return sorted({*tokenizer.non_speech_tokens, *special})


def blank_tokens(tokenizer: Tokenizer) -> list[int]:
    """The tokens never drawn first (Whisper's SuppressBlank): a space, and the end."""
    return [*tokenizer.encode(" "), tokenizer.eot]
