"""Synthetic assets: ChatTTS's own file layout, loaded by ChatTTS's own loader, plausible audio,
ChatTTS's tokenizer contract, deterministic builds, built once and reused."""

import dataclasses
import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from worker.model.synthetic_assets import (
    CHATTTS_TOKENS,
    MANIFEST_NAME,
    SCALES,
    asset_paths,
    build_synthetic_assets,
    ensure_synthetic_assets,
    read_manifest,
    synthetic_config,
)

ASSET_FILES = {
    "asset/Vocos.safetensors",
    "asset/DVAE.safetensors",
    "asset/Decoder.safetensors",
    "asset/Embed.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
}
WEIGHT_FILES = {path for path in ASSET_FILES if path.endswith(".safetensors")}
NUM_TEXT_TOKENS = 21178
SAMPLES_PER_TOKEN = 512


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets") / "synthetic-tiny"
    build_synthetic_assets(root, "tiny")
    return root


@pytest.fixture(scope="module")
def chat(tiny_root):
    import ChatTTS

    chat = ChatTTS.Chat()
    chat.config = synthetic_config("tiny")
    assert chat._load(device=torch.device("cpu"), **asset_paths(tiny_root))
    return chat


@pytest.fixture(scope="module")
def tokenizer(tiny_root):
    from transformers import BertTokenizerFast

    # The very call ChatTTS's Tokenizer makes.
    return BertTokenizerFast.from_pretrained(asset_paths(tiny_root)["tokenizer_path"])


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_mtimes(root):
    return {path: path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()}


def test_the_layout_is_the_one_chattts_loads_with_the_manifest_listing_every_file(tiny_root):
    assert {str(path.relative_to(tiny_root)) for path in tiny_root.rglob("*") if path.is_file()} >= ASSET_FILES
    manifest = read_manifest(tiny_root)
    assert (manifest.scale, manifest.seed) == ("tiny", 0)
    assert manifest.files == {path: sha256_of(tiny_root / path) for path in ASSET_FILES}
    paths = asset_paths(tiny_root)
    assert set(paths) == {
        "vocos_ckpt_path", "dvae_ckpt_path", "gpt_ckpt_path", "decoder_ckpt_path", "tokenizer_path", "embed_path",
    }  # fmt: skip
    assert all(Path(path).exists() for path in paths.values())


def test_chattts_loads_them_through_its_own_loader_at_the_tiny_size(chat):
    assert chat.has_loaded(use_decoder=True) and chat.has_loaded(use_decoder=False)
    assert chat.gpt.gpt.config.hidden_size == 64 and len(chat.gpt.gpt.layers) == 2
    assert chat.tokenizer.len == NUM_TEXT_TOKENS


@pytest.mark.parametrize("text", ["hello world", "你好，世界。今天天气不错。"])
def test_synthesis_gives_finite_audio_that_is_neither_clipped_nor_silent(chat, text):
    import ChatTTS

    torch.manual_seed(0)
    tokens = 48
    params = ChatTTS.Chat.InferCodeParams(
        spk_emb=chat.sample_random_speaker(), min_new_token=tokens, max_new_token=tokens, show_tqdm=False
    )
    [wav] = chat.infer([text], skip_refine_text=True, split_text=False, params_infer_code=params)
    assert len(wav) > 0.9 * tokens * SAMPLES_PER_TOKEN
    assert np.isfinite(wav).all()
    assert np.abs(wav).max() < 0.9
    assert np.sqrt(np.mean(np.square(wav))) > 0.005


def test_the_refine_text_path_runs_and_keeps_no_control_tokens(chat, tokenizer):
    import ChatTTS

    params = ChatTTS.Chat.RefineTextParams(min_new_token=8, max_new_token=8, show_tqdm=False)
    refined = chat.infer(["hello world"], refine_text_only=True, params_refine_text=params)
    assert isinstance(refined, str) and refined.strip()
    assert max(tokenizer.encode(refined, add_special_tokens=False)) < tokenizer.convert_tokens_to_ids("[break_0]")


def test_the_vocabulary_has_exactly_chattts_text_token_count(tokenizer):
    assert len(tokenizer) == NUM_TEXT_TOKENS


