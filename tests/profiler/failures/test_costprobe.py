"""The probe beside a validation run (``profiler.failures.costprobe``): which of the probe's
steps are saves and differentials, and the cost figures they replace."""
from __future__ import annotations

from pathlib import Path

import pytest

from layercheck.contract.trace import read_trace
from profiler.failures.costprobe import Beside, priced_load_s

ROOT = Path(__file__).resolve().parents[3]


def _step(step, *, after, tracking=0.0, begin=100.0):
    """A worker's ``step`` event whose checkpoint took ``after`` s past its compute."""
    computed = begin + step + 0.5
    return {"event": "step", "step": step, "begin": begin + step, "computed": computed,
            "time": computed + after, "tracking_s": tracking, "held_s": 0.0,
            "stall_s": after + tracking}


def test_deepspeed_s_saves_are_its_interval_s_steps_after_the_worker_s_first():
    # every 2 steps; the first step (a fresh process's warm-up) is not a sample even
    # where it saves, and a step without a save is not one
    steps = [_step(1, after=0.0), _step(2, after=0.30), _step(3, after=0.001),
             _step(4, after=0.50), _step(5, after=0.0), _step(6, after=0.40)]
    probe = Beside.from_steps("deepspeed", (12.0, 10.0, 11.0), tuple(steps), 2)
    assert probe.saves_s == pytest.approx((0.30, 0.50, 0.40)) and probe.diffs_s == ()
    assert probe.save_s == pytest.approx(0.40) and probe.restart_s == 11.0


def test_lowdiff_s_full_save_is_its_step_less_the_hand_off_and_its_differential_the_rest():
    # compression inside the step (tracking_s) and a 0.01 s hand-off on every step; the
    # full checkpoint every 3 steps on top of the hand-off
    steps = [_step(1, after=0.01, tracking=0.9)]
    for s in range(2, 10):
        steps.append(_step(s, after=0.01 + (0.6 if s % 3 == 0 else 0.0),
                           tracking=0.35 + 0.01 * s))
    probe = Beside.from_steps("lowdiff", (9.0,), tuple(steps), 3)
    assert probe.saves_s == pytest.approx((0.6, 0.6, 0.6))
    assert probe.diff_s == pytest.approx(0.01 + 0.35 + 0.01 * 5)  # steps 2, 4, 5, 7, 8: median 5


def test_the_figures_are_the_trace_s_bytes_over_the_probe_s_seconds():
    trace = read_trace(ROOT / "traces/minilm-200steps")
    from sim import CostModel, Scenario
    scenario = Scenario.from_trace(trace, costs=CostModel.from_calibration(trace.costs))
    workload, costs = scenario.workload, scenario.costs
    ds = Beside(strategy="deepspeed", restarts_s=(14.0,), saves_s=(0.25,))
    figures = ds.figures(workload, costs)
    assert set(figures) == {"restart_s", "save_gbps"} and figures["restart_s"] == 14.0
    assert costs.with_overrides(**figures).save_s(workload.full_bytes) == pytest.approx(0.25)
    ld = Beside(strategy="lowdiff", restarts_s=(14.0,), saves_s=(0.25,), diffs_s=(0.5, 0.7, 0.6))
    diff = ld.figures(workload, costs)["diff_snapshot_gbps"]
    # the simulator prices the differential back at the probe's seconds
    priced = costs.with_overrides(diff_snapshot_gbps=diff)
    assert priced.diff_snapshot_s(priced.diff_bytes(workload.full_bytes)) == pytest.approx(0.6)
    # a strategy without full saves: the restart alone
    assert Beside(strategy="gemini", restarts_s=(15.0, 17.0)).figures(workload, costs) == \
        {"restart_s": 16.0}


def test_the_load_is_the_first_successor_s_and_only_where_it_restored_a_step():
    resumed = {"event": "resumed", "step": 6, "time": 200.0, "load_s": 0.2}  # LayerCheck's part
    for strategy in ("deepspeed", "lowdiff", "checkfreq", "layercheck", "gemini"):
        probe = Beside.from_steps(strategy, (10.0,), (), 3, resumed, 1.1)
        assert (probe.load_s, probe.load_step) == (1.1, 6)
    fresh = Beside.from_steps("deepspeed", (10.0,), (), 3, {**resumed, "step": 0}, 0.01)
    assert fresh.load_s is None and Beside.from_steps("checkfreq", (10.0,), (), 3).load_s is None


@pytest.mark.parametrize("strategy, priced", [("deepspeed", "load_s"), ("lowdiff", "load_s"),
                                              ("checkfreq", "async_load_s"),
                                              ("layercheck", "lc_load_s"),
                                              ("tiered", "tier_load_s")])
