import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from layercheck.contract.calibration import read_calibration
from sim.api import COLUMNS
from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_torch_free():
    code = ("import sys, sim, sim.__main__, sim.cli, sim.api, sim.reference, sim.report, sim.presets, "
            "sim.frontier, sim.tuning, layercheck.contract.lanes, layercheck.budget; "
            "sim.simulate(sim.Scenario.from_preset('llama-3.2-1b', window_s=3600.0), mtbf_s=600.0, seeds=1); "
            "assert 'torch' not in sys.modules, 'sim imported torch'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_default_table_says_what_it_rests_on():
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d")
    assert result.returncode == 0, result.stderr
    head = result.stdout.splitlines()[:3]
    assert head[0].startswith("qwen2.5-7b (synthetic), MTBF 30m")
    assert head[1].startswith("costs: paper-a100") and "fit" in head[1] and "assumed" in head[1]
    assert head[2].startswith("protocol: matched") and "stale_s" in head[2]
    assert "layercheck-sync" in result.stdout and "gemini" in result.stdout and "stale h" in result.stdout


def test_json_has_exactly_the_keys(capsys):
    assert main(["--mtbf", "30m", "--json", "--seeds", "2", "--window", "1d",
                 "--preset", "llama-3.2-1b"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"rows", "scenario"}
    assert all(list(row) == list(COLUMNS) for row in data["rows"])
    assert data["scenario"]["name"] == "llama-3.2-1b"


def test_csv_and_custom(capsys):
    assert main(["--iteration-time", "6s", "--iterations", "1000", "--checkpoint-cost", "60s",
                 "--restart", "120s", "--interval", "100", "--strategies", "deepspeed,checkfreq",
                 "--mtbf", "2h", "--csv", "--seeds", "2", "--window", "2d"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 3


def test_sweep_writes_files(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--mtbf", "0.1h..1h", "--points", "3", "--seeds", "2", "--window", "1d",
                 "--preset", "llama-3.2-1b", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"sweep.csv", "sweep.json", "sweep.html"}
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert len(rows) == 3 * 8 and {r["strategy"] for r in rows} >= {"limit", "layercheck"}
    assert "limit (perfect checkpointer)" in (out / "sweep.html").read_text()


@pytest.mark.parametrize("args", [["--mtbf", "-1"], ["--mtbf", "5x"], ["--mtbf", "1h", "--trace", "/no/such"],
                                  ["--mtbf", "1h", "--strategies", "foo"], ["--mtbf", "1h", "--bogus"],
                                  ["--mtbf", "1h", "--trace", "traces"], ["sweep", "--mtbf", "3h..1h"],
                                  ["--gpu-mtbf", "1000h"], ["--mtbf", "1h", "--seeds", "x"],
                                  ["--mtbf", "1h", "--costs", "paper-h100"],
                                  ["--mtbf", "1h", "--cost", "speed=3"],
                                  ["--mtbf", "1h", "--cost", "save_gbps=fast"],
                                  ["--mtbf", "1h", "--write-gbps", "0"],
                                  ["--mtbf", "1h", "--protocol", "fair"],
                                  ["--mtbf", "1h", "--engine", "turbo"],
                                  ["--mtbf", "1h", "--workers", "0"],
                                  ["sweep", "--points", "2", "--scheduler", "localhost:8786"]])
def test_bad_input_is_one_line_exit_2(args):
    result = _run(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("python -m sim")


def test_malformed_trace(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    result = _run("--mtbf", "1h", "--trace", str(tmp_path))
    assert result.returncode == 2 and "not valid JSON" in result.stderr


def test_tune_prints_the_best_setting_and_the_line_to_paste(capsys):
    assert main(["tune", "--preset", "qwen2.5-7b", "--mtbf", "0.5h", "--max-gb", "500",
                 "--seeds", "2", "--window", "2d"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen2.5-7b-synthetic: MTBF 30m, 2 seeds, costs paper-a100")
    assert "budgets: --max-gb 500" in out and "paper default" in out
    assert "    LayerCheckConfig(base_threshold=" in out


def test_tune_json(capsys):
    assert main(["tune", "--trace", "traces/minilm-1000steps", "--costs", "paper-a100", "--mtbf",
                 "1h", "--max-write-share", "0.05", "--json", "--seeds", "2", "--window", "2d"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recommended"]["write_share"] <= 0.05 and out["costs"] == "paper-a100"
    assert out["config_line"].startswith("LayerCheckConfig(") and out["grid_size"] == 400


@pytest.mark.parametrize("args,words", [
    (["--trace", "{uncalibrated}", "--mtbf", "1h"],
     "has no costs.json (what each checkpointing mechanism costs"),
    (["--preset", "qwen2.5-7b", "--mtbf", "1h", "--max-gb", "50"], "--max-gb 50 binds"),
    (["--preset", "qwen2.5-7b", "--mtbf", "1h", "--max-gb", "300", "--max-staleness", "150"],
     "cannot both hold"),
    (["--preset", "qwen2.5-7b", "--mtbf", "1h", "--max-write-share", "5"], "--max-write-share must"),
    (["--preset", "qwen2.5-7b", "--max-gb", "500"], "give --mtbf"),
    (["--iteration-time", "6s", "--mtbf", "1h"], "tune replays a trace's drift"),
])
def test_tune_bad_or_infeasible_budgets_are_one_line_and_exit_2(args, words, capsys, tmp_path):
    uncalibrated = tmp_path / "minilm-uncalibrated"     # a capture made with --no-calibrate
    shutil.copytree("traces/minilm-1000steps", uncalibrated,
                    ignore=shutil.ignore_patterns("costs.json"))
    args = [a.format(uncalibrated=uncalibrated) for a in args]
    assert main(["tune", *args, "--seeds", "2", "--window", "1d"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


# -- the stale cost factor phi: --stale-cost, its bounds in every report ---------------------
def _phi_costs(tmp_path, value=0.5, low=0.0, high=1.0):
    """The 7B preset's costs.json with a measured stale cost factor and its interval."""
    data = read_calibration(ROOT / "traces/qwen2.5-7b-synthetic").to_dict()
    data["figures"]["stale_cost"] = {"value": value, "low": low, "high": high,
                                     "source": "measured", "method": "on traces/x, a test's"}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    return path


def test_the_table_shows_phi_its_bounds_source_and_when_the_ranking_depends_on_it(tmp_path):
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the capture's phi, carried over to the preset by its composition
    phi = read_calibration(ROOT / "traces/qwen2.5-7b-synthetic").figures["stale_cost"]
    assert lines[3].startswith(f"stale cost phi: {phi.value:g} (interval {phi.low:g}..{phi.high:g}); "
                               "transferred: carried over from traces/minilm-200steps")
    assert "phi low phi high" in lines[4]
    depends = [line for line in lines if line.startswith("the ranking depends on phi")]
    assert all(f"at phi {phi.low:g} (low)" in line and f"at {phi.high:g} (high)" in line
               for line in depends)  # where it does, it says at which of phi's bounds
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d",
                  "--costs", str(_phi_costs(tmp_path)))
    lines = result.stdout.splitlines()
    assert lines[3] == "stale cost phi: 0.5 (interval 0..1); measured: on traces/x, a test's"
    assert lines[-1].startswith("the ranking depends on phi: first at phi 0 (low) is layercheck")
    given_phi = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d", "--costs",
                     str(_phi_costs(tmp_path)), "--stale-cost", "0.25").stdout.splitlines()
    assert given_phi[3].startswith("stale cost phi: 0.25 (no interval); given:")
    assert not given_phi[-1].startswith("the ranking depends")


def test_csv_and_sweep_carry_the_bounds(tmp_path, capsys):
    costs = str(_phi_costs(tmp_path))
    assert main(["--mtbf", "30m", "--csv", "--seeds", "2", "--window", "1d", "--costs", costs]) == 0
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert "ratio_at_phi_low,ratio_at_phi_high" in header and "stale_lost_s" in header
    out = tmp_path / "sw"
    assert main(["sweep", "--mtbf", "0.2h..1h", "--points", "2", "--seeds", "2", "--window", "2d",
                 "--costs", costs, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("MTBF ") and "the ranking depends on phi" in line for line in printed)
    assert "ratio_at_phi_low" in (out / "sweep.csv").read_text().splitlines()[0]
    html = (out / "sweep.html").read_text()
    assert "layercheck at phi low" in html and "triangle-down-open" in html


# --- issue 27, item 12: tune and run refuse a nonsense trace (the trace schema) ----------------
def _corrupt(folder: Path, how: str) -> None:
    """Damage a copy of a capture the way issue 27 found ``sim tune`` recommending from."""
    import numpy as np
    import pandas as pd
    drift, steps = pd.read_parquet(folder / "drift.parquet"), pd.read_parquet(folder / "steps.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    if how == "negative drift":
        drift["drift"] = -drift["drift"]
    elif how == "empty drift":
        drift = drift.iloc[:0]
    elif how == "negative lr":
        steps["lr"] = -steps["lr"]
    elif how == "nan params":
        manifest["layers"][3]["params"] = float("nan")
    elif how == "huge layer":
        manifest["layers"][2]["bytes"] = 10 ** 30
    drift.to_parquet(folder / "drift.parquet")
    steps.to_parquet(folder / "steps.parquet")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert np.isfinite(steps["forward_s"]).all()


@pytest.mark.parametrize("how,words", [
    ("negative drift", "drift table, column drift, row 0: "),
    ("empty drift", "drift table: 0 rows; it needs one per (step, layer)"),
    ("negative lr", "steps table, column lr, row 0: "),
    ("nan params", "layers table, column params, row 3: nan is not an integer"),
    ("huge layer", "layers table, column bytes, row 2: "),
])
@pytest.mark.parametrize("command", ["tune", "run"])
def test_a_nonsense_trace_is_refused_not_recommended_from(tmp_path, capsys, how, words, command):
    folder = tmp_path / "minilm"
    shutil.copytree(ROOT / "traces/minilm-200steps", folder)
    _corrupt(folder, how)
    assert main([command, "--trace", str(folder), "--mtbf", "1h", "--seeds", "2",
                 "--window", "1d"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


# --- issue 27, item 11: extreme but accepted values are refused before they allocate ----------
def _capped(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m sim`` with 2 GiB of address space and a minute: a refusal must come before
    anything large is allocated or run (the import alone takes about 1 GiB)."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, preexec_fn=cap,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1"})


def _log(folder: Path, times) -> str:
    path = folder / "failures.csv"
    path.write_text("time_s\n" + "".join(f"{t!r}\n" for t in times))
    return str(path)


@pytest.mark.parametrize("args,words", [
    (["--mtbf", "1e-6s"], "failures per run"),
    (["--gpus", "1000000000000", "--gpu-mtbf", "1h"], "failures per run"),
    (["--mtbf", "1h", "--window", "1e12d"], "failures per run"),
    (["--mtbf", "1h", "--failures", "weibull", "--shape", "0.01"], "Weibull shape 0.01"),
    (["--mtbf", "1h", "--failures", "weibull", "--shape", "0.002"], "Weibull shape 0.002"),
    (["--failure-log", "{tiny_gaps}"], "failures per run"),
    (["--failure-log", "{one_second}"], "failures per run"),
    (["--mtbf", "1h", "--seeds", "1000000000"], "failures in all"),
    (["--mtbf", "1h", "--engine", "simpy", "--window", "3000d"], "simpy"),
    (["--mtbf", "1h", "--interval", "99999999999999999999"], "the job's 1692 steps"),
    (["--iteration-time", "1s", "--iterations", "1000000000000", "--mtbf", "1h"], "iterations"),
    (["--iteration-time", "1s", "--checkpoint-gb", "1e300", "--mtbf", "1h"], "checkpoint size"),
    (["sweep", "--points", "1000000000"], "failures in all"),
    (["sweep", "--mtbf", "1e-7s..1h", "--points", "3"], "failures per run"),
    (["--nodes", "1000000", "--node-mtbf", "1s"], "failures per run"),
    (["--nodes", "1000000", "--node-mtbf", "1e9h", "--seeds", "100"], "random streams"),
    (["sweep", "--out", "/etc/passwd", "--points", "2", "--seeds", "1", "--window", "1h"], "--out"),
    (["presets", "--write", "--seed", "-1"], "--seed"),
])
def test_extreme_values_are_one_line_exit_2_before_allocating(tmp_path, args, words):
    logs = {"tiny_gaps": _log(tmp_path, [1e-9, 2e-9, 3e-9]),
            "one_second": _log(tmp_path, [float(t) for t in range(1, 101)])}
    result = _capped(*[a.format(**logs) for a in args])
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_log_played_once_runs_over_any_window(tmp_path):
    """The bound counts what a run draws: a log played once draws its rows, whatever the window."""
    result = _capped("--failure-log", _log(tmp_path, [3600.0, 7200.0]), "--log-once",
                     "--window", "1e12d", "--seeds", "2", "--strategies", "deepspeed", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"][0]["failures"] == 2.0


# --- issue 26: a job of N nodes, failure domains, real failure records ---------------------


def test_fit_failures_prints_the_fit_and_the_attribution(capsys):
    assert main(["fit-failures", "lanl", "--system", "18", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["failures"] == 3997 and out["summary"]["nodes"] == 1024
    assert {"system", "node gaps"} == set(out["fits"]) and "Los Alamos" in out["attribution"]
    assert out["cofailures"]["largest"] == 6
    assert main(["fit-failures", "philly"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("data: Microsoft Philly traces") and "restart_gap" in lines[-2]


@pytest.mark.parametrize("args,words", [
    (["--nodes", "8"], "--node-mtbf X"),
    (["--nodes", "8", "--node-mtbf", "1h", "--mtbf", "1h"], "drop --mtbf"),
    (["--nodes", "8", "--node-mtbf", "1h", "--gpus", "8"], "drop --gpus"),
    (["--node-mtbf", "1h", "--mtbf", "1h"], "give --nodes N"),
    (["--domain", "rack:4:1d", "--mtbf", "1h"], "give --nodes N"),
    (["--nodes", "0", "--node-mtbf", "1h"], "from 1 to"),
    (["--nodes", "8", "--node-mtbf=-1h"], "--node-mtbf"),
    (["fit-failures", "lanl", "--system", "18", "--cofailure-window=-1s"], "--cofailure-window"),
    (["--nodes", "8", "--node-mtbf", "1h", "--domain", "rack:x:1d"], "KIND:SIZE:MTBF"),
    (["--nodes", "8", "--node-mtbf", "1h", "--domain", "pdu:4:1d"], "rack, switch"),
    (["--nodes", "8", "--node-mtbf", "1h", "--domain", "rack:4:0s"], "positive"),
    (["--nodes", "8", "--failure-log", "lanl"], "--system N"),
    (["--nodes", "8", "--failure-log", "lanl", "--system", "99"], "system 99"),
    (["--nodes", "8", "--failure-log", "philly"], "fit-failures philly"),
    (["--nodes", "8", "--failure-log", "lanl", "--system", "18", "--node-mtbf", "1h"], "own rate"),
    (["--nodes", "8", "--failure-log", "lanl", "--system", "18", "--log-once"], "--log-once"),
    (["--nodes", "8", "--failures", "weibull", "--node-mtbf", "1h", "--failure-log", "lanl"],
     "--failures log"),
    (["--nodes", "1000000", "--node-mtbf", "1s"], "failures per run"),
    (["fit-failures", "lanl"], "--system N"),
    (["fit-failures", "no-such.csv"], "no such file"),
    (["fit-failures", "philly", "--system", "1"], "not LANL"),
])
def test_bad_node_input_is_one_line_exit_2(capsys, args, words):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert err.startswith("python -m sim: error:")


def test_bad_node_input_from_the_shell_has_no_traceback():
    result = _run("--nodes", "8", "--node-mtbf", "1h", "--domain", "rack:1:1d")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "at least 2" in result.stderr
