"""A real training process killed with SIGKILL mid-run, restarted: it resumes at the
newest committed step (no replay, no fresh start) and finishes as if nothing happened."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.layercheck.halting import HaltingRun

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "finetune_tiny.py"
STEPS = 160
KILL_AT = 90  # the child halts once this step is committed; the kill comes then


def _args(ckpt, losses):
    return ["--ckpt", str(ckpt), "--steps", str(STEPS), "--losses", str(losses)]


def _losses(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]  # a replayed step overwrites: the run as resumed
    return out


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_resumes_at_the_committed_step(tmp_path):
    clean = HaltingRun(SCRIPT, _args(tmp_path / "clean", tmp_path / "clean.jsonl"))
    assert clean.wait() == 0

    crash = HaltingRun(SCRIPT, _args(tmp_path / "ckpt", tmp_path / "crash.jsonl"),
                       halt_at=KILL_AT)
    assert crash.wait_for("restored")["step"] == 0
    crash.wait_for("halted")
    crash.kill()
    assert crash.steps() == list(range(1, KILL_AT + 1))
    committed = read_manifest(LocalStore(tmp_path / "ckpt")).latest_step()
    assert committed == KILL_AT

    again = HaltingRun(SCRIPT, _args(tmp_path / "ckpt", tmp_path / "crash.jsonl"),
                       stderr=open(tmp_path / "again.err", "wb"))
    code = again.wait()
    assert code == 0, (tmp_path / "again.err").read_text()[-2000:]
    # restore() gave the newest committed step, and training went on from the next one
    assert [e for e in again.events if e["event"] == "restored"] == [
        {"event": "restored", "step": committed}]
    assert again.steps() == list(range(committed + 1, STEPS + 1))
    resumed, reference = _losses(tmp_path / "crash.jsonl"), _losses(tmp_path / "clean.jsonl")
    # the child halted inside lc.step(KILL_AT), before the loop logged that step's loss
    assert sorted(resumed) == [s for s in range(1, STEPS + 1) if s != KILL_AT]
    assert abs(resumed[STEPS] - reference[STEPS]) <= 0.01 * reference[STEPS]
