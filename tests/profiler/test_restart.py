"""The restart probe (``profiler.mechanisms.restart``): a real training worker killed as
the validation's supervisor kills it, and its successor timed from the kill to ready."""
from __future__ import annotations

import json
import os

import pytest

from profiler.config import CaptureConfig
from profiler.mechanisms.restart import VICTIM_STEPS, time_restart, time_restarts
from tests.profiler.conftest import TINY


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_probe_needs_a_checkpoint_interval_and_a_step_to_kill_at(tmp_path):
    with pytest.raises(ValueError, match="every >= 1"):
        time_restart(CaptureConfig(**TINY), "cpu", tmp_path, every=0, kill_at=3)
    with pytest.raises(ValueError, match="count >= 1"):
        time_restarts(CaptureConfig(**TINY), "cpu", tmp_path, count=0)


def test_a_chain_times_each_successor_from_its_predecessor_s_kill_and_the_first_resumes(tmp_path):
    chain = time_restarts(CaptureConfig(**TINY), "cpu", tmp_path, count=2, every=2, kill_at=5,
                          resume=True)
    first, second = chain.restarts
    victim = _events(tmp_path / "victim.jsonl")
    steps = [e for e in victim if e["event"] == "step"]
    # it was training and checkpointing, as a run's worker is, and died at the kill:
    # nothing after it
    last = max(e["step"] for e in steps)
    assert last >= 5 and all(e["time"] <= first.killed for e in victim)
    for pid in (first.victim, second.victim):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # a new interpreter importing torch and transformers and building the job
    assert all(0.5 < r.seconds < 300 for r in chain.restarts)
    # the first successor is a run's next worker: in the victim's folder (none of its own)
    # it loaded the victim's newest save: that of its last logged step, or, where the kill
    # fell between a save and its step's log line, the next one
    assert chain.resumed is not None and not (tmp_path / "ckpt" / "successor").exists()
    assert chain.resumed["step"] in {last - last % 2, last + 1 - (last + 1) % 2}, last
    middle = _events(tmp_path / "successor.jsonl")
    ready = next(e for e in middle if e["event"] == "ready")
    assert ready["time"] == first.ready > first.killed
    # where the restart went: the worker's code began, the job was prepared, the engine built
    assert first.killed < ready["entered"] <= ready["prepared"] <= ready["built"] <= ready["time"]
    # the ledger's load: from the successor's ready to its resume
    assert chain.load_s == pytest.approx(chain.resumed["time"] - ready["time"]) and chain.load_s > 0
    # it trained on past its resume and was the second victim; the second successor
    # stopped at ready
    assert [e["step"] for e in middle if e["event"] == "resumed"] == [chain.resumed["step"]]
    assert (max(e["step"] for e in middle if e["event"] == "step")
            >= chain.resumed["step"] + VICTIM_STEPS)
    assert first.ready < second.killed and all(e["time"] <= second.killed for e in middle)
    probe = [e for e in _events(tmp_path / "successor1.jsonl") if e["event"] == "ready"]
    assert [e["time"] for e in probe] == [second.ready]
    assert probe[0]["pid"] != middle[0]["pid"] == second.victim
    assert chain.samples == (first.seconds, second.seconds)
    assert chain.seconds == pytest.approx((first.seconds + second.seconds) / 2)
    # the first victim's steps, its saves (every 2 steps) among them
    steps = [e["step"] for e in chain.victim_steps]
    assert steps[:4] == [1, 2, 3, 4] and all(e["time"] <= first.killed for e in chain.victim_steps)
    assert [e["stall_s"] > 0 for e in chain.victim_steps[:4]] == [False, True, False, True]


def test_a_resuming_successor_that_ends_the_chain_is_killed_once_it_resumed(tmp_path):
    chain = time_restarts(CaptureConfig(**TINY), "cpu", tmp_path, count=1, every=2, kill_at=4,
                          resume=True)
    events = _events(tmp_path / "successor.jsonl")
    ready = next(e for e in events if e["event"] == "ready")
    assert chain.resumed is not None and chain.resumed["step"] >= 4
    # the last worker of the chain is killed once it resumed: no step of its own
    assert not [e for e in events if e["event"] == "step"]
    with pytest.raises(ProcessLookupError):
        os.kill(ready["pid"], 0)
