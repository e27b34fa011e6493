"""Calibration: every figure of costs.json measured (or stated) on the tiny model's job."""
from __future__ import annotations

import pytest

from sim.calibrated import FIGURES, read_calibration
from profiler.config import default_interval
from profiler.cli import main

from profiler.mechanisms import MECHANISMS

ASSUMED = {"diff_batch"}
DERIVED = {"load_fixed_s", "peer_loss_probability"}   # peer loss: sim.placement
STATED = {n for m in MECHANISMS for n in m.stated}    # their declared defaults, said so


@pytest.fixture
def calibrated(calibrated_tiny):
    return calibrated_tiny


@pytest.mark.slow
def test_every_figure_is_there_with_its_source_and_method(calibrated, capsys):
    costs = read_calibration(calibrated)
    assert set(costs.figures) == set(FIGURES)
    for name, figure in costs.figures.items():
        expected = ("assumed" if name in ASSUMED else "derived" if name in DERIVED
                    else "transferred" if name == "stale_cost"
                    else FIGURES[name].default.source if name in STATED else "measured")
        assert figure.source == expected, name
        assert len(figure.method) > 40, name
        if FIGURES[name].unit == "GB/s" and figure.source == "measured":
            assert figure.value == pytest.approx(figure.bytes / figure.seconds / 1e9), name
    assert costs.name == "tiny" and costs.full_bytes > 0
    assert costs.model["label"] == "tiny" and "path" not in costs.model


@pytest.mark.slow
def test_the_figures_are_what_this_job_costs(calibrated, tiny_capture):
    costs = read_calibration(calibrated)
    trace = tiny_capture.trace
    value = costs.value
    assert value("restart_s") > 1  # a new interpreter importing torch and transformers
    # the peer copy is timed over loopback; its loss follows from the peer sharing the host
    assert costs.figures["peer_gbps"].bytes == pytest.approx(trace.full_checkpoint_bytes, rel=0.2)
    assert value("peer_loss_probability") == pytest.approx(32 / 419, abs=1e-4)
    assert value("diff_batch") == 2
    # a differential keeps 1% of the entries: values (4 bytes) and int32 indices
    assert 0.01 * 8 / 12 * 0.9 < value("diff_fraction") < 0.01 * 8 / 12 * 1.3
    # LowDiff's figures are its validation checkpointer's: a run with a full save at the
    # interval (at least 3: two differentials after it), then those two (the batch)
    # replayed by a fresh checkpointer's load
    every = max(default_interval(trace), 3)
    assert len(costs.figures["diff_replay_gbps"].samples) == 2
    assert len(costs.figures["diff_snapshot_gbps"].samples) == every + 2 - 1
    assert "DiffCheckpointer" in costs.figures["diff_snapshot_gbps"].method
    # CheckFreq's snapshot is its background thread's, one per repeat after the first save
    assert len(costs.figures["snapshot_gbps"].samples) == 1
    assert value("tracking_fraction") == pytest.approx(
        trace.steps["drift_s"].sum() / trace.compute_seconds().sum())
    assert costs.figures["lc_load_gbps"].bytes == trace.full_checkpoint_bytes
    for name in ("save_gbps", "load_gbps", "snapshot_gbps", "persist_gbps", "async_load_gbps",
                 "host_copy_gbps", "lc_write_gbps", "lc_load_gbps"):
        # one full state: weights + two Adam moments, within headers and step counters
        assert costs.figures[name].bytes == pytest.approx(trace.full_checkpoint_bytes, rel=0.2), name


@pytest.mark.parametrize("args, words", [
    (["calibrate", "--trace", "/no/such/trace"], "no such trace folder"),
    (["calibrate", "--trace", "traces/qwen2.5-7b-synthetic"], "not a trace made by"),
    (["calibrate", "--trace", "traces/minilm-1000steps", "--repeats", "0"], "repeats=0"),
    (["calibrate", "--trace", "traces/minilm-1000steps", "--scratch", "/no/such"], "no such folder"),
])
def test_bad_calibrate_input_is_one_line_and_exit_2(args, words, capsys, monkeypatch):
    from pathlib import Path
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_calibrate_needs_a_trace(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate"])
    assert exit_.value.code == 2 and "--trace" in capsys.readouterr().err


def test_a_calibration_keeps_a_measured_stale_cost_else_writes_the_transferred_one():
    """The stale cost factor is not timed by calibrate (profiler staleness measures it):
    a measurement already in the trace's costs.json stays; anything else is the capture's
    phi carried over by this trace's composition."""
    import dataclasses
    from pathlib import Path

    from layercheck.contract.calibration import Figure
    from layercheck.contract.trace import read_trace
    from profiler.calibrate import _stale_cost, transferred_stale_cost

    trace = read_trace(Path(__file__).resolve().parents[2] / "traces/minilm-200steps")
    carried = _stale_cost(dataclasses.replace(trace, costs=None))
    assert carried == transferred_stale_cost(trace) and carried.source == "transferred"
    assert "minilm-200steps by composition" in carried.method
    if "stale_cost" in trace.costs.filled:          # a costs.json from before the figure
        assert _stale_cost(trace) == carried
    else:
        assert _stale_cost(trace) == trace.costs.figures["stale_cost"]
    measured = Figure(value=0.4, low=0.1, high=0.7, source="measured", method="staleness on x")
    costs = dataclasses.replace(trace.costs, figures={**trace.costs.figures, "stale_cost": measured})
    assert _stale_cost(dataclasses.replace(trace, costs=costs)) is measured
