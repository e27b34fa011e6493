"""Tiny fixtures shared by the simulator's tests."""
from __future__ import annotations

import numpy as np
import pytest

from sim import CostModel, Workload


def small_workload(seed: int = 1, steps: int = 40) -> Workload:
    """Uneven steps and a sprinkling of LayerCheck writes: small enough for SimPy."""
    rng = np.random.default_rng(seed)
    writes = np.where(rng.random(steps) < 0.3, rng.uniform(1e9, 5e9, steps), 0.0)
    return Workload(name="small", compute_s=rng.uniform(1, 3, steps), full_bytes=int(20e9),
                    layercheck_bytes=writes, staleness=5.0)


# slow writer and peer link so the writer queues and snapshots wait
SMALL_COSTS = CostModel(write_gbps=2.0, peer_gbps=3.0, peer_loss_probability=0.3,
                        restart_s=5.0, diff_batch=3)


@pytest.fixture
def workload() -> Workload:
    return small_workload()
