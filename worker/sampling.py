"""Per-row token sampling for batched generation.

Stock ChatTTS applies one temperature, top-p, top-k and one random generator to a whole batch, so
requests with different settings cannot share a GPT pass and a seeded request sounds different
depending on its batch mates. Here every row carries its own settings, and its randomness comes
from a counter-based hash of (row seed, step, codebook, token): a row's audio depends on its seed
alone, the same on any device and in any batch, and drawing it needs no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
# Constants below 2**31 keep every product of 32-bit values inside int64.
_MIX = 0x45D9F3B
# ChatTTS penalises audio tokens repeated within the last 16 steps.
REPETITION_WINDOW = 16
# Marks a slot of ``recent`` tokens that holds no token yet (a fixed-size window early in a pass).
NO_TOKEN = -1


@dataclass(frozen=True)
class RowSampling:
    temperature: torch.Tensor  # (rows,)
    top_p: torch.Tensor  # (rows,)
    top_k: torch.Tensor  # (rows,) long
    repetition_penalty: torch.Tensor  # (rows,)
    seed: torch.Tensor  # (rows,) long, 0 <= seed < 2**32

    def select(self, rows: torch.Tensor) -> RowSampling:
        return RowSampling(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = ((x >> 16) ^ x) * _MIX & _MASK32
    x = ((x >> 16) ^ x) * _MIX & _MASK32
    return (x >> 16) ^ x


def uniform_noise(seed: torch.Tensor, step: int | torch.Tensor, codebooks: int, vocab: int) -> torch.Tensor:
    """Uniform (0, 1) noise of shape (rows, codebooks, vocab), a pure function of (seed, step).

    ``step`` may be a 0-d device tensor, so that a captured CUDA graph draws new noise on each replay.
    """
    device = seed.device
    counter = (
        step * codebooks * vocab
        + torch.arange(codebooks, device=device).view(1, -1, 1) * vocab
        + torch.arange(vocab, device=device).view(1, 1, -1)
    )
    mixed = _hash32((_hash32(seed.view(-1, 1, 1)) ^ counter) & _MASK32)
    return (mixed.double() + 0.5) / 2.0**32


def segment_seed(audio_seed: int, segment: int, attempt: int = 0) -> int:
    """The sampling seed of one segment of a request: distinct per segment and per quality retry."""
    return (audio_seed + segment * 0x9E3779B1 + attempt * 0x85EBCA6B) & _MASK32


def sample(
    logits: torch.Tensor,
    history: torch.Tensor,
    sampling: RowSampling,
    step: int | torch.Tensor,
    eos_token: int,
    eos_blocked: torch.Tensor,
) -> torch.Tensor:
    """Draw the next token of each (row, codebook).

    logits: (rows, codebooks, vocab) float32; history: (rows, steps, codebooks) tokens generated so
    far, in any order, NO_TOKEN in slots not filled yet; rows where eos_blocked is true cannot draw
    eos_token yet. Returns (rows, codebooks).
    """
    rows, codebooks, vocab = logits.shape
    logits = logits / sampling.temperature.view(-1, 1, 1)
    logits = _penalise_repetition(logits, history[:, -REPETITION_WINDOW:], sampling.repetition_penalty)
    logits[..., eos_token] = logits[..., eos_token].masked_fill(eos_blocked.view(-1, 1), -torch.inf)
    logits = _keep_top_k_top_p(logits, sampling.top_k, sampling.top_p)
    # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits).
    noise = uniform_noise(sampling.seed, step, codebooks, vocab)
    gumbel = -torch.log(-torch.log(noise)).float()
    return torch.argmax(logits + gumbel, dim=-1)


def _penalise_repetition(logits: torch.Tensor, recent: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    if recent.shape[1] == 0:
        return logits
    counts = torch.zeros_like(logits)
    filled = recent.ne(NO_TOKEN)
    counts.scatter_add_(2, (recent * filled).transpose(1, 2), filled.to(logits.dtype).transpose(1, 2))
    alpha = torch.pow(penalty.view(-1, 1, 1), counts)
    return torch.where(logits < 0, logits * alpha, logits / alpha)


def _keep_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask all but each row's k most likely tokens and its top-p nucleus (the first always stays)."""
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    probabilities = torch.softmax(ordered, dim=-1)
    mass_before = torch.cumsum(probabilities, dim=-1) - probabilities
    rank = torch.arange(logits.shape[-1], device=logits.device).view(1, 1, -1)
    drop_ordered = (rank >= top_k.view(-1, 1, 1)) | (mass_before > top_p.view(-1, 1, 1))
    drop = torch.zeros_like(drop_ordered).scatter(-1, order, drop_ordered)
    return logits.masked_fill(drop, -torch.inf)
