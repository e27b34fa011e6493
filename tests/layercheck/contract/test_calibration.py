"""costs.json: figures with intervals, the signed stale cost factor, and declared defaults
(the contract's schema-agnostic reading, and the simulator's against its strategies)."""
import json
from pathlib import Path

import pytest

from types import SimpleNamespace

import sim.strategies
from layercheck.contract import calibration as contract
from layercheck.contract.calibration import (SOURCES, STALE_COST_CAPTURE, TRANSFERRED_STALE_COST,
                                             CalibrationError, Figure, write_calibration)
from layercheck.contract.figure import FigureSpec
from sim import SimError
from sim.calibrated import FIGURES, Calibration, checked, read_calibration

ROOT = Path(__file__).resolve().parents[3]


def _figures(**changes):
    out = {n: Figure(value=2.0 if FIGURES[n].unit != "1" else 0.25, source="measured",
                     method=f"timed {n}") for n in FIGURES}
    return {**out, **changes}


def test_the_stale_cost_figure_and_its_transferred_default():
    spec = FIGURES["stale_cost"]
    assert spec.unit == "1" and spec.used_by == "layercheck" and spec.signed
    assert spec.default is TRANSFERRED_STALE_COST
    assert "transferred" in SOURCES and TRANSFERRED_STALE_COST.source == "transferred"
    assert STALE_COST_CAPTURE in TRANSFERRED_STALE_COST.method
    assert "python -m profiler staleness" in TRANSFERRED_STALE_COST.method
    # no other figure may be negative; every figure declares a default (issue 28: the paper's
    # value, what an older costs.json is filled with), stale_cost's the only transferred one
    assert [n for n, s in FIGURES.items() if s.signed] == ["stale_cost"]
    assert all(s.default is not None for s in FIGURES.values())
    assert [n for n, s in FIGURES.items() if s.default.source == "transferred"] == ["stale_cost"]


def test_the_transferred_constant_is_the_shipped_captures_measurement():
    """The default is what `python -m profiler staleness` measured on the shipped capture,
    once the capture carries it (until then there is nothing to compare it with)."""
    figures = json.loads((ROOT / STALE_COST_CAPTURE / "costs.json").read_text())["figures"]
    if "stale_cost" in figures:
        measured = Figure.from_dict(figures["stale_cost"])
        assert measured.source == "measured"
        assert (TRANSFERRED_STALE_COST.value, TRANSFERRED_STALE_COST.low,
                TRANSFERRED_STALE_COST.high) == (measured.value, measured.low, measured.high)
    assert TRANSFERRED_STALE_COST.low <= TRANSFERRED_STALE_COST.value <= TRANSFERRED_STALE_COST.high


def test_an_interval_is_optional_validated_and_written_only_when_present():
    plain = Figure(value=0.5, source="measured", method="m")
    assert plain.interval == (0.5, 0.5) and "low" not in plain.to_dict()
    ranged = Figure(value=0.5, low=0.25, high=0.75, source="measured", method="m")
    assert ranged.interval == (0.25, 0.75)
    assert ranged.to_dict() == {"value": 0.5, "source": "measured", "method": "m",
                                "low": 0.25, "high": 0.75}
    assert Figure.from_dict(ranged.to_dict()) == ranged
    with pytest.raises(CalibrationError, match="low <= value <= high"):
        Figure(value=0.9, low=0.25, high=0.75, source="measured", method="m")
    with pytest.raises(CalibrationError, match="both low and high"):
        Figure(value=0.5, low=0.25, source="measured", method="m")
    with pytest.raises(CalibrationError, match="finite"):
        Figure(value=0.5, low=float("-inf"), high=1.0, source="measured", method="m")


def test_only_the_stale_cost_may_be_negative():
    """A measured negative Delta (the recovered run ahead of the reference) is reported as
    measured; no cost of a mechanism is ever negative."""
    negative = Figure(value=-0.2, low=-0.5, high=0.1, source="measured", method="Delta / staleness")
    cal = Calibration(name="here", description="d", figures=_figures(stale_cost=negative))
    assert cal.figures["stale_cost"].value == -0.2
    with pytest.raises(CalibrationError, match="restart_s must be >= 0"):
        Calibration(name="here", description="d",
                    figures=_figures(restart_s=Figure(value=-1.0, source="measured", method="m")))
    with pytest.raises(CalibrationError, match="lc_commit_s must be >= 0"):
        Calibration(name="here", description="d", figures=_figures(
            lc_commit_s=Figure(value=0.1, low=-0.1, high=0.2, source="measured", method="m")))


