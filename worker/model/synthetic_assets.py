"""Synthetic ChatTTS assets: random weights laid out exactly like ChatTTS's real asset folder.

The real weights (about 1.1 GB from Hugging Face, CC BY-NC 4.0) cannot be downloaded in CI or on a
machine without internet access, yet the farm must still be exercised end to end there: loaded
through ChatTTS's own ``Chat._load``, tokenised, run through the GPT and decoded by the Decoder and
Vocos into audio. Synthetic assets stand in for them. They are built locally and deterministically
from a seed, with ChatTTS's own module classes, and saved in its file formats, at two scales:

* ``tiny``: a 2-layer, 64-wide GPT with everything else shrunk to match, about 22 MiB. A 32-token
  synthesis takes about 0.1 s on a small CPU. Used by the tests.
* ``full``: ChatTTS's real architecture (the default ``ChatTTS.config.Config()``), about 1161 MiB,
  so that memory use and speed are those of the real model. Used by the benchmarks.

The weights are random, so the audio is noise, not speech. The initialisation is chosen so that the
audio is finite and neither silent nor clipped, and passes the farm's quality gate as speech would.

ChatTTS is imported inside the functions because importing it changes the process environment
(it sets ``TOKENIZERS_PARALLELISM``); importing this module has no side effects.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import string
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pybase16384 as b14
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordPiece

if TYPE_CHECKING:
    from ChatTTS.config import Config

logger = logging.getLogger(__name__)

SCALES = ("tiny", "full")
MANIFEST_NAME = "farm-assets.json"
# Bump whenever the same scale and seed would give different files, so that old builds are rebuilt.
FORMAT_VERSION = 2

ProgressCallback = Callable[[str, int, int], None]

_TINY_GPT_WIDTH = 64

# The ISTFT of unit-magnitude, random-phase bins at n_fft=1024 has an RMS of about 0.026: this gain
# brings it to about 0.055 (peaks near 0.25), a normal speech level, far from both silence and clipping.
_VOCOS_MAGNITUDE_GAIN = 2.0
# Spread of the log-magnitudes around that gain: enough to vary from bin to bin and frame to frame,
# small enough that exp() stays far below Vocos's clip at 1e2.
_VOCOS_LOG_MAGNITUDE_STD = 0.3

_BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_FULL_WIDTH_PUNCTUATION = "，。！？、；：“”‘’（）《》【】…—～·「」『』〈〉〔〕"
# ChatTTS's 50 tokens, as in its real tokenizer (ids 21128..21177), reordered: ChatTTS keeps only
# the refined-text tokens whose id is below [break_0]'s (core.py, _infer), so the prosody marks a
# refined text may carry come before [break_0] and every control token comes after it.
_PROSODY_TOKENS = ("[uv_break]", "[v_break]", "[laugh]", "[lbreak]", "[llbreak]")
_CONTROL_TOKENS = (
    *(f"[break_{i}]" for i in range(8)),
    "[Sasr]", "[Pasr]", "[Easr]",
    "[Stts]", "[Ptts]", "[Etts]",
    "[Sbreak]", "[Pbreak]", "[Ebreak]",
    "[undefine]", "[spk_emb]", "[empty_spk]", "[music]", "[pure]",
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
)  # fmt: skip
CHATTTS_TOKENS = _PROSODY_TOKENS + _CONTROL_TOKENS

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_GPT_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class AssetManifest:
    scale: str
    seed: int
    format_version: int
    files: dict[str, str]  # path relative to the root -> sha256 hex digest


def synthetic_config(scale: str) -> Config:
    """A fresh ChatTTS Config for the scale: ``full`` is ChatTTS's default, ``tiny`` a small model.

    The result shares nothing with ChatTTS's class-level defaults, which every ``Chat()`` uses, so
    changing it never leaks into another model.
    """
    _check_scale(scale)
    from ChatTTS.config import config as cc

    config = copy.deepcopy(cc.Config())
    if scale == "full":
        return config

    width = _TINY_GPT_WIDTH
    # The Decoder reads each GPT hidden state as two mel-rate frames of half its width.
    decoder_width = width // 2
    dvae_width = 32
    return replace(
        config,
        gpt=cc.GPT(hidden_size=width, intermediate_size=2 * width, num_attention_heads=4, num_hidden_layers=2),
        embed=cc.Embed(hidden_size=width),
        decoder=cc.Decoder(idim=decoder_width, odim=decoder_width, hidden=64, n_layer=2, bn_dim=16),
        dvae=cc.DVAE(
            encoder=cc.Decoder(idim=dvae_width, odim=2 * dvae_width, hidden=64, n_layer=2, bn_dim=16),
            decoder=cc.Decoder(idim=dvae_width, odim=dvae_width, hidden=64, n_layer=2, bn_dim=16),
            # DVAE.forward splits the quantizer's output into two halves along the channels.
            vq=cc.VQ(dim=2 * dvae_width),
        ),
        vocos=cc.Vocos(
            backbone=cc.Backbone(init_args=cc.BackboneInitArgs(dim=64, intermediate_dim=192, num_layers=2)),
            head=cc.FourierHead(init_args=cc.FourierHeadInitArgs(dim=64)),
        ),
        # Speaker embeddings are sampled at the GPT's width.
        spk_stat=_narrow_speaker_stats(config.spk_stat, width),
    )


def build_synthetic_assets(
    root: Path, scale: str, *, seed: int = 0, progress: ProgressCallback | None = None
) -> AssetManifest:
    """Build synthetic assets at root, replacing whatever is there.

    The files are built in a temporary folder next to root, manifest last, and the folder is renamed
    into place at the end: a crash never leaves a root that looks complete. The same scale and seed
    always give byte-identical files. ``progress(relative_path, done, total)`` is called as each file
    (the manifest included) is written.
    """
    config = synthetic_config(scale)
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".building", dir=root.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private, but other users' workers read the assets
        manifest = _write_assets(staging, config, scale, seed, progress)
        _move_into_place(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("built synthetic %s assets (seed %d) in %s", scale, seed, root)
    return manifest


def read_manifest(root: Path) -> AssetManifest | None:
    """The manifest of a completely built root; None when it is missing, unreadable or incomplete."""
    root = Path(root)
    try:
        data = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
        manifest = AssetManifest(
            scale=str(data["scale"]),
            seed=int(data["seed"]),
            format_version=int(data["format_version"]),
            files={str(path): str(digest) for path, digest in data["files"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not manifest.files or not all((root / path).is_file() for path in manifest.files):
        return None
    return manifest


def ensure_synthetic_assets(data_dir: Path, scale: str, *, progress: ProgressCallback | None = None) -> Path:
    """``data_dir/assets/synthetic-<scale>``, built first (with seed 0) when it is not complete.

    Safe when several processes call it at once: one builds while the others wait, then reuse it.
    """
    _check_scale(scale)
    assets_dir = Path(data_dir) / "assets"
    root = assets_dir / f"synthetic-{scale}"
    if _is_current(read_manifest(root), scale):
        return root
    assets_dir.mkdir(parents=True, exist_ok=True)
    with open(assets_dir / f".synthetic-{scale}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        # Another process may have finished the build while this one waited for the lock.
        if not _is_current(read_manifest(root), scale):
            # Builds of this root only run under this lock, so leftovers are from killed builds.
            for leftover in assets_dir.glob(f".{root.name}.*.building"):
                shutil.rmtree(leftover, ignore_errors=True)
            logger.info("building synthetic %s assets in %s", scale, root)
            build_synthetic_assets(root, scale, progress=progress)
    return root


def asset_paths(root: Path) -> dict[str, str]:
    """The keyword paths ``Chat._load`` takes for the assets at root, joined like ``Chat.load`` does."""
    from ChatTTS.config import config as cc

    return {name: os.path.join(root, relative) for name, relative in asdict(cc.Path()).items()}


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: expected one of {', '.join(SCALES)}")


def _is_current(manifest: AssetManifest | None, scale: str) -> bool:
    return manifest is not None and manifest.scale == scale and manifest.format_version == FORMAT_VERSION


def _narrow_speaker_stats(spk_stat: str, width: int) -> str:
    """ChatTTS's speaker statistics (float16 std, then mean) cut down to their first width dimensions."""
    std, mean = np.split(np.frombuffer(b14.decode_from_string(spk_stat), dtype=np.float16), 2)
    return b14.encode_to_string(np.concatenate([std[:width], mean[:width]]).tobytes())


