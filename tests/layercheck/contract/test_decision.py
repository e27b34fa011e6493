"""layercheck.contract.decision: the recorded config and its one error rule, K_l(t) as a trace
records it (the write budget's factor included), the paper's defaults scaled."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from layercheck.contract import decision
from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.policy import Policy
from layercheck.contract.trace import TraceError, read_trace

TRACES = Path(__file__).resolve().parents[3] / "traces"


@pytest.fixture(scope="module")
def minilm():
    return read_trace(TRACES / "minilm-200steps")


def _with_config(trace, config):
    return dataclasses.replace(trace, manifest={**trace.manifest, "config": config})


def test_the_recorded_config_is_the_manifests(minilm):
    config = decision.recorded_config(minilm)
    assert config == LayerCheckConfig.from_dict(minilm.manifest["config"])


def test_missing_fields_are_the_defaults_and_unknown_keys_are_ignored(minilm):
    """The trace format's version rule: a field a later library added is at the
    value it had before; a key a newer library added is not this one's to judge."""
    partial = _with_config(minilm, {"smax": 90, "warmup_steps": 7, "from_a_newer_library": 1})
    assert decision.recorded_config(partial) == LayerCheckConfig(smax=90, warmup_steps=7)
    assert decision.recorded_config(_with_config(minilm, {})) == LayerCheckConfig()


@pytest.mark.parametrize("config, says", [
    ({"smax": 10, "warmup_steps": 20}, "shorten the warm-up or raise smax"),
    ({"base_threshold": "abc"}, "base_threshold"),
    ({"thresholds": {"no.such.layer": 1e-3}}, "no.such.layer"),
    (None, "NoneType, not a JSON object"),
    (["smax", 10], "list, not a JSON object"),
])
def test_a_garbled_recorded_config_is_a_trace_error_that_says_the_fix(minilm, config, says):
    with pytest.raises(TraceError, match="minilm-200steps.*recorded config") as info:
        decision.recorded_config(_with_config(minilm, config))
    message = str(info.value)
    assert says in message and ("correct" in message or "restore" in message)
    assert "\n" not in message


def test_policy_for_keeps_the_recorded_overrides_under_the_settings_own(minilm):
    names = minilm.layer_names
    recorded = _with_config(minilm, {**minilm.manifest["config"],
                                     "thresholds": {names[1]: 0.5, names[2]: 0.25}})
    tried = LayerCheckConfig(base_threshold=2e-3, thresholds={names[2]: 0.125})
    policy = decision.policy_for(recorded, tried)
    assert policy.base[1] == 0.5 and policy.base[2] == 0.125
    plain = Policy.from_config(tried, names, list(minilm.layers["kind"]))
    assert np.array_equal(np.delete(policy.base, [1, 2]), np.delete(plain.base, [1, 2]))
    assert np.array_equal(policy.sizes, minilm.budget_sizes)


def test_threshold_matrix_carries_the_recorded_budget_factor(minilm):
    """K_l(t) = base_l * lr(t) / lr_peak * k_scale(t): a step the controller scaled
    by 4 has four times the thresholds it has with the factor 1."""
    factor = np.where(np.arange(minilm.num_steps) % 3 == 0, 4.0, 0.5)
    scaled = dataclasses.replace(minilm, steps=minilm.steps.assign(k_scale=factor))
    plain = decision.threshold_matrix(minilm)
    policy = Policy.from_config(decision.recorded_config(minilm), minilm.layer_names,
                                list(minilm.layers["kind"]))
    np.testing.assert_array_equal(plain, np.vstack([policy.thresholds(r)
                                                    for r in minilm.lr_ratio()]))
    np.testing.assert_array_equal(decision.threshold_matrix(scaled), plain * factor[:, None])


def test_a_step_without_a_learning_rate_has_the_base_thresholds(minilm):
    lr = minilm.steps["lr"].to_numpy().copy()
    lr[5] = np.nan
    blind = dataclasses.replace(minilm, steps=minilm.steps.assign(lr=lr))
    assert decision.lr_ratio(blind)[5] == 1.0
    np.testing.assert_array_equal(decision.threshold_matrix(blind)[5],
                                  decision.policy_for(minilm).base)


def test_the_papers_defaults_scale_to_the_run():
    assert decision.paper_default(decision.PAPER_STEPS) == LayerCheckConfig() == decision.PAPER
    assert decision.paper_default(5000) == LayerCheckConfig()
    assert decision.paper_schedule(300) == (round(200 * 300 / 1692), round(1000 * 300 / 1692))
    assert decision.paper_schedule(3) == (1, 2)
    # a given warm-up is kept and a derived Smax is never below it
    assert decision.paper_schedule(300, warmup_steps=250) == (250, 250)
    given = decision.paper_default(300, base_threshold=2e-3, smax=40, warmup_steps=3)
    assert (given.base_threshold, given.embedding_threshold, given.smax, given.warmup_steps) \
        == (2e-3, 2e-3 * decision.EMBEDDING_FACTOR, 40, 3)
