"""The validation: real runs killed at known times against the simulator's predictions.

The slow test runs a short version on the tiny model (a 20 s window, one
failure); it checks that the table is produced and sane, not the 5% goal
(a window this short is dominated by one restart). The suite runs three
strategies (a full checkpoint, LayerCheck's composite, the memory tier); all six
are a drill (``-m drill``): each strategy's checkpointer is killed and restored
for real in tests/profiler/checkpointers/test_killed_checkpointers.py.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profiler.cli import main
from profiler.config import ValidationConfig
from profiler.errors import ProfilerError
from profiler.failures.validate import failure_logs, failure_times, format_table, summarise

ROOT = Path(__file__).resolve().parents[3]
WINDOW = 20.0
EVERY = ["deepspeed", "checkfreq", "gemini", "lowdiff", "layercheck", "tiered"]


@pytest.mark.slow
@pytest.mark.parametrize("strategies", [
    pytest.param(["deepspeed", "layercheck", "tiered"], id="three"),
    pytest.param(EVERY, id="six", marks=pytest.mark.drill)])
def test_a_short_validation_gives_a_sane_table(strategies, calibrated_tiny, tmp_path, capsys):
    log = tmp_path / "failures.csv"
    log.write_text("time_s\n6\n")
    out = tmp_path / "validation.json"
    assert main(["validate", "--trace", str(calibrated_tiny), "--window", f"{WINDOW:g}",
                 "--failures", str(log), "--interval", "2", "--repeats", "1",
                 "--strategies", ",".join(strategies),
                 "--min-failures", "1", "--probes", "1", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [row["strategy"] for row in doc["table"]] == strategies
    assert doc["failures_s"] == [6.0] and doc["interval"] == 2 and doc["costs"] == "tiny"
    (run,) = doc["runs"]
    assert run["failures_s"] == [6.0] and len(run["peer_lost"]) == 1
    assert run["cadences"]["deepspeed"]["every"] == 2 and run["cadences"]["layercheck"] is None
    if "gemini" in strategies:
        assert run["cadences"]["gemini"]["every"] == 2
    # tiered's memory tier copies every step, whatever the interval; the seed's draw (0.68)
    # takes the node and keeps the buddy's copy: the restore is exact, nothing stale
    assert run["cadences"]["tiered"]["every"] == 1 and run["losses"] == ["node"]
    for row in run["table"]:
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
    for summary in doc["table"]:  # one repeat: its median is its row
        row = next(r for r in run["table"] if r["strategy"] == summary["strategy"])
        assert summary["relative_error"] == summary["relative_error_min"] == \
            summary["relative_error_max"] == row["relative_error"]
    measured = run["measured"]
    assert all(m["contention"]["checked"] for m in measured.values())  # Linux: /proc/stat
    assert measured["deepspeed"]["checkpoint_stall_s"] > 0  # saves every 2 steps
    assert measured["layercheck"]["tracking_s"] > 0
    if "lowdiff" in strategies:
        assert measured["lowdiff"]["tracking_s"] > 0        # its compression, every step
    assert run["predicted"]["layercheck"]["failures"] == 1
    tiered = measured["tiered"]
    assert tiered["tracking_s"] > 0 and tiered["checkpoint_stall_s"] > 0  # drift, the copies
    assert len(tiered["recovered_from"]) == len(tiered["resumed_at"]) <= 1
    if tiered["recovered_from"] == ["memory"]:  # the buddy's copy, kept at the node's loss
        assert tiered["stale_s"] == 0 and tiered["resumed_at"][0] > 0
    # each run's prediction restarts as the probe beside it did, where costs.json's
    # restart (timed at calibration) gives predicted_from_costs
    from sim import CostModel
    from sim.calibrated import read_calibration
    from layercheck.contract.trace import read_trace
    from profiler.failures.costprobe import LOADS, priced_load_s
    from sim import Scenario
    costs = CostModel.from_calibration(read_calibration(calibrated_tiny))
    calibrated = costs.restart_s
    state = Scenario.from_trace(read_trace(calibrated_tiny), costs=costs).workload.full_bytes
    assert doc["probes"] == 1 and set(run["probes"]) == set(strategies)
    for strategy, beside in run["probes"].items():
        probe = beside["restart_s"]
        # the run's restart: the median of the one timed before it and the one after it
        # (the next run's probe's; after the last run, the repeat's closing restart)
        assert 0.5 < probe < 300 and len(beside["restarts_s"]) == len(beside["after_s"]) == 1
        assert probe == pytest.approx((beside["restarts_s"][0] + beside["after_s"][0]) / 2)
        following = strategies[strategies.index(strategy) + 1:]
        if following:
            assert beside["after_s"] == run["probes"][following[0]]["restarts_s"]
        row = next(r for r in run["table"] if r["strategy"] == strategy)
        assert row["restart_probe_s"] == probe and row["save_probe_s"] == beside["save_s"]
        # the full saves at the run's interval (2: at steps 2, 4 and 6, where the probe's
        # first worker is killed) where the run makes them, and lowdiff's differentials
        # between them (steps 3 and 5: the first step is not a sample)
        full, diffs = strategy in ("deepspeed", "lowdiff"), strategy == "lowdiff"
        assert (len(beside["saves_s"]) >= 3) == full, (strategy, beside)
        assert all(0 < x < 60 for x in beside["saves_s"])
        assert (len(beside["diffs_s"]) >= 2) == diffs and row["diff_probe_s"] == beside["diff_s"]
        assert row["predicted_from_costs"] == run["predicted_from_costs"][strategy]["effective_ratio"]
        # one failure at 6 s: a recovery runs at most to the window's end, which cuts
        # both predictions' where a restart takes longer than the rest of the window
        base, cut = run["predicted_from_costs"][strategy]["recovery_s"], WINDOW - 6.0
        slower, delta = run["predicted"][strategy]["recovery_s"] - base, probe - calibrated
        # and where its first successor loaded the victim's recovery point (all but
        # gemini, whose peer the probe does not start), the recovery's load is the probe's
        assert (beside["load_s"] is not None) == (strategy in LOADS), (strategy, beside)
        assert row["load_probe_s"] == beside["load_s"]
        if beside["load_s"] is not None:
            assert beside["load_step"] > 0 and 0 < beside["load_s"] < 60
            # where the prediction resumes past the job's start (its recovery is more than
            # the restart: a load, and the warm-up), the load is the probe's; a resume from
            # step 0 (nothing durable yet, e.g. CheckFreq's first persist still running at
            # the failure) loads nothing in either prediction
            if base > calibrated + 1e-9:
                delta += beside["load_s"] - priced_load_s(strategy, costs, state)
        # where the probe timed full saves (and lowdiff's differentials) or a step's copy
        # again (tiered's memory tier), its figures move the step the failure strikes, and
        # with it a resumed worker's warm-up and lowdiff's replay, by a fraction of a
        # second (a CI run: deepspeed by 0.016 s, tiered by 0.0001 s)
        assert set(beside["measured"]) == ({"tier_copy_gbps", "tier_thread_gbps"}
                                           if strategy == "tiered" else set())
        close = 0.5 if strategy in ("deepspeed", "lowdiff", "tiered") else 1e-6
        if base < cut - 1e-6:
            assert slower == pytest.approx(min(delta, cut - base), abs=close), strategy
        else:
            assert min(delta, 0.0) - close <= slower <= close, strategy


def test_failure_times_are_seeded_and_inside_the_window():
    times = failure_times(mtbf_s=100.0, window_s=600.0, seed=3)
    assert times == failure_times(mtbf_s=100.0, window_s=600.0, seed=3)
    assert times != failure_times(mtbf_s=100.0, window_s=600.0, seed=4)
    assert all(0 < a < b < 600 for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("fields, words", [
    ({"window_s": 0}, "window_s=0"),
    ({"strategies": ("none",)}, "choose from deepspeed, checkfreq, gemini, lowdiff, layercheck, tiered"),
    ({"failures_s": (5.0, 3.0)}, "strictly increasing"),
    ({"failures_s": (700.0,), "window_s": 600}, "not inside the 600 s window"),
    ({"window_s": 60, "mtbf_s": 20}, "expects 3.0 failures; a validation needs at least 5 per "
     "run: use --mtbf 12 or less"),
    ({"failures_s": (1.0, 2.0)}, "has 2 failure"),
    ({"repeats": 0}, "repeats=0"),
    ({"interval": 0}, "interval=0"),
    ({"probes": 0}, "probes=0: use an integer >= 1"),
])
def test_bad_settings_say_the_fix(fields, words):
    with pytest.raises(ProfilerError, match=words):
        ValidationConfig(**fields)


@pytest.mark.parametrize("args, words", [
    (["validate", "--trace", "/no/such"], "no such trace folder"),
    (["validate", "--trace", "traces/qwen2.5-7b-synthetic"], "has no capture settings"),
    (["validate", "--trace", "traces/minilm-zero3-200steps"], "a DeepSpeed capture"),
    (["validate", "--trace", "traces/minilm-1000steps", "--window", "soon"], "not a duration"),
    (["validate", "--trace", "traces/minilm-1000steps", "--strategies", "lowdif"],
     "choose from"),
    (["validate", "--trace", "traces/minilm-1000steps", "--mtbf", "100"], "expects 1.2 failures"),
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


def test_a_capture_that_shared_the_machine_is_named_before_anything_runs(tiny_capture, tmp_path,
                                                                        capsys):
    import shutil
    from profiler.contention import Lap, summarize
    trace = tmp_path / "shared"
    shutil.copytree(tiny_capture.path, trace)
    manifest = json.loads((trace / "manifest.json").read_text())
    # what profiler.capture recorded for a run that had another job spinning a core
    manifest["machine"]["contention"] = summarize([Lap(wall_s=1.0, busy_s=2.0, own_s=1.0)] * 10)
    (trace / "manifest.json").write_text(json.dumps(manifest))
    assert main(["validate", "--trace", str(trace), "--quiet"]) == 2  # uncalibrated, as before
    err = capsys.readouterr().err
    assert f"warning: the capture of {trace}: other processes used 1.00 cores" in err
    assert "measure again on a quiet machine" in err
    # a quiet capture says nothing (the fixture's own record depends on this machine's load)
    manifest["machine"]["contention"] = summarize([Lap(wall_s=1.0, busy_s=1.0, own_s=1.0)] * 10)
    (trace / "manifest.json").write_text(json.dumps(manifest))
    assert main(["validate", "--trace", str(trace), "--quiet"]) == 2
    assert "warning" not in capsys.readouterr().err


def test_the_prediction_counts_stale_time_as_the_ledger_does():
    """The ledger counts every update stale layers discarded as lost (profiler/failures/ledger.py):
    the prediction does too, whatever stale cost factor the calibration carries."""
    import dataclasses

    from layercheck.contract.calibration import Figure
    from layercheck.contract.trace import read_trace
    from profiler.failures.validate import FailureLog, _predict, _scenario

    trace = read_trace(ROOT / "traces/minilm-200steps")
    record = Figure(value=0.3, low=0.1, high=0.5, source="measured", method="a test's")
    calibration = dataclasses.replace(trace.costs,
                                      figures={**trace.costs.figures, "stale_cost": record})
    scenario = _scenario(trace, calibration, FailureLog(0, (30.0, 70.0)), 10)
    row = _predict(scenario, 120.0, ["layercheck"])["layercheck"]
    assert row["stale_s"] > 0 and row["stale_lost_s"] == row["stale_s"]


def test_every_repeat_draws_its_own_log_with_the_fewest_failures_required():
    config = ValidationConfig(window_s=90.0, mtbf_s=15.0, seed=4, repeats=3, min_failures=5)
    logs = failure_logs(config)
    assert logs == failure_logs(config)                    # seeded
    assert [log.repeat for log in logs] == [0, 1, 2]
    assert len({log.seed for log in logs}) == 3            # seed + r, redrawn + repeats
    for log in logs:
        assert len(log.times) >= 5
        assert log.seed % 3 == (4 + log.repeat) % 3 and log.seed >= 4 + log.repeat
        assert log.times == failure_times(mtbf_s=15.0, window_s=90.0, seed=log.seed)
        # every draw it passed over had fewer than 5
        for attempt in range(log.redraws):
            skipped = failure_times(mtbf_s=15.0, window_s=90.0, seed=4 + log.repeat + 3 * attempt)
            assert len(skipped) < 5
    assert any(log.redraws for log in failure_logs(
        ValidationConfig(window_s=75.0, mtbf_s=15.0, repeats=6)))  # redrawing happens
    given = failure_logs(ValidationConfig(failures_s=(1.0, 2.0), min_failures=2, repeats=2))
    assert [log.times for log in given] == [(1.0, 2.0)] * 2 and given[0].seed is None


def test_the_summary_is_the_median_of_the_repeats_with_their_spread():
    def row(strategy, error, measured):
        return {"strategy": strategy, "relative_error": error, "measured_ratio": measured,
                "failures": 5, "window_s": 90.0}
    runs = [{"table": [row("deepspeed", 0.04, 0.5), row("gemini", -0.01, 0.7)]},
            {"table": [row("deepspeed", -0.02, 0.6), row("gemini", 0.03, 0.8)]},
            {"table": [row("deepspeed", 0.01, 0.4), row("gemini", 0.02, 0.9)]}]
    table = summarise(runs, ["deepspeed", "gemini"])
    assert [t["strategy"] for t in table] == ["deepspeed", "gemini"]
    ds = table[0]
    assert ds["repeats"] == 3 and ds["relative_error"] == 0.01
    assert (ds["relative_error_min"], ds["relative_error_max"]) == (-0.02, 0.04)
    assert ds["measured_ratio"] == 0.5 and ds["failures"] == [5, 5, 5]
    assert table[1]["relative_error"] == 0.02


def test_each_run_s_restarts_after_it_are_the_next_run_s_probe_s_and_the_last_the_closing():
    from profiler.failures.costprobe import Beside
    from profiler.failures.validate import _bracketed
    probes = {"deepspeed": Beside(strategy="deepspeed", restarts_s=(10.0, 11.0, 12.0)),
              "gemini": Beside(strategy="gemini", restarts_s=(8.0, 9.0, 7.0)),
              "layercheck": Beside(strategy="layercheck", restarts_s=(13.0, 14.0, 15.0))}
    bracketed = _bracketed(probes, (20.0, 21.0, 22.0))
    assert list(bracketed) == ["deepspeed", "gemini", "layercheck"]
    assert bracketed["deepspeed"].after_s == (8.0, 9.0, 7.0)
    assert bracketed["gemini"].after_s == (13.0, 14.0, 15.0)
    assert bracketed["layercheck"].after_s == (20.0, 21.0, 22.0)
    assert bracketed["deepspeed"].restart_s == pytest.approx(9.5)
    assert bracketed["layercheck"].restart_s == pytest.approx(17.5)
    assert all(bracketed[s].restarts_s == probes[s].restarts_s for s in probes)


def test_the_prediction_restarts_as_the_probe_beside_the_run_did():
    """Each failure's recovery in the prediction moves by the probe's difference from
    costs.json's restart (the failures stay at their wall-clock times)."""
    from layercheck.contract.trace import read_trace
    from profiler.failures.costprobe import Beside
    from profiler.failures.validate import FailureLog, _beside, _predict, _scenario

    trace = read_trace(ROOT / "traces/minilm-200steps")
    scenario = _scenario(trace, trace.costs, FailureLog(0, (40.0,)), 10)  # one: the same replay
    strategies = ["deepspeed", "checkfreq", "gemini", "lowdiff", "layercheck", "tiered"]
    calibrated = _predict(scenario, 120.0, strategies)
    later = (scenario.costs.restart_s + 1.5,) * 3
    probed = {s: _predict(_beside(scenario, Beside(strategy=s, restarts_s=later)), 120.0, [s])[s]
              for s in strategies}
    for strategy in strategies:
        before, after = calibrated[strategy], probed[strategy]
        assert after["recovery_s"] - before["recovery_s"] == pytest.approx(1.5), strategy
        assert after["effective_ratio"] < before["effective_ratio"], strategy


