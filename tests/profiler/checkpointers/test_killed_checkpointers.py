"""CheckFreq's, GEMINI's and LowDiff's checkpointers under a real SIGKILL: what a new process restores.

A real worker (``python -m profiler worker``, as a validation starts it,
the tiny job with one thread) trains under the strategy, halts after step 7
with its checkpoints durable, and is SIGKILLed with its process group (LowDiff's
writer dies with it; GEMINI's peer, started here, survives). A new
checkpointer in this process then loads, and the state must be, bit for bit,
the one a reference run here reaches at the recovered step.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from profiler.checkpointers import checkpointer_class
from profiler.config import CaptureConfig
from profiler.mechanisms.restart import spawn_worker
from profiler.checkpointers.peerstore import start_peer
from profiler.jobs.plain import PlainJob
from profiler.state import TrainingState
from profiler.failures.worker import EventReader, write_job
from tests.profiler.conftest import TINY

pytestmark = pytest.mark.slow

CONFIG = CaptureConfig(**{**TINY, "warmup_steps": 1})
HALT = 7


def _reference(steps: int, *, compressed: bool, tmp) -> dict[str, torch.Tensor]:
    """The state after ``steps`` steps of the job in this process (LowDiff's training is
    compressed: its checkpointer's hook on, as in the worker)."""
    job = PlainJob.prepare(CONFIG, say=lambda _: None)
    hook = checkpointer_class("lowdiff")(job, tmp, interval=10 ** 6, batch=10 ** 6) if compressed else None
    for step in range(1, steps + 1):
        job.step((step - 1) * CONFIG.batch_size)
        if hook is not None:
            hook.save(step, step * CONFIG.batch_size)
    if hook is not None:
        hook.close()
    return {k: t.detach().clone()
            for k, t in TrainingState(job.model, job.optimizer, job.scheduler).tensors().items()}


def _killed_worker(root, strategy: str, interval: int, options: dict) -> None:
    log = root / "worker.jsonl"
    spec = write_job(root / "worker.json", config=CONFIG, device="cpu", root=root / "ckpt",
                     log=log, strategy=strategy, interval=interval, halt_at=HALT, engine=True,
                     options=options)
    proc = spawn_worker(spec, root / "worker.out", CONFIG.threads)
    reader, deadline = EventReader(log), time.time() + 300
    try:
        while not any(e["event"] == "halted" for e in reader.events):
            assert proc.poll() is None, (root / "worker.out").read_text()[-2000:]
            assert time.time() < deadline, "the worker did not halt"
            reader.poll()
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _load(strategy: str, root, interval: int, options: dict):
    job = PlainJob.prepare(CONFIG, say=lambda _: None)
    ckpt = checkpointer_class(strategy)(job, root / "ckpt" / "job0", interval=interval, **options)
    resume = ckpt.load()
    state = {k: t.detach().clone()
             for k, t in TrainingState(job.model, job.optimizer, job.scheduler).tensors().items()}
    ckpt.close()
    return resume, state


def _assert_same(state, expected) -> None:
    assert state.keys() == expected.keys()
    for key, tensor in state.items():
        assert torch.equal(tensor, expected[key]), key


def test_gemini_restores_the_peer_copy_and_after_losing_the_peer_its_storage(tmp_path):
    proc, port = start_peer()
    fresh = None
    try:
        # copies to the peer every 3 steps (3, 6), storage every 4 (4: its own host copy)
        _killed_worker(tmp_path, "gemini", 3, {"storage_every": 4, "peer": port})
        resume, state = _load("gemini", tmp_path, 3, {"storage_every": 4, "peer": port})
        assert (resume.step, resume.position) == (6, 6 * CONFIG.batch_size)
        _assert_same(state, _reference(6, compressed=False, tmp=tmp_path / "ref"))
        proc.kill()  # the failure takes the peer's memory: storage is the last tier
        proc.wait()
        fresh, again = start_peer()
        resume, state = _load("gemini", tmp_path, 3, {"storage_every": 4, "peer": again})
        assert resume.step == 4
        _assert_same(state, _reference(4, compressed=False, tmp=tmp_path / "ref4"))
    finally:
        for p in (proc, fresh):
            if p is not None:
                p.kill()
                p.wait()
                p.stdout.close()


def test_lowdiff_restores_the_full_save_and_replays_its_differentials(tmp_path):
    # a full save at 4; differentials of every step, sealed in batches of 2 (the halt
    # seals step 7's)
    _killed_worker(tmp_path, "lowdiff", 4, {"batch": 2})
    resume, state = _load("lowdiff", tmp_path, 4, {"batch": 2})
    assert (resume.step, resume.position) == (HALT, HALT * CONFIG.batch_size)
    _assert_same(state, _reference(HALT, compressed=True, tmp=tmp_path / "ref"))


def test_checkfreq_restores_the_snapshot_taken_while_the_next_step_ran(tmp_path):
    # saves after 3 and 6; each snapshot copies while the next step computes, and the
    # halt after 7 waits for step 6's persist
    _killed_worker(tmp_path, "checkfreq", 3, {})
    resume, state = _load("checkfreq", tmp_path, 3, {})
    assert (resume.step, resume.position) == (6, 6 * CONFIG.batch_size)
    _assert_same(state, _reference(6, compressed=False, tmp=tmp_path / "ref"))
