"""The recorder's step table: what a step's phases cost, with LayerCheck's share taken out."""
from __future__ import annotations

import time

import numpy as np

from profiler.config import CaptureConfig
from profiler.jobs.plain import PlainJob
from profiler.recorder import Recorder
from tests.profiler.conftest import TINY


def test_the_optimizer_phase_loses_only_the_drift_hook_not_the_reduce(tmp_path):
    # the reduce of the drift sums runs in lc.step(), after the optimizer phase: a slow
    # one (an all-reduce on a loaded machine) must not be taken out of the optimizer's time
    job = PlainJob.prepare(CaptureConfig(**{**TINY, "warmup_steps": 1}), say=lambda _: None)
    lc = job.make_layercheck(tmp_path / "ckpt", job.config.layercheck_config())
    lc.restore()
    fast = lc.drift.reduce

    def slow(sums: np.ndarray) -> np.ndarray:
        time.sleep(0.05)
        return fast(sums)
    lc.drift.reduce = slow
    recorder = Recorder(lc.state.accumulators.size)
    try:
        for position in range(0, 3 * job.config.batch_size, job.config.batch_size):
            _, times = job.step(position)
            before = lc.state.accumulators.copy()
            hook_s = lc.drift.seconds
            report = lc.step(extra={"position": position})
            recorder.step(times, 0.0, report, before, drift_in_optimizer_s=hook_s)
            assert 0 < hook_s < times.optimizer_s  # the hook ran inside the optimizer phase
            assert report.drift_s >= hook_s + 0.05  # and the slow reduce after it
    finally:
        lc.close()
    steps = recorder.tables()["steps"]
    assert (steps["optimizer_s"] > 0).all(), steps
    assert (steps["drift_s"] >= 0.05).all()
