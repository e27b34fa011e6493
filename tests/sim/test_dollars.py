"""sim.dollars: a bill's arithmetic by hand, and NVIDIA's published example from its own inputs."""
from __future__ import annotations

import math

import pytest

from sim import Scenario
from sim.api import simulate
from sim.dollars import HOURS_PER_MONTH, PRICES, Prices, bill
from sim.errors import SimError
from sim.strategies import Footprint

GIB = 2 ** 30


def test_a_bill_by_hand():
    row = {"strategy": "x", "checkpoint_stall_s": 3600.0, "lost_work_s": 7200.0,
           "stale_lost_s": 1800.0, "failures": 10.0, "recovery_s": 500.0, "bytes_written": 1e12}
    footprint = Footprint(durable_bytes=50e9, moved_bytes=100e9, point_bytes=100e9, base_bytes=20e9)
    prices = Prices(gpu_hour_usd=2.0, gpus=8, storage_usd_per_gb_month=0.023,
                    write_usd_per_gb=0.0006, keep=2)
    out = bill(row, footprint, prices, window_s=HOURS_PER_MONTH * 3600, restart_s=30.0)
    # GPU hours: each cause's hours x 8 GPUs; 10 restarts of 30 s, the other 200 s recovery
    assert out.gpu_hours == pytest.approx({"stall": 8.0, "lost_work": 16.0, "stale_work": 4.0,
                                           "restart": 8 * 300 / 3600, "recovery": 8 * 200 / 3600})
    assert out.usd_gpu == pytest.approx((8 + 16 + 4 + 8 * 500 / 3600) * 2.0)
    # storage: 2 kept points of 100 GB and a 20 GB base, for one month
    assert out.usd_storage == pytest.approx(220 * 0.023)
    # writes: half of what it moved is durable
    assert out.usd_writes == pytest.approx(1e12 * 0.5 / 1e9 * 0.0006)
    assert out.usd_total == pytest.approx(out.usd_gpu + out.usd_storage + out.usd_writes)


def test_restart_never_takes_more_than_the_recovery():
    row = {"strategy": "x", "checkpoint_stall_s": 0.0, "lost_work_s": 0.0, "stale_lost_s": 0.0,
           "failures": 4.0, "recovery_s": 50.0, "bytes_written": 0.0}
    out = bill(row, Footprint(), Prices(), window_s=86400.0, restart_s=30.0)
    assert out.gpu_hours["restart"] == pytest.approx(50 / 3600 * 8)
    assert out.gpu_hours["recovery"] == 0.0


def test_every_default_price_names_its_source():
    for name, figure in PRICES.items():
        assert figure.source in ("published", "derived", "assumed") and len(figure.method) > 40, name
    assert Prices().sources()["gpu_hour_usd"]["source"] == "published"
    assert Prices(gpu_hour_usd=1.0).sources()["gpu_hour_usd"]["source"] == "given"


@pytest.mark.parametrize("field, value, words", [
    ("gpu_hour_usd", -1.0, "--gpu-hour-usd"), ("gpus", 0, "--gpus"), ("keep", 1.5, "--keep"),
    ("storage_usd_per_gb_month", math.nan, "--storage-usd-per-gb-month")])
def test_bad_prices_say_which_flag(field, value, words):
    with pytest.raises(SimError, match=words):
        Prices(**{field: value})


def nvidia_405b() -> float:
    """NVIDIA's example ("Cut Checkpoint Costs with About 30 Lines of Python and NVIDIA
    nvCOMP", developer.nvidia.com, 2026): a 405B model on 128 GPUs at $4.40 a GPU-hour,
    a synchronous checkpoint every 30 minutes (48 a day, 1,440 a month), written at 5 GB/s
    of their GB (GiB: 782 "GB" is 70B x 12 bytes). 405B x 12 bytes = 4.86e12 bytes, 905.2 s
    a save. A step of 5 s (not stated, immaterial) and 179 steps between saves make one
    save every 1,800 s of wall clock; the job runs the whole month (no uncharged end)."""
    nbytes = 405e9 * 12
    save_s = nbytes / (5 * GIB)
    scenario = Scenario.custom(iteration_s=5.0, iterations=600_000, checkpoint_gb=nbytes / 1e9,
                               checkpoint_s=save_s, window_s=30 * 86400.0, interval=179)
    row = simulate(scenario, mtbf_s=1e15, strategies=["deepspeed"], seeds=1).iloc[0]
    prices = Prices(gpu_hour_usd=4.40, gpus=128)
    return bill(row, Footprint(), prices, window_s=30 * 86400.0,
                restart_s=scenario.costs.restart_s).gpu_hours["stall"] * prices.gpu_hour_usd


def test_nvidias_405b_example_from_its_inputs():
    stall_usd = nvidia_405b()
    by_hand = 1440 * (405e9 * 12 / (5 * GIB)) / 3600 * 128 * 4.40
    assert stall_usd == pytest.approx(by_hand, rel=0.01)       # 203,900: 1,439.8 saves, not 1,440
    assert stall_usd == pytest.approx(200_000, rel=0.10)        # "can cost $200,000 a month"
