"""Tiny fixtures shared by the simulator's tests."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim import CostModel, Scenario, Workload
from sim.api import _failure_rows
from sim.strategies import get_strategy
from sim.timeline import Timeline
from sim.workload import LayerWrites

LAYER_BYTES = np.array([4e9, 2e9, 6e9, 8e9])
BASE_STEP = 3


def small_workload(seed: int = 1, steps: int = 40) -> Workload:
    """Uneven steps, four layers of 20 GB together, a base checkpoint at step 3, a
    sprinkling of layer writes after it and other writes after a restore: small enough
    for SimPy."""
    rng = np.random.default_rng(seed)
    written = rng.random((steps, len(LAYER_BYTES))) < 0.2
    written[: BASE_STEP - 1] = False
    written[min(BASE_STEP, steps) - 1] = True
    # after a restore of s, each layer next written 1-8 steps on (past the job: steps + 1)
    restarted = np.minimum(np.arange(steps + 1)[:, None]
                           + rng.integers(1, 9, (steps + 1, len(LAYER_BYTES))), steps + 1)
    layers = LayerWrites(written=written, nbytes=LAYER_BYTES, params=LAYER_BYTES / 12,
                         restarted=restarted)
    return Workload(name="small", compute_s=rng.uniform(1, 3, steps), full_bytes=int(20e9),
                    layers=layers)


# a slow writer and peer link so the writer queues and snapshots wait
SMALL_COSTS = CostModel(save_gbps=2.0, persist_gbps=2.0, lc_write_gbps=2.0, peer_gbps=3.0,
                        peer_loss_probability=0.3, restart_s=5.0, diff_batch=3, lc_commit_s=0.4,
                        tracking_fraction=0.05)


@pytest.fixture
def workload() -> Workload:
    return small_workload()


def sweep_lanes(mtbfs=(36.0, 300.0, 3600.0), seeds=4, window=3 * 86400.0, costs=None):
    """The sweep's lanes on the default preset: every strategy x MTBF x seed."""
    scenario = Scenario.from_preset("qwen2.5-7b")
    if costs:
        scenario = dataclasses.replace(scenario, costs=scenario.costs.with_overrides(**costs))
    times, uniforms = _failure_rows(scenario, list(mtbfs), seeds, window)
    timelines, strategy, row = [], [], []
    for mi, mtbf in enumerate(mtbfs):
        for name in scenario.available():
            cadence = scenario.cadence(name, mtbf)
            timelines.append(Timeline.build(get_strategy(name).schedule(
                scenario.workload, scenario.costs, cadence)))
            strategy += [len(timelines) - 1] * seeds
            row += [mi * seeds + i for i in range(seeds)]
    return timelines, np.array(strategy), times, np.array(row), uniforms, window


DRIFT_CASES = ("none", "nan", "inf", "negative")
"""What ``drift_case`` puts into a run's drift besides ordinary values."""


def drift_case(rng: np.random.Generator, steps: int, layers: int, special: str) -> np.ndarray:
    """steps x layers of drift as a replay may meet it: ordinary (gamma), with NaNs, with
    infinities, or shifted below zero (``DRIFT_CASES``)."""
    drift = rng.gamma(1.0, 2e-4, (steps, layers))
    if special == "nan":
        drift[rng.random(drift.shape) < 0.1] = np.nan
    elif special == "inf":
        drift[rng.random(drift.shape) < 0.05] = np.inf
    elif special == "negative":
        drift -= 3e-4
    return drift
