"""The profiler's mechanisms declare the versions the torch-free table compares against."""
from layercheck.contract.measurement import MEASURED_BY, MECHANISM_VERSIONS


def test_the_profilers_mechanisms_declare_the_same_versions():
    from profiler.mechanisms import INSTALLED_VERSIONS
    assert INSTALLED_VERSIONS == MECHANISM_VERSIONS


def test_each_mechanism_measures_the_figures_the_table_names():
    from profiler.mechanisms import MECHANISMS
    for mechanism in MECHANISMS:
        for figure in mechanism.figures:
            assert figure in MEASURED_BY, figure
    assert {f for m in MECHANISMS for f in m.figures} == set(MEASURED_BY)


def test_calibrate_records_the_code_that_measured(monkeypatch):
    from profiler import calibrate
    from layercheck.contract.trace import read_trace
    from pathlib import Path
    trace = read_trace(Path(__file__).resolve().parents[2] / "traces" / "minilm-200steps")
    figures = dict(trace.costs.figures)
    figures.pop("stale_cost")
    made = calibrate._calibration(trace, figures, 1.0, 1)
    assert made.code["mechanisms"] == MECHANISM_VERSIONS
    assert made.code["figures"]["lc_write_gbps"] == ["layercheck", "layercheck writer"]
