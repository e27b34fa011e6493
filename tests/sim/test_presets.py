"""Preset traces: valid, labelled synthetic, decided by layercheck.policy.replay,
close to the paper's aggregates, calibrated to its end-to-end times."""
import numpy as np
import pytest

from layercheck.config import LayerCheckConfig
from layercheck.policy import Policy, replay
from layercheck.trace import read_trace
from sim.api import Scenario
from sim.presets import (PRESET_NAMES, PUBLISHED, REGIMES, TRACES_DIR, build_trace, compute_seconds,
                         trace_stats)
from sim.strategies import get_strategy
from sim.timeline import Timeline


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_shipped_trace_is_the_seeded_build(name):
    shipped = read_trace(TRACES_DIR / f"{name}-synthetic")
    built = build_trace(name, seed=0)
    assert shipped.kind == "synthetic" and "SYNTHETIC" in shipped.manifest["description"]
    np.testing.assert_array_equal(shipped.write_matrix(), built.write_matrix())
    np.testing.assert_allclose(shipped.drift_matrix(), built.drift_matrix())


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_writes_are_what_the_policy_decides(name):
    trace = read_trace(TRACES_DIR / f"{name}-synthetic")
    config = LayerCheckConfig.from_dict(trace.manifest["config"])
    policy = Policy.from_config(config, trace.layer_names, list(trace.layers["kind"]))
    decided = np.zeros_like(trace.write_matrix())
    for d in replay(policy, trace.drift_matrix(), trace.lr_ratio()):
        decided[d.step - 1, d.layers] = True
    np.testing.assert_array_equal(decided, trace.write_matrix())


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_aggregates_near_published(name):
    stats, pub = trace_stats(read_trace(TRACES_DIR / f"{name}-synthetic")), PUBLISHED[name]
    assert stats["layer_writes"] == pytest.approx(pub.layer_writes, rel=0.1)
    assert stats["checkpoints"] == pytest.approx(pub.checkpoints, rel=0.15)
    assert stats["total_gb"] == pytest.approx(pub.total_gb, rel=0.05)
    if pub.staleness:
        assert stats["staleness"] == pytest.approx(pub.staleness, rel=0.05)
        assert stats["max_staleness"] == pytest.approx(pub.max_staleness, rel=0.05)


def test_traces_stay_small():
    for name in PRESET_NAMES:
        size = sum(p.stat().st_size for p in (TRACES_DIR / f"{name}-synthetic").iterdir())
        assert size < 3e6


@pytest.mark.parametrize("name,strategy,minutes", [("qwen2.5-7b", "layercheck", 198.8),
                                                   ("qwen2.5-7b", "gemini", 747.9),
                                                   ("llama-3.2-1b", "layercheck", 43.8)])
def test_failure_free_times_match_the_paper(name, strategy, minutes):
    scenario = Scenario.from_preset(name)
    plan = get_strategy(strategy).plan(scenario.workload, scenario.costs, interval=1)
    assert Timeline.build(plan).ready[-1] / 60 == pytest.approx(minutes, rel=0.01)


def test_matched_freshness_is_the_papers_106():
    assert round(Scenario.from_preset("qwen2.5-7b").workload.staleness) == 106


def test_compute_and_regime():
    assert compute_seconds("llama-3.2-1b") < compute_seconds("qwen2.5-3b") < compute_seconds("qwen2.5-7b")
    regime = REGIMES["llama3-405b"]
    assert regime.job_mtbf_s / 3600 == pytest.approx(3.09, abs=0.01)
    assert regime.gpu_mtbf_s == pytest.approx(regime.job_mtbf_s * 16384)
