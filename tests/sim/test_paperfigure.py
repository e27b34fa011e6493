"""The paper's own figure (sim.paperfigure): its values with their source, our side from
real simulations, the paper's arithmetic, and ``python -m sim paper``."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim import Scenario, simulate
from sim.cli import main
from sim.paper import PUBLISHED_SHARES
from sim.paperfigure import (ACCOUNTINGS, PAPER_MTBF_S, PAPER_RATIOS, PAPER_RECOVERY_S,
                             PAPER_SOURCE, STRATEGIES, gemini_readings, implied,
                             lowdiff_write_rate, paper_figure)
from sim.strategies import PROTOCOLS

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"seeds": 2, "window_s": 2 * 86400.0}


@pytest.fixture(scope="module")
def figure():
    return paper_figure(**SMALL)


def test_the_papers_figures_carry_their_source():
    assert PAPER_MTBF_S == 1800.0
    assert PAPER_RATIOS == {"layercheck": 0.923, "lowdiff": 0.888, "gemini": 0.845}
    for text in ("IEEE CLUSTER 2026", "Qwen2.5-7B", "MTBF 0.5 h", "92.3%", "88.8%", "84.5%"):
        assert text in PAPER_SOURCE
    assert PAPER_RECOVERY_S == {"layercheck": 10.0, "lowdiff": 34.0, "gemini": 346.0}


def test_the_table_is_the_simulators(figure):
    """Every cell is a simulation of the preset at the MTBF, seeds and window asked for: the
    same numbers simulate gives for the same scenario, under each protocol and accounting."""
    assert len(figure.cells) == len(STRATEGIES) * len(PROTOCOLS) * len(ACCOUNTINGS)
    for protocol in PROTOCOLS:
        scenario = Scenario.from_preset("qwen2.5-7b", protocol=protocol, window_s=SMALL["window_s"])
        for accounting, stale in zip(ACCOUNTINGS, (None, 0.0)):
            df = simulate(dataclasses.replace(scenario, stale_cost=stale), mtbf_s=PAPER_MTBF_S,
                          strategies=list(STRATEGIES), seeds=2).set_index("strategy")
            for strategy in STRATEGIES:
                cell = figure.cell(strategy, protocol, accounting)
                assert cell.ratio == df.loc[strategy, "effective_ratio"]
                assert cell.ci95 == df.loc[strategy, "ci95"]
                assert cell.ratio_at_phi_high == df.loc[strategy, "ratio_at_phi_high"]
                assert cell.shares["rework"] == df.loc[strategy, "lost_work_s"] / SMALL["window_s"]
    phi = figure.cell("layercheck", "matched", ACCOUNTINGS[0]).phi
    assert phi == Scenario.from_preset("qwen2.5-7b").stale_figure().value
    assert figure.cell("layercheck", "matched", ACCOUNTINGS[1]).phi == 0.0


def test_each_cell_carries_the_closed_form_at_its_phi(figure):
    for cell in figure.cells:
        assert cell.first_order == figure.terms[cell.protocol, cell.strategy].ratio(cell.phi)


def test_what_the_papers_ratios_leave_for_stall_and_rework():
    """The docs' arithmetic of the paper's side: x = 1 - ratio / (1 - R/M)."""
    x = {i.strategy: i.remainder for i in implied()}
    # LowDiff: 9.5%, inside its published checkpoint share, near its low end
    low, high = PUBLISHED_SHARES["lowdiff"]
    assert low <= x["lowdiff"] <= high and x["lowdiff"] == pytest.approx(0.0949, abs=5e-4)
    # LayerCheck: 7.2%, 3.5 to 4.8 points under its own published share
    assert x["layercheck"] == pytest.approx(0.0718, abs=5e-4)
    assert x["layercheck"] < PUBLISHED_SHARES["layercheck-sync"][0] - 0.03
    # GEMINI with the published 346 s recovery would need a negative stall: not that protocol
    assert x["gemini"] < 0


def test_gemini_against_its_published_inputs():
    """Per iteration its 747.9 min run caps it at 0.236; at Young's interval for the 20.27 s
    checkpoint that run implies (43 steps) and a 10 s recovery it comes to 0.844."""
    g = gemini_readings()
    assert g["per_iteration_cap"] == pytest.approx(0.2357, abs=5e-4)
    assert g["checkpoint_s"] == pytest.approx(20.27, abs=0.01)
    assert round(g["young_interval_steps"]) == 43
    assert g["young_ratio"] == pytest.approx(PAPER_RATIOS["gemini"], abs=2e-3)


def test_the_write_rate_lowdiffs_figure_needs():
    """At 88.8% LowDiff's 7B run ends within 10,574 s / (1 - 0.095) = 11,683 s, so its
    19,259 GB need 1.65 GB/s, above the derived save_gbps (1.24) and inside its band."""
    from sim.costs import CostModel
    w = lowdiff_write_rate()
    assert w["run_s"] == pytest.approx(11_683, abs=2) and w["gbps"] == pytest.approx(1.65, abs=5e-3)
    band = CostModel().band("save_gbps")
    assert CostModel().save_gbps < w["gbps"] < band.high and w["gbps"] > band.low


def test_the_text_and_json(figure):
    text = figure.text()
    assert "0.923" in text and "0.888" in text and "0.845" in text and "first order" in text
    data = figure.to_dict()
    assert data["paper"]["source"] == PAPER_SOURCE and len(data["rows"]) == len(figure.cells)
    row = next(r for r in data["rows"] if r["strategy"] == "layercheck-sync")
    assert row["paper"] == 0.923 and row["interval"] == ""
    assert next(r for r in data["rows"] if r["strategy"] == "gemini" and
                r["protocol"] == "matched")["interval"] == "106/106"


def test_one_seed_has_no_band_and_the_json_stays_json(capsys):
    assert main(["paper", "--seeds", "1", "--window", "1d", "--json"]) == 0
    out = capsys.readouterr().out

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    data = json.loads(out, parse_constant=refuse)
    assert all(r["ci95"] is None for r in data["rows"])
    assert main(["paper", "--seeds", "1", "--window", "1d"]) == 0
    assert "+-n/a" in capsys.readouterr().out


def test_another_mtbf_has_no_paper_column():
    other = paper_figure(mtbf_s=7200.0, strategies=("deepspeed",), **SMALL)
    assert other.to_dict()["paper"] is None and "published at MTBF 30m only" in other.text()
    assert all(r["paper"] is None for r in other.to_dict()["rows"])


def test_the_command(capsys):
    assert main(["paper", "--seeds", "2", "--window", "2d", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mtbf_s"] == 1800.0 and data["seeds"] == 2 and data["window_s"] == 172800.0
    assert {r["protocol"] for r in data["rows"]} == set(PROTOCOLS)
    assert {r["accounting"] for r in data["rows"]} == set(ACCOUNTINGS)


@pytest.mark.parametrize("args, text", [
    (["--mtbf", "5x"], "--mtbf='5x' is not a duration"),
    (["--seeds", "0"], "--seeds 0: give a whole number"),
    (["--window", "0"], "--window='0' must be a positive duration"),
    (["--seed", "-1"], "--seed -1: give a non-negative integer"),
    (["--mtbf", "1s"], "failures per run"),
])
def test_bad_input_is_one_line_and_exit_2(args, text, capsys):
    assert main(["paper", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and text in err


def test_torch_free():
    code = ("import sys, sim.paperfigure, sim.firstorder; "
            "assert 'torch' not in sys.modules, 'sim imported torch'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
