"""A farm with no worker: a real `chattts-farm web` (gunicorn) with keys on, on a Redis of its own that
no worker consumes, so every job stays queued for as long as a test lets it, and every stream carries
what the test writes to it (tests/web/streams.py plays the worker's side)."""

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
import requests

from chattts_farm import audio_store, redis_keys
from chattts_farm.celery_client import create_celery
from chattts_farm.settings import Settings
from cli.local_services import free_port, start_redis_server
from tests.support import CLI, Web
from web.access.api_keys import hash_key


@dataclass
class PausedFarm:
    """The web app, its Redis, and keys made with `chattts-farm keys create`; no worker anywhere."""

    web: Web
    redis: redis.Redis
    keys: dict[str, str]
    port: int
    directory: Path

    def headers(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[name]}"}

    def jobs_of(self, name: str) -> list[dict]:
        answer = requests.get(f"{self.web.url}/api/jobs?limit=500", headers=self.headers(name), timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()["jobs"]

    def waits_of(self, name: str) -> int:
        """How many of this key's requests hold a wait slot now, as the web processes count them in Redis:
        the slots whose lease has not ended."""
        return self.redis.zcount(redis_keys.wait_slots(hash_key(self.keys[name])[:16]), time.time(), "+inf")

    def submit_stream(self, name: str) -> str:
        """A queued job of this key that streams: the id."""
        answer = requests.post(
            f"{self.web.url}/api/jobs",
            json={"text": "Streamed.", "stream": True},
            headers=self.headers(name),
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        return answer.json()["id"]

    def finished_job(self, name: str, audio: bytes) -> str:
        """A job of this key, done with ``audio`` as its stored WAV, as a worker leaves one: the audio in
        the farm's store, then the result naming it. The id."""
        answer = requests.post(
            f"{self.web.url}/api/jobs",
            json={"text": "Stored.", "format": "wav"},
            headers=self.headers(name),
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        settings = Settings.from_env(data_dir=self.directory, redis_url=f"redis://127.0.0.1:{self.redis_port}/0")
        store = audio_store.from_settings(settings)
        key = store.key(job_id, "wav")
        store.write(key, audio)
        result = {"job_id": job_id, "duration_s": 1.0, "audio_key": key, "audio_url": None, "voice_embedding": None}
        create_celery(settings).backend.store_result(job_id, result, "SUCCESS")
        return job_id

    def open_download(self, name: str, job_id: str, receive_buffer: int) -> socket.socket:
        """A download of the job's stored audio on a raw socket with a small receive buffer, left unread."""
        return self._open_get(name, f"/api/jobs/{job_id}/audio", receive_buffer)

    @property
    def redis_port(self) -> int:
        return self.redis.connection_pool.connection_kwargs["port"]

    def open_stream(self, name: str, job_id: str, receive_buffer: int | None = None) -> socket.socket:
        """A listener of the job's stream (raw PCM) on a raw socket, left unread; ``receive_buffer``
        shrinks its socket's receive buffer, so that the server's sends soon block."""
        return self._open_get(name, f"/api/jobs/{job_id}/stream?format=pcm", receive_buffer)

    def _open_get(self, name: str, path: str, receive_buffer: int | None) -> socket.socket:
        """A GET of ``path`` with this key, sent on a raw socket and left unread."""
        call = socket.socket()
        if receive_buffer is not None:
            call.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        call.connect(("127.0.0.1", self.port))
        call.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.keys[name]}\r\n\r\n".encode()
        )
        return call

    def open_speech_call(self, name: str) -> socket.socket:
        """A speech call sent on a raw socket, left open and unread: a client waiting for its audio."""
        body = json.dumps({"model": "tts-1", "input": "Waiting for a paused worker.", "voice": 7}).encode()
        head = (
            "POST /v1/audio/speech HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n"
            f"Authorization: Bearer {self.keys[name]}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        call = socket.create_connection(("127.0.0.1", self.port))
        call.sendall(head.encode() + body)
        return call


@contextlib.contextmanager
def start_paused_farm(directory: Path, key_names: tuple[str, ...], **settings: str) -> Iterator[PausedFarm]:
    """The farm, with a key made by `chattts-farm keys create` for each name; ``settings`` are further
    environment variables of the web."""
    redis_port, web_port = free_port(), free_port()
    redis_server = start_redis_server(redis_port, directory / "redis", "--save", "", "--appendonly", "no")
    environment = {
        **os.environ,
        "CHATTTS_FARM_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CHATTTS_FARM_DATA_DIR": str(directory),
        "CHATTTS_FARM_DATABASE_URL": f"sqlite:///{directory / 'farm.db'}",
        "CHATTTS_FARM_REQUIRE_API_KEY": "true",
        # The tests' own submissions must not hit the per-minute budget.
        "CHATTTS_FARM_RATE_LIMIT_PER_MINUTE": "10000",
        **settings,
    }
    try:
        web = Web.start(web_port, environment)
        try:
            keys = {}
            for name in key_names:
                created = subprocess.run(
                    [CLI, "keys", "create", name], env=environment, capture_output=True, text=True, check=True
                )
                keys[name] = re.search(r"cf_\S+", created.stdout).group(0)
            with redis.Redis(port=redis_port) as client:
                yield PausedFarm(web, client, keys, web_port, directory)
        finally:
            web.kill()
    finally:
        redis_server.terminate()
        redis_server.wait(timeout=20)
