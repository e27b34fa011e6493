"""Two real processes on one checkpoint directory: the second is refused, clearly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.errors import DirectoryLocked
from layercheck.manifest import read_manifest
from layercheck.store import LocalStore

ROOT = Path(__file__).resolve().parents[2]

# A training process that says READY, waits for the go file, trains a few steps,
# reports, then holds the directory.
HOLDER = r"""
import sys, time, torch
from torch import nn
from layercheck import LayerCheck, LayerCheckConfig
from layercheck.errors import DirectoryLocked
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
go = sys.argv[2]
print("READY", flush=True)
while not __import__("os").path.exists(go):
    time.sleep(0.005)
try:
    lc = LayerCheck(model, opt, sys.argv[1], LayerCheckConfig(warmup_steps=1, base_threshold=0,
                                                              embedding_threshold=0))
except DirectoryLocked as exc:
    print("LOCKED", exc, flush=True)
    sys.exit(3)
start = lc.restore()
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    lc.step()
lc.flush()
print("HOLDING", start + 3, flush=True)
sys.stdin.read()
lc.close()
"""


def _holder(directory: Path, go: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(go)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _model():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.slow
def test_second_process_and_gc_are_refused_until_the_holder_dies(tmp_path):
    go = tmp_path / "go"
    go.touch()
    holder = _holder(tmp_path / "c", go)
    try:
        assert holder.stdout.readline() == "READY\n"
        line = holder.stdout.readline()
        assert line.startswith("HOLDING 3"), line + holder.stderr.read()
        model, opt = _model()
        with pytest.raises(DirectoryLocked) as info:
            LayerCheck(model, opt, tmp_path / "c")
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "in use by another process" in message
        assert "point this one at another directory" in message
        gc = subprocess.run([sys.executable, "-m", "layercheck", "gc", str(tmp_path / "c")],
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert gc.returncode == 2 and "Traceback" not in gc.stderr
        assert gc.stderr.count("\n") == 1 and f"pid {holder.pid}" in gc.stderr
        before = (tmp_path / "c" / "manifest.jsonl").read_bytes()
        assert LocalStore(tmp_path / "c").list("layers")  # nothing was collected
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / "c" / "manifest.jsonl").read_bytes() == before
    with LayerCheck(model, opt, tmp_path / "c") as lc:  # the kernel released the dead lock
        assert lc.restore() == 3
    assert read_manifest(LocalStore(tmp_path / "c")).problems == []


@pytest.mark.slow
def test_two_processes_racing_for_a_fresh_directory_exactly_one_wins(tmp_path):
    go = tmp_path / "go"
    racers = [_holder(tmp_path / "c", go) for _ in range(2)]
    try:
        # both are at the start line (imports done) before the go: a real race
        assert [r.stdout.readline() for r in racers] == ["READY\n"] * 2
        go.touch()
        lines = sorted(r.stdout.readline() for r in racers)
        assert lines[0].startswith("HOLDING 3"), lines
        assert lines[1].startswith("LOCKED") and "in use by another process" in lines[1], lines
    finally:
        for r in racers:
            r.send_signal(signal.SIGKILL)
            r.wait()
    view = read_manifest(LocalStore(tmp_path / "c"))
    assert view.problems == [] and sorted(view.states) == [1, 2, 3]
    assert view.resumes == [0]  # one timeline: the loser wrote nothing
