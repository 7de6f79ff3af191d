"""How big the engine is: its slots and its KV cache's blocks, from the settings or the free GPU memory.

Read once, when the synthesizer builds its engine (see worker.engine_process.pipeline).
"""

from __future__ import annotations

import logging

import torch

from chattts_farm.contract import MAX_SAMPLE_CODES, MAX_TRANSCRIPT_CHARS
from chattts_farm.settings import CPU_SLOTS, MAX_AUTO_SLOTS, Settings, SettingsError
from worker.engine.blocks import BLOCK_POSITIONS, blocks_for
from worker.engine.runner import ModelRunner
from worker.model.loading import LoadedModel

logger = logging.getLogger(__name__)

# Without a SLOTS setting: the CPU's slots; on CUDA the share of free memory the slots
# and the KV cache take, less room for the prefill, the vocoder and the graphs' scratch, and as many
# slots as that holds with SLOT_SHARE_BLOCKS blocks of cache each (768 positions: a mean segment of
# the standard workload ends near 550), at most MAX_AUTO_SLOTS.
GPU_MEMORY_SHARE = 0.85
GPU_WORKSPACE_BYTES = 6 * 2**30
SLOT_SHARE_BLOCKS = 12


def max_text_prompt_tokens(settings: Settings) -> int:
    """The longest prompt of a voice without a reference clip: a segment of text, or what refine-text
    makes of it (up to 384 tokens), with the prompt's tags."""
    return max(settings.max_segment_chars, 384) + 16


def max_prompt_tokens(settings: Settings) -> int:
    """The longest prompt a slot holds: a text prompt, and a reference clip's words (a token a
    character at most) and speaker sample (its codes: about 47 a second of the clip) when the voice is one."""
    return max_text_prompt_tokens(settings) + MAX_TRANSCRIPT_CHARS + MAX_SAMPLE_CODES


def prefill_tokens(settings: Settings) -> int:
    """The prompt tokens one prefill pass takes: a pass's worth of the longest text prompts. A pass of
    clip voices' prompts (up to ~2,300 tokens) takes fewer of them: at 512 of those, one pass's
    activations alone would outgrow what the engine leaves free (it ran out of memory on an H200)."""
    return settings.max_segments_per_pass * max_text_prompt_tokens(settings)


def kv_dtype(settings: Settings) -> torch.dtype | None:
    """The KV cache's dtype when it is not the model's own."""
    return torch.float8_e4m3fn if settings.kv_dtype == "fp8" else None


def matmul_dtype(settings: Settings) -> torch.dtype | None:
    """The dtype of the GPT's matmuls in large passes when it is not the model's own."""
    return torch.float8_e4m3fn if settings.matmul_dtype == "fp8" else None


def engine_capacity(model: LoadedModel, settings: Settings) -> dict[str, int | None]:
    """How many segments the engine runs at once (``slots``) and how many blocks their KV cache
    shares (``kv_blocks``; None: every slot its longest segment, as the CPU has by default): the
    settings, or what the free GPU memory holds."""
    per_block = ModelRunner.bytes_per_block(
        model, kv_bytes=torch.finfo(kv_dtype(settings) or model.chat.gpt.gpt.dtype).bits // 8
    )
    cache_bytes = settings.kv_cache_gib * 2**30
    if model.device.type != "cuda":
        slots = settings.slots or CPU_SLOTS
        kv_blocks = int(cache_bytes // per_block) if cache_bytes else None
    else:
        free, _ = torch.cuda.mem_get_info(model.device)
        budget = free * GPU_MEMORY_SHARE - GPU_WORKSPACE_BYTES
        if matmul_dtype(settings) is not None:
            # The runner makes the float8 weights after this sizing, from the memory left.
            budget -= ModelRunner.fp8_weight_bytes(model)
        per_slot = ModelRunner.bytes_per_slot(model, max_new_tokens=settings.max_new_tokens)
        slots = settings.slots or max(1, min(MAX_AUTO_SLOTS, int(budget // (per_slot + SLOT_SHARE_BLOCKS * per_block))))
        kv_blocks = int((cache_bytes or budget - slots * per_slot) // per_block)
        logger.info(
            "engine: %d slots, a KV cache of %d blocks (%.1f GiB, %d positions) in %.0f MiB free",
            slots,
            kv_blocks,
            kv_blocks * per_block / 2**30,
            kv_blocks * BLOCK_POSITIONS,
            free / 2**20,
        )
    longest = blocks_for(max_prompt_tokens(settings) + settings.max_new_tokens)
    if kv_blocks is not None and kv_blocks < longest:
        raise SettingsError(
            f"the KV cache holds {max(kv_blocks, 0)} blocks of {BLOCK_POSITIONS} positions, fewer than one "
            f"segment's {longest} (MAX_NEW_TOKENS {settings.max_new_tokens}): raise CHATTTS_FARM_KV_CACHE_GIB "
            f"or lower CHATTTS_FARM_MAX_NEW_TOKENS"
        )
    return {"slots": slots, "kv_blocks": kv_blocks}


def describe_memory(device: torch.device) -> str:
    """The GPU's memory as a log line: what torch holds (and of it, live tensors) and what is free."""
    if device.type != "cuda":
        return "no GPU memory"
    free, _ = torch.cuda.mem_get_info(device)
    return (
        f"{torch.cuda.memory_allocated(device) / 2**30:.1f} GiB allocated, "
        f"{torch.cuda.memory_reserved(device) / 2**30:.1f} GiB reserved, {free / 2**30:.1f} GiB free"
    )
