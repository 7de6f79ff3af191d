"""What the web has sent of a streaming job's audio, and the cancel that stops it.

A streaming job's listeners (``GET /api/jobs/<id>/stream``, ``/v1/audio/speech``; any number, in any web
process) each ask before sending a chunk, in one atomic Redis call, whether the job is still wanted, and
record how far into its audio that chunk goes. A cancel marks the job in the same hash and reads, in the
same step, the furthest any listener got: no chunk goes out after a cancel, and every chunk that went out
before it is charged (the furthest point, not the sum: two listeners of one job hear the same audio).
"""

from __future__ import annotations

from flask import current_app

from chattts_farm import redis_keys
from web import backends

# KEYS: the job's delivery hash. ARGV: how far into its audio (seconds) the next chunk goes, the hash's
# lifetime. Answers 1 (send it, recorded) or 0 (the job was cancelled: send nothing more).
_SEND = """
if redis.call('HEXISTS', KEYS[1], 'cancelled') == 1 then
    return 0
end
if tonumber(ARGV[1]) > tonumber(redis.call('HGET', KEYS[1], 'seconds') or '0') then
    redis.call('HSET', KEYS[1], 'seconds', ARGV[1])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: the job's delivery hash. ARGV: the hash's lifetime. Answers the seconds sent before the cancel.
_CANCEL = """
redis.call('HSET', KEYS[1], 'cancelled', '1')
redis.call('EXPIRE', KEYS[1], ARGV[1])
return redis.call('HGET', KEYS[1], 'seconds') or '0'
"""


class Delivery:
    """The delivery record of one job, bound to this app's Redis when made: a streamed response's body
    runs after its request's context has gone."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.key = redis_keys.delivery(job_id)
        self.redis = backends.current().redis
        # As long as the job's result: a listener of a job queued for hours still finds its cancel.
        self.lifetime_s = current_app.config["SETTINGS"].result_ttl_s

    def may_send(self, through_s: float) -> bool:
        """Whether a chunk of the job's audio that ends ``through_s`` into it may go out (recorded if so)."""
        send = self.redis.register_script(_SEND)
        return bool(send(keys=[self.key], args=[f"{through_s:.6f}", self.lifetime_s]))

    def cancelled(self) -> bool:
        return bool(self.redis.hexists(self.key, "cancelled"))


def cancel_all(job_ids: list[str]) -> list[float]:
    """Stop the jobs' listeners; for each job, the seconds of its audio they sent before (what its cancel
    charges). One round trip for them all."""
    script = backends.current().redis.register_script(_CANCEL)
    pipeline = backends.current().redis.pipeline(transaction=False)
    lifetime_s = current_app.config["SETTINGS"].result_ttl_s
    for job_id in job_ids:
        script(keys=[redis_keys.delivery(job_id)], args=[lifetime_s], client=pipeline)
    return [float(seconds) for seconds in pipeline.execute()]
