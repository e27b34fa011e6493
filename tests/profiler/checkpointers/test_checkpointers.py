"""The strategies' real mechanisms: save, change the state, load, and get the saved state back."""
from __future__ import annotations

import pytest
import torch

from profiler.checkpointers.base import folder_bytes
from profiler.checkpointers.full import FullCheckpointer
from profiler.checkpointers.layerwise import LayerCheckpointer
from profiler.config import CaptureConfig
from profiler.engine import deepspeed_available
from profiler.jobs.plain import PlainJob
from profiler.state import TrainingState
from profiler.checkpointers.twophase import TwoPhaseCheckpointer
from tests.profiler.conftest import TINY


@pytest.fixture(scope="module")
def job():
    config = CaptureConfig(**{**TINY, "warmup_steps": 1})
    job = PlainJob.prepare(config, say=lambda _: None)
    return job


def _snapshot(job) -> dict[str, torch.Tensor]:
    state = TrainingState(job.model, job.optimizer, job.scheduler)
    return {k: t.detach().clone() for k, t in state.tensors().items()}


def _lrs(job) -> list[float]:
    return [g["lr"] for g in job.optimizer.param_groups]


@pytest.mark.parametrize("kind", [FullCheckpointer, TwoPhaseCheckpointer, LayerCheckpointer])
def test_save_then_load_gives_the_saved_state_back(job, kind, tmp_path):
    ckpt = kind(job, tmp_path / kind.__name__, interval=1)
    assert ckpt.load() is None  # a fresh folder: no recovery point, start at step 1
    job.step(0)
    saved = ckpt.save(1, job.config.batch_size)
    ckpt.flush()
    assert saved.stall_s > 0
    expected, lrs = _snapshot(job), _lrs(job)
    job.step(job.config.batch_size)  # the live state moves on
    assert any(not torch.equal(t, expected[k]) for k, t in _snapshot(job).items())
    ckpt.close()
    again = kind(job, tmp_path / kind.__name__, interval=1)
    resume = again.load()
    assert (resume.step, resume.position) == (1, job.config.batch_size)
    for key, tensor in _snapshot(job).items():
        assert torch.equal(tensor, expected[key]), key
    assert _lrs(job) == pytest.approx(lrs)
    again.close()


def test_a_two_phase_folder_without_metadata_is_not_a_recovery_point(job, tmp_path):
    ckpt = TwoPhaseCheckpointer(job, tmp_path, interval=1)
    job.step(0)
    ckpt.save(3, 24)
    ckpt.flush()
    (tmp_path / "step9").mkdir()  # a persist killed before DCP wrote .metadata
    (tmp_path / "step9" / "__0_0.distcp").write_bytes(b"partial")
    assert [p.name for p in ckpt.durable()] == ["step3"]
    assert ckpt.load().step == 3


def test_a_full_save_keeps_one_save_on_disk(job, tmp_path):
    ckpt = FullCheckpointer(job, tmp_path, interval=2)
    assert [ckpt.due(i, 6) for i in range(1, 7)] == [False, True, False, True, False, False]
    first = ckpt.save(2, 0).bytes
    ckpt.save(4, 0)
    assert sorted(p.name for p in tmp_path.glob("step*")) == ["step4"]
    assert first >= TrainingState(job.model, job.optimizer, job.scheduler).nbytes() * 0.95
    assert folder_bytes(tmp_path / "step4") == pytest.approx(first, rel=0.05)


@pytest.mark.skipif(not deepspeed_available(), reason="DeepSpeed's own latest file")
@pytest.mark.parametrize("latest", ["", "step6"])
def test_a_deepspeed_latest_left_empty_by_a_kill_loads_the_newest_whole_save(job, tmp_path, latest):
    ckpt = FullCheckpointer(job, tmp_path, interval=2)
    job.step(0)
    ckpt.save(4, 16)
    expected = _snapshot(job)
    job.step(16)
    # DeepSpeed truncates latest, then writes it: a kill in between leaves it empty
    (tmp_path / "latest").write_text(latest)
    with pytest.warns(UserWarning, match="loading step4, the newest save"):
        resume = FullCheckpointer(job, tmp_path, interval=2).load()
    assert (resume.step, resume.position) == (4, 16)
    for key, tensor in _snapshot(job).items():
        assert torch.equal(tensor, expected[key]), key


def test_layercheck_resumes_with_the_step_of_each_layers_copy(job, tmp_path):
    ckpt = LayerCheckpointer(job, tmp_path)
    assert ckpt.due(5, 6) and not ckpt.due(6, 6)  # every step but the job's last
    ckpt.load()
    for step in (1, 2):
        job.step(0)
        ckpt.save(step, step * 4)
    ckpt.close()
    again = LayerCheckpointer(job, tmp_path)
    resume = again.load()
    assert resume.step == 2 and set(resume.sources) == {
        "model.embed_tokens", *[f"model.layers.{i}" for i in range(4)], "model.norm", "lm_head"}
    assert all(1 <= s <= 2 for s in resume.sources.values())
    again.close()
