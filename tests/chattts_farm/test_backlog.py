"""The contract's backlog helper: a Celery caller reads how many jobs wait, and whether the farm takes
more, before it sends."""

from celery import Celery

from chattts_farm.backlog import read_backlog
from chattts_farm.contract import DEFAULT_QUEUE, TASK_NAME


def test_jobs_sent_to_either_queue_count_as_waiting_until_the_cap_says_the_farm_is_full(idle_redis_url):
    caller = Celery(broker=idle_redis_url, backend=idle_redis_url)
    assert read_backlog(redis_url=idle_redis_url, max_queued_jobs=2).waiting == 0

    caller.send_task(TASK_NAME, kwargs={"text": "Routed."}, queue=DEFAULT_QUEUE)
    half = read_backlog(redis_url=idle_redis_url, max_queued_jobs=2)
    caller.send_task(TASK_NAME, kwargs={"text": "A plain send_task goes to Celery's default queue."})
    full = read_backlog(redis_url=idle_redis_url, max_queued_jobs=2)

    assert (half.waiting, half.accepting) == (1, True)
    assert (full.waiting, full.accepting) == (2, False)


def test_the_cap_is_the_farms_setting_unless_given(idle_redis_url, monkeypatch):
    monkeypatch.setenv("CHATTTS_FARM_MAX_QUEUED_JOBS", "7")
    monkeypatch.setenv("CHATTTS_FARM_REDIS_URL", idle_redis_url)

    backlog = read_backlog()

    assert (backlog.waiting, backlog.max_queued_jobs, backlog.accepting) == (0, 7, True)
