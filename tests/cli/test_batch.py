"""`chattts-farm batch FILE.jsonl` against a real web server and real CPU workers: the batch submitted,
its progress shown, its archive written once every item has ended; a refused batch names its fault."""

import json
import os
import subprocess
import zipfile

import pytest
import requests

from tests.support import CLI, serve_web


@pytest.fixture(scope="module")
def farm_url(workers, data_dir, tmp_path_factory):
    for base, _ in serve_web(workers, data_dir, tmp_path_factory.mktemp("batch-web") / "farm.db"):
        yield base


def run_batch(*arguments):
    return subprocess.run([CLI, "batch", *arguments], capture_output=True, text=True, env=os.environ, timeout=300)


def write_items(path, *items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_a_batch_is_submitted_watched_and_its_archive_written_when_every_item_has_ended(farm_url, tmp_path):
    items = write_items(
        tmp_path / "chapter.jsonl",
        {"text": "The first line of the chapter.", "custom_id": "line-1"},
        {"text": "The second line.", "custom_id": "line-2", "format": "wav"},
        {"text": "The third line."},
    )

    finished = run_batch(str(items), "--url", farm_url, "--format", "mp3", "--voice", "alloy")

    assert finished.returncode == 0, finished.stderr
    batch_id = finished.stderr.split()[1].rstrip(":")
    assert f"batch {batch_id} done: 3 done; archive {tmp_path / 'chapter.zip'}" in finished.stdout
    with zipfile.ZipFile(tmp_path / "chapter.zip") as archive:
        assert sorted(archive.namelist()) == ["2.mp3", "line-1.mp3", "line-2.wav", "manifest.json"]
        manifest = json.loads(archive.read("manifest.json"))
    assert manifest["batch_id"] == batch_id and [entry["status"] for entry in manifest["items"]] == ["done"] * 3
    status = requests.get(f"{farm_url}/api/batches/{batch_id}", timeout=10).json()
    job = requests.get(farm_url + status["items"][0]["status_url"], timeout=10).json()
    assert job["voice"]["seed"] == 390_000_000 and job["parameters"]["priority"] == "bulk"


def test_a_refused_batch_names_the_item_at_fault_and_writes_nothing(farm_url, tmp_path):
    items = write_items(tmp_path / "bad.jsonl", {"text": "Fine."}, {"text": "Fine.", "speed": 42})

    refused = run_batch(str(items), "--url", farm_url)

    assert refused.returncode == 1
    assert "400: items[1].speed: must be between 1 and 9, got 42 (items[1].speed)" in refused.stderr
    assert not (tmp_path / "bad.zip").exists()


def test_an_unreachable_farm_is_said_so(tmp_path):
    items = write_items(tmp_path / "items.jsonl", {"text": "Fine."})

    refused = run_batch(str(items), "--url", "http://127.0.0.1:1")

    assert refused.returncode == 1 and "could not be reached" in refused.stderr
