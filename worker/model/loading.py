"""Loading ChatTTS from the source ``CHATTTS_FARM_MODEL`` names.

- ``huggingface`` (default): the real weights through ChatTTS's own loader (HF cache, else download).
- ``local:<dir>``: real weights in a folder, checked against ChatTTS's own sha256 map.
- ``synthetic-tiny`` / ``synthetic-full``: random weights in ChatTTS's layout (see
  :mod:`worker.model.synthetic_assets`), built into the data dir on first use.
- ``auto``: real weights when they can be had, else ``synthetic-tiny`` with a loud warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from chattts_farm.contract import ModelUnavailable
from chattts_farm.settings import Settings

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_WHAT_TO_SET = (
    "Set CHATTTS_FARM_MODEL=local:<dir> to a folder holding the ChatTTS weights, or "
    "CHATTTS_FARM_MODEL=synthetic-tiny (or synthetic-full) to run on random weights."
)


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is, shown by every layer above (results, health, pages)."""

    kind: str  # "real" | "synthetic"
    scale: str | None  # "tiny" | "full" for synthetic weights
    source: str
    device: str
    dtype: str

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


@dataclass
class LoadedModel:
    chat: ChatTTS.Chat  # noqa: F821 - imported lazily, ChatTTS is heavy
    info: ModelInfo
    device: torch.device

    @property
    def is_synthetic(self) -> bool:
        return self.info.kind == "synthetic"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_model(settings: Settings, *, progress: Callable[[str, int, int], None] | None = None) -> LoadedModel:
    """Load the model ``settings.model`` names; raise :class:`ModelUnavailable` when it cannot be had."""
    import ChatTTS

    device = pick_device(settings.device)
    source = settings.model
    chat = ChatTTS.Chat(logging.getLogger("ChatTTS"))
    if source == "auto":
        try:
            return load_model_from(chat, "huggingface", settings, device, progress)
        except ModelUnavailable as error:
            logger.warning(
                "!!! No real ChatTTS weights (%s). Falling back to RANDOM synthetic-tiny weights: "
                "the audio will be noise, not speech. !!!",
                error,
            )
            return load_model_from(
                ChatTTS.Chat(logging.getLogger("ChatTTS")), "synthetic-tiny", settings, device, progress
            )
    return load_model_from(chat, source, settings, device, progress)


def load_model_from(
    chat, source: str, settings: Settings, device: torch.device, progress: Callable[[str, int, int], None] | None
) -> LoadedModel:
    if source == "huggingface":
        if not chat.load(source="huggingface", device=device):
            raise ModelUnavailable(
                "could not load the ChatTTS weights from HuggingFace (2Noise/ChatTTS): no usable copy in "
                "the HuggingFace cache and the download failed (offline?). " + _WHAT_TO_SET
            )
        kind, scale = "real", None
    elif source.startswith("local:"):
        folder = Path(source.removeprefix("local:")).expanduser()
        if not (folder / "asset").is_dir():
            raise ModelUnavailable(f"{folder} has no asset/ folder of ChatTTS weights. " + _WHAT_TO_SET)
        if not chat.load(source="custom", custom_path=str(folder), device=device):
            raise ModelUnavailable(
                f"the ChatTTS weights in {folder} failed ChatTTS's checksum verification (missing or "
                "altered files). " + _WHAT_TO_SET
            )
        kind, scale = "real", None
    elif source in ("synthetic-tiny", "synthetic-full"):
        from worker.model.synthetic_assets import asset_paths, ensure_synthetic_assets, synthetic_config

        scale = source.removeprefix("synthetic-")
        root = ensure_synthetic_assets(settings.data_dir, scale, progress=progress)
        chat.config = synthetic_config(scale)
        if not chat._load(device=device, **asset_paths(root)):
            raise ModelUnavailable(
                f"the synthetic {scale} assets in {root} did not load; delete the folder to have them built again"
            )
        kind = "synthetic"
    else:
        raise ModelUnavailable(
            f"unknown model source {source!r}: use huggingface, local:<dir>, synthetic-tiny, synthetic-full or auto"
        )

    if device.type == "cuda":
        # Padded batches give attention a mask, for which torch picks cuDNN attention on Hopper; cuDNN
        # builds a plan for every new (batch, length) shape, and a decode loop meets a new length every
        # step: measured on an H200, 60-80 ms a step until each shape has been seen once. The
        # memory-efficient kernel has no such set-up cost.
        torch.backends.cuda.enable_cudnn_sdp(False)
    dtype_name = settings.cuda_dtype if device.type == "cuda" else "fp32"
    chat.gpt.gpt.to(_DTYPES[dtype_name])
    # Nothing here trains. With the weights wanting gradients, every pass run outside inference mode
    # (the warm-up's, the CUDA graph captures') recorded autograd's graph, and the buffers it wrote kept
    # that graph's activations alive: 14 GiB in the vocoder's window graphs on an H200, and the
    # engine's KV cache sized around them ran out of memory.
    for part in vars(chat).values():
        if isinstance(part, torch.nn.Module):
            part.requires_grad_(False)
    info = ModelInfo(kind, scale, source, str(device), dtype_name)
    logger.info("loaded ChatTTS model %s", info.as_dict())
    return LoadedModel(chat=chat, info=info, device=device)
