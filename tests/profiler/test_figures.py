"""The heatmap: thresholds as the policy computes them, and a real PNG."""
from __future__ import annotations

import numpy as np
import pytest

from layercheck import LayerCheckConfig
from layercheck.policy import Policy
from profiler.figures import heatmap_png, threshold_matrix


def test_thresholds_match_the_policy(tiny_capture):
    trace = tiny_capture.trace
    policy = Policy.from_config(LayerCheckConfig.from_dict(trace.manifest["config"]),
                                trace.layer_names, trace.layers["kind"].tolist())
    expected = np.vstack([policy.thresholds(r) for r in trace.lr_ratio()])
    np.testing.assert_allclose(threshold_matrix(trace), expected)


def test_heatmap_is_a_png(tiny_capture, tmp_path):
    pytest.importorskip("matplotlib")
    path = heatmap_png(tiny_capture.trace, tmp_path / "img" / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
