"""The stale-cost figures: the capture's measured phi and its parts as the constants the
simulator carries over, and their transfer to other traces by composition
(profiler.stalefigure, sim.composite)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sim.calibrated import read_calibration
from layercheck.contract.figure import STALE_COST_CAPTURE, STALE_COST_PARTS, TRANSFERRED_STALE_COST
from layercheck.contract.trace import read_trace
from profiler.calibrate import transferred_stale_cost
from profiler.cli import main
from profiler.stalefigure import stale_cost_figure

ROOT = Path(__file__).resolve().parents[2]
TRANSFERRED = ("qwen2.5-7b-synthetic", "qwen2.5-3b-synthetic", "llama-3.2-1b-synthetic",
               "minilm-1000steps", "minilm-zero3-200steps")
"""The shipped traces whose stale cost is carried over from the capture."""


@pytest.fixture(scope="module")
def study() -> dict:
    return json.loads((ROOT / STALE_COST_CAPTURE / "staleness.json").read_text())


def test_the_constants_are_the_shipped_captures_study(study):
    for part, constant in (("composite", TRANSFERRED_STALE_COST), *STALE_COST_PARTS.items()):
        measured = stale_cost_figure(study, part)
        assert (constant.value, constant.low, constant.high) == (
            measured.value, measured.low, measured.high), part
    assert STALE_COST_PARTS["blocks"].method == stale_cost_figure(study, "blocks").method
    assert f"n = {study['summary']['figure']['n']}" in TRANSFERRED_STALE_COST.method


@pytest.mark.parametrize("name", TRANSFERRED)
def test_every_shipped_trace_carries_phi_by_its_own_composition(name):
    trace = read_trace(ROOT / "traces" / name)
    assert trace.costs.figures["stale_cost"] == transferred_stale_cost(trace)
    assert "by composition" in trace.costs.figures["stale_cost"].method


def test_transfer_to_writes_the_carried_figure_and_keeps_the_rest(tmp_path, capsys):
    folder = shutil.copytree(ROOT / "traces" / "qwen2.5-7b-synthetic", tmp_path / "q")
    costs = read_calibration(folder / "costs.json")
    data = costs.to_dict()
    data["figures"]["stale_cost"] = {**TRANSFERRED_STALE_COST.to_dict()}  # as before the transfer
    (folder / "costs.json").write_text(json.dumps(data))
    assert main(["staleness", "--transfer-to", str(folder)]) == 0
    after = read_calibration(folder / "costs.json")
    assert after.figures["stale_cost"] == transferred_stale_cost(read_trace(folder))
    assert {n: f for n, f in after.figures.items() if n != "stale_cost"} == \
        {n: f for n, f in costs.figures.items() if n != "stale_cost"}
    assert f"{folder}: stale_cost " in capsys.readouterr().out


def test_transfer_to_keeps_a_measured_phi_and_says_so(tmp_path, capsys):
    folder = shutil.copytree(ROOT / STALE_COST_CAPTURE, tmp_path / "m")
    before = (folder / "costs.json").read_text()
    assert main(["staleness", "--transfer-to", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "measured on its own job" in err and err.count("\n") == 1
    assert (folder / "costs.json").read_text() == before
    assert main(["staleness", "--transfer-to", str(tmp_path / "none")]) == 2
