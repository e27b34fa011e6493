"""How a rank ends (``profiler.launch.leave``): a real process with a real gloo group."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.layercheck.torchrun import ROOT

pytest.importorskip("torch")

PROGRAM = """
import atexit, sys
import torch.distributed as dist
from profiler.launch import leave
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
atexit.register(lambda: print("teardown", end=""))
print("written", end="")  # no newline: still in the buffer when leave runs
leave(3)
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**base, "PYTHONPATH": str(ROOT), **env})


def test_a_rank_under_torchrun_flushes_its_output_and_skips_the_teardown():
    done = _run({"LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "written"  # flushed; the atexit handler never ran


def test_outside_torchrun_the_process_ends_as_usual():
    done = _run({})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "writtenteardown"
