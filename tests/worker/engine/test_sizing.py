"""How big the engine is: slots and KV cache blocks from the settings (the GPU's free memory needs a GPU)."""

import dataclasses

import pytest

from chattts_farm.settings import SettingsError
from worker.engine.blocks import blocks_for
from worker.engine.runner import ModelRunner
from worker.engine.sizing import CPU_SLOTS, engine_capacity, max_prompt_tokens
from worker.engine_process.pipeline import Synthesizer


def test_the_kv_cache_takes_the_memory_the_setting_gives_and_refuses_one_too_small_for_a_segment(
    tiny_settings, synthesizer
):
    model = synthesizer.model
    per_block = ModelRunner.bytes_per_block(model, kv_bytes=4)  # fp32 on the CPU
    longest = blocks_for(max_prompt_tokens(tiny_settings) + tiny_settings.max_new_tokens)
    # By default on the CPU every slot holds its longest segment: nothing is ever preempted.
    assert engine_capacity(model, tiny_settings) == {"slots": CPU_SLOTS, "kv_blocks": None}
    assert Synthesizer(model, tiny_settings).engine.scheduler.pool.blocks == CPU_SLOTS * longest
    given = dataclasses.replace(tiny_settings, kv_cache_gib=3 * longest * per_block / 2**30)
    assert engine_capacity(model, given)["kv_blocks"] == 3 * longest
    too_small = dataclasses.replace(tiny_settings, kv_cache_gib=(longest - 1) * per_block / 2**30)
    with pytest.raises(SettingsError, match="CHATTTS_FARM_KV_CACHE_GIB"):
        engine_capacity(model, too_small)
