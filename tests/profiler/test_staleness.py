"""Parameter-weighted staleness and the choice of failure steps."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.staleness import failure_steps, weighted_staleness


def test_staleness_by_hand():
    # 2 layers (params 1 and 3); base at step 2; layer 1 rewritten at step 4
    written = np.array([[0, 0], [1, 1], [0, 0], [0, 1], [0, 0]], dtype=bool)
    s = weighted_staleness(written, np.array([1, 3]))
    assert np.isnan(s[0])
    # t=2: 0; t=3: 1; t=4: (2*1 + 0*3)/4; t=5: (3*1 + 1*3)/4
    np.testing.assert_allclose(s[1:], [0.0, 1.0, 0.5, 1.5])


def test_failure_steps_pick_the_stalest_step_per_window():
    s = np.array([np.nan, 0, 1, 2, 0, 1, 0.5, 3, 4.0])  # the last step is never chosen
    assert failure_steps(s, 1) == [8]
    assert failure_steps(s, 2) == [4, 8]
    with pytest.raises(ValueError, match="need"):
        failure_steps(s, 9)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 30), st.integers(1, 5), st.data())
def test_staleness_is_bounded_by_the_oldest_layer(steps, layers, data):
    bits = data.draw(st.lists(st.booleans(), min_size=steps * layers, max_size=steps * layers))
    written = np.array(bits, dtype=bool).reshape(steps, layers)
    written[0] = True  # a base at step 1
    params = np.array(data.draw(st.lists(st.integers(1, 100), min_size=layers, max_size=layers)))
    s = weighted_staleness(written, params)
    last = np.maximum.accumulate(np.where(written, np.arange(1, steps + 1)[:, None], 0), axis=0)
    oldest = (np.arange(1, steps + 1) - last.min(axis=1))
    assert np.all(s >= 0) and np.all(s <= oldest + 1e-9)
    assert np.all(s[written.all(axis=1)] == 0)
