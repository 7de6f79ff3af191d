"""Dependencies run one way: cli -> web, worker -> chattts_farm. The shared layer imports no other
package of ours, the web never imports the worker, and the torch-free parts stay torch-free."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"chattts_farm", "cli", "web", "worker"}
MAY_IMPORT = {
    "chattts_farm": {"chattts_farm"},
    "web": {"web", "chattts_farm"},
    "worker": {"worker", "chattts_farm"},
    "cli": OURS,
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of everything a module imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_the_packages_below_it(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        forbidden = (imported_packages(path) & OURS) - MAY_IMPORT[package]
        if forbidden:
            wrong[str(path.relative_to(ROOT))] = sorted(forbidden)
    assert not wrong, f"{package} may import only {sorted(MAY_IMPORT[package])}: {wrong}"


def loaded_after_importing(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules`` (and every submodule of a package)."""
    probe = (
        "import importlib, json, pkgutil, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    finished = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert finished.returncode == 0, finished.stderr
    return set(json.loads(finished.stdout))


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_the_shared_layer_loads_no_torch_no_flask_and_nothing_else_of_ours():
    loaded = top_level(loaded_after_importing(["chattts_farm"]))
    assert not loaded & {"torch", "flask", "numpy", "ChatTTS", "web", "worker", "cli"}


def test_the_web_app_with_every_module_loads_no_worker_and_no_torch():
    loaded = top_level(loaded_after_importing(["web"]))
    assert not loaded & {"torch", "ChatTTS", "worker", "cli"}


def test_the_worker_parts_that_manage_processes_load_no_torch():
    # The supervisor must not initialise CUDA before it pins each child to its GPU; Flower imports the
    # workers' Celery app.
    loaded = top_level(loaded_after_importing(["worker.supervisor", "worker.celery_app", "worker.cuda", "cli.main"]))
    assert "torch" not in loaded


def test_the_engines_bookkeeping_loads_no_torch():
    # Who holds the slots and the cache's blocks, and the record of each segment they run, is plain
    # Python, testable and readable without a model.
    loaded = top_level(
        loaded_after_importing(["worker.engine.scheduler", "worker.engine.segment", "worker.engine.blocks"])
    )
    assert not loaded & {"torch", "numpy", "ChatTTS"}


# The worker's top level: everything of it but its engine process (worker.engine_process) and what
# only that process runs (worker.engine, worker.vocoder, worker.model).
CELERY_SIDE = [
    "worker.tasks",
    "worker.runtime",
    "worker.engine_client",
    "worker.engine_report",
    "worker.channel",
    "worker.interpreter",
    "worker.celery_app",
    "worker.supervisor",
    "worker.stream_publisher",
    "worker.encoders",
    "worker.dead_letters",
    "worker.consumer",
    "worker.failover",
    "worker.audio",
    "worker.results",
    "worker.callbacks",
    "worker.result_backend",
    "worker.batches",
]


@pytest.mark.parametrize("module", CELERY_SIDE)
def test_the_celery_side_of_a_worker_loads_no_torch(module):
    # The model lives in the engine process (worker.engine_process): the worker's Celery process holds
    # job threads, Redis clients and the channel's end, and pays for no torch in memory or start-up.
    loaded = top_level(loaded_after_importing([module]))
    assert not loaded & {"torch", "ChatTTS", "transformers"}


def test_the_celery_side_is_every_module_of_the_workers_top_level():
    # A module added beside them is on the Celery side, or belongs in a room of the engine process.
    top = {f"worker.{path.stem}" for path in (ROOT / "worker").glob("*.py") if path.stem != "__init__"}
    assert top == set(CELERY_SIDE) | {"worker.cuda"}
