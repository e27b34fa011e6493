"""Reading how many steps a run is behind the failure-free one (profiler.convergence)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.convergence import SequenceLosses, decreasing_fit, read_delta, steps_behind


def test_the_fit_pools_a_rise_and_keeps_a_fall():
    np.testing.assert_allclose(decreasing_fit([5, 4, 4.5, 3]), [5, 4.25, 4.25, 3])
    np.testing.assert_allclose(decreasing_fit([3, 2, 1]), [3, 2, 1])
    np.testing.assert_allclose(decreasing_fit([1, 2, 3]), [2, 2, 2])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=30))
def test_the_fit_is_non_increasing_and_keeps_the_mean(y):
    fit = decreasing_fit(y)
    assert np.all(np.diff(fit) <= 1e-9)
    assert np.isclose(fit.mean(), np.mean(y), atol=1e-9)


STEPS = np.array([0, 10, 20, 30, 40])
LOSS = np.array([5.0, 4.0, 3.0, 2.5, 2.0])


def test_a_run_equal_to_the_reference_is_not_behind():
    assert steps_behind(STEPS, LOSS, 30, 0.0) == (0.0, None)


def test_behind_is_read_off_the_earlier_curve_linearly():
    # at step 30 the run shows 3.0 + 0.0: loss 2.5 + 0.5 = 3.0, the reference's at step 20
    assert steps_behind(STEPS, LOSS, 30, 0.5) == (10.0, None)
    # 2.75 lies halfway between steps 20 (3.0) and 30 (2.5): 25
    assert steps_behind(STEPS, LOSS, 30, 0.25) == (5.0, None)


def test_ahead_is_read_off_the_later_curve_and_is_negative():
    assert steps_behind(STEPS, LOSS, 20, -0.5) == (-10.0, None)
    assert steps_behind(STEPS, LOSS, 20, -0.75) == (-15.0, None)


def test_beyond_the_curve_is_censored_with_a_bound():
    assert steps_behind(STEPS, LOSS, 30, -1.0) == (-10.0, "ahead")  # at least 10 ahead
    assert steps_behind(STEPS, LOSS, 30, 5.0) == (30.0, "behind")  # at least 30 behind


def test_a_noisy_reference_is_fitted_before_it_is_read():
    noisy = np.array([5.0, 4.0, 4.2, 2.5, 2.0])  # a bump at step 20
    # fit: 5, 4.1, 4.1, 2.5, 2: at step 30 a gap of +1.6 reaches 4.1 -> the last step at or
    # above it is 20: read at 20
    assert steps_behind(STEPS, noisy, 30, 1.6) == (10.0, None)


def test_a_step_the_reference_did_not_evaluate_is_refused():
    with pytest.raises(KeyError, match="no evaluation at step 15"):
        steps_behind(STEPS, LOSS, 15, 0.1)


def _losses(curve: np.ndarray, noise: np.ndarray, tokens: np.ndarray) -> SequenceLosses:
    """Per-sequence summed losses whose token-weighted mean is ``curve`` plus noise."""
    per_token = curve[:, None] + noise
    return SequenceLosses(STEPS, per_token * tokens[None, :], tokens)


def test_the_interval_covers_the_reading_and_shrinks_with_more_sequences():
    rng = np.random.default_rng(1)
    widths = []
    for n in (20, 2000):
        tokens = rng.integers(5, 15, n).astype(float)
        seq_effect = rng.normal(0, 0.5, n)  # sequences differ; both runs share that
        ref = _losses(LOSS, seq_effect[None, :] + rng.normal(0, 0.05, (5, n)), tokens)
        run = _losses(LOSS + 0.25, seq_effect[None, :] + rng.normal(0, 0.05, (5, n)), tokens)
        reading = read_delta(ref, run, 30, resamples=300, seed=0)
        assert reading.low <= reading.delta <= reading.high
        widths.append(reading.high - reading.low)
        assert reading.gap == pytest.approx(run.curve()[3] - ref.curve()[3])
    assert 0 < widths[1] < widths[0]
    assert abs(reading.delta - 5.0) < 1.0  # 0.25 above at step 30: about step 25


def test_an_identical_run_reads_zero_with_a_zero_interval():
    rng = np.random.default_rng(2)
    tokens = rng.integers(5, 15, 50).astype(float)
    ref = _losses(LOSS, rng.normal(0, 0.3, (5, 50)), tokens)
    reading = read_delta(ref, ref, 30, resamples=100)
    assert (reading.delta, reading.low, reading.high, reading.censored) == (0.0, 0.0, 0.0, None)


def test_runs_on_other_sequences_are_refused():
    ref = SequenceLosses(STEPS, np.ones((5, 3)), np.ones(3))
    other = SequenceLosses(STEPS, np.ones((5, 3)), np.array([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="different held-out sequences"):
        read_delta(ref, other, 30)
    with pytest.raises(ValueError, match="expected"):
        SequenceLosses(STEPS, np.ones((4, 3)), np.ones(3))


def test_sequence_losses_round_trip():
    ref = SequenceLosses(STEPS, np.arange(15.0).reshape(5, 3), np.array([1.0, 2.0, 3.0]))
    back = SequenceLosses.from_dict(ref.to_dict())
    assert np.array_equal(back.loss, ref.loss) and np.array_equal(back.steps, ref.steps)
