import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layercheck.contract.trace import read_trace
from sim import COLUMNS, PRESETS, Scenario, SimError, limit_ratio, simulate, sweep, sweep_figure
from layercheck.contract.calibration import Figure
from sim.presets import TRACES_DIR
from sim.report import ranking_note, ranking_notes

from .conftest import SMALL_COSTS, small_workload

DAY = 86400.0


def test_presets_and_columns():
    assert PRESETS == ("qwen2.5-7b", "qwen2.5-3b", "llama-3.2-1b")
    df = simulate(Scenario.from_preset("llama-3.2-1b", window_s=DAY), mtbf_s=1800.0, seeds=2)
    assert tuple(df.columns) == COLUMNS
    assert list(df.strategy) == ["none", "deepspeed", "checkfreq", "gemini", "lowdiff", "layercheck",
                                 "layercheck-sync", "tiered"]
    assert ((df.effective_ratio > 0) & (df.effective_ratio < 1)).all()
    # useful_s is net of the stale time counted as lost (phi x stale_s), whatever phi is
    parts = df.useful_s + df.stale_lost_s + df.checkpoint_stall_s + df.lost_work_s + df.recovery_s
    np.testing.assert_allclose(parts, DAY)
    assert (df.set_index("strategy").loc[["layercheck", "layercheck-sync"], "stale_s"] > 0).all()


def test_stale_time_is_not_useful_unless_asked():
    s = Scenario.from_preset("llama-3.2-1b", window_s=DAY)
    honest = simulate(s, mtbf_s=1800.0, seeds=2, strategies=["layercheck"]).iloc[0]
    paper = simulate(dataclasses.replace(s, stale_as_useful=True), mtbf_s=1800.0, seeds=2,
                     strategies=["layercheck"]).iloc[0]
    assert paper.stale_s == pytest.approx(honest.stale_s)
    # by default the cost model's phi of the stale time is lost (the measured one, > 1)
    phi = s.stale_figure().value
    assert honest.stale_lost_s == pytest.approx(min(phi * honest.stale_s, paper.useful_s))
    assert honest.stale_lost_s > honest.stale_s
    assert paper.effective_ratio == pytest.approx(honest.effective_ratio
                                                  + honest.stale_lost_s / DAY)
    assert paper.useful_s == pytest.approx(honest.useful_s + honest.stale_lost_s)


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


def test_a_scenarios_schedule_is_the_one_simulate_runs():
    """Scenario.schedule: the strategy's cadence by the protocol (or the override) at the
    MTBF, as simulate uses it; an unknown strategy or one the job cannot run says so."""
    for protocol in ("matched", "native"):
        s = Scenario.from_preset("qwen2.5-7b", protocol=protocol, window_s=DAY)
        row = simulate(s, mtbf_s=1800.0, strategies=["gemini"], seeds=1).iloc[0]
        cadence = s.schedule("gemini", 1800.0).cadence
        assert (cadence.every, cadence.storage_every) == (row["interval"], row["storage_interval"])
    assert Scenario.from_preset("qwen2.5-7b", interval=7).schedule("deepspeed", 1800.0).cadence.every == 7
    assert Scenario.from_preset("qwen2.5-7b").schedule("layercheck", 1800.0).cadence is None
    with pytest.raises(SimError, match="unknown strategy"):
        Scenario.from_preset("qwen2.5-7b").schedule("x", 1800.0)
    with pytest.raises(SimError, match="needs a trace"):
        Scenario.custom(iteration_s=6.0, iterations=100).schedule("layercheck", 1800.0)


def test_a_scenarios_strategies_and_cadences_are_what_its_runs_use():
    """Scenario.strategy_names: the given ones checked and de-duplicated in order (a comma
    list too), else every compared one the job can run; Scenario.cadence: the protocol's,
    or an interval override (the scenario's, else the one given)."""
    s = Scenario.from_preset("qwen2.5-7b", window_s=DAY)
    assert s.strategy_names("gemini, deepspeed,gemini") == ["gemini", "deepspeed"]
    assert s.strategy_names() == list(simulate(s, mtbf_s=1800.0, seeds=1).strategy)
    with pytest.raises(SimError, match="no strategies given"):
        s.strategy_names([])
    assert s.cadence("layercheck", 1800.0) is None
    assert s.cadence("deepspeed", 1800.0, interval="9").every == 9
    assert Scenario.from_preset("qwen2.5-7b", interval=7).cadence("deepspeed", 1800.0).every == 7
    row = sweep(s, mtbf_s=[1800.0], strategies=["deepspeed"], seeds=1, interval=11, limit=False)
    assert row["interval"].tolist() == [11]


