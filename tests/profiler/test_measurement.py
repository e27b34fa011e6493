"""The profiler's mechanisms are the code the torch-free table (``CODE``) declares."""
import importlib

import pytest

from layercheck.contract.measurement import CODE, MEASURED_BY, MECHANISM_VERSIONS, MEASURES


def test_every_declared_piece_of_code_exists_and_each_mechanism_is_shipped():
    """Each declaration names real code; a mechanism's is the class ``calibrate`` runs,
    measuring exactly the declared figures; every shipped mechanism is declared."""
    from profiler.mechanisms import MECHANISMS
    shipped = {m.name: m for m in MECHANISMS}
    for code in CODE:
        module, _, name = code.code.partition(":")
        target = getattr(importlib.import_module(module), name)
        if code.mechanism:
            assert type(shipped[code.name]) is target, code
            assert target.figures == code.figures
    assert set(shipped) == set(MEASURES)
    assert {f for m in MECHANISMS for f in m.figures} == set(MEASURED_BY)


def test_a_mechanism_is_declared_once_in_the_contract():
    from profiler.errors import ProfilerError
    from profiler.mechanisms import Mechanism
    with pytest.raises(ProfilerError, match="not declared: add it.*measurement.CODE"):
        type("New", (Mechanism,), {"name": "new mechanism"})
    with pytest.raises(ProfilerError, match="lists its figures itself"):
        type("Again", (Mechanism,), {"name": "restart", "figures": ("restart_s",)})


def test_calibrate_records_the_code_that_measured(monkeypatch):
    from profiler import calibrate
    from layercheck.contract.trace import read_trace
    from pathlib import Path
    trace = read_trace(Path(__file__).resolve().parents[2] / "traces" / "minilm-200steps")
    from sim.calibrated import FIGURES
    # the shipped figures, and the declared default of any figure a strategy added after
    # that capture (a calibration holds every figure of the schema)
    figures = {name: spec.default for name, spec in FIGURES.items() if spec.default is not None}
    figures.update(trace.costs.figures)
    figures.pop("stale_cost")
    made = calibrate._calibration(trace, figures, 1.0, 1)
    assert made.code["mechanisms"] == MECHANISM_VERSIONS
    assert made.code["figures"]["lc_write_gbps"] == ["layercheck", "layercheck writer"]
