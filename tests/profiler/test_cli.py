"""The command line: bad input is one line on stderr and exit 2, never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, words", [
    (["capture", "--model", "gpt5"], "unknown model"),
    (["capture", "--model", "/no/such/folder"], "no such folder"),
    (["capture", "--steps", "-3"], "steps=-3"),
    (["capture", "--steps", "many"], "invalid int value"),
    (["capture", "--device", "tpu"], "device='tpu'"),
    (["drill", "--model", "tiny", "--failures", "0"], "failures=0"),
    (["drill", "--from", "/no/such/trace"], "no such trace folder"),
    (["frobnicate"], "invalid choice"),
    (["capture", "--config", "{not json"], "not valid JSON"),
    (["capture", "--config", "/no/such/config.json"], "neither a JSON object nor a readable file"),
    (["capture", "--config", '{"smax": 0}'], "--config: smax=0 must be an integer >= 1"),
    (["capture", "--config", '{"treshold": 1}'], "unknown LayerCheckConfig keys ['treshold']"),
    (["capture", "--config", '{"smax": 50}', "--smax", "40"], "drop --smax"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys):
    argparse_error = args[0] == "frobnicate" or "many" in args or "{not json" in args \
        or "/no/such/config.json" in args
    if argparse_error:  # argparse's own errors exit
        with pytest.raises(SystemExit) as exited:
            main(args)
        code = exited.value.code
    else:
        code = main(args)
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unreadable_model_folder(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["capture", "--model", str(tmp_path)]) == 2
    assert "config.json is unreadable" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["capture", "--model", str(empty)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_a_real_process_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "profiler", "capture", "--steps", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "profiler: error: steps=-1: use an integer >= 1"


def test_capture_command_writes_a_readable_trace(tmp_path, capsys):
    from layercheck.contract.trace import read_trace
    out = tmp_path / "cli-trace"
    code = main(["capture", "--model", "tiny", "--steps", "6", "--warmup-steps", "2",
                 "--batch-size", "2", "--seq-len", "16", "--threads", "1", "--quiet",
                 "--no-calibrate", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "LayerCheck: threshold 0.001" in printed and f"wrote {out}" in printed
    trace = read_trace(out)
    assert trace.num_steps == 6 and "python -m profiler capture" in trace.manifest["sources"]["command"]


CAPTURE = ["capture", "--model", "tiny", "--steps", "6", "--warmup-steps", "2", "--batch-size", "2",
           "--seq-len", "16", "--threads", "1", "--quiet", "--no-calibrate"]


@pytest.mark.slow
def test_capture_ends_with_a_summary_a_person_reads_and_the_next_command(tmp_path):
    out = tmp_path / "trace"
    done = subprocess.run([sys.executable, "-m", "profiler", *CAPTURE, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    summary = lines[lines.index(next(l for l in lines if l.startswith(f"wrote {out}: 6 steps"))):]
    assert "{" not in done.stdout  # no JSON dump
    assert "% of a full checkpoint (" in summary[1] and "at every step" in summary[1]
    assert summary[2].startswith("stall on the training thread: ")
    # not calibrated: calibrate first, then the simulator on this trace
    assert f"next: python -m profiler calibrate --trace {out}" in summary[-2]
    assert f"python -m sim --trace {out} --mtbf 2h" in summary[-2]
    assert summary[-1] == "(every figure as JSON: add --json)"


def test_capture_json_prints_every_figure_and_nothing_else_on_stdout(tmp_path, capsys):
    import json
    out = tmp_path / "trace"
    assert main([*CAPTURE, "--json", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    figures = json.loads(printed.out)  # the whole of stdout
    assert figures["trace"] == str(out) and figures["steps"] == 6
    assert 0 < figures["bytes_vs_full_every_step"] <= 1 and figures["stall_share"] >= 0
    assert "LayerCheck: threshold 0.001" in printed.err  # what the run says goes to stderr


def test_a_calibrated_capture_names_the_simulator_next(tiny_capture):
    from profiler.capture import CaptureResult
    from profiler.capture import summarize
    calibrated = CaptureResult(tiny_capture.path, tiny_capture.trace,
                               {**summarize(tiny_capture.trace), "costs": {"a": 1.0, "b": 2.0}})
    text = calibrated.text()
    assert "costs.json: 2 figures" in text
    assert f"next: python -m sim --trace {tiny_capture.path} --mtbf 2h" in text
    assert "calibrate" not in text.splitlines()[-2]
