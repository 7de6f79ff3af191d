"""A Celery process's encoder processes end with it, even when it is killed and cannot shut its pool down."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STARTS_AN_ENCODER = """
import os, time
from chattts_farm.settings import Settings
from worker.encoders import encoder_pool
pool = encoder_pool(Settings.from_env(encoder_processes=1))
print(pool.submit(os.getpid).result(), flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """Whether the process is there and not a zombie (an orphan's new parent may be slow to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def test_an_encoder_process_ends_soon_after_the_process_that_started_it_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", STARTS_AN_ENCODER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    encoder = int(parent.stdout.readline())
    assert encoder != parent.pid and running(encoder)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while running(encoder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(encoder)