def _move_into_place(staging: Path, root: Path) -> None:
    if not root.exists():
        staging.rename(root)
        return
    # A folder cannot be renamed over a non-empty one: move the old one aside first.
    discarded = root.with_name(f".{root.name}.{uuid.uuid4().hex}.old")
    root.rename(discarded)
    staging.rename(root)
    shutil.rmtree(discarded, ignore_errors=True)


def _write_assets(
    root: Path, config: Config, scale: str, seed: int, progress: ProgressCallback | None
) -> AssetManifest:
    paths = config.path
    mel_coef = _mel_coefficients(seed)
    # Each step builds one module, saves it and lets it go before the next: the full scale never
    # holds more than its largest module (the GPT) in memory.
    steps = (
        ("tokenizer", [f"{paths.tokenizer_path}/{name}" for name in _TOKENIZER_FILES], _write_tokenizer),
        ("vocos", [paths.vocos_ckpt_path], _write_vocos),
        ("dvae", [paths.dvae_ckpt_path], functools.partial(_write_dvae, mel_coef=mel_coef)),
        ("decoder", [paths.decoder_ckpt_path], functools.partial(_write_decoder, mel_coef=mel_coef)),
        ("embed", [paths.embed_path], _write_embed),
        ("gpt", [f"{paths.gpt_ckpt_path}/{name}" for name in _GPT_FILES], _write_gpt),
    )
    total = sum(len(files) for _, files, _ in steps) + 1  # and the manifest
    digests: dict[str, str] = {}
    for module, files, write in steps:
        # Modules draw their default initialisation from torch's global CPU generator: seed it for
        # determinism and restore it afterwards, leaving the caller's random state (CUDA's too,
        # which torch.manual_seed would reseed) untouched.
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(_module_seed(seed, module))
            write(root, config)
        for relative in files:
            digests[relative] = _sha256(root / relative)
            if progress is not None:
                progress(relative, len(digests), total)

    manifest = AssetManifest(scale=scale, seed=seed, format_version=FORMAT_VERSION, files=digests)
    (root / MANIFEST_NAME).write_text(json.dumps(asdict(manifest), indent=2) + "\n", encoding="utf-8")
    if progress is not None:
        progress(MANIFEST_NAME, total, total)
    return manifest


