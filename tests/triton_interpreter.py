"""Triton kernels checked on the CPU: there is no GPU here, and Triton's interpreter executes the same
program the GPU compiles. The interpreter is chosen when Triton is imported, so each check runs in a
fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def in_triton_interpreter(module: str, check: str) -> None:
    """Run ``module``'s function ``check`` (no arguments) in a fresh Python under Triton's interpreter."""
    completed = subprocess.run(
        [sys.executable, "-c", f"from {module} import {check}; {check}()"],
        env={
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
