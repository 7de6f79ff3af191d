"""Per-row token sampling for batched generation: the engine's sampler, run inside each decode step.

Stock ChatTTS applies one temperature, top-p, top-k and one random generator to a whole batch, so
requests with different settings cannot share a GPT pass and a seeded request sounds different
depending on its batch mates. Here every row carries its own settings, and its randomness comes
from a counter-based hash of (row seed, step, codebook, token): a row's audio depends on its seed
alone, the same on any device and in any batch, and drawing it needs no host sync. What a row draws
from is filtered exactly as stock ChatTTS filters it (:func:`filtered_logits`).
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
# ChatTTS's top-p and top-k warpers never keep fewer tokens than this, whatever top_p and top_k say.
MIN_TOKENS_TO_KEEP = 3


@dataclass(frozen=True)
class RowSampling:
    temperature: torch.Tensor  # (rows,)
    top_p: torch.Tensor  # (rows,) float64: ChatTTS rounds 1 - top_p from the double
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
    """Uniform (0, 1) noise of shape (rows, codebooks, vocab), a pure function of (seed, step) per row.

    ``step`` is one step for all rows (an int, or a 0-d device tensor, so that a captured CUDA graph draws
    new noise on each replay) or each row's own step, a (rows,) tensor.
    """
    device = seed.device
    if isinstance(step, torch.Tensor):
        step = step.view(-1, 1, 1)
    counter = (
        step * codebooks * vocab
        + torch.arange(codebooks, device=device).view(1, -1, 1) * vocab
        + torch.arange(vocab, device=device).view(1, 1, -1)
    )
    mixed = _hash32((_hash32(seed.view(-1, 1, 1)) ^ counter) & _MASK32)
    return (mixed.double() + 0.5) / 2.0**32


def sample(
    logits: torch.Tensor,
    history: torch.Tensor,
    sampling: RowSampling,
    step: int | torch.Tensor,
    eos_token: int,
    eos_blocked: torch.Tensor,
) -> torch.Tensor:
    """Draw the next token of each (row, codebook) from its :func:`filtered_logits`.

    ``step`` is the step drawn, for all rows or per row (see :func:`uniform_noise`). Returns (rows, codebooks).
    """
    rows, codebooks, vocab = logits.shape
    logits = filtered_logits(logits, history, sampling, eos_token, eos_blocked)
    # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits).
    noise = uniform_noise(sampling.seed, step, codebooks, vocab)
    gumbel = -torch.log(-torch.log(noise)).float()
    return torch.argmax(logits + gumbel, dim=-1)


def filtered_logits(
    logits: torch.Tensor, history: torch.Tensor, sampling: RowSampling, eos_token: int, eos_blocked: torch.Tensor
) -> torch.Tensor:
    """The logits each (row, codebook) draws from, filtered as ChatTTS's ``GPT.generate`` filters audio
    logits, each row with its own settings; tokens filtered out are -inf.

    In ChatTTS's order: divide by the temperature, penalise the tokens of the last REPETITION_WINDOW
    steps, keep the top-p nucleus, then the top k, each keeping at least MIN_TOKENS_TO_KEEP tokens, and
    only then block EOS (so a blocked EOS still takes a place in the top k).

    logits: (rows, codebooks, vocab) float32; history: (rows, steps, codebooks) tokens generated so far,
    of which the last REPETITION_WINDOW slots count (the latest steps in order, or a ring of that many
    slots), NO_TOKEN in slots not filled yet; rows where eos_blocked is true cannot draw eos_token yet.
    """
    logits = logits / sampling.temperature.view(-1, 1, 1)
    logits = _penalise_repetition(logits, history[:, -REPETITION_WINDOW:], sampling.repetition_penalty)
    logits = _keep_top_p_then_top_k(logits, sampling.top_p, sampling.top_k)
    logits[..., eos_token] = logits[..., eos_token].masked_fill(eos_blocked.view(-1, 1), -torch.inf)
    return logits


def _penalise_repetition(logits: torch.Tensor, recent: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """ChatTTS's CustomRepetitionPenaltyLogitsProcessorRepeat: a token seen n times in its codebook's
    recent steps has its logit divided by penalty**n, or multiplied when it is negative."""
    if recent.shape[1] == 0:
        return logits
    counts = torch.zeros_like(logits)
    filled = recent.ne(NO_TOKEN)
    counts.scatter_add_(2, (recent * filled).transpose(1, 2), filled.to(logits.dtype).transpose(1, 2))
    alpha = torch.pow(penalty.view(-1, 1, 1), counts)
    return torch.where(logits < 0, logits * alpha, logits / alpha)


def _keep_top_p_then_top_k(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """transformers' TopPLogitsWarper then TopKLogitsWarper, each with min_tokens_to_keep=3, per row.

    Top-p drops the least likely tokens whose probabilities add up to at most 1 - top_p; top-k then
    drops every token below the k-th largest logit left. Both drop a run of the least likely tokens,
    so one ascending sort serves both.
    """
    vocab = logits.shape[-1]
    ascending, order = torch.sort(logits, dim=-1)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    # The warper compares with the Python float 1 - top_p, which PyTorch rounds to float32 once.
    tail_mass = (1 - top_p.double()).float().view(-1, 1, 1)
    places_from_top = torch.arange(vocab - 1, -1, -1, device=logits.device)
    dropped = (cumulative <= tail_mass) & (places_from_top >= MIN_TOKENS_TO_KEEP)
    left = ascending.masked_fill(dropped, -torch.inf)
    k = top_k.clamp(MIN_TOKENS_TO_KEEP, vocab).view(-1, 1, 1).expand(*logits.shape[:-1], 1)
    kth_largest = left.gather(-1, vocab - k)
    dropped |= left < kth_largest
    return logits.masked_fill(dropped.scatter(-1, order, dropped), -torch.inf)
