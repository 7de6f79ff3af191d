"""Batched audio-token generation and decoding on a loaded ChatTTS model.

ChatTTS's own ``GPT.generate`` takes one speaker and one set of sampling settings per call. This loop
runs rows of different requests together: each row gets its own speaker embedding at prefill, its own
sampling settings and seed (see :mod:`worker.sampling`), its own length, and can be stopped alone.
The pass runs on a :class:`worker.engine.runner.DecodeRunner`: a KV cache preallocated for all rows
and a fixed-shape decode step, replayed as a CUDA graph on CUDA. Rows that finish stay in the batch,
masked, until the pass ends, so the shapes never change; the host looks at which rows are finished
only every SYNC_EVERY steps, and calls ``on_step`` and ``rows_to_stop`` there: progress is reported,
and a cancelled row stops, within SYNC_EVERY steps (an interrupted row keeps the steps drawn by then).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from chattts_farm.contract import SynthesisRequest
from worker.engine.runner import ENDED_BY_EOS, ENDED_BY_LIMIT, INTERRUPTED, DecodeRunner
from worker.model import LoadedModel
from worker.quality import SegmentQuality
from worker.sampling import RowSampling

# How many decode steps run between two looks of the host at the pass (one small device->host copy):
# often enough for progress and cancelling, rare enough to keep the GPU's queue full.
SYNC_EVERY = 8


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
    codes: torch.Tensor  # (tokens, num_vq) long: the audio tokens drawn at the same steps
    tokens: int
    ended_by: str  # "eos" | "length_rule" | "token_limit" | "interrupted"


# on_step(row indices still generating, step); rows_to_stop() -> indices of rows to end now. Both
# are called every SYNC_EVERY steps, not every step.
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
    device = model.device
    embeddings, attention_mask = embed_prompts(model, segments)
    ends = [min(segment.pinned_tokens or segment.max_tokens, segment.max_tokens) for segment in segments]
    max_steps = max(ends)
    runner = DecodeRunner(
        model,
        sampling=row_sampling(segments, device),
        min_tokens=torch.tensor([segment.pinned_tokens or 0 for segment in segments], device=device),
        end_at=torch.tensor(ends, device=device),
        prompt_length=embeddings.shape[1],
        max_steps=max_steps,
    )
    runner.prefill(embeddings, attention_mask)
    for step in range(max_steps):
        if step:
            runner.decode_step()
        if (step + 1) % SYNC_EVERY and step + 1 < max_steps:
            continue
        finished = runner.finished.tolist()  # the one host sync of SYNC_EVERY steps
        if rows_to_stop is not None:
            stopping = [row for row in set(rows_to_stop()) if not finished[row]]
            if stopping:
                runner.interrupt(stopping)
                for row in stopping:
                    finished[row] = True
        running = [row for row, done in enumerate(finished) if not done]
        if not running:
            break
        if on_step is not None:
            on_step(running, step)

    lengths, ended_by = runner.lengths.tolist(), runner.ended_by.tolist()
    return [
        SegmentOutput(
            hiddens=runner.hiddens[row, :count].clone(),
            codes=runner.codes[row, :count].clone(),
            tokens=count,
            ended_by=_reason(code, count, segment),
        )
        for row, (segment, count, code) in enumerate(zip(segments, lengths, ended_by, strict=True))
    ]


def embed_prompts(model: LoadedModel, segments: list[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompt embeddings (rows, length, width), each row's speaker in its slot, and their mask."""
    chat = model.chat
    num_vq = chat.config.gpt.num_vq
    prompts = [f"[Stts][spk_emb][speed_{segment.request.speed}]{segment.text}[Ptts]" for segment in segments]
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, num_vq, device=model.device)
    embeddings = chat.embed(input_ids, text_mask)
    # As ChatTTS's Speaker.apply: an embedding string decodes to float16, normalised as such on the CPU.
    speakers = torch.stack(
        [F.normalize(segment.speaker.cpu().half(), p=2.0, dim=0, eps=1e-12) for segment in segments]
    ).to(model.device)
    is_speaker_slot = input_ids[..., 0].eq(chat.tokenizer.spk_emb_ids).unsqueeze(-1)
    embeddings = torch.where(is_speaker_slot, speakers.unsqueeze(1).to(embeddings.dtype), embeddings)
    return embeddings, attention_mask


def row_sampling(segments: list[Segment], device: torch.device) -> RowSampling:
    return RowSampling(
        temperature=torch.tensor([segment.request.temperature for segment in segments], device=device),
        top_p=torch.tensor([segment.request.top_p for segment in segments], device=device, dtype=torch.float64),
        top_k=torch.tensor([segment.request.top_k for segment in segments], device=device),
        repetition_penalty=torch.tensor([segment.request.repetition_penalty for segment in segments], device=device),
        seed=torch.tensor([segment.seed for segment in segments], device=device, dtype=torch.long),
    )


def _reason(code: int, count: int, segment: Segment) -> str:
    if code == ENDED_BY_EOS:
        return "eos"
    if code == INTERRUPTED:
        return "interrupted"
    assert code == ENDED_BY_LIMIT, "every segment ends within max_steps"
    return "length_rule" if count == segment.pinned_tokens else "token_limit"


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
