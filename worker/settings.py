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



def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.strip().lower() in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"{ENV_PREFIX}{name} must be true or false, got {raw!r}")


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
    # The web app's database; empty means sqlite:///<data_dir>/farm.db.
    database_url: str = ""
    # Largest HTTP request body the web app reads.
    max_request_bytes: int = 1024 * 1024
    # API keys: required on /api and /v1 when on; per key: requests that change something (submit a
    # job, edit the catalog) a minute, reads a minute, and audio seconds a day. Reads get their own,
    # larger budget: a page watching a job polls its status twice a second.
    require_api_key: bool = False
    rate_limit_per_minute: int = 120
    read_rate_limit_per_minute: int = 1200
    daily_audio_quota_s: int = 4 * 3600
    # Signs the pages' session cookies (sign-in, CSRF tokens); every web process must share it.
    # Empty means one generated on first use and kept in <data_dir>/secret_key.
    secret_key: str = field(default="", repr=False)
    # How long finished results and their audio stay in Redis.
    result_ttl_s: int = 24 * 3600
    # Jobs a worker process holds and synthesises together (their segments then share GPT passes
    # of up to max_batch rows), and how long it waits for more once one has arrived.
    batch_jobs: int = 32
    worker_batch_window_ms: int = 50
    # A job running past the soft limit is stopped and fails with JobTimeout; a batch stuck past the
    # hard limit ends the worker process (its supervisor restarts it, its jobs are delivered again).
    task_soft_time_limit_s: int = 600
    task_time_limit_s: int = 900
    # Seconds between a worker's sweeps that return unacknowledged jobs of dead workers to the queue.
    unacked_restore_interval_s: int = 10

    @property
    def database_uri(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'farm.db'}"

    @property
    def visibility_timeout_s(self) -> int:
        """How long Redis lets a delivered, unacknowledged job be before handing it out again.

        A worker holds a job at most while one batch runs ahead of it and then its own batch runs,
        each bounded by the hard time limit; a longer timeout means no job is run twice while its
        worker lives, and a dead worker's jobs come back within this time.
        """
        return 2 * self.task_time_limit_s + 30

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
            database_url=_env_str(env, "DATABASE_URL", defaults.database_url),
            max_request_bytes=_env_int(env, "MAX_REQUEST_BYTES", defaults.max_request_bytes, minimum=1024),
            require_api_key=_env_bool(env, "REQUIRE_API_KEY", defaults.require_api_key),
            rate_limit_per_minute=_env_int(env, "RATE_LIMIT_PER_MINUTE", defaults.rate_limit_per_minute, minimum=1),
            read_rate_limit_per_minute=_env_int(env, "READ_RATE_LIMIT_PER_MINUTE", defaults.read_rate_limit_per_minute,
                                                minimum=1),
            daily_audio_quota_s=_env_int(env, "DAILY_AUDIO_QUOTA_S", defaults.daily_audio_quota_s, minimum=1),
            secret_key=_env_str(env, "SECRET_KEY", defaults.secret_key),
            result_ttl_s=_env_int(env, "RESULT_TTL_S", defaults.result_ttl_s, minimum=60),
            batch_jobs=_env_int(env, "BATCH_JOBS", defaults.batch_jobs, minimum=1),
            worker_batch_window_ms=_env_int(env, "WORKER_BATCH_WINDOW_MS", defaults.worker_batch_window_ms),
            task_soft_time_limit_s=_env_int(env, "TASK_SOFT_TIME_LIMIT_S", defaults.task_soft_time_limit_s, minimum=1),
            task_time_limit_s=_env_int(env, "TASK_TIME_LIMIT_S", defaults.task_time_limit_s, minimum=1),
            unacked_restore_interval_s=_env_int(env, "UNACKED_RESTORE_INTERVAL_S",
                                                defaults.unacked_restore_interval_s, minimum=1),
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        settings = replace(settings, data_dir=Path(settings.data_dir))
        if settings.task_time_limit_s < settings.task_soft_time_limit_s:
            raise SettingsError(f"{ENV_PREFIX}TASK_TIME_LIMIT_S must be at least {ENV_PREFIX}TASK_SOFT_TIME_LIMIT_S")
        if settings.cuda_dtype not in {"bf16", "fp16", "fp32"}:
            raise SettingsError(f"{ENV_PREFIX}CUDA_DTYPE must be bf16, fp16 or fp32, got {settings.cuda_dtype!r}")
        return settings
