"""The tiered strategy (sim.strategies.tiered): its sourced figures, its schedule, what its
failure split does, and its durable bytes against LayerCheck's."""
import numpy as np
import pytest

from sim import CostModel, Scenario
from sim.strategies import get_strategy
from sim.strategies.base import Cadence
from sim.strategies.tiered import BUDDY_LOSS_SHARE, FIGURES, PROCESS_SHARE

NAMES = ("tier_process_share", "tier_buddy_loss_share", "tier_copy_gbps", "tier_restore_gbps",
         "tier_thread_gbps")


@pytest.fixture(scope="module")
def scenario():
    return Scenario.from_preset("qwen2.5-7b")


def test_its_figures_have_sourced_defaults_and_bands():
    assert set(FIGURES) == set(NAMES)
    paper = CostModel.paper_a100()
    assert paper["tier_process_share"] == pytest.approx(63 / 419, abs=1e-4) == PROCESS_SHARE
    assert "Llama 3" in FIGURES["tier_process_share"].default.method
    assert "TIERS.md" in FIGURES["tier_buddy_loss_share"].default.method
    assert paper["tier_buddy_loss_share"] == pytest.approx(BUDDY_LOSS_SHARE, abs=1e-4)
    assert all(paper.band(name) is not None for name in NAMES)


def test_it_runs_by_default_and_writes_to_storage_only_what_layercheck_writes(scenario):
    assert "tiered" in scenario.strategy_names()
    tiered, layercheck = (scenario.schedule(name, 1800.0) for name in ("tiered", "layercheck"))
    assert tiered.footprint.durable_bytes == layercheck.footprint.durable_bytes
    assert tiered.footprint.moved_bytes > tiered.footprint.durable_bytes  # the buddy's copies
    assert tiered.footprint.host_bytes >= 4 * scenario.workload.full_bytes


def schedule(scenario, every=4, **figures):
    costs = scenario.costs.with_overrides(**figures) if figures else scenario.costs
    return get_strategy("tiered").schedule(scenario.workload, costs, Cadence(every=every))


def test_the_failure_split_is_a_parameter(scenario):
    assert schedule(scenario, tier_buddy_loss_share=0.1).backup_probability == 0.1
    # more failures that lose only processes: the memory recoveries read locally, faster
    slow = schedule(scenario, tier_process_share=0.0).recover[5]
    fast = schedule(scenario, tier_process_share=0.9, tier_buddy_loss_share=0.0).recover[5]
    assert fast < slow


def test_only_a_durable_recovery_pays_stale_layers_and_memory_copies_cut_it(scenario):
    base = schedule(scenario, tier_buddy_loss_share=0.0, stale_cost=1.0)
    assert base.composite is None  # memory recoveries are consistent
    lost = schedule(scenario, tier_buddy_loss_share=1.0, stale_cost=1.0)
    at = np.arange(300, scenario.workload.steps)
    assert (lost.recover_backup[at] >= base.recover_backup[at]).all()
    assert (lost.recover_backup[at] > base.recover_backup[at]).any()
    # memory copies every step: nothing the composite holds is older than a memory copy
    every = schedule(scenario, every=1, tier_buddy_loss_share=0.0, stale_cost=1.0)
    fixed = scenario.costs.restart_s + scenario.costs.lc_load_s(scenario.workload.full_bytes)
    assert every.recover_backup[at] == pytest.approx(fixed + scenario.workload.warmup_s)


def test_the_memory_tier_copy_stalls_and_the_buddy_send_runs_behind(scenario):
    a, b = schedule(scenario, tier_copy_gbps=100.0), schedule(scenario, tier_copy_gbps=10.0)
    assert b.snap[4] > a.snap[4] and b.snap[5] == a.snap[5]
    assert a.persist[4] == pytest.approx(scenario.costs.peer_s(scenario.workload.full_bytes))
    assert a.commit[4] and not a.commit[5]


def test_a_memory_recovery_is_the_tier_s_restore_and_a_node_s_adds_the_buddy_s_transfer(scenario):
    c, full = scenario.costs, scenario.workload.full_bytes
    process = schedule(scenario, tier_process_share=1.0, tier_buddy_loss_share=0.0,
                       tier_restore_gbps=2.0)
    assert process.recover[5] == pytest.approx(c.restart_s + full / 2e9 + scenario.workload.warmup_s)
    node = schedule(scenario, tier_process_share=0.0, tier_buddy_loss_share=0.0,
                    tier_restore_gbps=2.0)
    assert node.recover[5] - process.recover[5] == pytest.approx(c.peer_load_s(full))
    # a slower restore, a longer recovery; the copy's rate is not the restore's
    assert schedule(scenario, tier_restore_gbps=1.0).recover[5] > \
        schedule(scenario, tier_restore_gbps=2.0).recover[5]
    assert schedule(scenario, tier_copy_gbps=1.0).recover[5] == schedule(scenario).recover[5]


def test_the_tier_thread_is_charged_only_where_the_trace_s_compute_is_on_the_cpu(scenario):
    from pathlib import Path
    from layercheck.contract.trace import read_trace
    from sim.strategies.tiered import host_compute
    assert not host_compute(scenario.workload)  # a synthetic trace: a GPU job
    gpu = schedule(scenario, tier_thread_gbps=0.5), schedule(scenario, tier_thread_gbps=50.0)
    assert np.array_equal(gpu[0].snap, gpu[1].snap)
    cpu = Scenario.from_trace(read_trace(Path(__file__).parents[2] / "traces" / "minilm-200steps"))
    assert host_compute(cpu.workload)
    slow, fast = schedule(cpu, every=1, tier_thread_gbps=0.5), schedule(cpu, every=1,
                                                                        tier_thread_gbps=50.0)
    full = cpu.workload.full_bytes
    assert slow.snap[7] - fast.snap[7] == pytest.approx(full / 0.5e9 - full / 50e9)
