"""The chattts-farm command line, run as a user runs it: a separate process."""

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios

from cli.settings_docs import EXAMPLE_PASSWORD
from tests.support import CLI
from worker.audio import decode
from worker.model.synthetic_assets import MANIFEST_NAME


def run_cli(*arguments, data_dir):
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(data_dir)}
    return subprocess.run([CLI, *arguments], capture_output=True, text=True, env=environment, timeout=300)


def test_say_writes_the_audio_and_describes_it(tmp_path, data_dir):
    output = tmp_path / "hello.mp3"
    finished = run_cli(
        "say",
        "Hello from the farm.",
        "--voice",
        "42",
        "--format",
        "mp3",
        "-o",
        str(output),
        "--seed",
        "3",
        "--speed",
        "4",
        "--model",
        "synthetic-tiny",
        data_dir=data_dir,
    )
    assert finished.returncode == 0, finished.stderr
    summary = json.loads(finished.stdout)
    assert summary["model"]["kind"] == "synthetic" and summary["seed"] == 3 and summary["format"] == "mp3"
    assert "speaking" not in finished.stderr  # no progress bar when stderr is not a terminal
    samples, rate = decode(output.read_bytes())
    assert abs(len(samples) / rate - summary["duration_s"]) < 0.05


LONG_TEXT = " ".join(f"Sentence number {word} of a text that takes several segments." for word in "abcdef")


def run_cli_on_a_terminal(*arguments, data_dir) -> tuple[int, str]:
    """Runs the CLI with its stderr on a pseudo-terminal, as a person at a shell sees it."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # rows, columns
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(data_dir)}
    process = subprocess.Popen([CLI, *arguments], stdout=subprocess.DEVNULL, stderr=terminal, env=environment)
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end closed: the process has exited
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    return process.wait(timeout=300), seen.decode(errors="replace")


def test_say_shows_the_progress_of_a_long_text_on_a_terminal(tmp_path, data_dir):
    arguments = ("say", LONG_TEXT, "-o", str(tmp_path / "long.wav"), "--model", "synthetic-tiny")
    returncode, terminal = run_cli_on_a_terminal(*arguments, data_dir=data_dir)
    assert returncode == 0, terminal
    assert "speaking: 100%" in terminal and "segments" in terminal, terminal


def test_say_refuses_bad_input_on_stderr_with_a_failing_exit(tmp_path, data_dir):
    output = tmp_path / "never.wav"
    finished = run_cli(
        "say", "Hello.", "--voice", "not-a-voice", "-o", str(output), "--model", "synthetic-tiny", data_dir=data_dir
    )
    assert finished.returncode != 0
    assert "voice: must be an integer seed" in finished.stderr
    assert not output.exists()


def test_assets_build_writes_a_complete_asset_folder(tmp_path, data_dir):
    finished = run_cli("assets", "build", "--scale", "tiny", str(tmp_path / "tiny"), data_dir=data_dir)
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "tiny" / MANIFEST_NAME).is_file()
    assert (tmp_path / "tiny" / "asset" / "gpt" / "model.safetensors").is_file()


def test_flower_refuses_the_example_password_and_an_open_port_without_auth(tmp_path):
    for auth, address in ((f"ops:{EXAMPLE_PASSWORD}", "127.0.0.1"), ("", "0.0.0.0"), ("nopassword", "127.0.0.1")):
        environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path), "CHATTTS_FARM_FLOWER_AUTH": auth}
        refused = subprocess.run(
            [CLI, "flower", "--address", address, "--port", "1"], capture_output=True, text=True, env=environment
        )
        assert refused.returncode == 2 and "CHATTTS_FARM_FLOWER_AUTH" in refused.stderr, (auth, refused.stderr)
