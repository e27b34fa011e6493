"""The validation: real runs killed at known times against the simulator's predictions.

The slow test runs a short version on the tiny model (a 20 s window, one
failure); it checks that the table is produced and sane, not the 5% goal
(a window this short is dominated by one restart).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profiler.cli import main
from profiler.config import ValidationConfig
from profiler.errors import ProfilerError
from profiler.validate import failure_times

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 20.0


@pytest.mark.slow
def test_a_short_validation_gives_a_sane_table(calibrated_tiny, tmp_path, capsys):
    log = tmp_path / "failures.csv"
    log.write_text("time_s\n6\n")
    out = tmp_path / "validation.json"
    assert main(["validate", "--trace", str(calibrated_tiny), "--window", f"{WINDOW:g}",
                 "--failures", str(log), "--interval", "2", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [row["strategy"] for row in doc["table"]] == ["deepspeed", "checkfreq", "layercheck"]
    assert doc["failures_s"] == [6.0] and doc["interval"] == 2 and doc["costs"] == "tiny"
    for row in doc["table"]:
        assert row["failures"] == 1 and row["window_s"] == WINDOW
        assert 0 < row["measured_ratio"] < 1 and 0 < row["predicted_ratio"] < 1
        assert math.isfinite(row["relative_error"])
        # the diagnostic: the same prediction at the run's own step time
        assert row["pace"] > 0 and 0 <= row["predicted_at_pace"] < 1
        parts = sum(row[f"measured_{k}"] for k in ("useful_s", "checkpoint_stall_s",
                                                   "lost_work_s", "recovery_s"))
        assert parts <= WINDOW + 0.5  # the rest: job switches, a step cut by the window
        assert row["measured_recovery_s"] > 1  # a new process importing torch
        assert row["strategy"] in printed
    measured = doc["measured"]
    assert measured["deepspeed"]["checkpoint_stall_s"] > 0  # saves every 2 steps
    assert measured["layercheck"]["tracking_s"] > 0
    assert doc["predicted"]["layercheck"]["failures"] == 1


def test_failure_times_are_seeded_and_inside_the_window():
    times = failure_times(mtbf_s=100.0, window_s=600.0, seed=3)
    assert times == failure_times(mtbf_s=100.0, window_s=600.0, seed=3)
    assert times != failure_times(mtbf_s=100.0, window_s=600.0, seed=4)
    assert all(0 < a < b < 600 for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("fields, words", [
    ({"window_s": 0}, "window_s=0"),
    ({"strategies": ("gemini",)}, "choose from deepspeed, checkfreq, layercheck"),
    ({"failures_s": (5.0, 3.0)}, "strictly increasing"),
    ({"failures_s": (700.0,)}, "not inside the 600.0 s window"),
    ({"interval": 0}, "interval=0"),
])
def test_bad_settings_say_the_fix(fields, words):
    with pytest.raises(ProfilerError, match=words):
        ValidationConfig(**fields)


@pytest.mark.parametrize("args, words", [
    (["validate", "--trace", "/no/such"], "no such trace folder"),
    (["validate", "--trace", "traces/qwen2.5-7b-synthetic"], "has no capture settings"),
    (["validate", "--trace", "traces/minilm-zero3-200steps"], "a DeepSpeed capture"),
    (["validate", "--trace", "traces/minilm-1000steps", "--window", "soon"], "not a duration"),
    (["validate", "--trace", "traces/minilm-1000steps", "--strategies", "lowdiff"],
     "choose from"),
    (["validate", "--trace", "traces/minilm-1000steps", "--failures", "/no/such.csv"],
     "cannot read"),
])
def test_bad_validate_input_is_one_line_and_exit_2(args, words, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_an_uncalibrated_trace_says_to_calibrate(tiny_capture, capsys):
    assert main(["validate", "--trace", str(tiny_capture.path)]) == 2
    assert "python -m profiler calibrate --trace" in capsys.readouterr().err


def test_the_prediction_counts_stale_time_as_the_ledger_does():
    """The ledger counts every update stale layers discarded as lost (profiler/ledger.py):
    the prediction does too, whatever stale cost factor the calibration carries."""
    import dataclasses

    from layercheck.calibration import Figure
    from layercheck.trace import read_trace
    from profiler.validate import _predict

    trace = read_trace(ROOT / "traces/minilm-200steps")
    record = Figure(value=0.3, low=0.1, high=0.5, source="measured", method="a test's")
    calibration = dataclasses.replace(trace.costs,
                                      figures={**trace.costs.figures, "stale_cost": record})
    config = ValidationConfig(window_s=120.0, failures_s=(30.0, 70.0), strategies=("layercheck",))
    row = _predict(trace, calibration, (30.0, 70.0), 10, config)["layercheck"]
    assert row["stale_s"] > 0 and row["stale_lost_s"] == row["stale_s"]
