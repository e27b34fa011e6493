"""The restart probe (``profiler.mechanisms.restart``): a real training worker killed as
the validation's supervisor kills it, and its successor timed from the kill to ready."""
from __future__ import annotations

import json

import pytest

from profiler.config import CaptureConfig
from profiler.jobs.plain import PlainJob
from profiler.mechanisms.restart import VICTIM_STEPS, time_restart
from tests.profiler.conftest import TINY


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_successor_is_timed_from_the_kill_of_a_training_worker_to_its_ready(tmp_path):
    job = PlainJob.prepare(CaptureConfig(**TINY), say=lambda _: None)
    restarted = time_restart(job, tmp_path)
    victim = _events(tmp_path / "victim.jsonl")
    steps = [e for e in victim if e["event"] == "step"]
    # it was training, mid-run, and died at the kill: nothing after it, no checkpoint
    assert steps and max(e["step"] for e in steps) >= VICTIM_STEPS
    assert all(e["time"] <= restarted.killed for e in victim)
    assert not any((tmp_path / "ckpt").rglob("step*"))
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(restarted.victim, 0)
    ready = [e for e in _events(tmp_path / "successor.jsonl") if e["event"] == "ready"]
    assert len(ready) == 1 and ready[0]["time"] == restarted.ready
    # a new interpreter importing torch and transformers and building the job
    assert 0.5 < restarted.seconds < 300
