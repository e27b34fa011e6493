"""Each mechanism registers the figures it measures; together they cover the schema."""
import pytest

from sim.calibrated import FIGURES
from layercheck.contract.figure import CALIBRATE
from profiler import mechanisms
from profiler.calibrate import calibrate_job
from profiler.errors import ProfilerError
from profiler.mechanisms import MECHANISMS, Mechanism, check_coverage, check_measured


class _Registers(Mechanism):
    def __init__(self, name, *figures):
        self.name, self.figures = name, tuple(figures)


def test_the_shipped_mechanisms_cover_every_figure_calibrate_measures_once():
    check_coverage(MECHANISMS)
    registered = [n for m in MECHANISMS for n in m.figures]
    assert sorted(registered) == sorted(n for n, s in FIGURES.items() if s.measured_by == CALIBRATE)
    assert FIGURES["stale_cost"].measured_by == "python -m profiler staleness"


def test_a_figure_no_mechanism_measures_is_refused_by_name():
    without_restart = [m for m in MECHANISMS if "restart_s" not in m.figures]
    with pytest.raises(ProfilerError, match=r"no mechanism measures \['restart_s'\]"):
        check_coverage(without_restart)


@pytest.mark.parametrize("extra,match", [
    (_Registers("again", "save_gbps"), "registered by both"),
    (_Registers("typo", "save_gbp"), "no strategy declares"),
    (_Registers("phi", "stale_cost"), "python -m profiler staleness"),
    (type("S", (_Registers,), {"stated": ("restart_s",)})("stating"), "states"),
])
def test_a_figure_registered_twice_unknown_or_measured_elsewhere_is_refused(extra, match):
    with pytest.raises(ProfilerError, match=match):
        check_coverage([*MECHANISMS, extra])


def test_a_measurement_must_return_what_its_mechanism_registers():
    check_measured(_Registers("m", "restart_s"), {"restart_s": object()})
    with pytest.raises(ProfilerError, match="registers"):
        check_measured(_Registers("m", "restart_s"), {"restart_s": 1, "save_gbps": 2})


def test_calibrate_refuses_an_uncovered_schema_before_it_measures(monkeypatch):
    monkeypatch.setattr(mechanisms, "MECHANISMS", MECHANISMS[:-1])

    class NoJob:                     # any use of the job would fail differently
        def __getattr__(self, name):
            raise AssertionError(f"calibrate touched the job ({name}) before its check")

    with pytest.raises(ProfilerError, match="no mechanism measures"):
        calibrate_job(NoJob(), None, near=".")
