"""bench/memory_report.py: allocations are told apart by the project's frames that made them; without a GPU
it says it needs one (its report itself runs only where CUDA's allocator does)."""

import subprocess
import sys

from bench.memory_report import ROOT, project_frames


def test_an_allocation_is_named_by_its_innermost_project_frames():
    frames = [
        {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 10, "name": "linear"},
        {"filename": f"{ROOT}/worker/vocoder/vocoder.py", "line": 153, "name": "forward"},
        {"filename": f"{ROOT}/worker/vocoder/vocoder.py", "line": 243, "name": "_capture"},
    ]
    assert project_frames(frames) == "vocoder.py:153:forward < vocoder.py:243:_capture"
    assert project_frames(frames[:1]) == "?"


def test_without_a_gpu_it_says_it_needs_one():
    finished = subprocess.run(
        [sys.executable, "-m", "bench.memory_report", "bench.engine_phases"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert finished.returncode != 0 and "needs a GPU" in finished.stderr
