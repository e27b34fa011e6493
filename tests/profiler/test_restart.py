"""The restart probe (``profiler.mechanisms.restart``): a real training worker killed as
the validation's supervisor kills it, and its successor timed from the kill to ready."""
from __future__ import annotations

import json

import pytest

from profiler.config import CaptureConfig
from profiler.mechanisms.restart import time_restart
from tests.profiler.conftest import TINY


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_successor_is_timed_from_the_kill_of_a_checkpointing_worker_to_its_ready(tmp_path):
    restarted = time_restart(CaptureConfig(**TINY), "cpu", tmp_path, every=2, kill_at=5)
    victim = _events(tmp_path / "victim.jsonl")
    steps = [e for e in victim if e["event"] == "step"]
    # it was training and checkpointing, as a run's worker is, and died at the kill:
    # nothing after it; its newest save (step 4, or 6 where it ran on) is on disk
    last = max(e["step"] for e in steps)
    assert last >= 5 and all(e["time"] <= restarted.killed for e in victim)
    saved = [int(p.name[4:]) for p in (tmp_path / "ckpt").glob("job*/step*")]
    assert saved and max(saved) == last - last % 2 >= 4, saved
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(restarted.victim, 0)
    ready = [e for e in _events(tmp_path / "successor.jsonl") if e["event"] == "ready"]
    assert len(ready) == 1 and ready[0]["time"] == restarted.ready
    # a new interpreter importing torch and transformers and building the job
    assert 0.5 < restarted.seconds < 300


def test_a_probe_needs_a_checkpoint_interval_and_a_step_to_kill_at(tmp_path):
    with pytest.raises(ValueError, match="every >= 1"):
        time_restart(CaptureConfig(**TINY), "cpu", tmp_path, every=0, kill_at=3)
