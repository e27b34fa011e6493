"""Run a command as the left side of a pipeline whose reader has gone (``cmd | true``,
``cmd | head -1`` once head has its line): every write to stdout fails with EPIPE.
Torch-free, shared by the CLI tests of every package."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_into_closed_pipe(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m <argv>`` from the repository root with stdout a pipe whose reading end
    is closed before the command starts (so the failure does not depend on timing);
    stderr captured as text."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
