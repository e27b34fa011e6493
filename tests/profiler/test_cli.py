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
