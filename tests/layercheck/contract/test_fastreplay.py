"""layercheck.contract.fastreplay decides exactly what layercheck.contract.policy.replay decides."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from layercheck.contract.fastreplay import base_step, fast_replay
from layercheck.contract.replayed import NO_WRITE
from layercheck.contract.policy import Policy, replay

# Values that make ties likely (sums of them hit thresholds exactly or within
# one rounding) next to arbitrary floats.
TIE_PRONE = [0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 1.0, 1 / 3, 1e-3, 2e-3, 5e-324]
drift_values = st.one_of(st.sampled_from(TIE_PRONE),
                         st.floats(0, 1, allow_nan=False, allow_infinity=False))
threshold_values = st.one_of(st.sampled_from([0.0, np.inf, 0.3, 0.6, 0.5, 1.0, 1e-3, 0.7]),
                             st.floats(0, 3, allow_nan=False))


@st.composite
def runs(draw, *, any_float: bool = False):
    steps = draw(st.integers(1, 60))
    layers = draw(st.integers(1, 5))
    values = (st.floats(allow_nan=True, allow_infinity=True, width=64) if any_float
              else drift_values)
    drift = draw(arrays(np.float64, (steps, layers), elements=values))
    lr = draw(arrays(np.float64, (steps,), elements=st.one_of(
        st.sampled_from([1.0, 0.5, 0.0, 2.0]), st.floats(0, 2, allow_nan=False))))
    base = draw(arrays(np.float64, (layers,), elements=threshold_values))
    smax = draw(st.integers(1, 70))
    policy = Policy(base=base, smax=smax, warmup_steps=draw(st.integers(0, smax)),
                    interval=draw(st.integers(1, 7)), lr_scaling=draw(st.booleans()))
    return policy, drift, lr


def assert_same(policy, drift, lr, **kwargs):
    expected = replay(policy, drift, lr)
    got = fast_replay(policy, drift, lr, **kwargs).decisions()
    assert len(got) == len(expected)
    for ref, (step, layers, reasons) in zip(expected, got):
        assert step == ref.step
        np.testing.assert_array_equal(layers, ref.layers, err_msg=f"step {step}")
        np.testing.assert_array_equal(reasons, ref.reasons, err_msg=f"step {step}")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.sampled_from(["auto", "windowed"]), st.integers(1, 20))
def test_same_decisions_as_reference(run, method, window):
    assert_same(*run, method=method, window=window)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(any_float=True), st.integers(1, 20))
def test_same_decisions_for_any_float_drift(run, window):
    """NaN, inf and negative drift: the certified method declines, the windowed one is exact."""
    assert_same(*run, window=window)


@pytest.mark.parametrize("scale", [1e-3, 1e-4, 0.0, np.inf])
@pytest.mark.parametrize("interval", [1, 4])
def test_long_run_with_lr_schedule(scale, interval):
    """A realistic shape: 31 layers, warm-up then cosine decay, layers drifting at different rates."""
    rng = np.random.default_rng(7)
    steps, layers = 3000, 31
    drift = rng.gamma(2.0, 1e-5, size=(steps, layers)) * rng.uniform(0.3, 3, size=layers)
    t = np.arange(1, steps + 1)
    lr = np.where(t < 100, t / 100, 0.5 * (1 + np.cos(np.pi * (t - 100) / (steps - 100))))
    policy = Policy(base=np.full(layers, scale), smax=400, warmup_steps=100,
                    interval=interval, lr_scaling=True)
    assert_same(policy, drift, lr)
    assert fast_replay(policy, drift, lr).method == "certified"


def test_near_ties_are_resolved_exactly():
    """0.1 + 0.2 + 0.3 summed left to right is 0.6000000000000001, not 0.6: a
    threshold of exactly that value is reached only by the running sum."""
    drift = np.array([[0.1], [0.2], [0.3], [0.1], [0.2], [0.3]] * 5)
    lr = np.ones(len(drift))
    for k in (0.6, 0.1 + 0.2 + 0.3, np.nextafter(0.6000000000000001, 1)):
        policy = Policy(base=np.array([k]), smax=100, warmup_steps=1, interval=1, lr_scaling=False)
        assert_same(policy, drift, lr, method="certified")


def test_no_base_checkpoint_when_the_run_ends_in_warmup():
    policy = Policy(base=np.ones(2), smax=50, warmup_steps=20, interval=1, lr_scaling=True)
    out = fast_replay(policy, np.ones((10, 2)), np.ones(10))
    assert base_step(policy, 10) is None
    assert (out.reasons == NO_WRITE).all()


def test_bad_shapes_say_what_is_expected():
    policy = Policy(base=np.ones(3), smax=5, warmup_steps=0, interval=1, lr_scaling=True)
    with pytest.raises(ValueError, match="steps x 3 layers"):
        fast_replay(policy, np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match="one value per step"):
        fast_replay(policy, np.ones((4, 3)), np.ones(5))
    with pytest.raises(ValueError, match="1..62"):
        fast_replay(policy, np.ones((4, 3)), np.ones(4), window=99)
