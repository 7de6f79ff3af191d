"""Workers on other hosts need only the Redis URL, the audio store and the model: two worker processes
with data dirs and node names of their own, as on two hosts, share one Redis and one audio store, and
between them serve every job."""

import pytest

from chattts_farm.audio_store import fetch_audio
from chattts_farm.contract import TASK_NAME
from cli.local_services import free_port, start_redis_server
from tests.support import Workers
from worker.audio import decode

JOBS = 6


@pytest.fixture
def two_hosts(tmp_path, tiny_assets):
    port = free_port()
    redis_server = start_redis_server(port, tmp_path / "redis", "--save", "", "--appendonly", "no")
    redis_url = f"redis://127.0.0.1:{port}/0"
    shared_store = f"file:{tmp_path / 'shared-audio'}"
    hosts = []
    try:
        for node in ("host-a", "host-b"):
            data_dir = tmp_path / node
            data_dir.mkdir()
            (data_dir / "assets").symlink_to(tiny_assets.resolve().parent, target_is_directory=True)
            hosts.append(
                Workers.start(
                    redis_url,
                    data_dir,
                    tmp_path / f"{node}.log",
                    count=1,
                    CHATTTS_FARM_NODE_NAME=node,
                    CHATTTS_FARM_AUDIO_STORE=shared_store,
                    # One job at a time each, so that a burst of jobs needs both hosts.
                    CHATTTS_FARM_MAX_JOBS_IN_FLIGHT="1",
                )
            )
        yield hosts, tmp_path
    finally:
        for host in hosts:
            host.stop()
        redis_server.terminate()
        redis_server.wait(timeout=20)


def test_two_hosts_share_one_redis_and_one_audio_store_and_serve_every_job(two_hosts):
    (host_a, _), tmp_path = two_hosts
    assert host_a.wait_for_workers(2) == ["cpu0@host-a", "cpu0@host-b"]
    sent = [
        host_a.client.send_task(TASK_NAME, kwargs={"text": f"Job {n} of a burst.", "voice": n + 1}) for n in range(JOBS)
    ]
    results = [job.get(timeout=300) for job in sent]
    assert {result["worker"] for result in results} == {"cpu0@host-a", "cpu0@host-b"}
    for result in results:
        # Wherever it ran, its audio is in the one store every host (and the web) reads.
        assert result["audio_url"].startswith((tmp_path / "shared-audio").as_uri())
        samples, rate = decode(fetch_audio(result))
        assert rate == 24_000 and len(samples) > 0
    # No worker touched a database: the web alone owns it.
    for node in ("host-a", "host-b"):
        assert not list((tmp_path / node).glob("*.db"))
