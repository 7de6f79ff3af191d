"""How big the engine is: slots and KV cache blocks from the settings or a GPU's free memory (faked here)."""

import dataclasses

import pytest
import torch

from chattts_farm.settings import SettingsError
from worker.engine.blocks import blocks_for
from worker.engine.layers import fp8_layer, fuse_layers
from worker.engine.runner import ModelRunner
from worker.engine.sizing import CPU_SLOTS, GPU_MEMORY_SHARE, engine_capacity, max_prompt_tokens
from worker.engine_process.pipeline import Synthesizer
from worker.model.loading import load_model


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


def test_a_slots_own_memory_is_its_hidden_states_kept_in_the_gpts_dtype(tiny_settings, synthesizer):
    model, runner = synthesizer.model, synthesizer.engine.runner
    assert runner.hiddens.dtype == model.chat.gpt.gpt.dtype
    assert ModelRunner.bytes_per_slot(model, max_new_tokens=tiny_settings.max_new_tokens) == runner.hiddens[0].nbytes


def capacity_on_a_gpu(model, settings, monkeypatch, free: float) -> dict:
    """engine_capacity on a GPU with ``free`` bytes free: faked, the sizing's arithmetic needs none."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 80 * 2**30))
    return engine_capacity(dataclasses.replace(model, device=torch.device("cuda")), settings)


def test_with_fp8_matmuls_a_gpus_slots_and_blocks_leave_room_for_the_fp8_weights(
    tiny_settings, synthesizer, monkeypatch
):
    model, free = synthesizer.model, 8 * 2**30
    fp8_matmuls = dataclasses.replace(tiny_settings, matmul_dtype="fp8")
    with_fp8 = capacity_on_a_gpu(model, fp8_matmuls, monkeypatch, free)
    # What a GPU with the fp8 weights' bytes less free gets without them (the sizing takes a share of it).
    smaller_gpu = free - ModelRunner.fp8_weight_bytes(model) / GPU_MEMORY_SHARE
    assert with_fp8 == capacity_on_a_gpu(model, tiny_settings, monkeypatch, smaller_gpu)
    assert with_fp8["kv_blocks"] < capacity_on_a_gpu(model, tiny_settings, monkeypatch, free)["kv_blocks"]


def test_the_fp8_weights_bytes_are_those_of_every_layers_float8_matmul_weights_and_scales(tiny_settings):
    model = load_model(tiny_settings)
    layers, _ = fuse_layers(model.chat.gpt.gpt)
    made = [fp8_layer(weights) for weights in layers]
    matmuls = [fp8 for layer in made for fp8 in (layer.qkv, layer.output, layer.gate_up, layer.down)]
    assert ModelRunner.fp8_weight_bytes(model) == sum(fp8.weight.nbytes + fp8.scale.nbytes for fp8 in matmuls)
