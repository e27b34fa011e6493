"""A scenario's job on N GPUs (sim.scale): costs, storage, spares, placement, Llama 3."""
import dataclasses

import numpy as np
import pytest

from sim import CostModel, Scenario, SimError
from sim.nodes import Domain
from sim.recovery import RecoveryModel
from sim.scale import (LLAMA3_NODE_MTBF_S, SCALE_COLUMNS, WHERE, ScaleModel, gpu_steps,
                       llama3_405b, scale_costs, simulate_scale)
from sim.storage import SharedStorage

DAY = 86400.0


def _small(**kw):
    return Scenario.custom(iteration_s=5.0, iterations=2000, checkpoint_gb=200.0,
                           window_s=kw.pop("window_s", 20 * DAY), **kw)


def test_one_node_on_unlimited_storage_keeps_the_one_node_costs():
    costs = CostModel.paper_a100()
    storage = SharedStorage(nodes=1, link_gbps=costs.save_gbps, read_link_gbps=costs.load_gbps,
                            aggregate_gbps=1e9, read_aggregate_gbps=1e9)
    scaled = scale_costs(costs, 1, storage, RecoveryModel())
    for name in ("restart_s", "save_gbps", "persist_gbps", "lc_write_gbps", "load_gbps",
                 "snapshot_gbps", "peer_gbps", "diff_replay_gbps", "lc_commit_s"):
        assert getattr(scaled, name) == pytest.approx(getattr(costs, name)), name
    assert scaled.provenance["save_gbps"].source == "derived"


def test_storage_writes_at_the_slower_of_links_and_aggregate():
    costs = CostModel.paper_a100()
    model = ScaleModel()
    few = scale_costs(costs, 4, model.storage(costs, 4), model.recovery)
    many = scale_costs(costs, 2048, model.storage(costs, 2048), model.recovery)
    assert few.save_gbps == pytest.approx(4 * costs.save_gbps)
    assert many.save_gbps == model.aggregate_gbps and many.load_gbps == model.read_aggregate_gbps
    assert many.snapshot_gbps == pytest.approx(2048 * costs.snapshot_gbps)
    assert many.restart_s == pytest.approx(costs.restart_s + 2.59 * 11)


def test_rows_have_every_column_and_the_breakdown_adds_up():
    frame = simulate_scale(_small(), ScaleModel(node_mtbf_s=20 * DAY), gpus=256, seeds=3)
    assert list(frame.columns) == list(SCALE_COLUMNS)
    assert list(frame["strategy"]) == ["none", "deepspeed", "checkfreq", "gemini", "lowdiff", "limit"]
    window = 20 * DAY
    for row in frame.itertuples():
        away = sum(getattr(row, c) for c in WHERE)
        assert row.effective_ratio * window + away == pytest.approx(window, rel=1e-6)
    assert (frame["failures"] > 5).all() and (frame["detection_s"] > 0).all()


def test_the_ratio_falls_as_the_job_grows():
    small = simulate_scale(_small(), ScaleModel(), gpus=64, seeds=3, strategies=["deepspeed"])
    big = simulate_scale(_small(), ScaleModel(), gpus=16384, seeds=3, strategies=["deepspeed"])
    assert big.iloc[0].effective_ratio < small.iloc[0].effective_ratio - 0.02
    assert big.iloc[0].failures > 30 * max(small.iloc[0].failures, 1.0)


def test_without_spares_the_job_waits_for_repair():
    scenario = _small()
    model = ScaleModel(node_mtbf_s=100 * DAY)     # recoveries rarely interrupted
    plenty = simulate_scale(scenario, model, gpus=512, seeds=3, strategies=["checkfreq"])
    none = simulate_scale(scenario, dataclasses.replace(model, recovery=RecoveryModel(spares=0)),
                          gpus=512, seeds=3, strategies=["checkfreq"])
    per_failure = none.iloc[0].reschedule_s / none.iloc[0].failures
    assert per_failure == pytest.approx(RecoveryModel().repair_s + 180.0, rel=0.1)
    assert plenty.iloc[0].reschedule_s / plenty.iloc[0].failures == pytest.approx(180.0, rel=0.1)
    assert none.iloc[0].effective_ratio < plenty.iloc[0].effective_ratio - 0.02


def test_gemini_loses_its_peer_only_where_the_placement_shares_a_rack():
    scenario = _small()
    racks = (Domain(name="rack", size=8, mtbf_s=2 * DAY),)
    kw = dict(gpus=512, seeds=3, strategies=["gemini"])
    cross = simulate_scale(scenario, ScaleModel(domains=racks), **kw).iloc[0]
    group = simulate_scale(scenario, ScaleModel(domains=racks, placement="group"), **kw).iloc[0]
    assert cross.peer_lost == 0 and group.peer_lost > 10
    # a lost peer copy rolls back to GEMINI's storage tier, further back
    assert group.lost_work_s > cross.lost_work_s and group.effective_ratio < cross.effective_ratio


def test_llama3_405b_above_90_percent():
    """Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs and an
    effective training time above 90% (Meta 2024). Under this model's stated figures
    (docs/sim-scale.md) a synchronous save at Daly's interval keeps 95%, the perfect
    checkpointer 97%: the 419 interruptions cost about 3% in recovery whatever the
    checkpointing, and the checkpoints the rest."""
    scenario, model = llama3_405b()
    assert model.node_mtbf_s == LLAMA3_NODE_MTBF_S
    frame = simulate_scale(scenario, model, gpus=16384, seeds=10, strategies=["deepspeed"])
    ds, limit = frame.iloc[0], frame.iloc[1]
    assert abs(ds.failures - 419) < 3 * np.sqrt(419 / 10) + 5
    assert 0.90 < ds.effective_ratio < limit.effective_ratio < 0.99
    recovery = ds.detection_s + ds.reschedule_s + ds.restart_s + ds.load_s
    assert 0.02 < recovery / scenario.window_s < 0.04


def test_gpu_steps_double_and_end_at_high():
    assert gpu_steps(8, 64) == [8, 16, 32, 64]
    assert gpu_steps(8, 100 * 8) == [8, 16, 32, 64, 128, 256, 512, 800]
    assert gpu_steps(16384, 16384) == [16384]


@pytest.mark.parametrize("gpus,match", [(12, "multiple of 8"), (0, "multiple of 8")])
def test_bad_job_sizes_say_the_fix(gpus, match):
    with pytest.raises(SimError, match=match):
        simulate_scale(_small(), ScaleModel(), gpus=gpus, seeds=2)
    with pytest.raises(SimError, match="low end"):
        gpu_steps(64, 8)
    with pytest.raises(SimError, match="positive number of seconds"):
        simulate_scale(_small(), ScaleModel(), gpus=8, seeds=2, window_s=-1.0)
