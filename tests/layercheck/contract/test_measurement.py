import json
from pathlib import Path

import pytest

from layercheck.contract.calibration import write_calibration
from layercheck.contract.measurement import (CODE, MEASURED_BY, MEASURES, MECHANISM_VERSIONS,
                                             MeasuringCode, age_warning, code_record, outdated)
from sim.calibrated import FIGURES, Calibration, read_calibration

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "traces" / "minilm-1000steps" / "costs.json"


def _old(tmp_path) -> Path:
    """The shipped calibration as written before versions were recorded (no code block)."""
    data = json.loads(SHIPPED.read_text())
    data.pop("code", None)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    return path


def _current(calibration: Calibration) -> Calibration:
    import dataclasses
    return dataclasses.replace(calibration, code=code_record(MECHANISM_VERSIONS, "0.1.0"))


def test_every_measurable_figure_names_known_mechanisms():
    assert set(MEASURED_BY) == set(FIGURES) - {"stale_cost"}
    assert {u for units in MEASURED_BY.values() for u in units} == set(MECHANISM_VERSIONS)


def test_the_tables_are_derived_from_one_declaration_per_piece_of_code():
    """A version and the figures it measures are declared once (``CODE``); each figure
    has one mechanism, named first, then the implementations that mechanism times."""
    assert len({c.name for c in CODE}) == len(CODE)
    assert MECHANISM_VERSIONS == {c.name: c.version for c in CODE}
    assert MEASURES == {c.name: c.figures for c in CODE if c.mechanism}
    kind = {c.name: c.mechanism for c in CODE}
    for figure, units in MEASURED_BY.items():
        assert [kind[u] for u in units] == [True] + [False] * (len(units) - 1), figure
        assert all(figure in next(c for c in CODE if c.name == u).figures for u in units)
    assert MEASURED_BY["peer_gbps"] == ("peer copy",)       # PeerCopy measures it, not HostCopy
    with pytest.raises(ValueError, match="version 0 must be a whole number >= 1"):
        MeasuringCode(name="x", version=0, figures=("restart_s",), code="m:o")


def test_an_old_costs_json_still_reads_and_is_outdated(tmp_path):
    old = read_calibration(_old(tmp_path))
    assert old.code == {}
    measured = [n for n in MEASURED_BY if old.figures[n].source == "measured"]
    assert outdated(old.code, old.figures) == measured
    line = age_warning(old.code, old.figures, "traces/minilm-1000steps")
    assert "\n" not in line and "records no mechanism versions" in line
    assert "`python -m profiler calibrate --trace traces/minilm-1000steps`" in line


def test_a_current_calibration_is_not_outdated_and_round_trips(tmp_path):
    current = _current(read_calibration(SHIPPED))
    assert outdated(current.code, current.figures) == []
    assert age_warning(current.code, current.figures, "x") is None
    back = read_calibration(write_calibration(current, tmp_path))
    assert back.code == current.code and back.code["mechanisms"] == MECHANISM_VERSIONS


def test_an_older_mechanism_outdates_only_its_figures():
    current = _current(read_calibration(SHIPPED))
    code = json.loads(json.dumps(current.code))
    code["mechanisms"]["layercheck writer"] = 0
    assert outdated(code, current.figures) == ["lc_write_gbps", "lc_commit_s"]
    assert "was measured by older mechanisms: lc_write_gbps, lc_commit_s" in \
        age_warning(code, current.figures, "traces/t")


def test_figures_not_measured_never_outdate():
    synthetic = read_calibration(ROOT / "traces" / "qwen2.5-7b-synthetic")
    assert outdated(synthetic.code, synthetic.figures) == []
