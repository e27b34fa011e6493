"""The write policy: pure, deterministic, and bounded staleness."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layercheck.config import ConfigError, LayerCheckConfig
from layercheck.policy import Policy, PolicyState, replay


def _policy(n, *, base=1e-3, emb=1e-2, smax=50, warmup=5, interval=1, scaling=True):
    cfg = LayerCheckConfig(base_threshold=base, embedding_threshold=emb, smax=smax,
                           warmup_steps=warmup, interval=interval, lr_scaling=scaling)
    kinds = ["embedding"] + ["block"] * (n - 1)
    return Policy.from_config(cfg, [f"l{i}" for i in range(n)], kinds)


runs = st.tuples(st.integers(1, 6), st.integers(1, 120), st.integers(1, 40), st.integers(0, 40),
                 st.integers(1, 7), st.integers(0, 2**31 - 1))


def _drift(seed, steps, layers):
    rng = np.random.default_rng(seed)
    return rng.exponential(2e-4, size=(steps, layers)) * rng.uniform(0.1, 3, size=layers)


@settings(max_examples=150, deadline=None)
@given(runs, st.sampled_from([0.0, 1e-4, 1e-3, math.inf]))
def test_staleness_never_exceeds_smax_plus_interval(run, base):
    layers, steps, smax, warmup, interval, seed = run
    warmup = min(warmup, smax)
    policy = _policy(layers, base=base, emb=base, smax=smax, warmup=warmup, interval=interval)
    state = PolicyState(policy=policy)
    drift = _drift(seed, steps, layers)
    lr = np.random.default_rng(seed).uniform(0.05, 1.0, size=steps)
    for t in range(1, steps + 1):
        state.observe(t, drift[t - 1], lr[t - 1])
        assert (state.staleness(t) <= smax + interval).all()


@settings(max_examples=100, deadline=None)
@given(runs)
def test_threshold_zero_is_a_full_checkpoint_at_every_opportunity(run):
    layers, steps, smax, warmup, interval, seed = run
    warmup = min(warmup, smax)
    policy = _policy(layers, base=0, emb=0, smax=smax, warmup=warmup, interval=interval)
    decisions = replay(policy, _drift(seed, steps, layers), np.ones(steps))
    for d in decisions:
        opportunity_after_base = d.step % interval == 0 and d.step >= warmup
        assert d.layers.tolist() == (list(range(layers)) if opportunity_after_base else [])


@settings(max_examples=100, deadline=None)
@given(runs)
def test_infinite_threshold_writes_only_what_smax_forces(run):
    layers, steps, smax, warmup, interval, seed = run
    warmup = min(warmup, smax)
    policy = _policy(layers, base=math.inf, emb=math.inf, smax=smax, warmup=warmup, interval=interval)
    last = np.zeros(layers, dtype=int)
    base_done = False
    for d in replay(policy, _drift(seed, steps, layers), np.ones(steps)):
        if d.layers.size and not base_done:
            assert d.is_full
            base_done = True
        elif d.layers.size:
            assert (d.reasons == 2).all()  # smax
            assert (d.step - last[d.layers] >= smax).all()
        last[d.layers] = d.step


def test_threshold_scales_with_learning_rate():
    policy = _policy(2, base=1e-3, emb=1e-2, warmup=0, smax=1000)
    state = PolicyState(policy=policy)
    state.observe(1, np.zeros(2), 1.0)  # base checkpoint
    d = state.observe(2, np.array([6e-4, 6e-4]), 0.5)  # K = 5e-4 for the block, 5e-3 embedding
    assert d.layers.tolist() == [1] and d.reasons.tolist() == [1]
    d = state.observe(3, np.array([0.0, 4e-4]), 1.0)
    assert d.layers.size == 0


def test_replay_is_deterministic():
    policy = _policy(4)
    drift = _drift(3, 200, 4)
    a = replay(policy, drift, np.ones(200))
    b = replay(policy, drift, np.ones(200))
    assert [x.layers.tolist() for x in a] == [x.layers.tolist() for x in b]


def test_per_layer_override_and_unknown_name():
    cfg = LayerCheckConfig(thresholds={"l1": 0.5})
    policy = Policy.from_config(cfg, ["l0", "l1"], ["embedding", "block"])
    assert policy.base.tolist() == [1e-2, 0.5]
    with pytest.raises(KeyError, match="does not have"):
        Policy.from_config(LayerCheckConfig(thresholds={"nope": 1.0}), ["l0"], ["block"])


@pytest.mark.parametrize("kwargs,match", [
    ({"smax": 0}, "smax"), ({"interval": 0}, "interval"), ({"base_threshold": -1}, "base_threshold"),
    ({"warmup_steps": 2000}, "warmup_steps"), ({"on_error": "ignore"}, "on_error"),
    ({"lr_peak": 0.0}, "lr_peak")])
def test_config_rejects_bad_values_and_says_why(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LayerCheckConfig(**kwargs)


def test_config_round_trips_through_dict():
    cfg = LayerCheckConfig(base_threshold=math.inf, thresholds={"a": 0.0}, smax=10, warmup_steps=3)
    assert LayerCheckConfig.from_dict(cfg.to_dict()) == cfg
