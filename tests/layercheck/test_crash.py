"""A real training process killed with SIGKILL mid-run, restarted, finishes as if nothing happened."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layercheck.manifest import read_manifest
from layercheck.store import LocalStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "finetune_tiny.py"
STEPS = 160


def _run(ckpt, losses, **kw):
    cmd = [sys.executable, str(SCRIPT), "--ckpt", str(ckpt), "--steps", str(STEPS),
           "--losses", str(losses)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, **kw)


def _losses(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]  # a replayed step overwrites: the run as resumed
    return out


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_finishes_within_one_percent(tmp_path):
    clean = _run(tmp_path / "clean", tmp_path / "clean.jsonl")
    assert clean.wait(timeout=600) == 0

    proc = _run(tmp_path / "ckpt", tmp_path / "crash.jsonl")
    deadline = time.time() + 600
    while time.time() < deadline:
        if (tmp_path / "crash.jsonl").exists() and len(_losses(tmp_path / "crash.jsonl")) >= 90:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(_losses(tmp_path / "crash.jsonl"))
    assert killed_at < STEPS
    view = read_manifest(LocalStore(tmp_path / "ckpt"))
    resume_from = view.latest_step()
    assert resume_from is not None and resume_from <= killed_at

    again = _run(tmp_path / "ckpt", tmp_path / "crash.jsonl", stderr=subprocess.PIPE)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err.decode()[-2000:]
    resumed, reference = _losses(tmp_path / "crash.jsonl"), _losses(tmp_path / "clean.jsonl")
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert abs(resumed[STEPS] - reference[STEPS]) <= 0.01 * reference[STEPS]