def test_each_chattts_token_is_one_token_even_inside_mixed_case_text(tokenizer):
    for token in CHATTTS_TOKENS:
        ids = tokenizer.encode(f"Hello{token}World", add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(ids).count(token) == 1, token
    prompt = tokenizer.encode("[Stts][spk_emb][speed_5]Hi[Ptts]", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(prompt)[:3] == ["[Stts]", "[spk_emb]", "[speed_5]"]


def test_prosody_marks_sort_below_break_0_and_control_tokens_from_it(tokenizer):
    def id_of(token):
        return tokenizer.convert_tokens_to_ids(token)

    break_0 = id_of("[break_0]")
    for kept in ("[uv_break]", "[laugh]", "[lbreak]"):
        assert id_of(kept) < break_0, kept
    control = [f"[{name}_{i}]" for name, count in (("break", 8), ("oral", 10), ("laugh", 3), ("speed", 10))
               for i in range(count)]  # fmt: skip
    control += ["[Sbreak]", "[Pbreak]", "[Ebreak]", "[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]"]
    for token in control:
        assert id_of(token) >= break_0, token
    ordinary_text = tokenizer.encode("hello world 你好，世界。", add_special_tokens=False)
    assert max(ordinary_text) < break_0


TEXTS = ["Hello world, this is a test.", "你好，世界。今天天气不错！", "Mixed 中英文 text 123."]


@pytest.mark.parametrize("text", TEXTS)
def test_english_and_chinese_text_tokenise_without_unknown_tokens(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids).replace(" ", "") == text.lower().replace(" ", "")


def test_the_same_seed_gives_identical_files_and_another_seed_different_weights(tiny_root, tmp_path):
    first = read_manifest(tiny_root)
    again = build_synthetic_assets(tmp_path / "again", "tiny", seed=0)
    other = build_synthetic_assets(tmp_path / "other", "tiny", seed=1)
    assert again.files == first.files
    assert all(other.files[path] != first.files[path] for path in WEIGHT_FILES)


def test_a_build_leaves_the_callers_random_state_alone(tmp_path):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    build_synthetic_assets(tmp_path / "root", "tiny")
    assert torch.equal(torch.rand(3), expected)


def test_a_build_reports_progress_file_by_file_ending_with_the_manifest(tmp_path):
    calls = []
    build_synthetic_assets(tmp_path / "root", "tiny", progress=lambda *call: calls.append(call))
    total = len(ASSET_FILES) + 1
    assert [done for _, done, _ in calls] == list(range(1, total + 1))
    assert {name for name, _, _ in calls} == ASSET_FILES | {MANIFEST_NAME}
    assert calls[-1] == (MANIFEST_NAME, total, total)


def test_a_failed_build_leaves_neither_a_root_nor_a_half_built_folder(tmp_path):
    def crash(name, done, total):
        if name.endswith("Embed.safetensors"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_synthetic_assets(tmp_path / "root", "tiny", progress=crash)
    assert list(tmp_path.iterdir()) == []


def test_ensure_builds_once_then_reuses_without_rebuilding(tmp_path):
    calls = []
    root = ensure_synthetic_assets(tmp_path, "tiny", progress=lambda *call: calls.append(call))
    assert root == tmp_path / "assets" / "synthetic-tiny"
    assert calls and read_manifest(root) is not None
    built = file_mtimes(root)
    calls.clear()

    assert ensure_synthetic_assets(tmp_path, "tiny", progress=lambda *call: calls.append(call)) == root
    assert calls == []
    assert file_mtimes(root) == built


def test_ensure_rebuilds_a_root_whose_manifest_is_missing(tmp_path):
    root = ensure_synthetic_assets(tmp_path, "tiny")
    (root / MANIFEST_NAME).unlink()
    (root / "asset" / "Embed.safetensors").unlink()
    assert read_manifest(root) is None

    ensure_synthetic_assets(tmp_path, "tiny")
    assert set(read_manifest(root).files) == ASSET_FILES
    assert (root / "asset" / "Embed.safetensors").is_file()


def test_concurrent_ensures_build_once(tmp_path):
    written = []
    start_together = threading.Barrier(2)

    def ensure():
        start_together.wait()
        ensure_synthetic_assets(tmp_path, "tiny", progress=lambda name, done, total: written.append(name))

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert written.count(MANIFEST_NAME) == 1
    assert read_manifest(tmp_path / "assets" / "synthetic-tiny") is not None


def test_read_manifest_is_none_when_missing_unreadable_or_incomplete(tiny_root, tmp_path):
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_NAME).write_text((tiny_root / MANIFEST_NAME).read_text())
    assert read_manifest(tmp_path) is None  # lists files that are not there


def test_full_config_is_chattts_default_config():
    from ChatTTS.config import Config

    assert dataclasses.asdict(synthetic_config("full")) == dataclasses.asdict(Config())


def test_configs_never_change_chattts_shared_defaults():
    from ChatTTS.config import Config

    defaults = dataclasses.asdict(Config())
    synthetic_config("tiny")
    full = synthetic_config("full")
    full.gpt.hidden_size = 1
    full.vocos.backbone.init_args.dim = 1
    assert Config().gpt.hidden_size == 768
    assert dataclasses.asdict(Config()) == defaults


def test_tiny_config_shrinks_the_model_but_keeps_chattts_fixed_sizes_and_ties():
    import pybase16384 as b14

    tiny = synthetic_config("tiny")
    width = tiny.gpt.hidden_size
    assert (width, tiny.gpt.num_hidden_layers) == (64, 2)
    assert tiny.embed.hidden_size == width
    assert tiny.decoder.idim == tiny.decoder.odim == width // 2
    assert tiny.dvae.vq.dim == 2 * tiny.dvae.decoder.idim
    assert (tiny.dvae.vq.levels, tiny.dvae.vq.G, tiny.dvae.vq.R) == ((5, 5, 5, 5), 2, 2)
    assert tiny.vocos.feature_extractor.init_args.n_mels == tiny.vocos.backbone.init_args.input_channels == 100
    assert (tiny.gpt.num_audio_tokens, tiny.gpt.num_text_tokens, tiny.gpt.num_vq) == (626, NUM_TEXT_TOKENS, 4)
    assert len(np.frombuffer(b14.decode_from_string(tiny.spk_stat), dtype=np.float16)) == 2 * width


def test_an_unknown_scale_is_refused(tmp_path):
    assert SCALES == ("tiny", "full")
    with pytest.raises(ValueError, match="unknown scale"):
        synthetic_config("huge")
    with pytest.raises(ValueError, match="unknown scale"):
        build_synthetic_assets(tmp_path / "root", "huge")
    with pytest.raises(ValueError, match="unknown scale"):
        ensure_synthetic_assets(tmp_path, "huge")
    assert list(tmp_path.iterdir()) == []