def test_the_load_replaces_the_figure_that_prices_the_strategy_s_recovery(strategy, priced):
    trace = read_trace(ROOT / "traces/minilm-200steps")
    from sim import CostModel, Scenario
    scenario = Scenario.from_trace(trace, costs=CostModel.from_calibration(trace.costs))
    workload, costs = scenario.workload, scenario.costs
    figures = Beside(strategy=strategy, restarts_s=(10.0,), load_s=1.25).figures(workload, costs)
    assert len(figures) == 2
    # the simulator's recovery prices the full state's load at the probe's seconds
    moved = costs.with_overrides(**figures)
    assert getattr(moved, priced)(workload.full_bytes) == pytest.approx(1.25)
    assert priced_load_s(strategy, moved, workload.full_bytes) == pytest.approx(1.25)
    assert priced_load_s(strategy, costs, workload.full_bytes) == \
        pytest.approx(getattr(costs, priced)(workload.full_bytes))
    # gemini's load (from its peer) is not probed: its figures stay costs.json's
    assert Beside(strategy="gemini", restarts_s=(10.0,), load_s=1.25).figures(
        workload, costs) == {"restart_s": 10.0}


def test_the_run_s_restart_is_the_median_of_the_restarts_before_and_after_it():
    before = Beside(strategy="deepspeed", restarts_s=(12.0, 9.0, 10.0), saves_s=(0.3,))
    assert before.restart_s == 10.0 and before.after_s == ()
    bracketed = before.after((8.0, 8.5, 13.0))
    # 8.0, 8.5, 9.0, 10.0, 12.0, 13.0: the median of six
    assert bracketed.restart_s == pytest.approx(9.5) and bracketed.after_s == (8.0, 8.5, 13.0)
    assert bracketed.restarts_s == before.restarts_s and bracketed.saves_s == (0.3,)
    assert bracketed.to_dict()["after_s"] == [8.0, 8.5, 13.0]
    assert bracketed.to_dict()["restart_s"] == pytest.approx(9.5)


def test_a_probe_without_a_restart_is_refused():
    with pytest.raises(ValueError, match="at least one restart"):
        Beside(strategy="gemini", restarts_s=())


def test_a_probed_mechanism_is_timed_again_and_replaces_the_calibration_s_figure(tmp_path):
    """tiered's memory-tier copy, every step of its run, is measured just before it on the
    job itself (a calibration hours before described another machine); its stated
    failure shares are not measurements and stay the calibration's."""
    from profiler.checkpointers import REAL
    from profiler.config import CaptureConfig
    from profiler.errors import ProfilerError
    from profiler.failures.costprobe import remeasure
    from tests.profiler.conftest import TINY
    job = CaptureConfig(**TINY)
    measured = remeasure(job, tmp_path / "probe", REAL["tiered"].probed)
    assert REAL["tiered"].probed == ("memory tier", "memory tier thread")
    assert set(measured) == {"tier_copy_gbps", "tier_thread_gbps"}
    assert all(value > 0 for value in measured.values())
    assert not (tmp_path / "probe").exists()
    probe = Beside(strategy="tiered", restarts_s=(9.0,), measured=measured)
    trace = read_trace(ROOT / "traces" / "minilm-200steps")
    from sim import Scenario
    scenario = Scenario.from_trace(trace)
    figures = probe.figures(scenario.workload, scenario.costs)
    assert figures == {"restart_s": 9.0, **measured}
    # the fresh process's restore after a kill, not a probed figure of the same name,
    # prices the run's recoveries
    loaded = Beside(strategy="tiered", restarts_s=(9.0,), load_s=2.0,
                    measured={**measured, "tier_restore_gbps": 123.0})
    assert loaded.figures(scenario.workload, scenario.costs)["tier_restore_gbps"] == \
        pytest.approx(scenario.workload.full_bytes / 2.0 / 1e9)
    assert probe.to_dict()["measured"] == measured
    with pytest.raises(ProfilerError, match="no calibration mechanism is called"):
        remeasure(job, tmp_path / "other", ("memory",))


def test_only_a_strategy_with_a_node_memory_tier_gets_a_node_folder_and_it_is_removed(tmp_path):
    from profiler.failures.costprobe import _node_memory
    with _node_memory("layercheck", tmp_path) as options:
        assert options == {}
    with _node_memory("tiered", tmp_path) as options:
        node = Path(options["tier"])
        assert node.is_dir()
    assert not node.exists()