def _module_seed(seed: int, module: str) -> int:
    # One random stream per module: resizing one module leaves the others' weights unchanged.
    return int.from_bytes(hashlib.sha256(f"{seed}:{module}".encode()).digest()[:8], "little")


def _sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _save_state_dict(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in module.state_dict().items()}
    save_file(state, path, metadata={"format": "pt"})
    # safetensors writes through a private temporary file, which leaves the result owner-only.
    path.chmod(0o644)


def _write_tokenizer(root: Path, config: Config) -> None:
    from transformers import BertTokenizerFast

    letters_and_digits = string.ascii_lowercase + string.digits
    pieces = [
        *_BERT_SPECIAL_TOKENS,
        *letters_and_digits,
        *string.punctuation,
        *(f"##{c}" for c in letters_and_digits),  # with these, WordPiece spells any word, never [UNK]
        *_FULL_WIDTH_PUNCTUATION,
    ]
    # CJK ideographs from U+4E00 on fill the vocabulary up to ChatTTS's size (to U+9FBD).
    base_size = config.gpt.num_text_tokens - len(CHATTTS_TOKENS)
    pieces += [chr(0x4E00 + i) for i in range(base_size - len(pieces))]

    backend = Tokenizer(WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    # normalized=False: matched in the raw text, so lowercasing never turns [Stts] into [stts].
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _BERT_SPECIAL_TOKENS])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHATTTS_TOKENS])

    tokenizer = BertTokenizerFast(tokenizer_object=backend, do_lower_case=True)
    directory = root / config.path.tokenizer_path
    tokenizer.save_pretrained(directory)
    # transformers 5 no longer writes this file, but ChatTTS's asset check requires it.
    (directory / "special_tokens_map.json").write_text(
        json.dumps(tokenizer.special_tokens_map, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def _write_vocos(root: Path, config: Config) -> None:
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    # Built like Chat._load builds it.
    vocos = Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(config.vocos.head)),
    )
    _init_istft_head(vocos.head.out)
    _save_state_dict(vocos, root / config.path.vocos_ckpt_path)