# -- the stale cost factor phi -------------------------------------------------------------
def _with_phi_interval(scenario, value=0.5, low=0.0, high=1.0):
    """The scenario with a cost model whose stale cost factor has an interval."""
    record = Figure(value=value, low=low, high=high, source="measured", method="a test's")
    costs = dataclasses.replace(scenario.costs, stale_cost=value,
                                provenance={**scenario.costs.provenance, "stale_cost": record})
    return dataclasses.replace(scenario, costs=costs)


def test_phi_0_is_stale_as_useful_and_phi_1_is_every_stale_update_lost_exactly():
    s = Scenario.from_preset("llama-3.2-1b", window_s=DAY)
    paper = simulate(dataclasses.replace(s, stale_as_useful=True), mtbf_s=1800.0, seeds=3)
    zero = simulate(dataclasses.replace(s, stale_cost=0.0), mtbf_s=1800.0, seeds=3)
    pd.testing.assert_frame_equal(zero, paper, check_exact=True)
    one = simulate(dataclasses.replace(s, stale_cost=1), mtbf_s=1800.0, seeds=3)
    # the accounting before phi: useful = useful_s - stale_s on every lane (byte for byte
    # against the goldens made under it: test_golden), so the phi=0 run's less its stale time
    assert (one.stale_s == zero.stale_s).all() and (one.stale_lost_s == one.stale_s).all()
    assert (zero.stale_lost_s == 0).all()
    np.testing.assert_allclose(one.useful_s, zero.useful_s - zero.stale_s, rtol=1e-14)
    assert (one.set_index("strategy").loc["layercheck", "effective_ratio"]
            < zero.set_index("strategy").loc["layercheck", "effective_ratio"])


def test_a_run_never_trains_backwards_whatever_phi():
    """phi x stale_s above a run's useful time (a high bound's phi, failures more frequent
    than the steps they cost) leaves the run no progress, not a negative ratio."""
    s = _with_phi_interval(Scenario.from_preset("qwen2.5-7b", window_s=DAY), 2.0, 0.5, 50.0)
    df = simulate(s, mtbf_s=1800.0, seeds=2).set_index("strategy")
    lc = df.loc["layercheck"]
    assert lc.ratio_at_phi_high == 0.0 < lc.effective_ratio < lc.ratio_at_phi_low
    assert (df[["effective_ratio", "ratio_at_phi_low", "ratio_at_phi_high"]] >= 0).all().all()
    assert lc.stale_lost_s <= lc.useful_s + lc.stale_lost_s


@settings(max_examples=20, deadline=None)
@given(a=st.floats(-2, 3), b=st.floats(-2, 3))
def test_the_ratio_never_rises_with_phi(a, b):
    s = Scenario(name="small", workload=small_workload(), costs=SMALL_COSTS, window_s=600.0)
    low, high = sorted((a, b))
    at_low = simulate(dataclasses.replace(s, stale_cost=low), mtbf_s=60.0, seeds=2)
    at_high = simulate(dataclasses.replace(s, stale_cost=high), mtbf_s=60.0, seeds=2)
    assert (at_low.effective_ratio >= at_high.effective_ratio).all()
    assert (at_low.useful_s >= at_high.useful_s).all()


def test_the_ratio_at_phis_bounds_is_the_ratio_recomputed_there():
    s = _with_phi_interval(Scenario.from_preset("llama-3.2-1b", window_s=DAY), 0.4, 0.1, 0.9)
    df = simulate(s, mtbf_s=1800.0, seeds=3)
    low = simulate(dataclasses.replace(s, stale_cost=0.1), mtbf_s=1800.0, seeds=3)
    high = simulate(dataclasses.replace(s, stale_cost=0.9), mtbf_s=1800.0, seeds=3)
    assert (df.ratio_at_phi_low == low.effective_ratio).all()
    assert (df.ratio_at_phi_high == high.effective_ratio).all()
    lc = df.set_index("strategy").loc["layercheck"]
    assert lc.ratio_at_phi_low > lc.effective_ratio > lc.ratio_at_phi_high
    assert lc.stale_lost_s == pytest.approx(0.4 * lc.stale_s)
    # strategies without stale layers do not depend on phi
    ds = df.set_index("strategy").loc["deepspeed"]
    assert ds.ratio_at_phi_low == ds.effective_ratio == ds.ratio_at_phi_high
    # a given phi has no interval
    given_phi = simulate(dataclasses.replace(s, stale_cost=0.4), mtbf_s=1800.0, seeds=3)
    assert (given_phi.ratio_at_phi_low == given_phi.effective_ratio).all()
    assert (given_phi.ratio_at_phi_high == given_phi.effective_ratio).all()
    # the sweep and its limit rows carry the bounds too
    curves = sweep(s, mtbf_s=[900.0, 3600.0], seeds=2, strategies=["layercheck"])
    assert curves.ratio_at_phi_low.notna().all() and curves.ratio_at_phi_high.notna().all()
    limit = curves[curves.strategy == "limit"]
    assert (limit.ratio_at_phi_low == limit.effective_ratio).all()


