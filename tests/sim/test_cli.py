import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.api import COLUMNS
from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_torch_free():
    code = ("import sys, sim, sim.__main__, sim.cli, sim.api, sim.reference, sim.report, sim.presets; "
            "sim.simulate(sim.Scenario.from_preset('llama-3.2-1b', window_s=3600.0), mtbf_s=600.0, seeds=1); "
            "assert 'torch' not in sys.modules, 'sim imported torch'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_default_table():
    result = _run("--mtbf", "0.5h", "--seeds", "2", "--window", "2d")
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-7b" in result.stdout and "layercheck" in result.stdout and "gemini" in result.stdout


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


def test_gpus_and_regime(capsys):
    assert main(["--regime", "llama3-405b", "--gpus", "1024", "--json", "--seeds", "1",
                 "--window", "1d", "--preset", "llama-3.2-1b", "--strategies", "layercheck"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["mtbf_s"] == pytest.approx(54 * 86400 / 419 * 16)


def test_sweep_writes_files(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--mtbf", "0.1h..1h", "--points", "3", "--seeds", "2", "--window", "1d",
                 "--preset", "llama-3.2-1b", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"sweep.csv", "sweep.json", "sweep.html"}
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert len(rows) == 3 * 7 and {r["strategy"] for r in rows} >= {"limit", "layercheck"}
    assert "limit (perfect checkpointer)" in (out / "sweep.html").read_text()


@pytest.mark.parametrize("args", [["--mtbf", "-1"], ["--mtbf", "5x"], ["--mtbf", "1h", "--trace", "/no/such"],
                                  ["--mtbf", "1h", "--strategies", "foo"], ["--mtbf", "1h", "--bogus"],
                                  ["--mtbf", "1h", "--trace", "traces"], ["sweep", "--mtbf", "3h..1h"],
                                  ["--gpu-mtbf", "1000h"], ["--mtbf", "1h", "--seeds", "x"]])
def test_bad_input_is_one_line_exit_2(args):
    result = _run(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("python -m sim")


def test_malformed_trace(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    result = _run("--mtbf", "1h", "--trace", str(tmp_path))
    assert result.returncode == 2 and "not valid JSON" in result.stderr
