"""dashboard.fidelity: drill.json parsing and deviations."""
from __future__ import annotations

import pytest

from dashboard import fidelity


def test_read_drill_and_window_deviation(trace):
    drill = fidelity.read_drill(trace.drill)
    fail = drill.failure_steps[0]
    assert fidelity.deviation_in(drill, 1, fail)["max_abs"] == 0.0
    whole = fidelity.deviation_in(drill, 1, trace.num_steps)
    assert whole["max_abs"] == pytest.approx(drill.max_abs_loss_deviation)
    assert whole["max_rel"] == pytest.approx(drill.max_rel_loss_deviation)
    assert len(fidelity.curves_figure(drill).data) == 2
    assert len(fidelity.curves_figure(drill, show_deviation=True).data) == 1


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("curves"), "missing 'curves'"),
    (lambda d: d["curves"].pop("recovered"), "missing 'recovered'"),
    (lambda d: d.__setitem__("max_abs_loss_deviation", "big"), "must be a number"),
])
def test_bad_drill_says_what_is_wrong(trace, mutate, message):
    data = dict(trace.drill, curves=dict(trace.drill["curves"]))
    mutate(data)
    with pytest.raises(fidelity.DrillError, match=message):
        fidelity.read_drill(data)


def test_no_drill_says_how_to_make_one():
    with pytest.raises(fidelity.DrillError, match="python -m profiler drill"):
        fidelity.read_drill(None)