def test_an_older_costs_json_reads_with_the_declared_default_and_says_so(tmp_path):
    cal = Calibration(name="old", description="d", figures=_figures())
    data = cal.to_dict()
    del data["figures"]["stale_cost"]                  # written before the figure existed
    (tmp_path / "costs.json").write_text(json.dumps(data))
    read = read_calibration(tmp_path)
    filled = read.figures["stale_cost"]
    assert read.filled == ("stale_cost",)
    assert (filled.value, filled.low, filled.high, filled.source) == (
        TRANSFERRED_STALE_COST.value, TRANSFERRED_STALE_COST.low, TRANSFERRED_STALE_COST.high,
        "transferred")
    assert filled.method.startswith("filled in on reading") and \
        TRANSFERRED_STALE_COST.method in filled.method
    # a file that has it reads it as written, nothing filled
    write_calibration(cal, tmp_path / "costs.json")
    again = read_calibration(tmp_path)
    assert again.filled == () and again.figures["stale_cost"] == cal.figures["stale_cost"]


def test_a_costs_json_missing_any_figure_reads_it_as_its_declared_default_assumed(tmp_path):
    """Issue 28: adding a figure must not break every shipped costs.json; a file that
    predates a figure reads it as the declaration's default, marked assumed. (Before, only
    stale_cost had a default and a missing save_gbps failed with "missing figures".)"""
    data = Calibration(name="old", description="d", figures=_figures()).to_dict()
    del data["figures"]["save_gbps"]
    (tmp_path / "costs.json").write_text(json.dumps(data))
    read = read_calibration(tmp_path)
    assert read.filled == ("save_gbps",)
    filled, default = read.figures["save_gbps"], FIGURES["save_gbps"].default
    assert (filled.value, filled.source) == (default.value, "assumed")
    assert filled.method.startswith("filled in on reading") and default.method in filled.method
    assert read.figures["restart_s"].source == "measured"   # the rest as written
    # a calibration built in code is still complete or refused
    with pytest.raises(CalibrationError, match="missing figures"):
        Calibration(name="x", description="d",
                    figures={n: f for n, f in _figures().items() if n != "stale_cost"})


def test_every_shipped_costs_file_reads_complete():
    paths = sorted(ROOT.glob("traces/*/costs.json"))
    assert paths
    for path in paths:
        assert set(read_calibration(path).figures) == set(FIGURES), path


def _spec(value: float = 1.0, default: bool = True) -> FigureSpec:
    return FigureSpec("s", "all", "a test figure", default=Figure(
        value=value, source="assumed", method="a test default") if default else None)


def test_the_contract_reads_the_figures_a_file_holds_and_the_simulator_checks_them(tmp_path):
    """The contract holds no figure of its own: its ``Calibration`` is the file's figures as
    written (none filled, none refused for being unknown); the simulator's, whose schema is
    its strategies' declarations (``sim.strategies.SCHEMA``), fills and checks them."""
    assert contract.Calibration.schema is None
    assert Calibration.schema is sim.strategies.SCHEMA and list(FIGURES) == list(sim.strategies.SCHEMA)
    figures = {"x_s": Figure(value=1.0, source="measured", method="m")}
    plain = contract.Calibration(name="x", description="d", figures=figures)
    assert list(plain.to_dict()["figures"]) == ["x_s"]
    with pytest.raises(CalibrationError, match="unknown figures"):
        Calibration(name="x", description="d", figures={**_figures(), **figures})
    data = Calibration(name="old", description="d", figures=_figures()).to_dict()
    del data["figures"]["save_gbps"]
    (tmp_path / "costs.json").write_text(json.dumps(data))
    read = contract.read_calibration(tmp_path)
    assert read.filled == () and "save_gbps" not in read.figures
    assert checked(read).filled == ("save_gbps",) and set(checked(read).figures) == set(FIGURES)
    assert checked(read).figures["restart_s"] == read.figures["restart_s"]


def test_a_fresh_interpreter_reads_a_costs_json_without_importing_the_simulator(tmp_path):
    """No entry point and no side-effect import: the contract reads a calibrated trace's
    costs.json by itself, and the simulator is not loaded."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from layercheck.contract.calibration import read_calibration\n"
            f"c = read_calibration({str(ROOT / 'traces' / 'minilm-200steps')!r})\n"
            "print(len(c.figures), 'sim' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    count, loaded = done.stdout.split()
    written = json.loads((ROOT / "traces" / "minilm-200steps" / "costs.json").read_text())
    assert int(count) == len(written["figures"]) and loaded == "False"
    assert "layercheck.figures" not in (ROOT / "pyproject.toml").read_text()


def test_a_figure_has_one_owner_and_a_default():
    one, two, bare = (SimpleNamespace(__name__=n, FIGURES=f) for n, f in (
        ("a", {"x_s": _spec()}), ("b", {"x_s": _spec()}), ("c", {"w_s": _spec(default=False)})))
    assert list(sim.strategies.schema((one,))) == ["x_s"]
    with pytest.raises(SimError, match="'x_s' is declared by both a and b"):
        sim.strategies.schema((one, two))
    with pytest.raises(SimError, match="'w_s' .c. declares no default"):
        sim.strategies.schema((bare,))
