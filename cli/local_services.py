"""Starting services on this machine: a free loopback port, a local redis-server answering PING.

Used by ``chattts-farm up``, the benchmarks and the tests, so a Redis is started one way everywhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

REDIS_START_TIMEOUT_S = 30


class RedisStartError(RuntimeError):
    """redis-server is missing, or did not come up; the message says why."""


def free_port() -> int:
    """A TCP port nothing listens on now (another process may still take it before we do)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host``:``port`` now (as servers do, despite TIME_WAIT leftovers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def start_redis_server(
    port: int,
    directory: Path,
    *options: str,
    server: str | None = None,
    timeout_s: float = REDIS_START_TIMEOUT_S,
    new_session: bool = False,
    password: str | None = None,
) -> subprocess.Popen:
    """A redis-server on 127.0.0.1:``port`` keeping its files in ``directory``, once it answers PING.

    Eviction is always off (``noeviction``): an evicted queued job would be lost silently. ``options``
    are further redis-server arguments (persistence, say). ``new_session`` puts the server in a
    session of its own, so a terminal's Ctrl-C does not reach it before its owner stops it in order.
    ``password`` is required of every client; it goes into a configuration file only its owner can
    read (``directory/redis.conf``), never onto the command line, where any local user could read it.
    """
    server = server or shutil.which("redis-server")
    if server is None:
        raise RedisStartError("redis-server is not installed: on Debian/Ubuntu `apt-get install -y redis-server`")
    directory.mkdir(parents=True, exist_ok=True)
    configuration = []
    if password is not None:
        configuration = [str(_write_private(directory / "redis.conf", f"requirepass {password}\n"))]
    process = subprocess.Popen(
        [
            server,
            *configuration,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--maxmemory-policy",
            "noeviction",
            *options,
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=new_session,
    )
    deadline = time.monotonic() + timeout_s
    with redis.Redis(port=port, password=password) as client:
        while True:
            try:
                client.ping()
                return process
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise RedisStartError(f"redis-server did not start on port {port} (in use?)") from None
                time.sleep(0.1)


def _write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by this user only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.chmod(path, 0o600)  # the file may have existed with looser permissions
    return path
