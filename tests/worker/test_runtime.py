"""The worker runtime's own Redis client (audio, heartbeats)."""

import dataclasses
import threading
import time

from cli.local_services import free_port, start_redis_server
from worker.runtime import redis_client


def test_an_audio_write_waits_out_a_redis_restart_instead_of_failing(tiny_settings, tmp_path):
    port = free_port()
    server = start_redis_server(port, tmp_path, "--appendonly", "yes")
    client = redis_client(dataclasses.replace(tiny_settings, redis_url=f"redis://127.0.0.1:{port}/0"))
    client.ping()
    server.terminate()
    server.wait(timeout=20)

    outcome = {}
    writer = threading.Thread(target=lambda: outcome.update(written=client.set("chattts:audio:job", b"RIFF")))
    writer.start()
    time.sleep(2)  # the write is in flight while Redis is down
    assert writer.is_alive()
    server = start_redis_server(port, tmp_path, "--appendonly", "yes")
    try:
        writer.join(timeout=30)
        assert outcome == {"written": True} and client.get("chattts:audio:job") == b"RIFF"
    finally:
        server.terminate()
        server.wait(timeout=20)
