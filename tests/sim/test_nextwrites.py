"""sim.nextwrites: the compiled table of a resumed policy's writes is the contract's."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.resumed import next_writes as contract_next_writes
from layercheck.contract.policy import Policy
from sim.engine import compiled_kernel
from sim.nextwrites import next_writes

from .conftest import DRIFT_CASES, drift_case

pytest.importorskip("numba")

KINDS = ["embedding", "block", "block", "norm", "head"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 50), smax=st.integers(1, 60),
       interval=st.integers(1, 5), k=st.sampled_from([1e-4, 1e-3, 1e-2, float("inf")]),
       special=st.sampled_from(DRIFT_CASES))
def test_the_compiled_table_is_the_contracts(seed, steps, smax, interval, k, special):
    assert compiled_kernel(load=True) is not None, "numba: the sim-fast extra, in both test environments"
    rng = np.random.default_rng(seed)
    drift = drift_case(rng, steps, len(KINDS), special)
    ratio = rng.uniform(0.0, 1.0, steps)
    config = LayerCheckConfig(base_threshold=k, embedding_threshold=10 * k, smax=smax,
                              warmup_steps=min(smax, 3), interval=interval)
    policy = Policy.from_config(config, [f"l{i}" for i in range(len(KINDS))], KINDS)
    ours = next_writes(policy, drift, ratio)
    np.testing.assert_array_equal(ours, contract_next_writes(policy, drift, ratio))


def test_without_the_kernel_loaded_it_is_the_contracts_walk(monkeypatch):
    monkeypatch.delitem(sys.modules, "sim.kernel", raising=False)
    policy = Policy.from_config(LayerCheckConfig(smax=4, warmup_steps=2), ["a"], ["block"])
    drift = np.full((10, 1), 1e-4)
    np.testing.assert_array_equal(next_writes(policy, drift, np.ones(10)),
                                  contract_next_writes(policy, drift, np.ones(10)))
