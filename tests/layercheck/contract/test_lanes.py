"""layercheck.contract.lanes: many policies at once, each decided exactly as layercheck.contract.policy.replay decides."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from layercheck.contract.fastreplay import fast_replay
from layercheck.contract.lanes import replay_many
from layercheck.contract.policy import Policy, replay

from .test_fastreplay import drift_values, threshold_values


def assert_same(policy, drift, lr, got):
    """``got`` (a Replayed) holds the reference's decisions and threshold factors."""
    expected = replay(policy, drift, lr)
    decisions = got.decisions()
    assert len(decisions) == len(expected)
    scales = got.k_scales()
    for ref, (step, layers, reasons) in zip(expected, decisions):
        np.testing.assert_array_equal(layers, ref.layers, err_msg=f"step {step}")
        np.testing.assert_array_equal(reasons, ref.reasons, err_msg=f"step {step}")
        assert scales[step - 1] == ref.k_scale, f"step {step}"


@st.composite
def policy_sets(draw, *, any_float: bool = False):
    """One run and several policies over it, some with a write budget."""
    steps, layers = draw(st.integers(1, 80)), draw(st.integers(1, 5))
    values = st.floats(allow_nan=True, allow_infinity=True, width=64) if any_float else drift_values
    drift = draw(arrays(np.float64, (steps, layers), elements=values))
    lr = draw(arrays(np.float64, (steps,), elements=st.one_of(
        st.sampled_from([1.0, 0.5, 0.0, 2.0]), st.floats(0, 2, allow_nan=False))))
    sizes = draw(arrays(np.float64, (layers,), elements=st.integers(0, 10**12).map(float)))
    policies = []
    for _ in range(draw(st.integers(1, 6))):
        smax = draw(st.integers(1, 70))
        budget = draw(st.one_of(st.none(), st.floats(1.0, 3e12)))
        policies.append(Policy(
            base=draw(arrays(np.float64, (layers,), elements=threshold_values)), smax=smax,
            warmup_steps=draw(st.integers(0, smax)), interval=draw(st.integers(1, 7)),
            lr_scaling=draw(st.booleans()), write_budget=budget,
            sizes=sizes if budget is not None or draw(st.booleans()) else None))
    # Repeat a policy: equal lanes are merged, and must still answer for both.
    policies.append(policies[0])
    return policies, drift, lr


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_sets())
def test_every_policy_decides_as_the_reference(case):
    policies, drift, lr = case
    lanes = replay_many(policies, drift, lr)
    for s, policy in enumerate(policies):
        assert_same(policy, drift, lr, lanes.replayed(s))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_sets(any_float=True))
def test_any_float_drift_too(case):
    """NaN, inf and negative drift: the lanes do the reference's arithmetic, so they agree."""
    policies, drift, lr = case
    lanes = replay_many(policies, drift, lr)
    for s, policy in enumerate(policies):
        assert_same(policy, drift, lr, lanes.replayed(s))


def test_budgeted_fast_replay_is_the_lanes_replay():
    rng = np.random.default_rng(3)
    drift = rng.gamma(2.0, 1e-4, size=(500, 6)) * rng.uniform(0.3, 3, size=6)
    lr = np.linspace(1.0, 0.1, 500)
    policy = Policy(base=np.full(6, 1e-3), smax=200, warmup_steps=50, interval=1,
                    lr_scaling=True, write_budget=2000.0, sizes=np.full(6, 1000.0))
    got = fast_replay(policy, drift, lr)
    assert got.method == "lanes"
    assert_same(policy, drift, lr, got)
    assert len(set(got.k_scales())) > 3          # the controller did move the thresholds


def test_equal_settings_share_lanes():
    """A layer's lane depends only on its own threshold, Smax, interval and base step:
    80 settings of a 31-layer model whose 30 blocks share one threshold need
    30 x 40 + 1 x 8 lanes, not 80 x 31."""
    policies = [Policy(base=np.array([e] + [k] * 30), smax=sm, warmup_steps=20, interval=iv,
                       lr_scaling=True)
                for k in np.geomspace(1e-5, 1e-1, 10) for e in (1e-3, 1e-2) for sm in (50, 100)
                for iv in (1, 2)]
    drift = np.random.default_rng(0).gamma(2.0, 1e-4, size=(120, 31))
    lanes = replay_many(policies, drift, np.ones(120))
    assert lanes.reasons.shape[1] == 30 * 40 + 8
    for s in (0, 17, 79):
        assert_same(policies[s], drift, np.ones(120), lanes.replayed(s))


def test_errors_say_what_is_wrong():
    p = Policy(base=np.ones(3), smax=5, warmup_steps=0, interval=1, lr_scaling=True)
    with pytest.raises(ValueError, match="at least one policy"):
        replay_many([], np.ones((4, 3)), np.ones(4))
    with pytest.raises(ValueError, match="steps x 3 layers"):
        replay_many([p], np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match="same model"):
        replay_many([p, Policy(base=np.ones(2), smax=5, warmup_steps=0, interval=1,
                               lr_scaling=True)], np.ones((4, 3)), np.ones(4))
    with pytest.raises(ValueError, match="needs sizes"):
        replay_many([Policy(base=np.ones(3), smax=5, warmup_steps=0, interval=1, lr_scaling=True,
                            write_budget=10.0)], np.ones((4, 3)), np.ones(4))
