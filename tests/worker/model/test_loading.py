"""Model sources: what loads, and what a user is told when nothing can."""

import dataclasses
import logging

import pytest
import torch

from chattts_farm.contract import ModelUnavailable
from worker.model.loading import load_model


@pytest.fixture
def offline_without_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_huggingface_offline_with_no_cache_says_what_to_set_instead(tiny_settings, offline_without_cache):
    with pytest.raises(ModelUnavailable, match="CHATTTS_FARM_MODEL=local:<dir>.*synthetic-tiny"):
        load_model(dataclasses.replace(tiny_settings, model="huggingface"))


def test_a_local_folder_is_verified_as_chattts_verifies_it(tiny_settings, synthesizer):
    from worker.model.synthetic_assets import ensure_synthetic_assets

    random_weights = ensure_synthetic_assets(tiny_settings.data_dir, "tiny")
    settings = dataclasses.replace(tiny_settings, model=f"local:{random_weights}")
    with pytest.raises(ModelUnavailable, match="checksum"):
        load_model(settings)


def test_no_weight_wants_a_gradient_so_no_pass_keeps_its_activations(tiny_settings, synthesizer):
    """Outside inference mode (warm-up, graph captures) a weight that wants a gradient makes every buffer
    a pass writes hold autograd's graph, and with it the pass's activations."""
    chat = load_model(tiny_settings).chat
    modules = [part for part in vars(chat).values() if isinstance(part, torch.nn.Module)]
    assert {"gpt", "decoder", "vocos"} <= {name for name, part in vars(chat).items() if part in modules}
    assert not [name for module in modules for name, weight in module.named_parameters() if weight.requires_grad]
    # The warm-up ran its passes outside inference mode: what they wrote holds no graph.
    runner = synthesizer.engine.runner
    assert runner.hiddens.grad_fn is None and not runner.hiddens.requires_grad


def test_a_local_folder_without_assets_is_refused(tiny_settings, tmp_path):
    settings = dataclasses.replace(tiny_settings, model=f"local:{tmp_path}")
    with pytest.raises(ModelUnavailable, match="no asset/ folder"):
        load_model(settings)


def test_an_unknown_source_lists_the_known_ones(tiny_settings):
    settings = dataclasses.replace(tiny_settings, model="s3://bucket")
    with pytest.raises(ModelUnavailable, match="huggingface, local:<dir>, synthetic-tiny"):
        load_model(settings)


def test_auto_falls_back_to_synthetic_tiny_loudly(tiny_settings, offline_without_cache, caplog):
    settings = dataclasses.replace(tiny_settings, model="auto")
    with caplog.at_level(logging.WARNING, logger="worker.model.loading"):
        model = load_model(settings)
    assert (model.info.kind, model.info.scale, model.info.dtype) == ("synthetic", "tiny", "fp32")
    assert any("RANDOM synthetic-tiny" in record.getMessage() for record in caplog.records)
