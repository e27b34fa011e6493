"""sim.tuning: budgets in, the best setting out; budgets no setting meets are named."""
from __future__ import annotations

import math

import numpy as np
import pytest

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.trace import read_trace
from sim.api import Scenario
from sim.costs import CostModel
from sim.errors import SimError
from sim.frontier import Grid
from sim.presets import TRACES_DIR
from sim.tuning import Budgets, candidates, evaluate_with_references, recommend

GRID = dict(base_thresholds=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, math.inf),
            embedding_thresholds=(1e-3, 1e-2, 1e-1), smax=(60, 200, 591), intervals=(1, 4),
            warmup_steps=118)


@pytest.fixture(scope="module")
def minilm():
    trace = read_trace(TRACES_DIR / "minilm-1000steps")
    scenario = Scenario.from_trace(trace, costs=CostModel.paper_a100(), window_s=3 * 86400.0)
    return trace, scenario, evaluate_with_references(trace, Grid(**GRID))


def advise(minilm, **budgets):
    trace, scenario, result = minilm
    return recommend(trace, scenario, Budgets(**budgets), mtbf_s=1800.0, seeds=3, result=result)


def test_the_best_setting_within_the_budgets(minilm):
    advice = advise(minilm, max_bytes=20e9, max_staleness=150)
    best = advice.best
    assert best["bytes_written"] <= 20e9 and best["max_staleness"] <= 150
    assert best["role"] == "grid" and best["effective_ratio"] > 0
    assert advice.config == LayerCheckConfig(**{k: best[k] for k in (
        "base_threshold", "embedding_threshold", "smax", "interval", "warmup_steps")})
    assert advice.paper["role"] == "paper default" and advice.recorded["role"] == "recorded"
    assert advice.simulated <= advice.within <= advice.grid_size == 108
    text = advice.text()
    assert "recommended" in text and "paper default" in text and advice.line in text
    assert "write_budget=" in text                      # the budget mode alternative


def test_it_wins_among_what_it_simulated(minilm):
    trace, scenario, result = minilm
    budgets = Budgets(max_write_share=0.05)
    rows = candidates(result.table, budgets)
    advice = recommend(trace, scenario, budgets, mtbf_s=1800.0, seeds=3, result=result)
    assert advice.simulated == len(rows)
    from sim.frontier import rate
    rated = rate(result, scenario, rows=rows, mtbf_s=1800.0, seeds=3)
    assert advice.best["effective_ratio"] == rated.loc[rows, "effective_ratio"].max()
    assert (result.table.loc[rows, "write_share"] <= 0.05).all()


def test_moving_a_budget_moves_the_recommendation(minilm):
    loose, tight = advise(minilm, max_bytes=40e9), advise(minilm, max_bytes=8e9)
    assert tight.best["bytes_written"] <= 8e9 < loose.best["bytes_written"]
    assert tight.config != loose.config and "--max-gb" in tight.binding()


def test_json_carries_a_config_the_library_and_profiler_take(minilm):
    out = advise(minilm, max_bytes=20e9, max_write_share=0.2).to_dict()
    assert LayerCheckConfig.from_dict(out["config"]) == LayerCheckConfig.from_dict(
        {k: out["recommended"][k] for k in ("base_threshold", "embedding_threshold", "smax",
                                            "interval", "warmup_steps")})
    assert out["budgets"] == {"max_gb": 20.0, "max_staleness": None, "max_write_share": 0.2,
                              "max_host_gb": None}
    mode = LayerCheckConfig.from_dict(out["budget_mode"]["config"])
    trace = minilm[0]
    base = mode.warmup_steps if mode.warmup_steps % mode.interval == 0 else None
    assert base is not None and mode.write_budget == pytest.approx(
        min((20e9 - trace.full_checkpoint_bytes) / (trace.num_steps - base),
            0.2 * out["write_bandwidth"]["bytes_per_s"] * trace.compute_seconds().mean()), rel=1e-3)
    assert out["write_bandwidth"]["source"] == "costs.json lc_write_gbps (measured)"


@pytest.mark.parametrize("budgets,words", [
    (dict(max_bytes=0.5e9), "--max-gb 0.5 binds: no setting meets it; the least any of the 108 "
                            "settings gives is 975.1 MB (base_threshold inf"),
    (dict(max_staleness=3), "--max-staleness 3 binds: no setting meets it; the least any of the "
                            "108 settings gives is 4 steps"),
    (dict(max_bytes=3e9, max_staleness=100), "--max-gb 3 and --max-staleness 100 cannot both hold: "
                                             "within --max-gb 3 the least largest staleness is "
                                             "199 steps"),
])
def test_infeasible_budgets_name_the_one_that_binds(minilm, budgets, words):
    with pytest.raises(SimError, match="^" + words.replace("(", r"\(")):
        advise(minilm, **budgets)


@pytest.mark.parametrize("budgets,words", [
    (dict(max_bytes=-3e9), "--max-gb must be a positive number of GB, got -3.0"),
    (dict(max_staleness=0), "--max-staleness must be a positive number of steps"),
    (dict(max_write_share=1.5), r"--max-write-share must be a fraction in \(0, 1\]"),
    (dict(max_write_share=float("nan")), "--max-write-share must be a fraction"),
])
def test_bad_budgets_say_the_fix(budgets, words):
    with pytest.raises(SimError, match=words):
        Budgets(**budgets)


def test_references_are_evaluated_beside_the_grid(minilm):
    table = minilm[2].table
    assert list(table["role"].value_counts().sort_index().items()) == [
        ("grid", 108), ("paper default", 1), ("recorded", 1)]
    recorded = table[table["role"] == "recorded"].iloc[0]
    assert recorded["bytes_written"] == minilm[0].writes["bytes"].sum()
    assert not np.isnan(table["write_share"]).any()