def test_the_stale_figure_in_force_and_its_accounting():
    s = Scenario.from_preset("llama-3.2-1b", window_s=DAY)
    assert s.stale_figure() == s.costs.provenance["stale_cost"]
    assert s.stale_figure().source == "transferred"
    given_phi = dataclasses.replace(s, stale_cost=0.25).stale_figure()
    assert (given_phi.value, given_phi.interval, given_phi.source) == (0.25, (0.25, 0.25), "given")
    assert dataclasses.replace(s, stale_as_useful=True).stale_figure().value == 0.0
    assert "phi = 0 " in dataclasses.replace(s, stale_cost=0).accounting()
    data = _with_phi_interval(s).to_dict()
    assert data["stale_cost"]["low"] == 0.0 and data["stale_cost"]["high"] == 1.0
    assert data["stale_cost"]["source"] == "measured"


@pytest.mark.parametrize("fields,match", [
    ({"stale_cost": float("nan")}, "finite"), ({"stale_cost": "1"}, "finite"),
    ({"stale_cost": True}, "finite"), ({"stale_cost": 0.5, "stale_as_useful": True}, "one of them")])
def test_bad_stale_cost_says_what_to_fix(fields, match):
    with pytest.raises(SimError, match=match):
        Scenario.from_preset("llama-3.2-1b", **fields)


def test_the_ranking_note_says_when_the_first_strategy_depends_on_phi():
    phi = Figure(value=0.5, low=0.0, high=1.0, source="measured", method="m")
    df = pd.DataFrame({"strategy": ["gemini", "layercheck", "limit"],
                       "effective_ratio": [0.80, 0.79, 0.99],
                       "ratio_at_phi_low": [0.80, 0.89, 0.99],
                       "ratio_at_phi_high": [0.80, 0.67, 0.99]})
    assert ranking_note(df, phi) == ("the ranking depends on phi: first at phi 0 (low) is "
                                     "layercheck, at 0.5 gemini, at 1 (high) gemini")
    assert ranking_note(df[df.strategy != "layercheck"], phi) is None
    two = pd.concat([df.assign(mtbf_s=600.0),
                     df.assign(mtbf_s=3600.0, ratio_at_phi_low=[0.80, 0.70, 0.99])])
    assert ranking_notes(two, phi) == ["MTBF 10m: " + ranking_note(df, phi)]


def test_a_replay_of_a_log_gets_the_simulators_cadences_and_peer_loss_draws():
    """What ``python -m profiler validate`` reads to run the same scenario for real: each
    strategy's cadence, and the draws that decide which failures take GEMINI's peer."""
    from sim import FailureModel
    from sim.api import _failure_rows, cadences, primary_loss_draws

    times = (40.0, 95.0, 130.0, 170.0, 230.0)
    s = Scenario.from_preset("llama-3.2-1b", failures=FailureModel.exact_log(times), interval=6,
                             seed=7)
    plans = cadences(s, ["deepspeed", "gemini", "lowdiff", "layercheck"])
    assert plans["deepspeed"].every == plans["gemini"].every == plans["lowdiff"].every == 6
    assert plans["layercheck"] is None and plans["gemini"].storage_every >= 6
    _, uniforms = _failure_rows(s, [None], 1, 300.0)
    np.testing.assert_array_equal(uniforms[0], primary_loss_draws(7, len(times)))
    # a peer lost at every failure (probability 1) or never (0): the draws decide in between
    lost = simulate(dataclasses.replace(s, costs=s.costs.with_overrides(peer_loss_probability=1.0)),
                    mtbf_s=None, seeds=1, window_s=300.0, strategies=["gemini"]).iloc[0]
    kept = simulate(dataclasses.replace(s, costs=s.costs.with_overrides(peer_loss_probability=0.0)),
                    mtbf_s=None, seeds=1, window_s=300.0, strategies=["gemini"]).iloc[0]
    assert lost.effective_ratio < kept.effective_ratio
