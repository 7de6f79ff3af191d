"""Starting services on this machine: a free loopback port, a local redis-server answering PING, a
throwaway PostgreSQL server.

Used by ``chattts-farm up``, the benchmarks and the tests, so a Redis is started one way everywhere.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

REDIS_START_TIMEOUT_S = 30
POSTGRES_START_TIMEOUT_S = 60
POSTGRES_BINARIES = Path("/usr/lib/postgresql")  # Debian's layout: <version>/bin/{initdb,postgres}
# PostgreSQL refuses to run as root; as root, the server runs as the user Debian's package makes for it.
POSTGRES_SERVER_USERS = ("postgres", "nobody")
# Speed over durability: a throwaway server's data is not worth an fsync.
THROWAWAY_POSTGRES_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


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


class PostgresStartError(RuntimeError):
    """PostgreSQL is not installed, or did not come up; the message says why."""


@dataclass
class PostgresServer:
    """A PostgreSQL server of our own: its data, log and unix socket in ``directory``, every local
    connection trusted, the superuser ``postgres``. Stopping it deletes everything it held."""

    directory: Path
    port: int
    process: subprocess.Popen
    _database_numbers: itertools.count = field(default_factory=lambda: itertools.count(1))

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of one of its databases, through its unix socket."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.directory}&port={self.port}"

    def create_database(self) -> str:
        """A new, empty database (copied from ``template0``, which takes milliseconds); its URL."""
        name = f"farm_{next(self._database_numbers)}"
        with self._connect(autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def accepts_connections(self) -> bool:
        import psycopg

        try:
            self._connect(connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        # SIGINT is the fast shutdown: SIGTERM would wait for every client to disconnect.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _connect(self, **options):
        import psycopg

        return psycopg.connect(host=str(self.directory), port=self.port, user="postgres", dbname="postgres", **options)


def start_postgres_server(port: int, *settings: str, timeout_s: float = POSTGRES_START_TIMEOUT_S) -> PostgresServer:
    """A new PostgreSQL server (Debian's ``postgresql`` package) on 127.0.0.1:``port`` and a unix socket
    in a new temporary directory, once it accepts connections: for tests and benchmarks, whose data is
    thrown away (it does not fsync). ``settings`` are further server settings, ``name=value``."""
    binaries = _postgres_binaries()
    as_user = _postgres_server_user() if os.geteuid() == 0 else {}
    directory = Path(tempfile.mkdtemp(prefix="chattts-farm-postgres-"))
    if as_user:
        os.chown(directory, as_user["user"], as_user["group"])
    log = directory / "server.log"
    try:
        subprocess.run(
            [binaries / "initdb", "--pgdata", directory / "data", "--username", "postgres", "--auth", "trust"]
            + ["--encoding", "UTF8", "--locale", "C.UTF-8", "--no-sync"],
            capture_output=True,
            text=True,
            check=True,
            **as_user,
        )
    except subprocess.CalledProcessError as error:
        shutil.rmtree(directory, ignore_errors=True)
        raise PostgresStartError(f"initdb failed: {error.stderr.strip()}") from None
    with log.open("w") as output:
        if as_user:
            os.chown(log, as_user["user"], as_user["group"])
        process = subprocess.Popen(
            [binaries / "postgres", "-D", directory / "data", "-p", str(port), "-h", "127.0.0.1", "-k", directory]
            + [f"-c{setting}" for setting in (*THROWAWAY_POSTGRES_SETTINGS, *settings)],
            stdout=output,
            stderr=subprocess.STDOUT,
            **as_user,
        )
    server = PostgresServer(directory, port, process)
    deadline = time.monotonic() + timeout_s
    while not server.accepts_connections():
        if process.poll() is not None or time.monotonic() > deadline:
            said = log.read_text()[-2000:]
            server.stop()
            raise PostgresStartError(f"PostgreSQL did not start on port {port}: {said}")
        time.sleep(0.1)
    return server


def _postgres_binaries() -> Path:
    """The newest installed PostgreSQL's bin directory."""
    versions = sorted(
        (path for path in POSTGRES_BINARIES.glob("*/bin") if (path / "postgres").exists()),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if not versions:
        raise PostgresStartError("PostgreSQL is not installed: on Debian/Ubuntu `apt-get install -y postgresql`")
    return versions[-1]


def _postgres_server_user() -> dict:
    """Popen's arguments that run the server as a user that is not root."""
    for name in POSTGRES_SERVER_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise PostgresStartError(f"PostgreSQL will not run as root, and none of the users {POSTGRES_SERVER_USERS} exists")


def _write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by this user only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.chmod(path, 0o600)  # the file may have existed with looser permissions
    return path
