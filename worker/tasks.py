"""The Celery task bodies: thin adapters between Celery and the batcher (see worker.batcher)."""

from __future__ import annotations

import logging
import time

from celery.concurrency import get_implementation
from celery.exceptions import Ignore
from celery.signals import worker_init
from celery.worker import state as worker_state

from worker import runtime
from worker.celery_app import app
from worker.contract import (
    EMBEDDING_TASK_NAME,
    HEALTH_TASK_NAME,
    PROGRESS_STATE,
    TASK_NAME,
    FarmError,
    InvalidRequest,
    JobCancelled,
    SynthesisRequest,
    audio_key,
    parse_voice,
)

logger = logging.getLogger(__name__)

# A running job reports its progress this often (the contract promises at least once a second).
PROGRESS_EVERY_S = 0.5


@worker_init.connect
def _start_runtime(sender, **_) -> None:
    # The model lives in this process and the batcher batches across its job threads: forking pools
    # would copy CUDA state into children and run one job per process.
    if get_implementation(sender.pool_cls).__module__ != "celery.concurrency.thread":
        raise RuntimeError("chattts-farm workers batch jobs in one process: run them with `-P threads` "
                           "(`chattts-farm worker` does)")
    runtime.start(app.farm_settings, sender.hostname, is_revoked=lambda job_id: job_id in worker_state.revoked)


# Errors of the farm's own kinds are the caller's to read: logged without a traceback.
@app.task(bind=True, name=TASK_NAME, throws=(FarmError,))
def synthesize(self, **arguments) -> dict:
    farm = runtime.current()
    job_id = self.request.id
    request = SynthesisRequest.from_arguments(arguments, max_text_chars=farm.settings.max_text_chars,
                                              request_id=job_id)
    job = farm.batcher.submit(request)
    while not job.finished.wait(PROGRESS_EVERY_S):
        if job.started_at is not None:
            self.update_state(state=PROGRESS_STATE, meta=job.progress)
    outcome = job.outcome
    if isinstance(outcome, JobCancelled):
        self.backend.mark_as_revoked(job_id, reason="revoked", request=self.request)
        raise Ignore()
    if isinstance(outcome, Exception):
        raise outcome
    key = audio_key(job_id)
    farm.redis.set(key, outcome.audio, ex=farm.settings.result_ttl_s)
    summary = outcome.summary()
    logger.info("job %s done: %.2f s of audio in a batch of %d", job_id, outcome.duration_s, outcome.batch_size)
    return {
        **summary,
        "job_id": job_id,
        "audio_key": key,
        "worker": farm.hostname,
        "model": outcome.model["kind"],
        "model_info": outcome.model,
        "started_at": job.started_wall,
        "finished_at": time.time(),
    }


@app.task(name=HEALTH_TASK_NAME)
def health() -> dict:
    return runtime.current().health()


@app.task(name=EMBEDDING_TASK_NAME, throws=(FarmError,))
def voice_embedding(seed: int) -> str:
    """The embedding a seed names, for callers without torch (the web catalog stores it)."""
    from worker.voices import embedding_for_seed

    voice = parse_voice(seed)
    if not isinstance(voice, int):
        raise InvalidRequest("seed", "must be an integer seed")
    return embedding_for_seed(runtime.current().batcher.synthesizer.model.chat.speaker, voice)
