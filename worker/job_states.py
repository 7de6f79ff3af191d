"""A running job's states in Celery's Redis result backend, written so that they never overwrite its end.

Celery's own write of a state looks at the stored one first (a job that succeeded stays SUCCESS): two
round trips, and a third where the task looked as well. Here the look and the write are one script,
one round trip (in a pipeline of many, for the progress of all running jobs), and atomic.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend

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


class JobStates:
    def __init__(self, backend: RedisBackend):
        self.backend = backend
        self._set_unless = backend.client.register_script(_SET_UNLESS)
        self._expires = str(int(backend.expires or 0))

    def start(self, request: Any) -> bool:
        """Store the job's STARTED state, as Celery's ``task_track_started`` would, unless it has succeeded
        already (delivered again after its acknowledgement was lost): whether it was stored. Redis away,
        it is tried again as Celery's own writes are (``result_backend_always_retry``)."""
        meta = self.backend._get_result_meta(
            result={"pid": os.getpid(), "hostname": request.hostname or socket.gethostname()},
            state=states.STARTED,
            traceback=None,
            request=request,
        )
        meta["task_id"] = request.id
        return bool(
            self.backend._ensure_retryable(
                self._set_unless,
                keys=[self.backend.get_key_for_task(request.id)],
                args=[self.backend.encode(meta), self._expires, "1", states.SUCCESS],
            )
        )

    def report_progress(self, pipeline: Any, request: Any, progress: dict) -> None:
        """Queue a running job's progress on ``pipeline``, written unless the job has ended meanwhile."""
        meta = self.backend._get_result_meta(result=progress, state=PROGRESS_STATE, traceback=None, request=request)
        self._set_unless(
            keys=[self.backend.get_key_for_task(request.id)],
            args=[self.backend.encode(meta), self._expires, "0", *ENDED],
            client=pipeline,
        )
