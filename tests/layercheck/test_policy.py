"""The write policy: pure, deterministic, and bounded staleness."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layercheck.contract.config import ConfigError, LayerCheckConfig
from layercheck.contract.policy import Policy, PolicyState, Reason, replay


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
        # at step t, before its decision: the step a forced write happens at most
        assert (state.staleness(t) <= smax + interval - 1).all()
        state.observe(t, drift[t - 1], lr[t - 1])
        # after it (what a failure right after step t restores): one less, and no slack
        assert (state.staleness(t) <= smax + interval - 2).all()


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
            # at the first opportunity at which the age reaches smax, not one later
            assert (d.step - last[d.layers] >= smax).all()
            assert (d.step - last[d.layers] < smax + interval).all()
        last[d.layers] = d.step


def test_threshold_scales_with_learning_rate():
    policy = _policy(2, base=1e-3, emb=1e-2, warmup=0, smax=1000)
    state = PolicyState(policy=policy)
    state.observe(1, np.zeros(2), 1.0)  # base checkpoint
    d = state.observe(2, np.array([6e-4, 6e-4]), 0.5)  # K = 5e-4 for the block, 5e-3 embedding
    assert d.layers.tolist() == [1] and d.reasons.tolist() == [1]
    d = state.observe(3, np.array([0.0, 4e-4]), 1.0)
    assert d.layers.size == 0


# -- exact ties: K and smax are inclusive bounds -----------------------------------------
# Powers of two: every sum and product below is exact in binary floating point, so an
# accumulator can equal K to the last bit.
K = 2.0 ** -10


@pytest.mark.parametrize("scaling,lr_ratio", [(True, 1.0), (True, 0.5), (True, 0.25),
                                              (False, 1.0), (False, 0.5)])
def test_an_accumulator_exactly_at_k_is_written(scaling, lr_ratio):
    policy = _policy(2, base=K, emb=8 * K, smax=1000, warmup=1, scaling=scaling)
    k = K * lr_ratio if scaling else K
    state = PolicyState(policy=policy)
    state.observe(1, np.zeros(2), lr_ratio)  # the base checkpoint
    d = state.observe(2, np.array([0.0, k / 2]), lr_ratio)
    assert d.layers.size == 0 and state.accumulators[1] == k / 2
    d = state.observe(3, np.array([0.0, k / 2]), lr_ratio)  # A == K, to the last bit
    assert d.layers.tolist() == [1] and d.reasons.tolist() == [1]
    assert state.accumulators[1] == 0.0


@pytest.mark.parametrize("scaling,lr_ratio", [(True, 0.5), (False, 1.0)])
def test_an_accumulator_one_ulp_below_k_is_not_written(scaling, lr_ratio):
    policy = _policy(2, base=K, emb=8 * K, smax=1000, warmup=1, scaling=scaling)
    k = K * lr_ratio if scaling else K
    state = PolicyState(policy=policy)
    state.observe(1, np.zeros(2), lr_ratio)
    d = state.observe(2, np.array([np.nextafter(8 * k, 0.0), np.nextafter(k, 0.0)]), lr_ratio)
    assert d.layers.size == 0  # (the embedding's K is 8k)


@pytest.mark.parametrize("smax,warmup,interval,writes", [
    (7, 2, 1, [2, 9, 16, 23, 30]),   # the age reaches smax at 9: written at 9, not 10
    (6, 3, 3, [3, 9, 15, 21, 27]),   # the age reaches smax on an opportunity
    (7, 3, 3, [3, 12, 21, 30]),      # it reaches smax at 10, between opportunities
    (1, 0, 1, list(range(1, 31))),   # smax 1: every step
])
def test_smax_forces_a_write_exactly_when_the_age_reaches_it(smax, warmup, interval, writes):
    policy = _policy(2, base=math.inf, emb=math.inf, smax=smax, warmup=warmup,
                     interval=interval)
    decisions = replay(policy, np.full((30, 2), 1.0), np.ones(30))
    assert [d.step for d in decisions if d.layers.size] == writes
    assert all(d.reasons.tolist() == [2, 2] for d in decisions[writes[0]:] if d.layers.size)
    # the staleness bound of the module doc is reached, not merely respected
    state = PolicyState(policy=policy)
    worst = 0
    for t in range(1, 31):
        state.observe(t, np.zeros(2), 1.0)
        worst = max(worst, int(state.staleness(t).max()))
    assert worst == max(b - a for a, b in zip([0, *writes], writes)) - 1


# -- replay against a reference written out plainly ---------------------------------------
def _reference_decisions(thresholds, smax, warmup, interval, scaling, drift, lr):
    """The module contract for each layer on its own, in plain Python floats:
    [(step, [(layer, reason), ...]), ...] for the steps that write something.
    ``thresholds``: the base threshold of each layer."""
    steps, layers = len(drift), len(thresholds)
    acc, last, base_done, out = [0.0] * layers, [0] * layers, False, []
    for t in range(1, steps + 1):
        for l in range(layers):
            acc[l] = acc[l] + float(drift[t - 1][l])
        written = []
        if t % interval == 0 and not base_done and t >= warmup:
            base_done = True
            written = [(l, "base") for l in range(layers)]
        elif t % interval == 0 and base_done:
            for l in range(layers):
                b = thresholds[l]
                k = b if not scaling or math.isinf(b) else b * float(lr[t - 1])
                if acc[l] >= k:
                    written.append((l, "threshold"))
                elif t - last[l] >= smax:
                    written.append((l, "smax"))
        for l, _ in written:
            acc[l], last[l] = 0.0, t
        if written:
            out.append((t, written))
    return out


def _replayed(policy, drift, lr):
    return [(d.step, [(int(l), Reason(r).label) for l, r in zip(d.layers, d.reasons)])
            for d in replay(policy, drift, lr) if d.layers.size]


# drift in whole multiples of 2^-12 and thresholds of 2^-10 or 2^-9: exact ties are common
dyadic_runs = st.tuples(st.integers(1, 5), st.integers(1, 80), st.integers(1, 30),
                        st.integers(0, 30), st.integers(1, 5), st.integers(0, 2**31 - 1),
                        st.booleans(), st.sampled_from([0.0, 2.0 ** -10, 2.0 ** -9, math.inf]))


@settings(max_examples=200, deadline=None)
@given(dyadic_runs)
def test_replay_equals_a_plain_reference_at_exact_ties(run):
    layers, steps, smax, warmup, interval, seed, scaling, base = run
    warmup = min(warmup, smax)
    rng = np.random.default_rng(seed)
    drift = rng.integers(0, 5, size=(steps, layers)) * 2.0 ** -12
    lr = rng.choice([1.0, 0.5, 0.25], size=steps)
    policy = _policy(layers, base=base, emb=2 * base, smax=smax, warmup=warmup,
                     interval=interval, scaling=scaling)
    thresholds = [2 * base] + [base] * (layers - 1)  # _policy: layer 0 is the embedding
    assert _replayed(policy, drift, lr) == _reference_decisions(
        thresholds, smax, warmup, interval, scaling, drift, lr)


@settings(max_examples=100, deadline=None)
@given(runs, st.booleans())
def test_replay_equals_a_plain_reference(run, scaling):
    layers, steps, smax, warmup, interval, seed = run
    warmup = min(warmup, smax)
    drift = _drift(seed, steps, layers)
    lr = np.random.default_rng(seed + 1).uniform(0.0, 1.0, size=steps)
    policy = _policy(layers, smax=smax, warmup=warmup, interval=interval, scaling=scaling)
    thresholds = [1e-2] + [1e-3] * (layers - 1)  # _policy's defaults: embedding, blocks
    reference = _reference_decisions(thresholds, smax, warmup, interval, scaling, drift, lr)
    assert _replayed(policy, drift, lr) == reference


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


# -- the rest of the contract: sizes, thresholds, decisions, bad input -------------------
def _bare(n=2, **kwargs):
    fields = dict(base=np.full(n, K), smax=1000, warmup_steps=1, interval=1, lr_scaling=True)
    return Policy(**{**fields, **kwargs})


def test_sizes_are_whole_byte_counts_from_zero_and_cannot_change_afterwards():
    policy = _bare(3, sizes=[0, 7, 2**40])  # a layer of zero bytes is a valid size
    assert policy.sizes.tolist() == [0.0, 7.0, 2.0 ** 40]
    with pytest.raises(ValueError):  # the policy is frozen, its sizes too
        policy.sizes[0] = 5
    assert policy.sizes.tolist() == [0.0, 7.0, 2.0 ** 40]
    for bad in ([-1, 1, 1], [1, 1], [1, 1, math.inf], [1, 1, math.nan], [1, 1, 0.5]):
        with pytest.raises(ValueError, match="whole byte count >= 0 per layer"):
            _bare(3, sizes=bad)


def test_thresholds_for_an_array_of_ratios_are_steps_by_layers():
    for scaling in (True, False):
        policy = _bare(2, base=np.array([K, 4 * K]), lr_scaling=scaling)
        ratios = np.array([1.0, 0.5, 0.25])
        k = policy.thresholds(ratios)
        assert k.shape == (3, 2)
        expected = np.outer(ratios if scaling else np.ones(3), [K, 4 * K])
        assert (k == expected).all()
        assert (policy.thresholds(0.5) == expected[1 if scaling else 0]).all()


def test_an_infinite_threshold_stays_infinite_at_a_zero_learning_rate_without_a_warning():
    import warnings
    policy = _bare(2, base=np.array([math.inf, 0.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf * 0 must not surface as a RuntimeWarning
        assert policy.thresholds(0.0).tolist() == [math.inf, 0.0]
        assert policy.thresholds(np.array([0.0, 1.0])).tolist() == [[math.inf, 0.0], [math.inf, 0.0]]
    state = PolicyState(policy=policy)
    state.observe(1, np.zeros(2), 0.0)  # the base checkpoint
    d = state.observe(2, np.array([1.0, 0.0]), 0.0)  # a huge drift never reaches an infinite K
    assert d.layers.tolist() == [1]


def test_decisions_hold_integer_layers_and_reasons_at_every_kind_of_step():
    policy = _bare(2, warmup_steps=4, interval=2)
    state = PolicyState(policy=policy)
    steps = [state.observe(t, np.array([2 * K, 0.0]), 1.0) for t in range(1, 7)]
    # 1: no opportunity; 2: before the warm-up; 4: base; 5: none; 6: threshold for layer 0
    for d in steps:
        assert d.layers.dtype.kind == d.reasons.dtype.kind == "i"
        assert d.k_scale == 1.0
    assert [d.layers.tolist() for d in steps] == [[], [], [], [0, 1], [], [0]]
    assert [d.reasons.tolist() for d in steps] == [[], [], [], [0, 0], [], [1]]
    assert [d.is_full for d in steps] == [False, False, False, True, False, False]
    assert state.staleness(6).dtype.kind == "i" and state.staleness(6).tolist() == [0, 2]


def test_every_decision_reports_the_budget_scale_of_its_step():
    from layercheck.contract import budget
    policy = _bare(2, warmup_steps=3, interval=2, write_budget=1.0, sizes=[10, 10])
    for level in (0, 3):  # e.g. a state resumed at a raised level
        state = PolicyState(policy=policy, level=level)
        decisions = [state.observe(t, np.zeros(2), 1.0) for t in (1, 2)]  # not one; before warm-up
        assert [d.k_scale for d in decisions] == [budget.scale(level)] * 2
    # after the base (step 4) nothing drifts, the account is under budget, the level falls
    state, levels = PolicyState(policy=policy), []
    for t in range(1, 10):
        levels.append(state.level)
        d = state.observe(t, np.zeros(2), 1.0)
        assert d.k_scale == budget.scale(levels[-1])  # the scale the step decided with
    assert levels[-1] < 0  # step 9: no opportunity, at a lowered level


def test_mark_written_takes_any_iterable_of_layers():
    state = PolicyState(policy=_bare(3))
    cases = [([], []), ([0], [0]), ((l for l in [1]), [1]), ({0, 2}, [0, 2]),
             (np.array([0, 2]), [0, 2]), (range(1, 3), [1, 2])]
    for t, (layers, expected) in enumerate(cases, 1):
        state.accumulators[:] = 1.0
        state.mark_written(t, layers)
        assert np.flatnonzero(state.accumulators == 0.0).tolist() == expected
        assert np.flatnonzero(state.last_written == t).tolist() == expected


def test_a_write_budget_without_sizes_says_how_to_give_them():
    policy = _bare(2, warmup_steps=0, write_budget=10.0)
    with pytest.raises(ValueError) as err:
        replay(policy, np.ones((3, 2)), np.ones(3))
    assert str(err.value) == ("a write budget needs the layers' sizes (Policy.sizes): give "
                              "Policy.from_config(..., sizes=bytes of one version of each layer)")


@pytest.mark.parametrize("shape", [(5,), (5, 3), (5, 1, 2)])
def test_replay_rejects_drift_of_the_wrong_shape(shape):
    with pytest.raises(ValueError, match=re.escape(f"drift must be steps x 2 layers, got {shape}")):
        replay(_bare(2), np.zeros(shape), np.ones(5))


def test_base_thresholds_are_float64_even_from_whole_numbers():
    cfg = LayerCheckConfig(base_threshold=1, embedding_threshold=2, thresholds={"l2": 3})
    policy = Policy.from_config(cfg, ["l0", "l1", "l2"], ["embedding", "block", "block"])
    assert policy.base.dtype == np.float64 and policy.base.tolist() == [2.0, 1.0, 3.0]


def test_thresholds_carry_the_write_budgets_factor():
    """K_l(t) = base_l * lr_ratio * k_scale, per step for arrays; 0 and inf stay."""
    policy = Policy(base=np.array([0.0, 1e-3, math.inf]), smax=9, warmup_steps=1, interval=1,
                    lr_scaling=True)
    ratio, factor = np.array([1.0, 0.5, 0.0]), np.array([2.0, 0.25, 4.0])
    k = policy.thresholds(ratio, factor)
    np.testing.assert_array_equal(k, policy.thresholds(ratio) * factor[:, None])
    assert k[2].tolist() == [0.0, 0.0, math.inf]
    assert policy.thresholds(0.5, 2.0).tolist() == [0.0, 1e-3, math.inf]
    fixed = dataclasses.replace(policy, lr_scaling=False)
    assert fixed.thresholds(0.5, 2.0).tolist() == [0.0, 2e-3, math.inf]
