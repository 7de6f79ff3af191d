"""The workers' result backend: Celery's Redis backend, each state of a job stored in one round trip.

Celery's Redis backend looks at a job's stored state before it stores another (a job that succeeded
stays SUCCESS: one delivered again must not overwrite it), then stores and publishes the new one: two
round trips for each state, STARTED and the result, and a third where the task looked for itself
whether its job had succeeded. Here the look and the write are one script, atomic, one round trip
(within a pipeline of many, for the progress of every running job). What is stored and published is
Celery's own meta, as before. The worker's Celery app names it (see worker.celery_app).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError

from chattts_farm.contract import PROGRESS_STATE

# KEYS[1]: a job's meta. ARGV[1]: the new meta; ARGV[2]: its expiry in seconds ('0': none); ARGV[3]: '1'
# to publish it, as Celery's Redis backend publishes each state it stores; ARGV[4...]: the states it
# must not overwrite. Returns 0 where the stored state is one of them, else 1.
_SET_UNLESS = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, stored = pcall(cjson.decode, current)
  if ok then
    for i = 4, #ARGV do
      if stored['status'] == ARGV[i] then
        return 0
      end
    end
  end
end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
end
if ARGV[3] == '1' then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
end
return 1
"""

# A progress report comes from a look at the jobs in flight that may be older than the job's end.
ENDED = (states.SUCCESS, states.FAILURE, states.REVOKED)


class ResultBackend(RedisBackend):
    @functools.cached_property
    def _set_unless(self):
        return self.client.register_script(_SET_UNLESS)

    def _store_result(self, task_id, result, state, traceback=None, request=None, **kwargs):
        """Celery's store of a state (a result, a failure, a revocation), unless the job has succeeded."""
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = task_id.decode() if isinstance(task_id, bytes) else task_id
        self._write_state(task_id, meta, unless=(states.SUCCESS,))
        return result

    def start(self, request: Any) -> bool:
        """Store the job's STARTED state, as Celery's ``task_track_started`` would, unless it has succeeded
        already (delivered again after its acknowledgement was lost): whether it was stored. Redis away,
        it is tried again as Celery's own writes are (``result_backend_always_retry``)."""
        meta = self._get_result_meta(
            result={"pid": os.getpid(), "hostname": request.hostname},
            state=states.STARTED,
            traceback=None,
            request=request,
        )
        meta["task_id"] = request.id
        return bool(self._ensure_retryable(self._write_state, request.id, meta, unless=(states.SUCCESS,)))

    def report_progress(self, pipeline: Any, request: Any, progress: dict) -> None:
        """Queue a running job's progress on ``pipeline`` (of this backend's client), written unless the
        job has ended meanwhile; not published (no caller waits for progress)."""
        meta = self._get_result_meta(result=progress, state=PROGRESS_STATE, traceback=None, request=request)
        self._write_state(request.id, meta, unless=ENDED, publish=False, client=pipeline)

    def _write_state(self, task_id: str, meta: dict, *, unless: tuple[str, ...], publish: bool = True, client=None):
        value = self.encode(meta)
        if len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError("value too large for Redis backend", state=meta["status"], task_id=task_id)
        expires = self.failure_expires if meta["status"] == states.FAILURE else self.expires
        return self._set_unless(
            keys=[self.get_key_for_task(task_id)],
            args=[value, str(int(expires or 0)), "1" if publish else "0", *unless],
            client=client,
        )
