"""CheckFreq's two phases on a live job: the snapshot overlaps the next step, the update waits."""
from __future__ import annotations

import time

import pytest
import torch

from profiler.config import CaptureConfig
from profiler.jobs.plain import PlainJob
from profiler.state import TrainingState
from profiler.checkpointers.twophase import TwoPhaseCheckpointer
from tests.profiler.conftest import TINY

DELAY_S = 0.4


@pytest.fixture()
def job():
    return PlainJob.prepare(CaptureConfig(**{**TINY, "warmup_steps": 1}), say=lambda _: None)


def _state(job) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone()
            for k, t in TrainingState(job.model, job.optimizer, job.scheduler).tensors().items()}


class SlowSnapshot(TwoPhaseCheckpointer):
    """The real checkpointer whose background thread starts its copy late, as a copy
    slower than the next step's forward and backward would."""

    def _two_phases(self, *args):
        time.sleep(DELAY_S)
        super()._two_phases(*args)


def test_the_next_update_waits_for_the_snapshot_and_the_save_holds_the_saved_step(job, tmp_path):
    job.step(0)
    expected = _state(job)
    ckpt = SlowSnapshot(job, tmp_path)
    saved = ckpt.save(1, 4)
    assert ckpt.held_s() == 0.0  # nothing held yet: the copy runs behind the save
    job.step(4)  # its weight update must wait for the copy of step 1's weights
    held = ckpt.held_s()
    assert held >= DELAY_S / 2 > saved.stall_s
    assert ckpt.held_s() == 0.0  # read once per step
    ckpt.flush()
    assert ckpt.last.snapshot_s > 0 and ckpt.last.persist_s > 0
    assert any(not torch.equal(t, expected[k]) for k, t in _state(job).items())
    ckpt.close()
    again = TwoPhaseCheckpointer(job, tmp_path)
    resume = again.load()
    assert (resume.step, resume.position) == (1, 4)
    for key, tensor in _state(job).items():
        assert torch.equal(tensor, expected[key]), key


def test_a_save_waits_for_the_previous_persist_and_keeps_one_folder(job, tmp_path):
    ckpt = TwoPhaseCheckpointer(job, tmp_path, interval=2)
    for step in (2, 4):
        job.step(0)
        ckpt.save(step, step)
    assert (tmp_path / "step2" / ".metadata").exists()  # save 4 waited for step 2's persist
    ckpt.flush()
    assert [p.name for p in ckpt.durable()] == ["step4"]
    assert sorted(p.name for p in tmp_path.glob("step*")) == ["step4"]
    ckpt.close()


def test_a_failed_persist_is_raised_in_the_training_thread(job, tmp_path):
    ckpt = TwoPhaseCheckpointer(job, tmp_path)
    (tmp_path / "step1").write_text("a file where the save's folder goes")
    ckpt.save(1, 4)
    with pytest.raises(RuntimeError, match="CheckFreq's background save failed"):
        ckpt.flush()
    ckpt.close()


def test_close_takes_the_hook_off_the_optimizer(job, tmp_path):
    ckpt = TwoPhaseCheckpointer(job, tmp_path)
    ckpt.save(1, 4)
    ckpt.flush()
    hooks = len(job.optimizer._optimizer_step_pre_hooks)
    ckpt.close()
    assert len(job.optimizer._optimizer_step_pre_hooks) == hooks - 1
