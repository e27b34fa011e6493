"""A short real capture of the tiny model, shared by the tests that read a trace; the
same job's command-line options, and a runner, for the multi-rank captures."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from profiler.capture import capture  # noqa: E402
from profiler.config import CaptureConfig  # noqa: E402

TINY = dict(model="tiny", steps=14, batch_size=4, seq_len=32, warmup_steps=3, smax=8,
            threads=1, eval_sequences=8)
JOB = ["--model", "tiny", "--steps", str(TINY["steps"]), "--batch-size", str(TINY["batch_size"]),
       "--seq-len", str(TINY["seq_len"]), "--warmup-steps", str(TINY["warmup_steps"]),
       "--smax", str(TINY["smax"]), "--threads", "1", "--quiet"]
"""``TINY`` as typed on the command line."""
ROOT = Path(__file__).resolve().parents[2]


def run_command(command: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` from the repository root as a user would (no DS_ACCELERATOR, no
    OMP_NUM_THREADS, no torchrun variables: the profiler must cope); AssertionError
    unless it exits 0."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DS_ACCELERATOR", "OMP_NUM_THREADS", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT),
                                                  "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def tiny_capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "tiny"
    return capture(CaptureConfig(**TINY), out=out, progress=False, say=lambda _: None)
