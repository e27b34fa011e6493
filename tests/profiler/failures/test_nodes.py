"""What a failure takes from tiered's node: the draws' split, and the node's memory tier
played on one machine, restored by the library itself (the tiny job, in one process)."""
from __future__ import annotations

import pytest
import torch

from profiler.checkpointers.tiered import TieredCheckpointer
from profiler.config import CaptureConfig
from profiler.failures.nodes import NODE, NODE_AND_BUDDY, PROCESS, NodeMemory, losses
from profiler.jobs.plain import PlainJob
from profiler.state import TrainingState
from tests.profiler.conftest import TINY

CONFIG = CaptureConfig(**{**TINY, "warmup_steps": 1})


def test_the_draws_split_as_the_simulator_s_shares():
    # below the buddy-loss share: the engines' durable composite; then the node's share
    took = losses([0.01, 0.02, 0.5, 0.84, 0.86, 0.99], process_share=0.15,
                  buddy_loss_share=0.016)
    assert took == (NODE_AND_BUDDY, NODE, NODE, NODE, PROCESS, PROCESS)
    assert losses([0.5], process_share=1.0, buddy_loss_share=0.0) == (PROCESS,)


def _state(job) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone()
            for k, t in TrainingState(job.model, job.optimizer, job.scheduler).tensors().items()}


def _run(job, node: NodeMemory, folder, steps: int):
    """A worker: load, train to ``steps`` saving every step, its LayerCheck closed as a
    kill after the last commit leaves it (the node's memory tier kept). The job is built
    once (a load replaces its whole state, as in a fresh worker)."""
    ckpt = TieredCheckpointer(job, folder, tier=str(node.folder))
    resume = ckpt.load()
    taken, loaded = ckpt.tiers_taken(), _state(job)
    for step in range((resume.step if resume else 0) + 1, steps + 1):
        job.step((step - 1) * CONFIG.batch_size)
        ckpt.save(step, step * CONFIG.batch_size)
    ckpt.lc.flush()
    ckpt.lc.close()
    return resume, taken, loaded, _state(job)


def test_a_node_loss_restores_the_buddy_s_copy_exactly_and_losing_both_the_composite(tmp_path):
    node = NodeMemory(tmp_path / "fallback")
    folder = tmp_path / "ckpt" / "job0"
    job = PlainJob.prepare(CONFIG, say=lambda _: None)
    try:
        _, _, _, at6 = _run(job, node, folder, 6)
        node.lose(NODE)
        tier = node.folder / "job0"
        assert sorted(p.name for p in tier.iterdir()) == ["ward0"]  # only the buddy's copy
        resume, taken, loaded, _ = _run(job, node, folder, 8)
        assert resume.step == 6 and set(resume.sources.values()) == {6}  # exact, nothing stale
        assert loaded.keys() == at6.keys()
        assert all(torch.equal(loaded[k], at6[k]) for k in at6)  # bit for bit
        assert taken == {"memory": len(resume.sources)}
        node.lose(PROCESS)
        resume, _, _, _ = _run(job, node, folder, 8)
        assert resume.step == 8 and set(resume.sources.values()) == {8}
        node.lose(NODE_AND_BUDDY)
        assert not any(node.folder.iterdir())
        resume, taken, _, _ = _run(job, node, folder, 8)
        # the durable composite: LayerCheck's layer versions, none newer than its step
        assert taken == {"storage": len(resume.sources)} and 1 <= resume.step <= 8
        assert max(resume.sources.values()) <= resume.step
    finally:
        node.close()
    assert not node.folder.exists()
    node = NodeMemory(tmp_path / "fallback")
    try:
        with pytest.raises(ValueError, match="node, node\\+buddy"):
            node.lose("rack")
    finally:
        node.close()
