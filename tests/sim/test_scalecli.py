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
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m sim: error: --trace: "), err
