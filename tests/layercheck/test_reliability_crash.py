"""The crash harness in CI: a few SIGKILLs at random moments, and proof it can fail.

The full run (>= 200 trials) is ``python benchmarks/bench_crash.py``; its
figures are in docs/reliability.md. Here every kill waits for the child's first
commit (``--kill-after-commit``): what each trial must recover does not depend
on how fast this machine trains.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_crash.py"


def _bench(tmp_path, *args):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", str(BENCH), "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_random_sigkills_never_lose_a_committed_step(tmp_path):
    proc, result = _bench(tmp_path, "--trials", "6", "--seed", "7", "--max-delay", "1.0",
                          "--kill-after-commit")
    assert result["violations"] == 0, result["violation_examples"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(result["killed_while_main"].values()) == 6  # every child was killed, not done
    assert min(result["restored_steps"]) > 0  # every trial committed and recovered a step


@pytest.mark.slow
def test_the_harness_reports_a_store_that_lies(tmp_path):
    proc, result = _bench(tmp_path, "--trials", "3", "--seed", "7", "--sabotage",
                          "--kill-after-commit")
    assert proc.returncode == 1
    # trials 2 and 3 start past the base checkpoint, so they commit sabotaged heads
    assert result["violations"] >= 2
    assert any("fell back past damaged files" in v or "differs from the uninterrupted run" in v
               for v in result["violation_examples"])
