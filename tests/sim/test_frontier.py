"""sim.frontier: every setting measured as the library would decide it, the front, the ratio."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.policy import Policy, replay
from layercheck.contract.trace import last_written, read_trace
from sim.api import Scenario, simulate
from sim.costs import CostModel
from sim.errors import SimError
from sim.frontier import (Grid, config_line, evaluate, paper_default, pareto, rate,
                          recorded_config, write_bandwidth)
from sim.presets import TRACES_DIR

from .conftest import DRIFT_CASES, drift_case

MINILM = TRACES_DIR / "minilm-1000steps"
SMALL = dict(base_thresholds=(1e-4, 1e-3, 1e-2, math.inf), embedding_thresholds=(1e-3, 1e-1),
             smax=(60, 300), intervals=(1, 4))


@pytest.fixture(scope="module")
def minilm():
    return read_trace(MINILM)


def reference(trace, config):
    """What the library's own policy writes for ``config`` on the trace, step by step."""
    policy = Policy.from_config(config, trace.layer_names, list(trace.layers["kind"]))
    ratio = np.nan_to_num(trace.lr_ratio(), nan=1.0)
    written = np.zeros((trace.num_steps, len(trace.layer_names)), dtype=bool)
    for d in replay(policy, trace.drift_matrix(), ratio):
        written[d.step - 1, d.layers] = True
    return written


def test_every_setting_is_measured_as_the_policy_decides(minilm):
    grid = Grid(**SMALL, warmup_steps=118)
    result = evaluate(minilm, grid.configs())
    assert len(result.table) == grid.size == 32
    params = minilm.layers["params"].to_numpy(dtype=np.float64)
    for row, config in enumerate(result.configs):
        written = reference(minilm, config)
        np.testing.assert_array_equal(result.written(row), written)
        got = result.table.loc[row]
        assert got["warmup_steps"] == min(118, config.smax)
        assert got["layer_writes"] == written.sum()
        assert got["bytes_written"] == (written @ minilm.layer_bytes).sum()
        series = minilm.weighted_staleness(written)            # the one definition
        defined = ~np.isnan(series)
        assert got["mean_weighted_staleness"] == pytest.approx(series[defined].mean(), rel=1e-9)
        oldest = np.arange(1, len(written) + 1)[defined] - last_written(written)[defined].min(axis=1)
        assert got["max_staleness"] == oldest.max()
        assert got["write_share"] == pytest.approx(
            got["bytes_written"] / write_bandwidth(minilm)[0] / minilm.compute_seconds().sum())
        detail = result.detail([row]).loc[row]
        assert detail["peak_weighted_staleness"] == pytest.approx(series[defined].max())
        assert detail["checkpoints"] == written.any(axis=1).sum()


@pytest.mark.parametrize("name", ["minilm-1000steps", "qwen2.5-7b-synthetic"])
def test_the_recorded_setting_writes_what_the_trace_recorded(name):
    trace = read_trace(TRACES_DIR / name)
    result = evaluate(trace, [recorded_config(trace)])
    np.testing.assert_array_equal(result.written(0), trace.write_matrix())
    assert result.table.loc[0, "bytes_written"] == trace.writes["bytes"].sum()


def test_default_grid_is_400_settings_and_brings_warmup_to_smax():
    trace = read_trace(TRACES_DIR / "qwen2.5-7b-synthetic")
    grid = Grid.for_trace(trace)
    assert grid.size == 400 and grid.smax == (100, 215, 464, 1000) and grid.warmup_steps == 200
    assert math.isinf(grid.base_thresholds[-1])
    assert {c.warmup_steps for c in grid.configs() if c.smax == 100} == {100}


@pytest.mark.parametrize("change,words", [
    (dict(intervals=()), "intervals is empty"),
    (dict(base_thresholds=(-1.0,)), "base_threshold=-1.0 must be a number >= 0"),
    (dict(smax=(0,)), "smax=0 must be an integer >= 1"),
    (dict(base_thresholds=("often",)), "grid: could not convert string to float"),
])
def test_bad_grids_say_the_fix(change, words):
    with pytest.raises(SimError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Grid(**{**SMALL, **change}, warmup_steps=10)


def test_pareto_is_the_lower_left_front():
    cost = np.array([1.0, 2.0, 3.0, 2.0, 4.0, 1.0])
    stale = np.array([9.0, 5.0, 5.0, 7.0, 1.0, 9.0])
    assert pareto(cost, stale).tolist() == [True, True, False, False, True, False]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=40))