@torch.no_grad()
def _init_istft_head(out: torch.nn.Linear) -> None:
    """Make Vocos's ISTFT head emit spectra of near-constant magnitude and random phase.

    The layer's outputs are log-magnitudes, then phases, one per frequency bin. With the default
    initialisation the magnitudes would be exp() of values spread over several units: loud, often
    clipped noise. Its input is layer-normalised (unit variance per feature), so each output's
    spread is the norm of its weight row.
    """
    bins = out.out_features // 2
    row_scale = out.in_features**-0.5
    out.weight[:bins].normal_(0.0, _VOCOS_LOG_MAGNITUDE_STD * row_scale)
    out.bias[:bins].fill_(float(np.log(_VOCOS_MAGNITUDE_GAIN)))
    # Phases must spread over whole turns from frame to frame, or overlapping frames add coherently.
    out.weight[bins:].normal_(0.0, np.pi * row_scale)
    out.bias[bins:].uniform_(-np.pi, np.pi)


def _write_dvae(root: Path, config: Config, mel_coef: str) -> None:
    from ChatTTS.model import DVAE

    dvae = DVAE(
        decoder_config=asdict(config.dvae.decoder),
        encoder_config=asdict(config.dvae.encoder),
        vq_config=asdict(config.dvae.vq),
        dim=config.dvae.decoder.idim,
        coef=mel_coef,
    )
    _save_state_dict(dvae, root / config.path.dvae_ckpt_path)


def _write_decoder(root: Path, config: Config, mel_coef: str) -> None:
    from ChatTTS.model import DVAE

    decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim, coef=mel_coef)
    _save_state_dict(decoder, root / config.path.decoder_ckpt_path)


def _mel_coefficients(seed: int) -> str:
    """The per-mel-bin output scale shared by the DVAE and the Decoder, as ``DVAE(coef=...)`` takes it.

    Drawn like DVAE's own default (uniform in [0, 1)). Shared because Chat._load builds the Decoder
    with the DVAE's coefficients before loading the Decoder's own.
    """
    generator = torch.Generator().manual_seed(_module_seed(seed, "mel_coef"))
    return b14.encode_to_string(torch.rand(100, generator=generator).numpy().tobytes())


def _write_embed(root: Path, config: Config) -> None:
    from ChatTTS.model import Embed

    embed = Embed(
        config.embed.hidden_size, config.embed.num_audio_tokens, config.embed.num_text_tokens, config.embed.num_vq
    )
    # ChatTTS puts an L2-normalised speaker embedding (norm 1) among the token embeddings; with
    # nn.Embedding's N(0, 1) rows (norm ~sqrt(width)) the voice would barely change the audio. Rows of
    # norm ~1 give the speaker its due weight, as in the trained model.
    with torch.no_grad():
        for table in (embed.emb_text, *embed.emb_code):
            table.weight.normal_(0.0, config.embed.hidden_size**-0.5)
    _save_state_dict(embed, root / config.path.embed_path)


def _write_gpt(root: Path, config: Config) -> None:
    from transformers import LlamaConfig, LlamaModel

    # The LlamaConfig ChatTTS's GPT builds from the gpt section (gpt.py, _build_llama_config). Its
    # default 32000-token embed_tokens is saved too, as in the real files; ChatTTS drops it on load.
    # LlamaModel initialises like transformers does: weights N(0, 0.02), norms at 1, which keeps the
    # hidden states finite in bf16.
    llama_config = LlamaConfig(**asdict(config.gpt))
    gpt = LlamaModel(llama_config)
    directory = root / config.path.gpt_ckpt_path
    llama_config.save_pretrained(directory)
    _save_state_dict(gpt, directory / "model.safetensors")
