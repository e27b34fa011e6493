"""``python -m sim scale``: the table, --json, --csv, and bad input as one line with exit 2."""
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
import pytest

from sim.cli import main
from sim.scale import SCALE_COLUMNS

FAST = ["scale", "--preset", "llama-3.2-1b", "--seeds", "2", "--window", "1d"]


def _main(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:        # argparse's own refusals
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_the_table_names_every_size_and_where_the_time_goes():
    code, out, err = _main(*FAST, "--gpus", "8..32")
    assert code == 0, err
    for size in ("8 GPUs (1 nodes)", "16 GPUs (2 nodes)", "32 GPUs (4 nodes)"):
        assert size in out
    assert "waiting for storage" in out and "limit" in out and "layercheck" in out
    # one node's synchronous save waits for its own Lustre link (paper-a100: 1.24 GB/s)
    deepspeed = next(line for line in out.splitlines() if line.strip().startswith("deepspeed"))
    assert float(deepspeed.split()[5].rstrip("%")) > 1.0


def test_json_and_csv_carry_the_rows():
    code, out, _ = _main(*FAST, "--gpus", "16..32", "--json")
    assert code == 0
    doc = json.loads(out)
    assert {r["gpus"] for r in doc["rows"]} == {16, 32}
    assert doc["scale"]["recovery"]["hang_timeout_s"] == 600.0
    assert "Llama 3" in doc["scale"]["node_mtbf_source"]
    code, out, _ = _main(*FAST, "--gpus", "16", "--csv", "--spares", "0", "--domain", "rack:2:30d")
    assert code == 0
    frame = pd.read_csv(io.StringIO(out))
    assert list(frame.columns) == list(SCALE_COLUMNS) and set(frame["gpus"]) == {16}


@pytest.mark.parametrize("argv,fix", [
    (["--gpus", "8..abc"], "write LOW..HIGH in GPUs"),
    (["--gpus", "12"], "multiple of 8"),
    (["--gpus", "64..8"], "low end"),
    (["--gpus", "8", "--seeds", "1"], "at least 2"),
    (["--gpus", "8", "--domain", "rack:16"], "give KIND:SIZE:MTBF"),
    (["--gpus", "8", "--spares", "-1"], "spares"),
    (["--gpus", "8", "--node-mtbf", "soon"], "--node-mtbf"),
    (["--gpus", "8", "--aggregate-gbps", "0"], "positive bandwidth"),
    (["--gpus", "8000000", "--node-mtbf", "1e9h", "--seeds", "100"], "random streams"),
    (["--gpus", "64", "--node-mtbf", "0.01s"], "failures per run"),
])
def test_bad_input_is_one_line_that_says_the_fix(argv, fix):
    code, out, err = _main(*FAST, *argv)
    assert code == 2 and out == ""
    assert fix in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# -- the job: the same scenario vocabulary as python -m sim's (sim.scenarioargs) ----------
def test_an_old_calibration_warns_in_one_line_on_python_m_sim_scale(tmp_path):
    """A trace (or --costs file) measured by older mechanisms says so before the scale
    curve rests on it, as ``python -m sim --trace`` does."""
    import dataclasses
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from layercheck.contract.calibration import write_calibration
    from sim.calibrated import read_calibration
    root = Path(__file__).resolve().parents[2]
    trace = tmp_path / "t"
    shutil.copytree(root / "traces" / "minilm-200steps", trace)
    write_calibration(dataclasses.replace(read_calibration(trace), code={}), trace)
    for flags in (["--trace", str(trace)],
                  ["--preset", "llama-3.2-1b", "--costs", str(trace / "costs.json")]):
        done = subprocess.run([sys.executable, "-m", "sim", "scale", *flags, "--gpus", "8",
                               "--seeds", "2", "--window", "1d", "--strategies", "deepspeed"],
                              cwd=root, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
        assert len(warning) == 1, done.stderr
        assert f"`python -m profiler calibrate --trace {trace}`" in warning[0]


@pytest.mark.parametrize("make", ["missing", "a file", "no manifest", "bad parquet"])
def test_a_bad_trace_is_one_line_naming_the_flag(make, tmp_path):
    import shutil
    from pathlib import Path
    trace = tmp_path / "t"
    if make == "a file":
        trace.write_text("x")
    elif make == "no manifest":
        trace.mkdir()
    elif make == "bad parquet":
        shutil.copytree(Path(__file__).resolve().parents[2] / "traces" / "minilm-200steps", trace)
        (trace / "steps.parquet").write_text("garbage")
    code, out, err = _main("scale", "--trace", str(trace), "--gpus", "8", "--seeds", "2",
                           "--window", "1d")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m sim scale: error: --trace: "), err


def test_each_size_has_column_headers_and_a_summary_closes_the_report():
    code, out, err = _main(*FAST, "--gpus", "8..16", "--strategies", "deepspeed,gemini")
    assert code == 0, err
    lines = out.splitlines()
    heads = [line for line in lines if line.startswith("strategy ")]
    assert len(heads) == 2 and heads[0].split()[:3] == ["strategy", "ratio", "+-95%"]
    assert "storage" in heads[0].split() and "lost" in heads[0].split()
    assert max(len(line) for line in lines[2:-1]) <= 100       # the tables, between head and summary
    summary = lines[-1]
    assert summary.startswith("summary: ") and "at 16 GPUs" in summary
    assert " ahead of " in summary and "limit" not in summary


def test_the_summary_names_where_the_leader_changes():
    from sim.scalecli import _summary
    line = _summary({8: {"a": 0.9, "b": 0.8}, 16: {"a": 0.9, "b": 0.85},
                     32: {"a": 0.7, "b": 0.75}})
    assert line.startswith("summary: highest ratio by size: a from 8 to 16 GPUs; b at 32 GPUs; ")
    assert line.endswith("at 32 GPUs: b has the highest ratio, 0.7500, +0.0500 ahead of a (0.7000)")
    assert _summary({8: {"a": 0.9, "b": 0.8}, 16: {"a": 0.8, "b": 0.7}}).startswith(
        "summary: a has the highest ratio at every size (8 to 16 GPUs); at 16 GPUs: a has")
    assert _summary({8: {"a": 0.9, "b": 0.8}}) == \
        "summary at 8 GPUs: a has the highest ratio, 0.9000, +0.1000 ahead of b (0.8000)"
