"""How `chattts-farm worker` plans and launches its worker processes (without starting them)."""

import pytest

from chattts_farm.settings import Settings
from worker import supervisor
from worker.supervisor import NoGpus, WorkerSpec, plan_workers


def test_cpu_workers_are_named_and_queued_by_index():
    specs = plan_workers(None, 2)
    assert [spec.name for spec in specs] == ["cpu0", "cpu1"]
    command = specs[1].command(Settings.from_env({}, max_jobs_in_flight=8), "INFO")
    assert command[command.index("--queues") + 1] == "tts,celery,cpu1"
    assert command[command.index("--hostname") + 1] == "cpu1@%h"
    assert command[command.index("--pool") + 1] == "threads"
    assert command[command.index("--concurrency") + 1] == "8"


def test_explicit_gpus_each_get_one_process_pinned_to_that_gpu():
    specs = plan_workers("0,2", None)
    assert [spec.name for spec in specs] == ["gpu0", "gpu2"]
    environment = specs[1].environment()
    assert environment["CUDA_VISIBLE_DEVICES"] == "2"
    assert environment["PYTORCH_CUDA_ALLOC_CONF"]


def test_cpu_workers_see_no_gpu():
    environment = WorkerSpec("cpu", 0).environment()
    assert environment["CUDA_VISIBLE_DEVICES"] == "" and environment["CHATTTS_FARM_DEVICE"] == "cpu"


def test_all_gpus_are_counted_with_nvidia_smi_and_none_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(supervisor, "list_gpus", lambda: [0, 1, 2])
    assert [spec.name for spec in plan_workers("all", None)] == ["gpu0", "gpu1", "gpu2"]
    monkeypatch.setattr(supervisor, "list_gpus", lambda: [])
    with pytest.raises(NoGpus, match="--cpu N"):
        plan_workers(None, None)
