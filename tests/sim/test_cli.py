import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim.calibrated import read_calibration
from sim.api import COLUMNS, Scenario, simulate
from sim.cli import main
from sim.report import RUN_TAIL
from sim.settings import layercheck_grid
from layercheck.contract.trace import read_trace
from sim.units import MAX_DURATION_S

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_torch_free():
    code = ("import sys, sim, sim.__main__, sim.cli, sim.api, sim.reference, sim.report, sim.presets, "
            "sim.frontier, sim.tuning, layercheck.contract.lanes, layercheck.contract.budget; "
            "sim.simulate(sim.Scenario.from_preset('llama-3.2-1b', window_s=3600.0), mtbf_s=600.0, seeds=1); "
            "assert 'torch' not in sys.modules, 'sim imported torch'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_default_table_says_what_it_rests_on():
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d", "--no-bands")
    assert result.returncode == 0, result.stderr
    head = result.stdout.splitlines()[:5]
    assert head[0].startswith("qwen2.5-7b (synthetic), MTBF 30m")
    assert head[1].startswith("costs: paper-a100") and "fit" in head[1] and "assumed" in head[1]
    assert head[2].startswith("protocol: fair (every strategy at its own best setting") \
        and "stale_s" in head[2]
    assert head[4].startswith("prices: 8 GPUs at $2.7447 a GPU-hour")
    assert "layercheck-sync" in result.stdout and "gemini" in result.stdout and "stale h" in result.stdout
    assert any(line.startswith("verdict (fair): ") for line in result.stdout.splitlines())
    assert "GPU hours a run by cause, and dollars" in result.stdout


def test_json_has_exactly_the_keys(capsys):
    assert main(["--mtbf", "30m", "--json", "--seeds", "2", "--window", "1d",
                 "--preset", "llama-3.2-1b", "--no-bands", "--progress"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)                              # the bar went to stderr, not into the JSON
    assert "python -m sim run" in err and "2/2" in err
    assert set(data) == {"rows", "scenario", "verdict", "seconds"}
    assert all(list(row) == [*COLUMNS, *RUN_TAIL] for row in data["rows"])
    assert data["scenario"]["name"] == "llama-3.2-1b" and data["scenario"]["protocol"] == "fair"
    assert set(data["scenario"]["prices"]) >= {"gpu_hour_usd", "storage_usd_per_gb_month"}
    verdict = data["verdict"]
    assert verdict["winner"] in {r["strategy"] for r in data["rows"]}
    assert {"margin", "margin_ci95", "flips", "phi", "fresh", "robust"} <= set(verdict)


def test_csv_and_custom(capsys):
    assert main(["--iteration-time", "6s", "--iterations", "1000", "--checkpoint-cost", "60s",
                 "--restart", "120s", "--interval", "100", "--strategies", "deepspeed,checkfreq",
                 "--mtbf", "2h", "--csv", "--seeds", "2", "--window", "2d", "--protocol", "native",
                 "--no-bands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ",".join([*COLUMNS, *RUN_TAIL]) and len(lines) == 3


def test_the_paper_protocol_by_name_is_simulates_table(capsys):
    assert main(["--mtbf", "30m", "--json", "--seeds", "2", "--window", "1d", "--protocol",
                 "matched", "--preset", "llama-3.2-1b", "--no-bands"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    table = simulate(Scenario.from_preset("llama-3.2-1b"), mtbf_s=1800.0, seeds=2,
                     window_s=86400.0)
    assert [r["effective_ratio"] for r in rows] == table["effective_ratio"].tolist()


def test_budgets_belong_to_the_fair_protocol(capsys):
    assert main(["--mtbf", "30m", "--protocol", "matched", "--max-gb", "500"]) == 2
    assert "apply to the fair protocol" in capsys.readouterr().err


def test_frontier_json_and_csv(capsys):
    args = ["frontier", "--mtbf", "30m", "--seeds", "2", "--window", "1d", "--preset",
            "llama-3.2-1b", "--strategies", "deepspeed,gemini,layercheck"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["strategy"] for r in data["front"]} == {"deepspeed", "gemini", "layercheck"}
    ranges = data["best_by_budget"]
    assert ranges and ranges[-1]["to_bytes"] is None
    assert [r["effective_ratio"] for r in ranges] == sorted(r["effective_ratio"] for r in ranges)
    assert main([*args, "--csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("strategy,setting,origin,job_bytes,effective_ratio")


def test_sweep_writes_files(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--mtbf", "0.1h..1h", "--points", "3", "--seeds", "2", "--window", "1d",
                 "--preset", "llama-3.2-1b", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"sweep.csv", "sweep.json", "sweep.html"}
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert len(rows) == 3 * 9 and {r["strategy"] for r in rows} >= {"limit", "layercheck"}
    assert "limit (perfect checkpointer)" in (out / "sweep.html").read_text()


@pytest.mark.parametrize("args", [["--mtbf", "-1"], ["--mtbf", "5x"], ["--mtbf", "1h", "--trace", "/no/such"],
                                  ["--mtbf", "1h", "--strategies", "foo"], ["--mtbf", "1h", "--bogus"],
                                  ["--mtbf", "1h", "--trace", "traces"], ["sweep", "--mtbf", "3h..1h"],
                                  ["--gpu-mtbf", "1000h"], ["--mtbf", "1h", "--seeds", "x"],
                                  ["--mtbf", "1h", "--costs", "paper-h100"],
                                  ["--mtbf", "1h", "--cost", "speed=3"],
                                  ["--mtbf", "1h", "--cost", "save_gbps=fast"],
                                  ["--mtbf", "1h", "--write-gbps", "0"],
                                  ["--mtbf", "1h", "--protocol", "fastest"],
                                  ["--mtbf", "1h", "--max-host-gb", "-5"],
                                  ["--mtbf", "1h", "--gpu-hour-usd", "-1"],
                                  ["--mtbf", "1h", "--engine", "simpy"],
                                  ["frontier", "--mtbf", "1h", "--protocol", "native"],
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
    assert any(line.startswith("verdict: ") and " ahead of " in line for line in out.splitlines())
    assert "Against the best baseline within the same budgets, on the same failures" in out


def test_tune_json(capsys):
    assert main(["tune", "--trace", "traces/minilm-1000steps", "--costs", "paper-a100", "--mtbf",
                 "1h", "--max-write-share", "0.05", "--json", "--seeds", "2", "--window", "2d",
                 "--progress"]) == 0
    out, err = capsys.readouterr()
    out = json.loads(out)                               # the bar went to stderr, not into the JSON
    assert "python -m sim tune" in err and "3/3" in err
    assert out["recommended"]["write_share"] <= 0.05 and out["costs"] == "paper-a100"
    grid, _ = layercheck_grid(read_trace("traces/minilm-1000steps"))
    assert out["config_line"].startswith("LayerCheckConfig(") and out["grid_size"] == grid.size
    base = out["best_baseline"]
    assert base["strategy"] in ("deepspeed", "checkfreq", "gemini", "lowdiff")
    assert out["against_best_baseline"] == pytest.approx(
        out["recommended"]["effective_ratio"] - base["effective_ratio"])


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
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d", "--no-bands")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # the capture's phi, carried over to the preset by its composition
    phi = read_calibration(ROOT / "traces/qwen2.5-7b-synthetic").figures["stale_cost"]
    assert lines[3].startswith(f"stale cost phi: {phi.value:.3g} [{phi.low:.3g}..{phi.high:.3g}]; "
                               "transferred: carried over from traces/minilm-200steps")
    assert lines[3].endswith("(docs/stale-cost.md)") and len(lines[3]) <= 120
    assert "phi low phi high" in lines[5]
    assert any(line.startswith(f"  phi {phi.low:g}..{phi.high:g}: first at its low end ")
               for line in lines)
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d", "--no-bands",
                  "--protocol", "matched", "--costs", str(_phi_costs(tmp_path)))
    lines = result.stdout.splitlines()
    assert lines[3] == ("stale cost phi: 0.5 [0..1]; measured: on traces/x, a test's "
                        "(docs/stale-cost.md)")
    assert any(line.startswith("  phi 0..1: first at its low end layercheck") for line in lines)
    given_phi = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d", "--costs",
                     str(_phi_costs(tmp_path)), "--stale-cost", "0.25", "--no-bands",
                     "--protocol", "matched").stdout.splitlines()
    assert given_phi[3].startswith("stale cost phi: 0.25 (no interval); given:")
    assert not any(line.startswith("  phi ") for line in given_phi)


def test_csv_and_sweep_carry_the_bounds(tmp_path, capsys):
    costs = str(_phi_costs(tmp_path))
    assert main(["--mtbf", "30m", "--csv", "--seeds", "2", "--window", "1d", "--costs", costs,
                 "--protocol", "matched", "--no-bands"]) == 0
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
    (["--mtbf", "1h", "--interval", "99999999999999999999", "--protocol", "matched"],
     "the job's 1692 steps"),
    (["--mtbf", "1h", "--interval", "100"], "drop --interval"),
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
                     "--window", "1e12d", "--seeds", "2", "--strategies", "deepspeed", "--json",
                     "--no-bands")
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
    command = args[0] if args[0] in ("fit-failures", "scale") else "run"
    assert err.startswith(f"python -m sim {command}: error:")


def test_bad_node_input_from_the_shell_has_no_traceback():
    result = _run("--nodes", "8", "--node-mtbf", "1h", "--domain", "rack:1:1d")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "at least 2" in result.stderr


def test_a_reader_that_went_away_ends_the_command_quietly():
    # `python -m sim --mtbf 0.5h --json | head -1`: no error, and nothing at the
    # interpreter's exit either (its last flush has nowhere left to fail)
    from tests.pipes import run_into_closed_pipe
    done = run_into_closed_pipe("sim", "--mtbf", "0.5h", "--seeds", "2", "--json")
    assert (done.returncode, done.stderr) == (0, "")


def test_json_is_strict_where_a_figure_has_no_value(capsys):
    assert main(["--mtbf", "30m", "--json", "--seeds", "1", "--window", "1d", "--strategies",
                 "deepspeed", "--protocol", "matched", "--no-bands"]) == 0
    def refuse(name):
        raise AssertionError(f"{name} in the JSON")
    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert data["verdict"]["margin"] is None and data["rows"][0]["ci95"] is None


# --- huge finite values, and flags that size an allocation ---------------
@pytest.mark.parametrize("args,words", [
    (["--mtbf", "1e307s"], "--mtbf='1e307s' must be a positive duration from 1 ns to 1e18 s"),
    (["--nodes", "4", "--node-mtbf", "1e307s"], "--node-mtbf='1e307s' must be a positive duration "
                                                "from 1 ns to 1e18 s"),
    (["scale", "--node-mtbf", "1e307s"], "--node-mtbf='1e307s' must be a positive duration from"),
    (["sensitivity", "--mtbf", "1e307s"], "--mtbf='1e307s' must be a positive duration from"),
    (["--failure-log", "{huge}"], "time='1e308' must be a positive duration from 1 ns to 1e18 s"),
    (["--nodes", "4", "--failure-log", "{huge_node}"], "node '1e30' must be an integer from 0 to "
                                                       "999,999"),
    (["--gpus", "9" * 400, "--gpu-mtbf", "1h"], "an integer from 1 to 2**53"),
    (["scale", "--tenants", "1000000000", "--gpus", "8", "--seeds", "2", "--window", "1d"],
     "give at most --tenants 408 for this job"),
    (["scale", "--tenants", "100000000", "--gpus", "8", "--seeds", "2", "--window", "1d"],
     "more than the simulator's limit of 100,000"),
    (["scale", "--node-shape", "1e-300", "--gpus", "8", "--seeds", "2"], "from 0.01 to 20"),
])
def test_huge_finite_values_are_one_line_naming_the_range(tmp_path, args, words):
    """Each was a traceback (OverflowError in Daly's interval, numpy's 11-112 GiB MemoryError
    for the tenants' write times) or ran on NaN: now one line naming the range, before
    anything large is allocated (2 GiB of address space)."""
    (tmp_path / "huge.csv").write_text("time\n1\n1e308\n")
    (tmp_path / "nodes.csv").write_text("node,time\n0,1h\n1e30,2h\n")
    files = {"huge": str(tmp_path / "huge.csv"), "huge_node": str(tmp_path / "nodes.csv")}
    result = _capped(*[a.format(**files) for a in args])
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr


def test_the_longest_durations_run(capsys):
    """At the top of the range (1e18 s) an MTBF means no failure: the run goes through Daly's
    interval (the whole job) without overflow and loses nothing to failures."""
    assert main(["--mtbf", f"{MAX_DURATION_S}s", "--preset", "llama-3.2-1b", "--seeds", "2",
                 "--window", "1d", "--protocol", "native", "--strategies", "deepspeed",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["failures"] == 0.0 and row["lost_work_s"] == 0.0 and row["interval"] == 1692


def test_tune_with_one_seed_prints_no_band(capsys):
    """One seed has no 95% band (ci95 None): `tune --seeds 1` raised TypeError formatting it."""
    assert main(["tune", "--trace", str(ROOT / "traces/minilm-200steps"), "--mtbf", "1h",
                 "--seeds", "1", "--window", "1h"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("recommended", "paper default", "recorded"))]
    assert len(rows) == 3 and all(row.split()[-6] == "n/a" for row in rows), rows


# --- a path that is not a regular file is refused, never read -------------
def _trace_with(tmp_path: Path, name: str, make) -> str:
    """A copy of traces/minilm-200steps whose file ``name`` is replaced by ``make(path)``."""
    folder = tmp_path / "trace"
    shutil.copytree(ROOT / "traces/minilm-200steps", folder)
    (folder / name).unlink(missing_ok=True)
    make(folder / name)
    return str(folder)


def _fifo(path: Path) -> None:
    import os
    os.mkfifo(path)


RUN_ONE = ["--mtbf", "1h", "--seeds", "1", "--window", "6h", "--strategies", "deepspeed"]


@pytest.mark.parametrize("case", ["failure log", "node record", "fit-failures", "manifest.json",
                                  "costs.json", "staleness.json", "drill.json", "--costs"])
def test_a_fifo_where_the_simulator_reads_a_file_is_one_line_exit_2(tmp_path, capsys, case):
    """Each of these opened the FIFO and blocked forever (no writer ever comes)."""
    from tests.deadline import deadline
    fifo = tmp_path / "fifo.csv"
    _fifo(fifo)
    argv = {"failure log": ["--failure-log", str(fifo), "--seeds", "1", "--window", "6h"],
            "node record": ["--nodes", "4", "--failure-log", str(fifo), "--seeds", "1"],
            "fit-failures": ["fit-failures", str(fifo)],
            "--costs": ["--costs", str(fifo), "--preset", "llama-3.2-1b", *RUN_ONE],
            }.get(case) or ["--trace", _trace_with(tmp_path, case, _fifo), *RUN_ONE]
    with deadline(30, f"python -m sim with a FIFO as its {case}"):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a FIFO (named pipe), not a regular file" in err, err


@pytest.mark.parametrize("case", ["/dev/zero as the failure log", "manifest.json -> /dev/zero",
                                  "steps.parquet a FIFO"])
def test_a_device_or_a_fifo_the_simulator_reads_outside_python_is_one_line_exit_2(tmp_path, case):
    """/dev/zero was read until memory ran out (here: 2 GiB of address space), and pyarrow
    blocked on a FIFO where no signal reaches Python: a subprocess with a timeout."""
    if case.startswith("/dev/zero"):
        args = ["--failure-log", "/dev/zero", "--seeds", "1", "--window", "6h"]
        words = "/dev/zero: a character device, not a regular file"
    elif case.startswith("manifest"):
        args = ["--trace", _trace_with(tmp_path, "manifest.json",
                                       lambda p: p.symlink_to("/dev/zero")), *RUN_ONE]
        words = "manifest.json: a character device, not a regular file"
    else:
        args = ["--trace", _trace_with(tmp_path, "steps.parquet", _fifo), *RUN_ONE]
        words = "steps.parquet: a FIFO (named pipe), not a regular file"
    result = _capped(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr


# -- the command line a person reads: fast refusals, help, tables, verdicts, progress ------

LIGHT = ("import sys; from sim.cli import main; code = main({argv!r}); "
         "heavy = sorted(m for m in ('pandas', 'scipy', 'pyarrow', 'sim.api') if m in sys.modules); "
         "print(code, heavy)")


@pytest.mark.parametrize("argv", [["--mtbf", "-1h"], ["--mtbf", "1h", "--seeds", "0"],
                                  ["tune", "--mtbf", "1h", "--strategies", "gemini"],
                                  ["paper", "--window", "-3d"], ["scale", "--node-mtbf", "soon"],
                                  ["sensitivity", "--mtbf", "1h", "--window", "0"],
                                  ["sweep", "--mtbf", "1h"], ["frontier", "--bogus"]])
def test_a_bad_argument_is_refused_before_the_heavy_imports(argv):
    result = subprocess.run([sys.executable, "-c", LIGHT.format(argv=argv)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    if result.returncode == 2:           # argparse's own refusal exits from parse_args
        assert "(see --help)" in result.stderr
        return
    assert result.stdout.strip() == "2 []", (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("argv, words", [
    (["--mtbf", "-1h"], ["python -m sim run: error: --mtbf='-1h' is not a duration"]),
    (["tune", "--mtbf", "-0.5h"], ["python -m sim tune: error: --mtbf='-0.5h'"]),
    (["scale", "--node-mtbf", "-2d"], ["python -m sim scale: error: --node-mtbf='-2d'"]),
    (["paper", "--seeds", "0"], ["python -m sim paper: error: --seeds 0"]),
    (["sensitivity", "--bogus"], ["python -m sim sensitivity: error: unrecognized arguments"]),
    (["tune", "--mtbf", "1h", "--strategies", "gemini,layercheck"],
     ["python -m sim tune: error: --strategies gemini,layercheck: tune searches LayerCheck's own",
      "python -m sim --strategies gemini,layercheck"])])
def test_errors_name_the_subcommand_and_a_negative_value_gets_its_range(argv, words, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:            # argparse's refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "expected one argument" not in err
    for word in words:
        assert word in err


def test_a_negative_value_where_one_is_allowed_still_reaches_its_flag(capsys):
    from sim.cli import _join_negatives
    assert _join_negatives(["--mtbf", "1h", "--stale-cost", "-0.5", "--json"]) == \
        ["--mtbf", "1h", "--stale-cost=-0.5", "--json"]
    assert _join_negatives(["--stale-cost=-1", "-h"]) == ["--stale-cost=-1", "-h"]


def test_every_flag_has_a_help_line_and_every_command_examples():
    from sim.cli import COMMANDS, _parser
    top = _parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, parser in sub.choices.items():
        missing = [a.option_strings or a.dest for a in parser._actions if not a.help]
        assert not missing, f"{name}: {missing}"
        help_text = parser.format_help()
        assert "examples:\n  python -m sim" in help_text, name
        assert help_text.rstrip().endswith("Ranges of the command line's numbers."), name
    for name in ("run", "sensitivity", "paper", "frontier", "scale"):
        flags = {s for a in sub.choices[name]._actions for s in a.option_strings}
        assert {"--json", "--csv", "--wide"} <= flags, name
    for name in ("run", "tune", "sensitivity", "paper"):
        flags = {s for a in sub.choices[name]._actions for s in a.option_strings}
        assert "--progress" in flags, name


def test_the_header_says_phi_in_one_line_with_its_docs_link():
    from sim.report import STALE_DOC, header
    scenario = Scenario.from_preset("qwen2.5-7b")
    lines = header(scenario, mtbf="30m", seeds=2).splitlines()
    stale = [line for line in lines if line.startswith("stale cost phi")]
    assert len(stale) == 1 and stale[0].endswith(f"({STALE_DOC})") and len(stale[0]) <= 120
    assert (ROOT / STALE_DOC).is_file()
    assert scenario.stale_figure().method not in "\n".join(lines)   # the paragraph: JSON's


def _small_run():
    from sim.dollars import Prices
    from sim.fair import fixed
    result = fixed(Scenario.from_preset("llama-3.2-1b", window_s=86400.0), mtbf_s=1800.0,
                   strategies=["deepspeed", "gemini", "layercheck"], seeds=2)
    return result.bills(Prices())


def test_run_tables_fit_100_columns_and_the_bill_ends_with_its_verdict():
    from sim.report import bill_table, table
    df = _small_run()
    for text in (table(df), bill_table(df)):
        assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "K " in table(df) and "setting" in table(df)        # the settings: a block of their own
    assert len(table(df, width=None).splitlines()) == 2 + len(df)
    verdict = bill_table(df).splitlines()[-1]
    cheapest = df.loc[df["usd_total"].idxmin(), "strategy"]
    assert verdict.startswith(f"verdict: {cheapest} has the cheapest run, $") and " less than " in verdict


SENSITIVITY = ["sensitivity", "--mtbf", "1h", "--preset", "llama-3.2-1b", "--seeds", "1",
               "--window", "1d", "--figures", "persist_gbps", "--strategies", "deepspeed,checkfreq"]


def test_sensitivity_csv_is_clean_with_progress_on_stderr(capsys):
    assert main([*SENSITIVITY, "--csv", "--progress"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "figure,strategy,point,at_low,at_high,min,max,swing,band"
    assert len(lines) == 3 and all(line.startswith("persist_gbps,") for line in lines[1:])
    assert "python -m sim sensitivity" in err and "0/3" in err and "3/3" in err
    assert main([*SENSITIVITY, "--csv"]) == 0             # stderr not a terminal: no bar
    assert capsys.readouterr().err == ""


def test_sensitivity_table_ends_with_the_verdict(capsys):
    assert main(SENSITIVITY) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("figure ")):at]
    assert table and max(len(line) for line in table) <= 100
    verdict = lines[at]
    assert " has the highest ratio at the cost model's values, " in verdict and " ahead of " in verdict


PAPER = ["paper", "--seeds", "1", "--window", "1d"]


def test_paper_prints_verdicts_and_no_issue_or_path_outside_the_repo(capsys):
    assert main(PAPER) == 0
    out = capsys.readouterr().out
    assert "issue" not in out.lower()
    for path in set(re.findall(r"[\w.-]+(?:/[\w.-]+)+\.(?:md|json|py)", out)):
        assert (ROOT / path).exists(), path
    verdicts = [line for line in out.splitlines() if line.startswith("verdict (")]
    assert len(verdicts) == 4 and all("has the highest ratio" in v for v in verdicts)
    table = out.split("\n\n")[1].split("\nverdict (")[0].splitlines()
    assert table[0].split()[:3] == ["strategy", "protocol", "paper"] and len(table) == 2 + 12
    assert max(len(line) for line in table) <= 100


def test_paper_csv_has_a_row_a_cell(capsys):
    assert main([*PAPER, "--csv", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "python -m sim paper" in err and "0/4" in err and "4/4" in err
    lines = out.splitlines()
    assert lines[0].startswith("strategy,protocol,accounting,phi,paper,ratio,ci95")
    assert len(lines) == 1 + 6 * 2 * 2          # strategies x protocols x accountings


def test_fit_failures_and_presets_tables_fit_100_columns(capsys):
    assert main(["fit-failures", "philly"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[1:next(i for i, line in enumerate(lines) if line.startswith("restart_gap"))]
    assert table[0].startswith("sample ") and max(len(line) for line in table) <= 100
    assert any(line.split()[-1:] == ["better"] for line in table)     # its last column, in a block
    assert main(["fit-failures", "philly", "--wide"]) == 0
    assert capsys.readouterr().out.splitlines()[1].rstrip().endswith("better")
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["preset", "writes", "paper"] and len(lines) == 3 + 3
    assert max(len(line) for line in lines[1:]) <= 100
