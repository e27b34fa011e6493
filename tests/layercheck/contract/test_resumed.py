"""layercheck.contract.resumed: following ``next_writes`` from a restore of step j gives the
writes the policy makes from ``PolicyState.at(j)``, the state ``LayerCheck.restore`` leaves."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layercheck.contract.resumed import next_writes
from layercheck.contract.policy import Policy, PolicyState
from tests.layercheck.contract.test_fastreplay import runs


def _chain(table: np.ndarray, j: int, layer: int) -> list[int]:
    out, s = [], j
    while table[s, layer] <= table.shape[0] - 1:
        s = int(table[s, layer])
        out.append(s)
    return out


def _resumed_writes(policy, drift, lr, j) -> list[list[int]]:
    """The reference: the policy stepped on from the state a restore of j leaves."""
    state = PolicyState.at(policy, j, base_taken=True)
    writes: list[list[int]] = [[] for _ in range(policy.num_layers)]
    for t in range(j + 1, drift.shape[0] + 1):
        for layer in state.observe(t, drift[t - 1], float(lr[t - 1])).layers:
            writes[int(layer)].append(t)
    return writes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.data())
def test_the_chain_from_a_restore_is_the_policy_resumed_there(run, data):
    policy, drift, lr = run
    table = next_writes(policy, drift, lr)
    assert table.shape == (drift.shape[0] + 1, policy.num_layers)
    j = data.draw(st.integers(0, drift.shape[0]))
    expected = _resumed_writes(policy, drift, lr, j)
    assert [_chain(table, j, layer) for layer in range(policy.num_layers)] == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(any_float=True), st.data())
def test_nan_inf_and_negative_drift_resume_as_the_policy_does(run, data):
    policy, drift, lr = run
    j = data.draw(st.integers(0, drift.shape[0]))
    table = next_writes(policy, drift, lr)
    assert [_chain(table, j, layer) for layer in range(policy.num_layers)] == \
        _resumed_writes(policy, drift, lr, j)


def test_a_restore_waits_a_whole_threshold_where_the_uninterrupted_run_would_not():
    # one layer, drift 0.4 a step, threshold 1: written every 3rd step from its last write
    policy = Policy(base=np.array([1.0]), smax=50, warmup_steps=1, interval=1, lr_scaling=False)
    table = next_writes(policy, np.full((12, 1), 0.4), np.ones(12))
    assert table[1, 0] == 4 and table[4, 0] == 7 and table[10, 0] == 13  # 13: past the run
    # restored at 5 (written at 4 in the uninterrupted run, due at 7): next at 8
    assert _chain(table, 5, 0) == [8, 11]


def test_smax_and_the_opportunities_bound_the_wait():
    policy = Policy(base=np.array([np.inf, 0.0]), smax=4, warmup_steps=2, interval=3,
                    lr_scaling=True)
    table = next_writes(policy, np.zeros((12, 2)), np.ones(12))
    # never by drift: the first opportunity (a multiple of 3) at least 4 steps on
    assert table[:, 0].tolist() == [6, 6, 6, 9, 9, 9, 12, 12, 12, 13, 13, 13, 13]
    # threshold 0 and drift 0: A >= K at the first opportunity
    assert table[:, 1].tolist() == [3, 3, 3, 6, 6, 6, 9, 9, 9, 12, 12, 12, 13]


def test_the_budget_s_factor_scales_every_threshold():
    policy = Policy(base=np.array([1.0]), smax=50, warmup_steps=1, interval=1, lr_scaling=False)
    halved = next_writes(policy, np.full((10, 1), 0.4), np.ones(10), k_scale=np.full(10, 0.5))
    assert halved[0, 0] == 2   # 0.8 >= 0.5


def test_bad_shapes_say_which():
    policy = Policy(base=np.ones(2), smax=5, warmup_steps=1, interval=1, lr_scaling=False)
    with pytest.raises(ValueError, match="steps x 2 layers"):
        next_writes(policy, np.zeros((4, 3)), np.ones(4))
    with pytest.raises(ValueError, match="one value per step"):
        next_writes(policy, np.zeros((4, 2)), np.ones(3))
