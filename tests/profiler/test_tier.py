"""tiered's memory-tier figures, measured with the tier's own code (profiler.mechanisms.tier):
its restore and its thread's cost to a training step."""
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from profiler.mechanisms import tier
from profiler.mechanisms.base import GB, Bench
from profiler.state import TrainingState


@pytest.fixture
def job():
    return BusyJob()


def bench(job, folder, repeats=1):
    return Bench(job=job, trace=None, folder=folder, repeats=repeats, say=lambda _: None)


def test_the_restore_is_timed_from_memory_over_the_state_s_bytes(job, tmp_path):
    figure = tier.MemoryTierRestore().measure(bench(job, tmp_path, repeats=2))["tier_restore_gbps"]
    nbytes = TrainingState(job.model, job.optimizer, job.scheduler).nbytes()
    assert figure.source == "measured" and figure.bytes == nbytes and len(figure.samples) == 2
    assert figure.value == pytest.approx(nbytes / statistics.median(figure.samples) / GB)
    assert "verified" in figure.method and "memory" in figure.method


def test_a_restore_that_did_not_come_from_memory_is_refused(job, tmp_path, monkeypatch):
    from layercheck.tiers import tiered
    # a memory tier whose every slot fails its checksum: the restore falls back to storage
    monkeypatch.setattr(tiered, "_intact", lambda slot, name, item: False)
    with pytest.raises(RuntimeError, match="not every layer from memory"):
        tier.MemoryTierRestore().measure(bench(job, tmp_path))


class BusyJob:
    """A job whose step is pure-Python work: a thread that holds the interpreter beside it
    (below, the tier's commit made slower the same way) lengthens it."""

    def __init__(self) -> None:
        model = torch.nn.Linear(256, 256)
        self.model, self.optimizer = model, torch.optim.AdamW(model.parameters())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        model(torch.ones(1, 256)).sum().backward()
        self.optimizer.step()
        self.ranks = SimpleNamespace(world_size=1, is_coordinator=True)
        self.device = "cpu"

    def step(self, position: int) -> None:
        work(STEP_WORK)

    def make_layercheck(self, directory, config, *, tiers=None):
        from layercheck import LayerCheck
        return LayerCheck(self.model, self.optimizer, directory, config,
                          scheduler=self.scheduler, tiers=tiers)


def work(iterations: int) -> None:
    """A fixed amount of pure-Python work: it takes longer while another thread holds the
    interpreter (a loop that ran until a clock said stop would not)."""
    total = 0
    for i in range(iterations):
        total += i


def _iterations_for(seconds: float) -> int:
    start = time.perf_counter()
    work(100_000)
    return max(1, int(100_000 * seconds / (time.perf_counter() - start)))


STEP_WORK = _iterations_for(0.03)
"""About 30 ms of work on this machine, alone."""


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


def test_the_thread_s_cost_is_the_step_s_slowdown_while_it_works(job, tmp_path, monkeypatch):
    from layercheck.tiers.memory import MemoryTier
    commit = MemoryTier._commit

    def slow_commit(self, slot, record, after):
        commit(self, slot, record, after)
        spin(0.06)  # holds the interpreter: the step beside it waits for some of it
    monkeypatch.setattr(MemoryTier, "_commit", slow_commit)
    figure = tier.MemoryTierThread().measure(bench(job, tmp_path, repeats=2))["tier_thread_gbps"]
    nbytes = TrainingState(job.model, job.optimizer, job.scheduler).nbytes()
    steps = 2 * tier.THREAD_PAIRS * 2
    assert figure.bytes == nbytes and len(figure.samples) == steps
    beside, alone = figure.samples[:steps // 2], figure.samples[steps // 2:]
    slowdown = statistics.median(beside) - statistics.median(alone)
    assert slowdown > 0.005 and figure.seconds == pytest.approx(slowdown), (beside, alone)
    assert figure.value == pytest.approx(nbytes / slowdown / GB)


def test_no_slowdown_is_the_floor_not_a_negative_rate(job, tmp_path):
    figure = tier.MemoryTierThread().measure(bench(job, tmp_path))["tier_thread_gbps"]
    # the real commit of a small state takes a fraction of a 30 ms step's noise: at most
    # what was measured, never below the floor
    assert figure.seconds >= tier.NO_SLOWDOWN_S and figure.value > 0
