"""A short real drill on the tiny model: SIGKILL, recovery in a new process, fidelity."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from layercheck.contract.trace import read_trace
from profiler.config import CaptureConfig, DrillConfig
from profiler.failures.drill import _load_failure_free, drill
from profiler.errors import ProfilerError
from profiler.staleness import failure_steps, weighted_staleness
from tests.profiler.conftest import TINY


@pytest.mark.slow
def test_drill_kills_recovers_and_measures_deviation(tmp_path):
    config = DrillConfig(capture=CaptureConfig(**TINY), failures=2)
    result = drill(config, failures=2, out=tmp_path / "t", progress=False)
    doc = result.drill
    trace = read_trace(result.path)
    assert trace.drill == doc
    expected = failure_steps(weighted_staleness(trace.write_matrix(),
                                                trace.layers["params"].to_numpy()), 2)
    assert doc["failure_steps"] == expected
    # the failure strikes after step t committed: recovery resumes at t, no replay
    assert doc["restored_steps"] == doc["failure_steps"]
    assert len(doc["recovery_seconds"]) == 2 and min(doc["recovery_seconds"]) > 0
    curves = doc["curves"]
    assert curves["step"] == list(range(1, TINY["steps"] + 1))
    assert curves["failure_free"] == trace.steps["loss"].tolist()
    # same batches and same state before the first failure: bit-for-bit the same losses
    first = doc["failure_steps"][0]
    assert curves["recovered"][:first] == curves["failure_free"][:first]
    assert doc["pre_failure_max_abs_deviation"] == 0.0
    free, rec = np.array(curves["failure_free"]), np.array(curves["recovered"])
    dev = np.abs(rec - free)[first:]
    assert doc["max_abs_loss_deviation"] == pytest.approx(dev.max())
    assert doc["max_rel_loss_deviation"] == pytest.approx((dev / free[first:]).max())
    metric = doc["final_metric"]
    assert metric["failure_free"] == trace.manifest["evaluation"]["value"]
    assert np.isfinite(metric["recovered"])
    assert len(trace.recovery) == 3  # the capture's restore + the drill's two
    assert trace.recovery["step"].tolist()[1:] == doc["failure_steps"]


def test_from_trace_takes_the_job_from_a_captured_trace(tiny_capture):
    trace, job = _load_failure_free(tiny_capture.path, 3)
    assert job.capture == CaptureConfig.from_dict(trace.manifest["sources"]["capture"])
    assert job.capture.model == "tiny" and job.failures == 3


def test_from_trace_refuses_a_synthetic_trace():
    synthetic = Path(__file__).resolve().parents[3] / "traces" / "qwen2.5-7b-synthetic"
    with pytest.raises(ProfilerError, match="made by `python -m profiler capture`"):
        _load_failure_free(synthetic, 1)
