"""How `chattts-farm worker` plans and launches its worker processes (without starting them)."""

import pytest

from chattts_farm.settings import Settings
from worker import supervisor
from worker.supervisor import NoGpus, WorkerSpec, plan_workers


def test_cpu_workers_are_named_and_queued_by_index():
    specs = plan_workers(None, 2)
    assert [spec.name for spec in specs] == ["cpu0", "cpu1"]
    command = specs[1].command(Settings.from_env({}, max_jobs_in_flight=8), "INFO")
    assert command[command.index("--queues") + 1] == "callbacks,cpu1,tts.interactive,tts,celery,tts.bulk"
    assert command[command.index("--hostname") + 1] == "cpu1@%h"
    assert command[command.index("--pool") + 1] == "threads"
    assert command[command.index("--concurrency") + 1] == "8"


def test_explicit_gpus_each_get_one_celery_process_pinned_to_that_gpu_if_asked():
    specs = plan_workers("0,2", None, celery_processes=1)
    assert [spec.name for spec in specs] == ["gpu0", "gpu2"]
    environment = specs[1].environment(Settings.from_env({}))
    assert environment["CUDA_VISIBLE_DEVICES"] == "2"
    assert environment["PYTORCH_CUDA_ALLOC_CONF"]
    assert environment["CHATTTS_FARM_ENGINE_SOCKET"] == "" and environment["CHATTTS_FARM_ENGINE_STARTER"] == "true"


def test_a_gpu_gets_three_celery_processes_by_default_the_first_starting_its_engine_the_others_connecting():
    specs = plan_workers("0,2", None, socket_dir="/run/engines")
    assert [spec.name for spec in specs] == ["gpu0", "gpu0.1", "gpu0.2", "gpu2", "gpu2.1", "gpu2.2"]
    settings = Settings.from_env({})
    first, second = specs[3].environment(settings), specs[4].environment(settings)
    assert first["CUDA_VISIBLE_DEVICES"] == second["CUDA_VISIBLE_DEVICES"] == "2"
    assert first["CHATTTS_FARM_ENGINE_SOCKET"] == second["CHATTTS_FARM_ENGINE_SOCKET"] == "/run/engines/gpu2.sock"
    assert (first["CHATTTS_FARM_ENGINE_STARTER"], second["CHATTTS_FARM_ENGINE_STARTER"]) == ("true", "false")
    # All take the GPU's jobs, and share the jobs it holds at once: by default as many as its slots can be.
    assert first["CHATTTS_FARM_MAX_JOBS_IN_FLIGHT"] == "2048"
    command = specs[4].command(settings, "INFO")
    assert command[command.index("--queues") + 1] == "callbacks,gpu2,tts.interactive,tts,celery,tts.bulk"
    assert command[command.index("--hostname") + 1] == "gpu2.1@%h"
    assert command[command.index("--concurrency") + 1] == "683"
    command = specs[4].command(Settings.from_env({}, max_jobs_in_flight=9), "INFO")
    assert command[command.index("--concurrency") + 1] == "3"
    with pytest.raises(ValueError, match="socket"):
        plan_workers("0", None)


def test_cpu_workers_see_no_gpu():
    environment = WorkerSpec("cpu", 0).environment(Settings.from_env({}))
    assert environment["CUDA_VISIBLE_DEVICES"] == "" and environment["CHATTTS_FARM_DEVICE"] == "cpu"
    assert environment["CHATTTS_FARM_MAX_JOBS_IN_FLIGHT"] == "64"


def test_all_gpus_are_counted_with_nvidia_smi_and_none_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(supervisor, "list_gpus", lambda: [0, 1, 2])
    assert [spec.name for spec in plan_workers("all", None, celery_processes=1)] == ["gpu0", "gpu1", "gpu2"]
    monkeypatch.setattr(supervisor, "list_gpus", lambda: [])
    with pytest.raises(NoGpus, match="--cpu N"):
        plan_workers(None, None)
