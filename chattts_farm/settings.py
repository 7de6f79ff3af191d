"""The farm's settings: one place, read from ``CHATTTS_FARM_*`` environment variables.

Torch-free, so the web app, the workers and outside tools read the same settings. Build a
:class:`Settings` once at an entry point (CLI, app factory, worker start) and pass it down.

Each field declares its variable's meaning, its bounds and any older name it had; the README's
settings table and ``.env.example`` are generated from these declarations (``chattts-farm settings``),
and a test keeps them in step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "CHATTTS_FARM_"

logger = logging.getLogger(__name__)


class SettingsError(ValueError):
    """An environment variable holds a value the farm cannot use."""


def _setting(
    default: Any,
    meaning: str,
    *,
    minimum: float | None = None,
    choices: tuple[str, ...] = (),
    renamed_from: tuple[str, ...] = (),
    secret: bool = False,
    shown_default: str | None = None,
    role: str = "all",
) -> Any:
    """A field of :class:`Settings`: its default, what it means, and how its variable is checked.

    ``renamed_from`` are the variable's older names (without the prefix), still read with a warning.
    ``role`` says which processes read it: ``all``, ``web``, ``worker`` or ``flower``.
    """
    metadata = {
        "meaning": meaning,
        "minimum": minimum,
        "choices": choices,
        "renamed_from": renamed_from,
        "shown_default": shown_default,
        "role": role,
    }
    if isinstance(default, Path):
        return field(default_factory=lambda: Path(default), metadata=metadata)
    return field(default=default, metadata=metadata, repr=not secret)


# The most slots an engine gives itself without a SLOTS setting: on a GPU (as many as its memory
# holds, up to this), and on the CPU. MAX_JOBS_IN_FLIGHT defaults to them.
MAX_AUTO_SLOTS = 2048
CPU_SLOTS = 64


@dataclass(frozen=True)
class Settings:
    # Every process.
    model: str = _setting(
        "huggingface",
        "model source: `huggingface`, `local:<dir>`, `synthetic-tiny`, `synthetic-full`, `auto` (see Models)",
    )
    data_dir: Path = _setting(Path("var"), "where synthetic assets, the SQLite database and the secret key live")
    redis_url: str = _setting("redis://localhost:6379/0", "broker, result backend and shared state")
    result_ttl_s: int = _setting(24 * 3600, "how long results stay in Redis", minimum=60)
    audio_store: str = _setting(
        "",
        "where finished audio is kept: `file:<dir>` (a volume shared by every host), `s3://<bucket>/<prefix>` "
        "or `redis` (in memory: small setups only); see Audio store",
        shown_default="`file:<data dir>/audio`",
    )
    s3_endpoint_url: str = _setting(
        "", "an S3-compatible server for an `s3://` audio store (default: AWS's own)", shown_default="none"
    )
    audio_ttl_s: int = _setting(
        24 * 3600, "how long a job's audio is kept (`chattts-farm gc` deletes it after)", minimum=60
    )
    max_text_chars: int = _setting(5000, "longest text one request may carry", minimum=1)
    stream_ttl_s: int = _setting(
        120,
        "how long a streaming job's chunks stay readable in Redis after its last one (its whole audio is in "
        "the audio store); they take Redis memory: 48 KB an audio second while they last (docs/capacity.md)",
        minimum=60,
    )
    stream_max_entries: int = _setting(
        4096, "most chunks one job's stream keeps; older ones are trimmed (the whole audio is kept apart)", minimum=16
    )

    # Callbacks: the web checks a job's callback_url at submit, the workers deliver it.
    callback_secret: str = _setting(
        "",
        "signs every callback (`X-Chattts-Farm-Signature: sha256=<HMAC-SHA256 of the body>`); unset, a job "
        "with a `callback_url` is refused (400): the farm sends no unsigned callbacks",
        shown_default="none",
        secret=True,
    )
    callback_allowed_hosts: str = _setting(
        "",
        "hosts (comma-separated, as written in the URL) a callback may reach though they are not public "
        "addresses: loopback, private, link-local and the like are refused otherwise",
        shown_default="none",
    )
    callback_attempts: int = _setting(
        10, "times a callback is tried before it is given up as failed", minimum=1, role="worker"
    )
    callback_backoff_s: float = _setting(
        5.0,
        "wait before a callback's second attempt, doubling after each (5 s: the tenth is ~43 minutes after the first)",
        minimum=0.01,
        role="worker",
    )
    callback_timeout_s: float = _setting(
        10.0,
        "a callback attempt's bound on connecting, on each wait for its receiver, and on the whole attempt",
        minimum=0.1,
        role="worker",
    )

    # Workers: the model and synthesis.
    device: str = _setting("auto", "`auto` (CUDA when present), `cpu`, `cuda`, `cuda:1`, ...", role="worker")
    cuda_dtype: str = _setting(
        "bf16", "GPT dtype on CUDA (always fp32 on the CPU)", choices=("bf16", "fp16", "fp32"), role="worker"
    )
    slots: int = _setting(
        0,
        "segments the engine runs at once (a slot each); 0 sizes them from free GPU memory, at most "
        f"{MAX_AUTO_SLOTS} ({CPU_SLOTS} on the CPU)",
        minimum=0,
        renamed_from=("MAX_RUNNING_ROWS",),
        role="worker",
    )
    kv_cache_gib: float = _setting(
        0.0,
        "GiB of GPU memory the KV cache takes, in blocks of 64 positions shared by every slot; 0 takes what "
        "is free after the model, the slots' own state and a working margin (on the CPU: every slot its "
        "longest segment)",
        minimum=0,
        role="worker",
    )
    kv_dtype: str = _setting(
        "model",
        "the KV cache's dtype: `model` (the GPT's own: bf16 on CUDA) or `fp8` (e4m3, half the memory)",
        choices=("model", "fp8"),
        role="worker",
    )
    matmul_dtype: str = _setting(
        "model",
        "the GPT's matmuls in passes of at least 256 tokens (prefills, decode steps of 256 rows or more): "
        "`model` (the GPT's own dtype) or `fp8` (e4m3, weights scaled per output channel and inputs per row; "
        "needs a GPU with fp8 tensor cores, compute capability 8.9 or later; a row's numbers then depend on "
        "its pass's size)",
        choices=("model", "fp8"),
        role="worker",
    )
    max_segments_per_pass: int = _setting(
        64,
        "most segments one prefill, refine-text or vocoder pass takes",
        minimum=1,
        renamed_from=("MAX_ROWS_PER_PASS", "MAX_BATCH"),
        role="worker",
    )
    max_segment_chars: int = _setting(120, "longest segment long text is split into", minimum=20, role="worker")
    max_new_tokens: int = _setting(
        2048, "token limit of one segment (2048 is ChatTTS's own, ~43.7 s)", minimum=16, role="worker"
    )
    segment_pause_s: float = _setting(0.25, "silence between the segments of a long text", minimum=0, role="worker")
    stream_context_frames: int = _setting(
        0,
        "frames of context either side of a streamed chunk (a frame is one GPT step, ~21 ms): fewer send the "
        "first audio sooner; 0 measures at load the fewest that keep joined chunks equal to the unstreamed "
        "audio (within 1e-5 beyond rounding); at most the vocoder's receptive field (52 at full scale)",
        minimum=0,
        role="worker",
    )
    quality_retries: int = _setting(
        1, "regenerations, with another seed, of a segment the quality gate flags", minimum=0, role="worker"
    )
    asr: str = _setting(
        "auto",
        "the ASR check of every segment (see The ASR gate): `auto` (Whisper with real weights when its model "
        "is there, else off; off on synthetic weights, whose audio is noise), `whisper`, `offline` "
        "(pocketsphinx: English only, from PyPI alone) or `off`",
        choices=("auto", "whisper", "offline", "off"),
        role="worker",
    )
    asr_max_error_rate: float = _setting(
        0.5,
        "a segment whose heard text has more errors than this (word error rate; characters for Chinese) is "
        "flagged `asr_mismatch` and generated again, within QUALITY_RETRIES",
        minimum=0,
        role="worker",
    )
    asr_whisper_model: str = _setting(
        "tiny",
        "the Whisper model ASR uses: a name whose weights are in `~/.cache/whisper` (`tiny`, `base`, ...) or a "
        "checkpoint's path (`.pt`); never downloaded. `synthetic-tiny` and `synthetic-base` are a benchmark's aid "
        "(bench/asr_cost.py): the real architecture with random weights, whose verdicts are meaningless; only "
        "ASR=whisper uses them",
        role="worker",
    )

    # Workers: jobs.
    node_name: str = _setting(
        "",
        "the host part of this host's worker names (`gpu0@<node>`): default the host name; set it where "
        "hosts share one (containers, clones of one image), as every worker's name must be its own",
        role="worker",
    )
    max_jobs_in_flight: int = _setting(
        0,
        "jobs a GPU's (or CPU worker's) Celery processes hold at once (a thread each; they take another "
        "from Redis only as one ends): about the engine's slots keeps a GPU full without hoarding the "
        f"queue (0: {MAX_AUTO_SLOTS} for a GPU, {CPU_SLOTS} for a CPU worker, the most slots an engine "
        "gives itself there)",
        minimum=0,
        renamed_from=("BATCH_JOBS",),
        role="worker",
    )
    celery_processes: int = _setting(
        0,
        "Celery processes that take jobs for each engine (0: 3 for a GPU, 1 for a CPU worker): one "
        "process spends 8-12 ms of CPU a job (a GPU host, 2026-12-07), so it carries ~100 jobs a second, "
        "fewer than its engine finishes (~265 on an H100); the first starts and watches the engine "
        "process, the others connect to it, and they share MAX_JOBS_IN_FLIGHT",
        minimum=0,
        role="worker",
    )
    engine_socket: str = _setting(
        "",
        "set by `chattts-farm worker` for a GPU's Celery processes when there are several: the socket its "
        "engine process listens on for the others",
        role="worker",
    )
    engine_starter: bool = _setting(
        True,
        "set by `chattts-farm worker`: whether this Celery process starts its engine process (the first of "
        "a GPU's) or connects to ENGINE_SOCKET (the others)",
        role="worker",
    )
    task_soft_time_limit_s: int = _setting(
        600, "a job running longer is stopped (`JobTimeout`)", minimum=1, role="worker"
    )
    task_time_limit_s: int = _setting(
        900,
        "one engine step (or isolating a failed one) running longer ends the engine process "
        "(it is started again and its jobs run again, see ENGINE_RETRIES)",
        minimum=1,
        role="worker",
    )
    encoder_processes: int = _setting(
        4,
        "processes a worker encodes mp3, Ogg and FLAC results in, beside its job threads (0: in the job "
        "threads, one at a time under the interpreter's lock); started as needed",
        minimum=0,
        role="worker",
    )
    engine_module: str = _setting(
        "worker.engine_process.main",
        "the module a worker's engine process runs (`python -m <module>`); `bench/celery_side.py` swaps in "
        "one that answers at once, to measure what the Celery side costs without a GPU",
        role="worker",
    )
    engine_retries: int = _setting(
        2,
        "times a job runs again after the engine process running it died (a crash, the hard time limit, "
        "the OOM killer); once more, and it fails with `EngineLost`",
        minimum=0,
        role="worker",
    )
    unacked_restore_interval_s: int = _setting(
        10, "how often workers return dead workers' jobs to the queue", minimum=1, role="worker"
    )

    # The web app.
    database_url: str = _setting(
        "",
        "the web app's database: SQLite (one host) or, for several web hosts, "
        "`postgresql+psycopg://user:password@host:5432/name`",
        shown_default="`sqlite:///<data dir>/farm.db`",
        role="web",
    )
    max_request_bytes: int = _setting(1024 * 1024, "largest HTTP request body", minimum=1024, role="web")
    max_batch_bytes: int = _setting(
        64 * 1024 * 1024,
        "largest body of a batch (`POST /api/batches`, JSON or a JSON Lines upload: up to 10,000 jobs)",
        minimum=1024,
        role="web",
    )
    require_api_key: bool = _setting(False, "require API keys on `/api` and `/v1`", role="web")
    rate_limit_per_minute: int = _setting(
        120,
        "requests that change something (submit, edit the catalog), a minute per key; a request that makes "
        "several jobs (the workshop) counts each",
        minimum=1,
        role="web",
    )
    # Reads get their own, larger budget: a page watching a job polls its status twice a second.
    read_rate_limit_per_minute: int = _setting(
        1200, "reads (status polls, audio), a minute per key", minimum=1, role="web"
    )
    daily_audio_quota_s: int = _setting(4 * 3600, "audio seconds a day per key", minimum=1, role="web")
    # With keys off every caller is anonymous and shares one bound: without keys there is no identity
    # to be fair between (a client's address is a proxy's, or forged), only the server to protect.
    max_waits_per_key: int = _setting(
        64,
        "requests of one key held open on their audio (`/v1/audio/speech`, a job's stream, a download of its "
        "audio), however long they wait or take to read; keys off: one bound for all",
        minimum=1,
        role="web",
    )
    # Renewed while its request lives (every third of it, or of the send timeout if shorter): only a dead
    # web process lets a slot lapse.
    wait_slot_lease_s: int = _setting(
        60, "how long the wait slots of a web process that died stay taken", minimum=1, role="web"
    )
    stream_send_timeout_s: int = _setting(
        30,
        "a client that takes nothing of its streamed or downloaded audio for this long is disconnected, "
        "freeing its wait slot",
        minimum=1,
        role="web",
    )
    max_queued_jobs: int = _setting(
        10_000,
        "jobs waiting to start (in the queues, not yet taken by a worker) past which submissions get a 503 with "
        "`Retry-After`; Celery callers read it with `chattts_farm.backlog`",
        minimum=1,
        role="web",
    )
    max_queued_jobs_per_key: int = _setting(
        1000,
        "jobs of one key waiting to start past which its submissions get a 429; keys off: no such cap",
        minimum=1,
        role="web",
    )
    web_connections: int = _setting(
        1000,
        "connections each web process (a gevent worker) serves at once; its Redis connection pools are as large",
        minimum=1,
        role="web",
    )
    # Forwarded headers are believed only from this many proxies in front: more would let a client forge them.
    trust_proxy: int = _setting(
        0,
        "reverse proxies in front of the web (TLS ends there): their `X-Forwarded-*` headers are believed; 0: none",
        minimum=0,
        role="web",
    )
    secret_key: str = _setting(
        "",
        "signs the pages' session cookies; one for all web processes",
        shown_default="kept in `<data dir>/secret_key`",
        secret=True,
        role="web",
    )
    # An absolute lifetime from sign-in: signing out, or revoking the key, ends a session sooner.
    session_ttl_s: int = _setting(
        12 * 3600, "how long a browser signed in on the pages stays signed in", minimum=60, role="web"
    )
    job_retention_s: int = _setting(
        30 * 24 * 3600,
        "how long a finished job's row stays in the database (`chattts-farm gc` deletes it after)",
        minimum=60,
        role="web",
    )
    gc_interval_s: int = _setting(
        300, "how often `chattts-farm up` (and compose) runs `chattts-farm gc`", minimum=1, role="web"
    )
    flower_auth: str = _setting(
        "",
        "Flower's basic auth, `user:password`; without it Flower is open, with a warning",
        shown_default="none",
        secret=True,
        role="flower",
    )

    @property
    def database_uri(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'farm.db'}"

    @property
    def audio_store_location(self) -> str:
        return self.audio_store or f"file:{self.data_dir.resolve() / 'audio'}"

    @property
    def visibility_timeout_s(self) -> int:
        """How long Redis lets a delivered, unacknowledged job be before handing it out again.

        A worker holds a job at most while one batch runs ahead of it and then its own runs, each
        bounded by the hard time limit, and again after each death of its engine process that the
        engine retries allow (a run that hangs is ended at the hard limit), with one more hard limit
        of slack for the engine processes' starts. A longer timeout means no job is run twice while
        its worker lives; a dead worker's jobs come back sooner, through worker.failover.
        """
        return (3 + self.engine_retries) * self.task_time_limit_s + 30

    def jobs_in_flight(self, on_gpu: bool) -> int:
        """MAX_JOBS_IN_FLIGHT, or its default for a GPU or a CPU worker."""
        return self.max_jobs_in_flight or (MAX_AUTO_SLOTS if on_gpu else CPU_SLOTS)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``env`` (default: the process environment); ``overrides`` that are not None win."""
        env = os.environ if env is None else env
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        values = {}
        for setting in fields(cls):
            raw = _raw_value(env, setting)
            if raw is not None:
                values[setting.name] = _parse(setting, raw)
        values.update({name: value for name, value in overrides.items() if value is not None})
        settings = replace(cls(), **values)
        settings = replace(settings, data_dir=Path(settings.data_dir))
        for setting in fields(cls):
            choices = setting.metadata["choices"]
            if choices and getattr(settings, setting.name) not in choices:
                raise SettingsError(
                    f"{env_name(setting)} must be one of {', '.join(choices)}, got {getattr(settings, setting.name)!r}"
                )
        location = settings.audio_store_location
        kind, _, place = location.partition(":")
        if not (location == "redis" or (kind == "file" and place.strip("/")) or (kind == "s3" and place.strip("/"))):
            raise SettingsError(
                f"{ENV_PREFIX}AUDIO_STORE must be file:<dir>, s3://<bucket>/<prefix> or redis, got {location!r}"
            )
        if settings.task_time_limit_s < settings.task_soft_time_limit_s:
            raise SettingsError(f"{ENV_PREFIX}TASK_TIME_LIMIT_S must be at least {ENV_PREFIX}TASK_SOFT_TIME_LIMIT_S")
        return settings


