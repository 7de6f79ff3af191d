"""A lost host's jobs go to a live worker within seconds (worker.failover), not after Redis's visibility
timeout: real workers under two supervisors named as two hosts, on a Redis of the test's own, with the
default time limits (a visibility timeout of 4,530 s, which no job here could wait out)."""

import os
import re
import signal
import time

from chattts_farm.contract import DEFAULT_QUEUE, PROGRESS_STATE, TASK_NAME
from tests.support import Workers, wait_until
from tests.worker.test_tasks import LONG_TEXT

JOBS = 16
DEFAULT_LIMITS = {
    "CHATTTS_FARM_TASK_SOFT_TIME_LIMIT_S": "600",
    "CHATTTS_FARM_TASK_TIME_LIMIT_S": "900",
    "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(JOBS),
}


def test_the_jobs_of_a_lost_host_go_to_a_live_worker_within_seconds_and_run_once(own_redis_url, data_dir, tmp_path):
    redis_url = own_redis_url
    lost = Workers.start(
        redis_url, data_dir, tmp_path / "lost.log", count=1, CHATTTS_FARM_NODE_NAME="lost-host", **DEFAULT_LIMITS
    )
    client = lost.client
    lost_worker = client.send_task("chattts.health", queue="cpu0").get(timeout=30)
    jobs = [
        client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT[:900], "voice": i}, queue=DEFAULT_QUEUE)
        for i in range(JOBS)
    ]
    wait_until(lambda: all(job.state == PROGRESS_STATE for job in jobs), 60, "every job to run on the first host")
    live = Workers.start(
        redis_url, data_dir, tmp_path / "live.log", count=1, CHATTTS_FARM_NODE_NAME="live-host", **DEFAULT_LIMITS
    )
    try:
        assert not any(job.ready() for job in jobs), "the jobs ended before the host could be lost: make them longer"
        # The host goes: its supervisor first (nothing restarts the worker), then the worker.
        os.kill(lost.process.pid, signal.SIGKILL)
        os.kill(lost_worker["pid"], signal.SIGKILL)
        lost_at = time.monotonic()
        outputs = [job.get(timeout=180) for job in jobs]
        took_s = time.monotonic() - lost_at

        assert [output["job_id"] for output in outputs] == [job.id for job in jobs]
        assert {output["worker"] for output in outputs} == {"cpu0@live-host"}
        assert took_s < 180
        wait_until(lambda: all(f"[{job.id}] succeeded" in live.log() for job in jobs), 10, "every success logged")
        for job in jobs:
            assert len(re.findall(rf"chattts\.synthesize\[{job.id}\] succeeded", live.log())) == 1
        assert f"worker cpu0@lost-host (instance {lost_worker['pid']}." in live.log()
        assert f"{JOBS} of its {JOBS} messages put back on their queues" in live.log()
    finally:
        live.stop()