def test_the_probe_s_full_saves_and_differentials_price_the_prediction_s():
    """DeepSpeed's every save stalls the probe's seconds; LowDiff's step stalls its
    differential's; the calibration's figures give the rest."""
    from layercheck.contract.trace import read_trace
    from profiler.failures.costprobe import Beside
    from profiler.failures.validate import FailureLog, _beside, _predict, _scenario

    trace = read_trace(ROOT / "traces/minilm-200steps")
    scenario = _scenario(trace, trace.costs, FailureLog(0, (40.0,)), 6)
    full, restart = scenario.workload.full_bytes, (scenario.costs.restart_s,)
    ds = _predict(_beside(scenario, Beside(strategy="deepspeed", restarts_s=restart,
                                           saves_s=(0.2, 0.25, 0.3))), 120.0, ["deepspeed"])
    row = ds["deepspeed"]
    saves = row["bytes_written"] / full
    assert saves > 10 and row["checkpoint_stall_s"] == pytest.approx(0.25 * saves)
    calibrated = _predict(scenario, 120.0, ["lowdiff"])["lowdiff"]
    slower = _predict(_beside(scenario, Beside(strategy="lowdiff", restarts_s=restart,
                                               diffs_s=(0.7,))), 120.0, ["lowdiff"])["lowdiff"]
    steps_s = scenario.costs.diff_fraction * full / (scenario.costs.diff_snapshot_gbps * 1e9)
    assert steps_s < 0.5 and slower["checkpoint_stall_s"] > calibrated["checkpoint_stall_s"] + 10
    assert slower["effective_ratio"] < calibrated["effective_ratio"]


def test_the_printed_table_has_every_repeat_and_the_summary():
    row = {"strategy": "lowdiff", "measured_ratio": 0.5, "predicted_ratio": 0.52,
           "relative_error": 0.04, "failures": 6, "pace": 1.0, "predicted_at_pace": 0.51,
           "relative_error_at_pace": 0.02, "restart_probe_s": 12.5, "save_probe_s": 0.25,
           "load_probe_s": 0.8,
           "predicted_from_costs": 0.55, "relative_error_from_costs": 0.1}
    doc = {"repeats": 2, "window_s": 90.0,
           "runs": [{"repeat": 0, "seed": 0, "failures_s": [3.0], "table": [row]},
                    {"repeat": 1, "seed": 1, "failures_s": [4.5], "table": [row]}],
           "table": [{**row, "relative_error_min": -0.01, "relative_error_max": 0.05,
                      "failures": [6, 6]}]}
    text = format_table(doc)
    assert "repeat 1: seed 0, failures at 3 s" in text and "repeat 2: seed 1" in text
    assert "median over 2 repeat(s)" in text and "[ -1.00%,  +5.00%]" in text
    assert " 12.50s 0.250s 0.800s " in text and "0.5500  +10.00%" in text  # the probe, costs.json's prediction
