"""Just-in-time checkpointing (sim.strategies.jit): its declared figures, its schedule, and
what a failure costs it."""
from pathlib import Path

import numpy as np
import pytest

from sim.calibrated import FIGURES, read_calibration
from sim import CostModel, FailureModel, Scenario, simulate
from sim.strategies import STRATEGIES, get_strategy
from sim.strategies.jit import FIGURES as JIT_FIGURES

from .conftest import SMALL_COSTS, small_workload

ROOT = Path(__file__).resolve().parents[2]
JIT = ("jit_detect_s", "jit_replica_loss_probability", "jit_overhead_fraction")


def test_its_figures_join_the_schema_with_their_defaults():
    assert set(JIT_FIGURES) == set(JIT) and all(n in FIGURES for n in JIT)
    paper = CostModel.paper_a100()
    for name in JIT:
        assert paper[name] == JIT_FIGURES[name].default.value
        assert paper.provenance[name] == JIT_FIGURES[name].default
        assert paper.band(name) is not None           # python -m sim sensitivity varies it


def test_a_costs_json_older_than_the_strategy_reads_its_figures_as_assumed_defaults(tmp_path):
    """A calibration written before JIT existed (each shipped costs.json with JIT's
    figures taken out) reads, JIT's figures filled in from their declared defaults."""
    import json
    for shipped in sorted(ROOT.glob("traces/*/costs.json")):
        doc = json.loads(shipped.read_text())
        doc["figures"] = {k: v for k, v in doc["figures"].items() if k not in JIT}
        path = tmp_path / shipped.parent.name / "costs.json"
        path.parent.mkdir()
        path.write_text(json.dumps(doc))
        cal = read_calibration(path)
        assert set(JIT) <= set(cal.filled), path
        assert {cal.figures[n].source for n in JIT} == {"assumed"}, path
        assert CostModel.from_calibration(cal).jit_detect_s == JIT_FIGURES["jit_detect_s"].default.value


def test_every_step_is_a_recovery_point_and_nothing_is_written():
    w, c = small_workload(), SMALL_COSTS.with_overrides(jit_overhead_fraction=0.01)
    s = get_strategy("jit").schedule(w, c)
    n = s.steps
    assert s.commit[1:n].all() and not s.commit[0] and not s.commit[n]
    assert not s.bytes.any() and not s.persist.any()
    assert np.allclose(s.snap[1:n], 0.01 * w.compute_s[:n - 1])
    expected = c.jit_detect_s + c.save_s(w.full_bytes) + c.restart_s + c.load_s(w.full_bytes)
    assert np.allclose(s.recover[1:], expected) and s.recover[0] == c.restart_s
    assert (s.recover_backup == c.restart_s).all() and np.isnan(s.backup).all()
    assert s.backup_probability == c.jit_replica_loss_probability


def _run(loss, strategies=("jit",)):
    scenario = Scenario.from_preset("qwen2.5-7b", window_s=2 * 86400.0, stale_cost=1.0,
                                    costs=CostModel.paper_a100(jit_replica_loss_probability=loss))
    return simulate(scenario, mtbf_s=1800.0, strategies=list(strategies), seeds=3)


def test_a_failure_replays_at_most_the_minibatch_it_interrupted():
    row = _run(0.0).iloc[0]
    step = float(Scenario.from_preset("qwen2.5-7b").workload.compute_s.max())
    assert row.failures > 10
    assert row.lost_work_s / row.failures <= step + 1e-9


def test_losing_every_replica_restarts_the_job():
    kept, lost = _run(0.0).iloc[0], _run(1.0).iloc[0]
    assert lost.effective_ratio < 0.5 * kept.effective_ratio
    assert lost.lost_work_s > 100 * kept.lost_work_s


def test_it_runs_when_named_and_stays_out_of_the_papers_comparison():
    assert "jit" in STRATEGIES and not STRATEGIES["jit"].compared
    scenario = Scenario.custom(iteration_s=6.0, iterations=500, checkpoint_s=60.0,
                               window_s=86400.0, failures=FailureModel(kind="exponential"))
    assert "jit" not in set(simulate(scenario, mtbf_s=7200.0, seeds=2)["strategy"])
    assert list(simulate(scenario, mtbf_s=7200.0, seeds=2, strategies=["jit"])["strategy"]) == ["jit"]
