"""The staleness study on real training (profiler.stalecost, profiler.studyruns): a
short run of the tiny Qwen2 causal LM, its controls, its document and its figure."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.calibrated import read_calibration
from profiler.cli import main
from profiler.config import CaptureConfig
from profiler.errors import ProfilerError
from profiler.stalecost import (StaleCostConfig, reread, run_study, set_stale_cost,
                                stale_cost_figure)
from profiler.studyruns import link_copy

pytestmark = pytest.mark.slow

SMALL = dict(capture=CaptureConfig(model="tiny", steps=36, threads=1), eval_every=4,
             eval_sequences=48, horizons=(4, 12), resamples=60, failures=2, draws=2)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    return run_study(StaleCostConfig(**SMALL, scratch=tmp_path_factory.mktemp("scratch")),
                     say=lambda _: None)


def _runs(doc: dict, kind: str) -> list[dict]:
    return [r for r in doc["runs"] if r["kind"] == kind]


def test_the_exact_state_recovered_costs_nothing(study):
    (exact,) = _runs(study, "exact")
    assert exact["identical_to_reference"] is True
    for reading in [*exact["readings"].values(), *exact["readings_lr"].values()]:
        assert (reading["delta"], reading["low"], reading["high"]) == (0.0, 0.0, 0.0)
    ref = study["reference"]
    at = [ref["curve_steps"].index(s) for s in exact["curve_steps"]]
    assert exact["curve"] == [ref["curve"][i] for i in at]


def test_the_lost_work_control_reads_one(study):
    """The control loses exactly S_c steps of work (phi = 1 by the simulator's definition).
    Read on the learning-rate clock, a ruler of its own, it is S_c lost steps, within its
    interval, at every horizon of this short job (a control built wrong, with nothing
    rolled back or the optimizer state of f, reads about 0); the relative rule divides by
    it, so there it reads 1 exactly and each composite reads its own Delta / S over it."""
    summary = study["summary"]
    assert summary["rule"] == "relative" and summary["well_conditioned"]["holds"]
    for horizon, reading in summary["control"]["lr"]["0.001"].items():
        assert reading["low"] <= 1.0 <= reading["high"], horizon
        assert reading["n"] == 4  # 2 failure steps x 2 data orders
        assert abs(reading["value"] - 1.0) < 0.25, horizon
    for run in _runs(study, "control"):
        assert all(phi["value"] == 1.0 for phi in run["phi"].values())
    controls = {(r["failure_step"], r["draw"]): r for r in _runs(study, "control")}
    for run in _runs(study, "composite"):
        control = controls[(run["failure_step"], run["draw"])]
        for name, phi in run["phi"].items():
            mine = run["readings"][name]["delta"] / run["staleness"]
            theirs = control["readings"][name]["delta"] / control["staleness"]
            assert phi["value"] == pytest.approx(mine / theirs)


def test_every_replicate_has_its_composite_its_parts_and_its_control(study):
    plan = study["failure_steps"]["0.001"]
    assert len(plan) == 2 and all(t <= 36 - 12 for t in plan)
    series = np.array([np.nan if s is None else s for s in study["reference"]["staleness"]["0.001"]])
    clock = np.array(study["reference"]["lr_clock"])
    for t in plan:
        for draw in (0, 1):
            runs = {r["kind"]: r for r in study["runs"] if r["failure_step"] == t
                    and r["draw"] == draw}
            composite, control = runs["composite"], runs["control"]
            assert composite["staleness"] == pytest.approx(series[t - 1])
            # the parts' staleness adds up to the composite's on both clocks
            for key in ("staleness", "staleness_lr"):
                parts = sum(runs[p][key] for p in ("blocks", "embedding") if p in runs)
                assert parts == pytest.approx(composite[key])
            # the control: S_c whole steps lost, on the lr clock the lr of those steps
            assert control["rollback"] == max(1, round(composite["staleness"]))
            assert control["staleness_lr"] == pytest.approx(clock[t] - clock[t - control["rollback"]])
            assert all(step <= t for step in composite["restored_sources"].values())
            assert ("twin" in runs) == (draw == 1)
            for run in runs.values():
                assert set(run["readings"]) == set(run["readings_lr"]) == {"4", "12"}
                assert run["stop"] == max(r["step"] for r in run["readings"].values())


def test_a_study_is_read_again_from_its_stored_losses_exactly(study):
    stored = json.loads(json.dumps(study))
    again = reread(stored)
    for key in ("runs", "noise_floor", "summary"):
        assert again[key] == stored[key]
    other = reread(stored, rule="lr")  # another rule, from the same losses
    assert other["summary"]["rule"] == "lr"
    assert other["summary"]["figure"]["value"] == \
        study["summary"]["phi"]["0.001"]["composite"]["12"]["rules"]["lr"]["value"]


def test_the_command_reads_a_study_again_without_training(study, tmp_path, capsys):
    path = tmp_path / "staleness.json"
    path.write_text(json.dumps(study))
    assert main(["staleness", "--reread", str(path), "--rule", "lr"]) == 0
    again = json.loads(path.read_text())
    assert again["summary"]["rule"] == again["config"]["rule"] == "lr"
    assert again["reread"] == f"python -m profiler staleness --reread {path} --rule lr"
    assert again["summary"]["figure"]["value"] == \
        study["summary"]["phi"]["0.001"]["composite"]["12"]["rules"]["lr"]["value"]
    assert "stale_cost = " in capsys.readouterr().out
    path.write_text("{}")
    assert main(["staleness", "--reread", str(path)]) == 2
    assert "not a staleness study" in capsys.readouterr().err


def test_the_summary_and_the_figure(study):
    main = study["summary"]["figure"]
    assert main["threshold"] == 1e-3 and main["horizon"] == "12" and main["n"] == 4
    per_step = [r["readings"]["12"]["delta"] / r["staleness"] for r in _runs(study, "composite")]
    lost = [r["readings"]["12"]["delta"] / r["staleness"] for r in _runs(study, "control")]
    assert main["value"] == pytest.approx(np.mean(per_step) / np.mean(lost))  # ratio of means
    assert main["low"] < main["value"] < main["high"]
    figure = stale_cost_figure(study)
    assert (figure.value, figure.low, figure.high, figure.source) == (
        main["value"], main["low"], main["high"], "measured")
    assert "python -m profiler staleness" in figure.method and "n = 4" in figure.method
    assert "lost-work control" in figure.method
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
    ({"failures": 0}, "failures"), ({"draws": 0}, "draws"), ({"eval_every": 0}, "eval_every"),
    ({"eval_sequences": 1}, "eval_sequences"), ({"horizons": (0,)}, "horizons"),
    ({"horizons": (4, 4)}, "horizons"), ({"horizons": ("later",)}, "horizons"),
    ({"rule": "ratio"}, "rule"), ({"figure_horizon": "7"}, "figure_horizon"),
    ({"capture": CaptureConfig(model="tiny", steps=8)}, "too short"),
])
def test_bad_settings_say_what_to_fix(change, message):
    with pytest.raises(ProfilerError, match=message):
        StaleCostConfig(**{**SMALL, **change})


@pytest.mark.parametrize("argv, message", [
    (["--thresholds", "a,b"], "comma-separated numbers"),
    (["--horizons", "10,x"], "comma-separated numbers"),
    (["--failures", "0"], "failures"),
    (["--draws", "0"], "draws"),
    (["--rule", "ratio"], "rule"),
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
         "--threads", "1", "--eval-every", "5", "--eval-sequences", "24", "--horizons", "5,end",
         "--failures", "1", "--draws", "1", "--no-parts", "--no-exact", "--resamples", "20",
         "--scratch", str(tmp_path), "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=600,
        cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m profiler staleness --model tiny")
    assert [r["kind"] for r in doc["runs"]] == ["composite", "control"]
    assert doc["noise_floor"] == {} and doc["summary"]["figure"]["horizon"] == "end"
    assert f"wrote {out}" in proc.stdout
    assert "stale_cost = " in proc.stdout and "n = 1" in proc.stdout


def test_the_states_held_in_memory_resume_exactly(tmp_path):
    """From the state held at f with its own weights (a control rolled back by no steps),
    and from the composite with every layer put back as at f, the run repeats the
    reference bit for bit: what the controls, the twins and the parts rest on."""
    from profiler.studyruns import Recovery, Runs
    config = StaleCostConfig(**SMALL)
    runs = Runs(config, tmp_path, lambda _: None)
    reference = runs.reference()
    f = int(np.nanargmax(reference.staleness[1e-3][:20])) + 1
    (snap,) = runs.snapshots({1e-3: [f]}, {f}, None)
    stop, evals = f + 8, (f + 4 - f % 4, f + 8 - f % 4)
    ref = reference.losses
    expected = ref.loss[[ref.at(s) for s in evals]]
    twin = runs.recover(Recovery(kind="twin", threshold=None, step=f, draw=0, stop=stop,
                                 evals=evals))
    assert np.array_equal(twin.losses.loss, expected)
    every = tuple(name for layer in reference.names for name in layer)
    whole = runs.recover(Recovery(kind="blocks", threshold=1e-3, step=f, draw=0, stop=stop,
                                  evals=evals, snapshot=snap, fresh=every))
    assert np.array_equal(whole.losses.loss, expected)
    stale = runs.recover(Recovery(kind="composite", threshold=1e-3, step=f, draw=0, stop=stop,
                                  evals=evals, snapshot=snap))
    assert not np.array_equal(stale.losses.loss, expected)  # the composite itself is stale
    other = runs.recover(Recovery(kind="twin", threshold=None, step=f, draw=1, stop=stop,
                                  evals=evals))
    assert not np.array_equal(other.losses.loss, twin.losses.loss)  # another data order


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
