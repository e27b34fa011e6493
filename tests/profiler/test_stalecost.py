"""The staleness study on real training (profiler.stalecost, profiler.studyruns): a
short run of the tiny Qwen2 causal LM, its controls, its document and its figure."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layercheck.contract.calibration import read_calibration
from profiler.cli import main
from profiler.config import CaptureConfig
from profiler.errors import ProfilerError
from profiler.convergence import steps_behind
from profiler.stalecost import (StaleCostConfig, reread, run_study, set_stale_cost,
                                stale_cost_figure)
from profiler.studyruns import link_copy

pytestmark = pytest.mark.slow

SMALL = dict(capture=CaptureConfig(model="tiny", steps=36, threads=1), eval_every=4,
             eval_sequences=48, horizons=(4, 12), resamples=60)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    return run_study(StaleCostConfig(**SMALL, scratch=tmp_path_factory.mktemp("scratch")),
                     say=lambda _: None)


def _runs(doc: dict, kind: str) -> list[dict]:
    return [r for r in doc["runs"] if r["kind"] == kind]


def test_the_exact_state_recovered_costs_nothing(study):
    (exact,) = _runs(study, "exact")
    assert exact["identical_to_reference"] is True
    for reading in exact["readings"].values():
        assert (reading["delta"], reading["low"], reading["high"]) == (0.0, 0.0, 0.0)
    ref = study["reference"]
    at = [ref["curve_steps"].index(s) for s in exact["curve_steps"]]
    assert exact["curve"] == [ref["curve"][i] for i in at]


def test_every_threshold_recovers_a_composite_at_its_stalest_step(study):
    composite = _runs(study, "composite")
    assert sorted(r["threshold"] for r in composite) == [1e-4, 1e-3, 1e-2]
    for run in composite:
        series = np.array([np.nan if s is None else s for s in
                           study["reference"]["staleness"][f"{run['threshold']:g}"]])
        t = run["failure_step"]
        assert t <= 36 - 4
        assert run["staleness"] == pytest.approx(series[t - 1])
        assert run["staleness"] == pytest.approx(np.nanmax(series[:36 - 4]))
        # the restored layers are as old as the writes say: none newer than t
        assert all(step <= t for step in run["restored_sources"].values())
        assert run["max_layer_staleness"] == t - min(run["restored_sources"].values())
        assert run["identical_to_reference"] is None
        assert set(run["readings"]) == {str(h) for h in (4, 12) if t + h <= 36} | {"end"}
        for name, reading in run["readings"].items():
            assert reading["low"] <= reading["delta"] <= reading["high"]
            phi = run["phi"][name]
            if run["staleness"] > 0:
                assert phi["value"] == pytest.approx(reading["delta"] / run["staleness"])
            else:  # every layer was written at t: nothing is stale, phi is undefined
                assert phi is None and reading["delta"] == 0.0


def test_the_reorder_control_sizes_the_noise_floor(study):
    (reorder,) = _runs(study, "reorder")
    assert reorder["identical_to_reference"] is None
    assert reorder["curve"] != _runs(study, "exact")[0]["curve"]  # another data order
    floor = study["noise_floor"]
    assert set(floor) == set(reorder["readings"])
    ref = study["reference"]
    for name, reading in reorder["readings"].items():  # its |loss gap|, read as steps behind
        behind, _ = steps_behind(np.array(ref["curve_steps"]), np.array(ref["curve"]),
                                 reading["step"], abs(reading["loss_gap"]))
        assert floor[name] == behind >= 0
        assert behind == abs(reading["delta"]) or reading["loss_gap"] < 0


def test_a_study_is_read_again_from_its_stored_losses_exactly(study):
    again = reread(json.loads(json.dumps(study)))
    for key in ("runs", "noise_floor", "summary"):
        assert again[key] == study[key]


def test_the_summary_and_the_figure(study):
    main = study["summary"]["figure"]
    assert main["threshold"] == 1e-3 and main["horizon"] == "end"
    (run,) = [r for r in _runs(study, "composite") if r["threshold"] == 1e-3]
    assert main["value"] == pytest.approx(run["phi"]["end"]["value"])
    floor = study["noise_floor"]["end"] / run["staleness"]
    assert main["low"] == pytest.approx(run["phi"]["end"]["low"] - floor)
    assert main["high"] == pytest.approx(run["phi"]["end"]["high"] + floor)
    figure = stale_cost_figure(study)
    assert (figure.value, figure.low, figure.high, figure.source) == (
        main["value"], main["low"], main["high"], "measured")
    assert "python -m profiler staleness" in figure.method
    json.dumps(study)  # the document is plain JSON


def test_the_figure_goes_into_a_costs_json_beside_the_others(study, tmp_path):
    shipped = Path(__file__).resolve().parents[2] / "traces" / "minilm-200steps" / "costs.json"
    costs = tmp_path / "costs.json"
    costs.write_text(shipped.read_text())
    before = read_calibration(costs)
    set_stale_cost(costs, study)
    after = read_calibration(costs)
    assert after.figures["stale_cost"] == stale_cost_figure(study)
    for name, figure in before.figures.items():
        if name != "stale_cost":
            assert after.figures[name] == figure


def test_link_copy_keeps_the_files_and_copies_what_grows(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "layer.safetensors").write_bytes(b"x")
    (src / "sub" / "v.safetensors").write_bytes(b"y")
    (src / "manifest.jsonl").write_text("{}\n")
    (src / ".lock").write_text("")
    link_copy(src, tmp_path / "dst")
    dst = tmp_path / "dst"
    assert (dst / "layer.safetensors").stat().st_ino == (src / "layer.safetensors").stat().st_ino
    assert (dst / "sub" / "v.safetensors").read_bytes() == b"y"
    assert (dst / "manifest.jsonl").stat().st_ino != (src / "manifest.jsonl").stat().st_ino
    assert not (dst / ".lock").exists()


@pytest.mark.parametrize("change, message", [
    ({"thresholds": ()}, "thresholds"), ({"thresholds": (0.0,)}, "thresholds"),
    ({"failures": 0}, "failures"), ({"eval_every": 0}, "eval_every"),
    ({"reorders": -1}, "reorders"), ({"eval_sequences": 1}, "eval_sequences"),
    ({"horizons": (0,)}, "horizons"), ({"figure_horizon": "7"}, "figure_horizon"),
    ({"capture": CaptureConfig(model="tiny", steps=8)}, "too short"),
])
def test_bad_settings_say_what_to_fix(change, message):
    with pytest.raises(ProfilerError, match=message):
        StaleCostConfig(**{**SMALL, **change})


@pytest.mark.parametrize("argv, message", [
    (["--thresholds", "a,b"], "comma-separated numbers"),
    (["--horizons", "10,x"], "comma-separated numbers"),
    (["--failures", "0"], "failures"),
    (["--figure-horizon", "3"], "figure_horizon"),
    (["--scratch", "/no/such/folder"], "no such folder"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["staleness", "--model", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_the_command_writes_its_document(tmp_path):
    out = tmp_path / "study.json"
    proc = subprocess.run(
        [sys.executable, "-m", "profiler", "staleness", "--model", "tiny", "--steps", "30",
         "--threads", "1", "--eval-every", "5", "--eval-sequences", "24", "--horizons", "5",
         "--thresholds", "1e-3", "--resamples", "20", "--reorders", "0", "--scratch",
         str(tmp_path), "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=600,
        cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m profiler staleness --model tiny")
    assert [r["kind"] for r in doc["runs"]] == ["composite", "exact"]
    assert doc["noise_floor"] == {}
    assert f"wrote {out}" in proc.stdout


def test_every_run_starts_from_the_generators_of_a_new_process(tmp_path):
    """Dropout draws from torch's global generator: a run that inherited the generator
    its predecessor advanced would not repeat the reference (MiniLM's second run differed
    at step 1), so every job starts from the state a fresh build leaves."""
    import torch

    from profiler.studyruns import Runs
    runs = Runs(StaleCostConfig(**SMALL), tmp_path, lambda _: None)
    runs._job()
    fresh = torch.get_rng_state()
    torch.rand(1000)  # what a run's dropout does
    runs._job()
    assert torch.equal(torch.get_rng_state(), fresh)
