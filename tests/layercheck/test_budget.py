"""layercheck.contract.budget: the write budget's controller keeps the rate, Smax keeps the staleness."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layercheck.contract import budget
from layercheck.contract.config import ConfigError, LayerCheckConfig
from layercheck.contract.lanes import replay_many
from layercheck.contract.policy import Policy, PolicyState, replay
from layercheck.contract.trace import last_written, read_trace


def _run(steps=3000, layers=8, seed=0):
    rng = np.random.default_rng(seed)
    drift = rng.gamma(2.0, 5e-5, size=(steps, layers)) * np.geomspace(3, 0.1, layers)
    t = np.arange(1, steps + 1)
    lr = np.where(t < 100, t / 100, 0.5 * (1 + np.cos(np.pi * (t - 100) / (steps - 100))) + 0.05)
    return drift, lr


def _policy(layers, *, write_budget=None, smax=1000, warmup=100, interval=1, base=1e-3):
    return Policy(base=np.full(layers, base), smax=smax, warmup_steps=warmup, interval=interval,
                  lr_scaling=True, write_budget=write_budget,
                  sizes=np.linspace(1e6, 4e6, layers).round())


def _rate(policy, drift, lr):
    """Bytes per step after the base checkpoint, base excluded; and the decisions."""
    decisions = replay(policy, drift, lr)
    base = policy.base_step
    spent = sum(policy.sizes[d.layers].sum() for d in decisions if d.step > base)
    return spent / (len(drift) - base), decisions


def test_scale_doubles_every_eight_levels_and_is_one_at_zero():
    assert budget.scale(0) == 1.0
    assert budget.scale(budget.STEPS_PER_DOUBLING) == 2.0
    assert budget.scale(-budget.MAX_LEVEL) == 2.0 ** -20
    np.testing.assert_array_equal(budget.scale(np.array([0, 8])), [1.0, 2.0])


def test_level_moves_one_step_and_stays_in_range():
    assert budget.next_level(0, 5.0) == 1 and budget.next_level(0, 0.0) == -1
    assert budget.next_level(budget.MAX_LEVEL, 1.0) == budget.MAX_LEVEL
    assert budget.next_level(-budget.MAX_LEVEL, -1.0) == -budget.MAX_LEVEL


@pytest.mark.parametrize("fraction", [0.3, 0.6, 1.0, 2.0])
def test_the_realised_rate_meets_the_budget(fraction):
    """Budgets from a third to twice what fixed thresholds write: within 3%."""
    drift, lr = _run()
    free, _ = _rate(_policy(8), drift, lr)
    target = free * fraction
    got, decisions = _rate(_policy(8, write_budget=target), drift, lr)
    assert got <= target * 1.03
    assert got >= target * 0.9            # and it uses what it is given
    assert len({d.k_scale for d in decisions}) > 5


def test_a_budget_below_what_smax_forces_keeps_staleness_bounded():
    drift, lr = _run(steps=1500)
    policy = _policy(8, write_budget=1.0, smax=200)            # one byte per step: impossible
    state = PolicyState(policy=policy)
    for t in range(1, len(drift) + 1):
        state.observe(t, drift[t - 1], lr[t - 1])
        assert (state.staleness(t) <= policy.smax + policy.interval - 2).all()
    assert state.level == budget.MAX_LEVEL                     # thresholds as high as they go


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(20, 300), st.integers(1, 60), st.integers(1, 5),
       st.floats(1.0, 1e8), st.integers(0, 2**31 - 1))
def test_staleness_bound_holds_under_any_budget(layers, steps, smax, interval, target, seed):
    drift, lr = _run(steps=steps + 100, layers=layers, seed=seed)
    policy = _policy(layers, write_budget=target, smax=smax, warmup=min(smax, 10), interval=interval)
    state = PolicyState(policy=policy)
    for t in range(1, len(drift) + 1):
        assert (state.staleness(t) <= smax + interval - 1).all()
        state.observe(t, drift[t - 1], lr[t - 1])


def test_without_a_budget_nothing_changes():
    drift, lr = _run(steps=400)
    for d in replay(_policy(8), drift, lr):
        assert d.k_scale == 1.0


def test_config_and_policy_say_what_is_missing():
    with pytest.raises(ConfigError, match="positive number of bytes per step"):
        LayerCheckConfig(write_budget=0)
    with pytest.raises(ConfigError, match="positive number of bytes per step"):
        LayerCheckConfig(write_budget=float("inf"))
    assert LayerCheckConfig.from_dict(LayerCheckConfig(write_budget=2e9).to_dict()).write_budget == 2e9
    with pytest.raises(ValueError, match="whole byte count"):
        Policy(base=np.ones(2), smax=5, warmup_steps=0, interval=1, lr_scaling=True,
               sizes=np.array([1.5, 2.0]))
    policy = Policy(base=np.ones(2), smax=5, warmup_steps=0, interval=1, lr_scaling=True,
                    write_budget=10.0)
    with pytest.raises(ValueError, match="needs the layers' sizes"):
        replay(policy, np.ones((3, 2)), np.ones(3))
    cfg = LayerCheckConfig(write_budget=5e8)
    sized = Policy.from_config(cfg, ["a", "b"], ["block", "block"], sizes=[10, 20])
    assert sized.write_budget == 5e8 and sized.sizes.tolist() == [10.0, 20.0]


@pytest.mark.parametrize("name", ["minilm-1000steps", "qwen2.5-7b-synthetic"])
def test_budget_mode_on_the_shipped_capture_and_the_7b_preset(name):
    """The shipped traces' own drift, their recorded setting at half what it writes per
    step: within 3% of the budget, staleness still bounded by Smax, and the lanes twin
    takes the same decisions with the same factors."""
    trace = read_trace(Path(__file__).resolve().parents[2] / "traces" / name)
    config = LayerCheckConfig.from_dict(trace.manifest["config"])
    kinds, sizes = list(trace.layers["kind"]), trace.budget_sizes
    drift, lr = trace.drift_matrix(), np.nan_to_num(trace.lr_ratio(), nan=1.0)

    def written(policy):
        out = np.zeros(drift.shape, dtype=bool)
        decisions = replay(policy, drift, lr)
        for d in decisions:
            out[d.step - 1, d.layers] = True
        return out, decisions

    free = Policy.from_config(config, trace.layer_names, kinds, sizes=sizes)
    base = free.base_step
    target = 0.5 * (written(free)[0][base:] @ sizes).sum() / (trace.num_steps - base)
    held = Policy.from_config(dataclasses.replace(config, write_budget=target), trace.layer_names,
                              kinds, sizes=sizes)
    got, decisions = written(held)
    rate = (got[base:] @ sizes).sum() / (trace.num_steps - base)
    assert target * 0.9 <= rate <= target * 1.03
    oldest = np.arange(1, trace.num_steps + 1)[base:, None] - last_written(got)[base:]
    assert oldest.max() <= held.smax + held.interval - 1
    twin = replay_many([held], drift, lr).replayed(0)
    np.testing.assert_array_equal(twin.reasons >= 0, got)
    np.testing.assert_array_equal(twin.k_scale, [d.k_scale for d in decisions])
