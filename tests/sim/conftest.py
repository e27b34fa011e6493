"""Tiny fixtures shared by the simulator's tests."""
from __future__ import annotations

import numpy as np
import pytest

from sim import CostModel, Workload
from sim.workload import LayerWrites

LAYER_BYTES = np.array([4e9, 2e9, 6e9, 8e9])
BASE_STEP = 3


def small_workload(seed: int = 1, steps: int = 40) -> Workload:
    """Uneven steps, four layers of 20 GB together, a base checkpoint at step 3 and a
    sprinkling of layer writes after it: small enough for SimPy."""
    rng = np.random.default_rng(seed)
    written = rng.random((steps, len(LAYER_BYTES))) < 0.2
    written[: BASE_STEP - 1] = False
    written[min(BASE_STEP, steps) - 1] = True
    layers = LayerWrites(written=written, nbytes=LAYER_BYTES, params=LAYER_BYTES / 12)
    return Workload(name="small", compute_s=rng.uniform(1, 3, steps), full_bytes=int(20e9),
                    layers=layers)


# a slow writer and peer link so the writer queues and snapshots wait
SMALL_COSTS = CostModel(save_gbps=2.0, persist_gbps=2.0, lc_write_gbps=2.0, peer_gbps=3.0,
                        peer_loss_probability=0.3, restart_s=5.0, diff_batch=3, lc_commit_s=0.4,
                        tracking_fraction=0.05)


@pytest.fixture
def workload() -> Workload:
    return small_workload()