def env_name(setting: Field) -> str:
    return ENV_PREFIX + setting.name.upper()


def documented() -> Iterator[tuple[str, str, str, Field]]:
    """(variable, default as documented, meaning, field) for every setting, in declaration order."""
    defaults = Settings()
    for setting in fields(Settings):
        shown = setting.metadata["shown_default"]
        if shown is None:
            value = getattr(defaults, setting.name)
            shown = f"`{str(value).lower() if isinstance(value, bool) else value}`"
        yield env_name(setting), shown, setting.metadata["meaning"], setting


def _raw_value(env: Mapping[str, str], setting: Field) -> str | None:
    """The variable's text, or None when unset or blank; an older name is read with a warning."""
    raw = env.get(env_name(setting))
    for old_name in setting.metadata["renamed_from"]:
        if not (env.get(ENV_PREFIX + old_name) or "").strip():
            continue
        if raw is not None and raw.strip():
            logger.warning("%s%s is ignored: %s is set too", ENV_PREFIX, old_name, env_name(setting))
        else:
            logger.warning("%s%s is deprecated: call it %s", ENV_PREFIX, old_name, env_name(setting))
            raw = env[ENV_PREFIX + old_name]
    return None if raw is None or not raw.strip() else raw.strip()


def _parse(setting: Field, raw: str) -> Any:
    name = env_name(setting)
    kind = type(Settings.__dataclass_fields__[setting.name].default) if setting.name != "data_dir" else Path
    if kind is bool:
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
        raise SettingsError(f"{name} must be true or false, got {raw!r}")
    if kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            raise SettingsError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
        minimum = setting.metadata["minimum"]
        if minimum is not None and value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {value}")
        return value
    return Path(raw) if kind is Path else raw
