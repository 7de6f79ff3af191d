"""Batched audio-token generation and decoding on a loaded ChatTTS model.

ChatTTS's own ``GPT.generate`` takes one speaker and one set of sampling settings per call. This loop
runs rows of different requests together: each row gets its own speaker embedding at prefill, its own
sampling settings and seed (see :mod:`worker.sampling`), its own length, and can be stopped alone.
Rows that finish leave the batch (their KV cache rows are dropped), so short rows do not cost steps.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from transformers.cache_utils import DynamicCache

from chattts_farm.contract import SynthesisRequest
from worker.model import LoadedModel
from worker.quality import SegmentQuality
from worker.sampling import RowSampling, sample


@dataclass
class Segment:
    """One piece of a request's text, spoken by one row of a batched GPT pass."""

    owner: int  # the index of its request in the synthesis call
    index: int  # its place in that request's text
    text: str
    request: SynthesisRequest  # speed and sampling settings
    speaker: torch.Tensor  # (gpt width,) raw speaker embedding
    seed: int
    expected_tokens: int
    max_tokens: int
    # The synthetic model's length rule: end after exactly expected_tokens (EOS blocked before).
    pinned: bool = False
    output: SegmentOutput | None = None
    samples: np.ndarray | None = None
    quality: SegmentQuality | None = None

    @property
    def pinned_tokens(self) -> int | None:
        return self.expected_tokens if self.pinned else None


@dataclass
class SegmentOutput:
    hiddens: torch.Tensor  # (tokens, gpt width) float32: what the decoder turns into audio
    tokens: int
    ended_by: str  # "eos" | "length_rule" | "token_limit" | "interrupted"


# on_step(row indices still generating, step); rows_to_stop() -> indices of rows to end now.
StepCallback = Callable[[list[int], int], None]
StopCheck = Callable[[], Collection[int]]


@torch.inference_mode()
def generate(
    model: LoadedModel,
    segments: list[Segment],
    *,
    on_step: StepCallback | None = None,
    rows_to_stop: StopCheck | None = None,
) -> list[SegmentOutput]:
    """Generate the audio tokens of all segments in one batched pass, one row each."""
    chat = model.chat
    device = model.device
    num_vq = chat.config.gpt.num_vq
    eos_token = chat.config.gpt.num_audio_tokens - 1
    llama = chat.gpt.gpt

    prompts = [f"[Stts][spk_emb][speed_{segment.request.speed}]{segment.text}[Ptts]" for segment in segments]
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, num_vq, device=device)
    embeddings = chat.embed(input_ids, text_mask)
    speakers = F.normalize(torch.stack([segment.speaker.float() for segment in segments]).to(device), p=2.0, dim=1)
    is_speaker_slot = input_ids[..., 0].eq(chat.tokenizer.spk_emb_ids).unsqueeze(-1)
    embeddings = torch.where(is_speaker_slot, speakers.unsqueeze(1).to(embeddings.dtype), embeddings)

    sampling = RowSampling(
        temperature=torch.tensor([segment.request.temperature for segment in segments], device=device),
        top_p=torch.tensor([segment.request.top_p for segment in segments], device=device),
        top_k=torch.tensor([segment.request.top_k for segment in segments], device=device),
        repetition_penalty=torch.tensor([segment.request.repetition_penalty for segment in segments], device=device),
        seed=torch.tensor([segment.seed for segment in segments], device=device, dtype=torch.long),
    )
    min_tokens = torch.tensor([segment.pinned_tokens or 0 for segment in segments], device=device)
    ends = [min(segment.pinned_tokens or segment.max_tokens, segment.max_tokens) for segment in segments]
    end_at = torch.tensor(ends, device=device)
    max_steps = max(ends)
    history = torch.zeros(len(segments), max_steps, num_vq, dtype=torch.long, device=device)
    hiddens = torch.zeros(len(segments), max_steps, llama.config.hidden_size, dtype=torch.float32, device=device)

    outputs: list[SegmentOutput | None] = [None] * len(segments)
    active = torch.arange(len(segments), device=device)
    mask = attention_mask.bool()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    # transformers 5.24 renamed past_key_values to cache (the old name warns, and goes in 5.40).
    cache_keyword = "cache" if "cache" in inspect.signature(llama.forward).parameters else "past_key_values"
    step_input = embeddings.to(llama.dtype)
    # The code heads are weight-normalised: compute their weights once, not on every step.
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
        to_stop = set(rows_to_stop()) if rows_to_stop is not None else set()
        stopped = torch.tensor([i in to_stop for i in active_list], dtype=torch.bool, device=device)
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
                outputs[index] = SegmentOutput(hiddens=hiddens[index, :count].clone(), tokens=count, ended_by=ended_by)
            keep = (~done).nonzero().flatten()
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            active, mask, positions, tokens = active[keep], mask[keep], positions[keep], tokens[keep]
        if on_step is not None:
            on_step(active.tolist(), step)
        step_input = (
            torch.stack([chat.embed.emb_code[q](tokens[:, q]) for q in range(num_vq)], dim=2)
            .sum(dim=2)
            .unsqueeze(1)
            .to(llama.dtype)
        )
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        positions = positions[:, -1:] + 1

    assert all(output is not None for output in outputs), "every segment ends within max_steps"
    return outputs


@torch.inference_mode()
def decode(model: LoadedModel, hidden_states: list[torch.Tensor], max_rows_per_pass: int) -> list[np.ndarray]:
    """Turn each row's hidden states into 24 kHz samples.

    Rows are decoded together only with rows of the same length: the decoder and vocoder are
    convolutional, so zero padding would colour the end of shorter rows.
    """
    chat = model.chat
    samples: list[np.ndarray | None] = [None] * len(hidden_states)
    by_length: dict[int, list[int]] = {}
    for index, states in enumerate(hidden_states):
        by_length.setdefault(states.shape[0], []).append(index)
    for length, indices in by_length.items():
        for start in range(0, len(indices), max_rows_per_pass):
            chunk = indices[start : start + max_rows_per_pass]
            if length == 0:
                for index in chunk:
                    samples[index] = np.zeros(0, dtype=np.float32)
                continue
            batch = torch.stack([hidden_states[i] for i in chunk]).permute(0, 2, 1).contiguous()
            mel = chat.decoder(batch)
            audio = chat.vocos.decode(mel).float().cpu().numpy()
            for row, index in enumerate(chunk):
                samples[index] = audio[row]
    return samples
