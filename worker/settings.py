"""The farm's settings: one place, read from ``CHATTTS_FARM_*`` environment variables.

Torch-free, so the web app and outside tools can read the same settings as the workers.
Build a :class:`Settings` once at an entry point (CLI, app factory, worker start) and pass it down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

ENV_PREFIX = "CHATTTS_FARM_"


class SettingsError(ValueError):
    """An environment variable holds a value the farm cannot use."""


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{ENV_PREFIX}{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{ENV_PREFIX}{name} must be at least {minimum}, got {value}")
    return value


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{ENV_PREFIX}{name} must be a number, got {raw!r}") from None


def _env_str(env: Mapping[str, str], name: str, default: str) -> str:
    raw = env.get(ENV_PREFIX + name)
    return default if raw is None or raw.strip() == "" else raw.strip()



@dataclass(frozen=True)
class Settings:
    # Which weights to load: huggingface | local:<dir> | synthetic-tiny | synthetic-full | auto.
    model: str = "huggingface"
    data_dir: Path = field(default_factory=lambda: Path("var"))
    # Device for the model: "auto" picks CUDA when present, else the CPU.
    device: str = "auto"
    # GPT dtype on CUDA (fp32 is always used on the CPU): bf16 | fp16 | fp32.
    cuda_dtype: str = "bf16"
    # Most rows one GPT pass runs at once.
    max_batch: int = 64
    # Longest segment (characters) long text is split into.
    max_segment_chars: int = 120
    # Longest text one request may carry.
    max_text_chars: int = 5000
    # Token limit of one segment; 2048 tokens is ChatTTS's own cap (~43.7 s of audio).
    max_new_tokens: int = 2048
    # Silence between the segments of a long text.
    segment_pause_s: float = 0.25
    # How many times a segment the quality gate flags is generated again with another audio seed.
    quality_retries: int = 1
    redis_url: str = "redis://localhost:6379/0"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        defaults = cls()
        settings = cls(
            model=_env_str(env, "MODEL", defaults.model),
            data_dir=Path(_env_str(env, "DATA_DIR", str(defaults.data_dir))),
            device=_env_str(env, "DEVICE", defaults.device),
            cuda_dtype=_env_str(env, "CUDA_DTYPE", defaults.cuda_dtype),
            max_batch=_env_int(env, "MAX_BATCH", defaults.max_batch, minimum=1),
            max_segment_chars=_env_int(env, "MAX_SEGMENT_CHARS", defaults.max_segment_chars, minimum=20),
            max_text_chars=_env_int(env, "MAX_TEXT_CHARS", defaults.max_text_chars, minimum=1),
            max_new_tokens=_env_int(env, "MAX_NEW_TOKENS", defaults.max_new_tokens, minimum=16),
            segment_pause_s=_env_float(env, "SEGMENT_PAUSE_S", defaults.segment_pause_s),
            quality_retries=_env_int(env, "QUALITY_RETRIES", defaults.quality_retries),
            redis_url=_env_str(env, "REDIS_URL", defaults.redis_url),
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        if settings.cuda_dtype not in {"bf16", "fp16", "fp32"}:
            raise SettingsError(f"{ENV_PREFIX}CUDA_DTYPE must be bf16, fp16 or fp32, got {settings.cuda_dtype!r}")
        return settings
