"""The command line's scenario vocabulary (sim.scenarioargs), through ``python -m sim``: the
cost flags and their provenance, --costs, the failure flags (a job's MTBF, a log, a job of
nodes, a replayed record), the stale cost factor, and an old calibration's warning."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim.calibrated import FIGURES, read_calibration
from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_json_carries_every_figures_provenance(capsys):
    assert main(["--mtbf", "1h", "--json", "--seeds", "1", "--window", "1d", "--preset",
                 "llama-3.2-1b", "--write-gbps", "3", "--cost", "lc_commit_s=0.2",
                 "--protocol", "native", "--stale-as-useful"]) == 0
    data = json.loads(capsys.readouterr().out)
    figures = data["scenario"]["costs"]["figures"]
    assert set(figures) == set(FIGURES)
    assert figures["save_gbps"] == {"value": 3.0, "source": "given", "unit": "GB/s",
                                    "method": "given by the user (an override of the cost model)"}
    assert figures["lc_commit_s"]["value"] == 0.2 and figures["load_gbps"]["source"] == "fit"
    assert data["scenario"]["protocol"] == "native" and data["scenario"]["stale_as_useful"] is True


def test_costs_file_engine_and_exact_log(tmp_path, capsys):
    log = tmp_path / "failures.csv"
    log.write_text("time\n2h\n5h\n")
    args = ["--trace", "traces/llama-3.2-1b-synthetic", "--failure-log", str(log), "--log-once",
            "--seeds", "2", "--window", "12h", "--strategies", "deepspeed,layercheck", "--json",
            "--costs", "traces/qwen2.5-7b-synthetic", "--protocol", "matched", "--no-bands"]
    assert main(args) == 0
    fast = json.loads(capsys.readouterr().out)
    assert [r["failures"] for r in fast["rows"]] == [2.0, 2.0]
    seven_b = read_calibration(ROOT / "traces/qwen2.5-7b-synthetic")
    assert fast["scenario"]["costs"]["figures"]["diff_fraction"]["value"] == seven_b.value("diff_fraction")
    assert main([*args, "--engine", "simpy"]) == 0
    slow = json.loads(capsys.readouterr().out)
    for a, b in zip(fast["rows"], slow["rows"]):
        assert a["effective_ratio"] == pytest.approx(b["effective_ratio"], rel=1e-9)


def test_gpus_and_regime(capsys):
    assert main(["--regime", "llama3-405b", "--gpus", "1024", "--json", "--seeds", "1",
                 "--window", "1d", "--preset", "llama-3.2-1b", "--strategies", "layercheck"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["mtbf_s"] == pytest.approx(54 * 86400 / 419 * 16)


def test_stale_cost_0_is_stale_as_useful_and_1_the_accounting_before_it(capsys):
    base = ["--mtbf", "30m", "--json", "--seeds", "2", "--window", "1d", "--preset", "llama-3.2-1b",
            "--protocol", "matched", "--no-bands"]
    outs = {}
    for name, extra in {"alias": ["--stale-as-useful"], "zero": ["--stale-cost", "0"],
                        "one": ["--stale-cost", "1"]}.items():
        assert main([*base, *extra]) == 0
        outs[name] = json.loads(capsys.readouterr().out)
    assert outs["zero"]["rows"] == outs["alias"]["rows"]
    assert outs["zero"]["scenario"]["stale_as_useful"] is True
    one = {r["strategy"]: r for r in outs["one"]["rows"]}["layercheck"]
    assert one["stale_lost_s"] == one["stale_s"] > 0
    assert outs["one"]["scenario"]["stale_cost"] == {
        "value": 1.0, "low": 1.0, "high": 1.0, "source": "given",
        "method": "given by the user (--stale-cost, or --stale-as-useful for 0)"}


@pytest.mark.parametrize("args,words", [
    (["--stale-cost", "much"], "--stale-cost 'much': give a number"),
    (["--stale-cost", "nan"], "give a number"),
    (["--stale-cost", "1", "--stale-as-useful"], "--stale-as-useful is --stale-cost 0"),
    (["sweep", "--stale-cost", "x"], "give a number"),
    (["tune", "--stale-cost", "0", "--stale-as-useful"], "give one of them"),
])
def test_bad_stale_cost_is_one_line_exit_2(args, words, capsys):
    assert main([*args, "--mtbf", "1h", "--seeds", "1", "--window", "1d"] if args[0] != "sweep"
                else [*args, "--seeds", "1", "--window", "1d"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_old_calibration_warns_in_one_line_and_a_current_one_does_not(tmp_path):
    import dataclasses

    from layercheck.contract.calibration import write_calibration
    from layercheck.contract.measurement import MECHANISM_VERSIONS, code_record
    trace = tmp_path / "t"
    shutil.copytree(ROOT / "traces" / "minilm-200steps", trace)
    shipped = read_calibration(trace)
    write_calibration(dataclasses.replace(shipped, code={}), trace)    # as written before versions
    quick = ("--protocol", "matched", "--no-bands")      # the warning, not the comparison
    done = _run("--trace", str(trace), "--mtbf", "1h", "--seeds", "1", "--window", "1d", *quick)
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"`python -m profiler calibrate --trace {trace}`" in warning[0]
    current = dataclasses.replace(shipped, code=code_record(MECHANISM_VERSIONS, "0.1.0"))
    write_calibration(current, trace)
    done = _run("--trace", str(trace), "--mtbf", "1h", "--seeds", "1", "--window", "1d", *quick)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    write_calibration(dataclasses.replace(shipped, code={}), tmp_path / "old.json")   # by --costs
    done = _run("--costs", str(tmp_path / "old.json"), "--mtbf", "1h", "--seeds", "1",
                "--window", "1d", *quick)
    assert f"--trace {tmp_path}`" in done.stderr and done.returncode == 0


def test_a_job_of_nodes_runs_with_its_own_mtbf_and_domains(capsys):
    assert main(["--nodes", "2048", "--node-mtbf", "6350h", "--failures", "weibull", "--shape",
                 "0.7", "--domain", "rack:32:3000d", "--window", "3d", "--seeds", "2",
                 "--preset", "llama-3.2-1b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    failures = out["scenario"]["failures"]
    assert failures["kind"] == "nodes" and failures["nodes"] == 2048 and failures["shape"] == 0.7
    assert failures["job_mtbf_s"] == pytest.approx(1 / (2048 / (6350 * 3600) + 64 / (3000 * 86400)))
    assert failures["domains"] == [{"name": "rack", "size": 32, "mtbf_s": 3000 * 86400.0,
                                    "source": "given: --domain rack:32:3000d"}]
    assert out["scenario"]["mtbf_s"] is None and len({r["failures"] for r in out["rows"]}) == 1
    assert main(["--nodes", "64", "--node-mtbf", "100h", "--window", "1d", "--seeds", "1",
                 "--preset", "llama-3.2-1b", "--strategies", "deepspeed"]) == 0
    text = capsys.readouterr().out
    assert "MTBF 1.56h (its nodes')" in text and "failures: 64 nodes, exponential" in text


def test_a_replayed_record_carries_its_attribution(capsys):
    assert main(["--nodes", "1024", "--failure-log", "lanl", "--system", "18", "--window", "3d",
                 "--seeds", "2", "--preset", "llama-3.2-1b", "--strategies", "deepspeed,gemini",
                 "--json"]) == 0
    failures = json.loads(capsys.readouterr().out)["scenario"]["failures"]
    assert failures["record"] == "LANL system 18" and "Los Alamos" in failures["attribution"]
    assert main(["--nodes", "1024", "--failure-log", "lanl", "--system", "18", "--window", "1d",
                 "--seeds", "1", "--preset", "llama-3.2-1b", "--strategies", "deepspeed"]) == 0
    assert "recognize Los Alamos for providing these data" in capsys.readouterr().out