def test_no_front_point_is_dominated_and_every_other_point_is(points):
    cost, stale = (np.array(v, dtype=float) for v in zip(*points))
    front = pareto(cost, stale)
    for i in range(len(cost)):
        dominated = ((cost <= cost[i]) & (stale <= stale[i]) & ((cost < cost[i]) | (stale < stale[i])))
        if front[i]:
            assert not dominated.any()
        else:
            same = (cost == cost[i]) & (stale == stale[i]) & front
            assert dominated.any() or same.any()


def test_rate_is_the_simulator_on_each_settings_writes(minilm):
    grid = Grid(**SMALL, warmup_steps=118)
    result = evaluate(minilm, grid.configs())
    scenario = Scenario.from_trace(minilm, costs=CostModel.paper_a100(), window_s=86400.0)
    rated = rate(result, scenario, rows=[3, 17], mtbf_s=3600.0, seeds=3)
    assert rated["effective_ratio"].notna().sum() == 2
    for row in (3, 17):
        alone = dataclasses.replace(scenario, workload=dataclasses.replace(
            scenario.workload, layers=result.layer_writes(row)))
        expected = simulate(alone, mtbf_s=3600.0, strategies=["layercheck"], seeds=3).iloc[0]
        assert rated.loc[row, "effective_ratio"] == expected["effective_ratio"]
        assert rated.loc[row, "ci95"] == expected["ci95"]


def test_paper_default_scales_to_the_run_as_the_profiler_does(minilm):
    assert paper_default(1692) == LayerCheckConfig()
    assert paper_default(5000) == LayerCheckConfig()
    scaled = paper_default(minilm.num_steps)
    recorded = recorded_config(minilm)
    assert (scaled.warmup_steps, scaled.smax) == (recorded.warmup_steps, recorded.smax) == (118, 591)


@pytest.mark.parametrize("config", [
    LayerCheckConfig(), LayerCheckConfig(base_threshold=math.inf, smax=50, warmup_steps=10, interval=4),
    LayerCheckConfig(lr_scaling=False, thresholds={"norm": 0.5}, write_budget=2.5e8)])
def test_the_line_to_paste_builds_the_same_config(config):
    line = config_line(config)
    assert eval(line, {"LayerCheckConfig": LayerCheckConfig}) == config


def test_write_bandwidth_says_where_it_comes_from(minilm):
    preset = read_trace(TRACES_DIR / "qwen2.5-7b-synthetic")
    assert write_bandwidth(preset) == (1.24e9, "costs.json lc_write_gbps (derived)")   # sim.costs
    value, source = write_bandwidth(minilm)          # the shipped capture is calibrated
    assert value == minilm.costs.figures["lc_write_gbps"].value * 1e9
    assert source == "costs.json lc_write_gbps (measured)"
    uncalibrated = dataclasses.replace(minilm, costs=None)
    value, source = write_bandwidth(uncalibrated)
    assert value == minilm.manifest["machine"]["write_bytes_per_s"] and "measured" in source
    bare = dataclasses.replace(uncalibrated, manifest={**minilm.manifest, "machine": {}})
    with pytest.raises(SimError, match="--costs"):
        write_bandwidth(bare)
    scenario = Scenario.from_trace(bare, costs=CostModel.paper_a100())
    assert write_bandwidth(bare, scenario)[0] == 1.24e9


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 60),
       special=st.sampled_from([*DRIFT_CASES, "ratio zero"]))
def test_the_compiled_replay_decides_as_the_librarys_lanes(seed, steps, special):
    pytest.importorskip("numba")
    from layercheck.contract.lanes import replay_many
    from sim.engine import compiled_kernel
    from sim.frontier import _replay
    assert compiled_kernel(load=True) is not None, "numba: the sim-fast extra, in both test environments"
    kinds = ["embedding", "block", "block", "norm", "head"]
    rng = np.random.default_rng(seed)
    drift = drift_case(rng, steps, len(kinds), special)
    ratio = rng.uniform(0.0, 1.0, steps)
    if special == "ratio zero":
        ratio[rng.random(steps) < 0.3] = 0.0
    configs = [LayerCheckConfig(base_threshold=k, embedding_threshold=10 * k, smax=smax,
                                warmup_steps=min(smax, 3), interval=interval, lr_scaling=scaled)
               for k in (0.0, 1e-4, 1e-3, math.inf) for smax in (1, 7) for interval in (1, 3)
               for scaled in (True, False)]
    policies = [Policy.from_config(c, [f"l{i}" for i in range(len(kinds))], kinds) for c in configs]
    ours, theirs = _replay(policies, drift, ratio), replay_many(policies, drift, ratio)
    for field in ("reasons", "lane_of", "k_scale", "base_steps"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(theirs, field))
