import dataclasses

import numpy as np
import pytest

from layercheck.trace import read_trace
from sim import COLUMNS, PRESETS, Scenario, SimError, limit_ratio, simulate, sweep, sweep_figure
from sim.presets import TRACES_DIR

DAY = 86400.0


def test_presets_and_columns():
    assert PRESETS == ("qwen2.5-7b", "qwen2.5-3b", "llama-3.2-1b")
    df = simulate(Scenario.from_preset("llama-3.2-1b", window_s=DAY), mtbf_s=1800.0, seeds=2)
    assert tuple(df.columns) == COLUMNS
    assert list(df.strategy) == ["none", "deepspeed", "checkfreq", "gemini", "lowdiff", "layercheck",
                                 "layercheck-sync"]
    assert ((df.effective_ratio > 0) & (df.effective_ratio < 1)).all()
    parts = df.useful_s + df.stale_s + df.checkpoint_stall_s + df.lost_work_s + df.recovery_s
    np.testing.assert_allclose(parts, DAY)
    assert (df.set_index("strategy").loc[["layercheck", "layercheck-sync"], "stale_s"] > 0).all()


def test_stale_time_is_not_useful_unless_asked():
    s = Scenario.from_preset("llama-3.2-1b", window_s=DAY)
    honest = simulate(s, mtbf_s=1800.0, seeds=2, strategies=["layercheck"]).iloc[0]
    paper = simulate(dataclasses.replace(s, stale_as_useful=True), mtbf_s=1800.0, seeds=2,
                     strategies=["layercheck"]).iloc[0]
    assert paper.stale_s == pytest.approx(honest.stale_s)
    assert paper.effective_ratio == pytest.approx(honest.effective_ratio + honest.stale_s / DAY)
    assert paper.useful_s == pytest.approx(honest.useful_s + honest.stale_s)


def test_from_trace_takes_its_own_costs():
    trace = read_trace(TRACES_DIR / "qwen2.5-3b-synthetic")
    scenario = Scenario.from_trace(trace, window_s=DAY)
    assert scenario.workload.steps == trace.num_steps
    assert scenario.workload.full_bytes == trace.full_checkpoint_bytes
    assert scenario.costs.diff_fraction == trace.costs.figures["diff_fraction"].value
    assert scenario.costs.provenance["diff_fraction"].source == "derived"
    df = simulate(scenario, mtbf_s=3600.0, strategies=["deepspeed", "layercheck"], seeds=2)
    assert list(df.strategy) == ["deepspeed", "layercheck"]


def test_a_captured_trace_without_costs_says_how_to_measure_them():
    trace = read_trace(TRACES_DIR / "qwen2.5-3b-synthetic")
    captured = dataclasses.replace(trace, costs=None, manifest={**trace.manifest, "kind": "captured"})
    with pytest.raises(SimError, match="profiler calibrate"):
        Scenario.from_trace(captured)


def test_no_failures_gives_useful_over_useful_plus_overhead():
    """A window of whole jobs and no failures: ratio = N t / (N t + checkpoint stalls)."""
    step, n, k, c = 6.0, 1000, 100, 45.0
    jobs = 3
    checkpoints = len(range(k, n, k))
    wall = jobs * (n * step + checkpoints * c)
    s = Scenario.custom(iteration_s=step, iterations=n, checkpoint_gb=100.0, checkpoint_s=c,
                        interval=k, window_s=wall)
    df = simulate(s, mtbf_s=1e15, strategies=["none", "deepspeed"], seeds=1).set_index("strategy")
    assert df.loc["deepspeed", "effective_ratio"] == pytest.approx(n * step / (n * step + checkpoints * c),
                                                                   rel=1e-12)
    assert df.loc["deepspeed", "failures"] == 0
    assert df.loc["none", "effective_ratio"] == 1.0


def test_layercheck_without_failures_pays_only_its_tracking_in_warm_up():
    """Before the base checkpoint (step 200) LayerCheck writes nothing: each step costs
    compute x (1 + tracking fraction) and nothing else."""
    s = Scenario.from_preset("llama-3.2-1b")
    assert s.workload.layers.base_step == 200
    steps = s.workload.compute_s[:199]
    window = steps.sum() * (1 + s.costs.tracking_fraction)
    row = simulate(s, mtbf_s=1e15, strategies=["layercheck"], seeds=1, window_s=window).iloc[0]
    assert row.effective_ratio == pytest.approx(1 / (1 + s.costs.tracking_fraction), rel=1e-9)


@pytest.mark.parametrize("protocol", ["matched", "native"])
def test_simpy_engine_equals_the_fast_engine(protocol):
    s = Scenario.from_preset("llama-3.2-1b", window_s=0.5 * DAY, protocol=protocol)
    fast = simulate(s, mtbf_s=1800.0, seeds=2)
    slow = simulate(s, mtbf_s=1800.0, seeds=2, engine="simpy")
    assert list(fast.strategy) == list(slow.strategy)
    for column in COLUMNS[1:-2]:
        np.testing.assert_allclose(slow[column], fast[column], rtol=1e-9, atol=1e-6, err_msg=column)


def test_sweep_long_format_with_limit():
    s = Scenario.from_preset("llama-3.2-1b", window_s=2 * DAY)
    df = sweep(s, mtbf_s=[600.0, 3600.0], strategies=["deepspeed", "layercheck"], seeds=3)
    assert set(df.strategy) == {"deepspeed", "layercheck", "limit"}
    assert len(df) == 6 and {"mtbf_s", *COLUMNS} <= set(df.columns)
    assert limit_ratio(s, 3600.0) == pytest.approx(np.exp(-s.costs.restart_s / 3600.0))
    fig = sweep_figure(df)
    names = [t.name for t in fig.data if t.name]
    assert "limit (perfect checkpointer)" in names and "layercheck" in names


@pytest.mark.parametrize("kwargs,match", [
    ({"mtbf_s": -1.0}, "positive"), ({"mtbf_s": 60.0, "strategies": ["x"]}, "unknown strategy"),
    ({"mtbf_s": 60.0, "seeds": 0}, "seeds"), ({"mtbf_s": None}, "mtbf"),
    ({"mtbf_s": 60.0, "engine": "turbo"}, "engine")])
def test_bad_calls_say_what_to_fix(kwargs, match):
    with pytest.raises(SimError, match=match):
        simulate(Scenario.from_preset("llama-3.2-1b", window_s=DAY), **kwargs)


def test_custom_scenario_cannot_run_layercheck():
    s = Scenario.custom(iteration_s=6.0, iterations=100)
    assert "layercheck" not in s.available()
    assert s.protocol == "native"
    with pytest.raises(SimError, match="needs a trace"):
        simulate(s, mtbf_s=3600.0, strategies=["layercheck"])
    with pytest.raises(SimError, match="protocol"):
        Scenario.custom(iteration_s=6.0, iterations=100, protocol="fair")
