"""The heatmap: thresholds as the policy computes them, and a real PNG."""
from __future__ import annotations

import numpy as np
import pytest

from layercheck import LayerCheckConfig
from layercheck.contract.policy import Policy, replay
from profiler.figures import heatmap_png, threshold_matrix


def _live_thresholds(trace) -> np.ndarray:
    """K_l(t) as the live policy compared with at each step: the recorded config's
    thresholds at the step's LR ratio times the factor the policy itself (replayed on
    the trace's drift, not the trace's column) put on them."""
    policy = Policy.from_config(LayerCheckConfig.from_dict(trace.manifest["config"]),
                                trace.layer_names, trace.layers["kind"].tolist(),
                                sizes=trace.budget_sizes)
    ratio = trace.lr_ratio()
    decisions = replay(policy, trace.drift_matrix(), ratio)
    return np.vstack([policy.thresholds(r) * d.k_scale for r, d in zip(ratio, decisions)])


def test_thresholds_match_the_policy(tiny_capture):
    trace = tiny_capture.trace
    np.testing.assert_allclose(threshold_matrix(trace), _live_thresholds(trace))


def test_a_budget_runs_heatmap_uses_the_recorded_factor(budget_capture):
    """Budget mode scales every K by the controller's factor: the heatmap's A / K must
    divide by the scaled K, or a layer written at A = K looks written at A / K != 1."""
    trace = budget_capture.trace
    assert len(set(trace.k_scale())) > 2                       # the controller did act
    np.testing.assert_allclose(threshold_matrix(trace), _live_thresholds(trace))


def test_heatmap_is_a_png(tiny_capture, tmp_path):
    pytest.importorskip("matplotlib")
    path = heatmap_png(tiny_capture.trace, tmp_path / "img" / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
