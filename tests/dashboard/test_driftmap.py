"""dashboard.driftmap: heatmap, rates."""
from __future__ import annotations

import numpy as np
import pytest

from dashboard import driftmap


def test_rates_over_a_window(trace):
    full = driftmap.rates_frame(trace)
    part = driftmap.rates_frame(trace, 1, 50)
    assert full["writes"].sum() == len(trace.writes)
    assert part["writes"].sum() == (trace.writes["step"] <= 50).sum()
    np.testing.assert_allclose(full["mean_drift"], trace.drift_matrix().mean(axis=0))
    assert driftmap.window_stats(full)["fastest"] == "embed"


def test_heatmap_bins_long_runs_keeping_peaks(trace):
    fig = driftmap.heatmap_figure(trace)
    assert fig.data[0].z.shape == (len(trace.layer_names), trace.num_steps)
    from layercheck.contract.trace import Trace  # noqa: F401
    old = driftmap.MAX_COLUMNS
    try:
        driftmap.MAX_COLUMNS = 100
        binned = driftmap.heatmap_figure(trace)
        assert binned.data[0].z.shape[1] == 100
        assert np.isclose(binned.data[0].z.max(), trace.accumulator_matrix().max())
    finally:
        driftmap.MAX_COLUMNS = old
    assert len(fig.data[1].x) == len(trace.writes)  # one tick per write


def test_window_outside_the_run_says_so(trace):
    with pytest.raises(ValueError, match="within 1..400"):
        driftmap.rates_frame(trace, 0, 500)
