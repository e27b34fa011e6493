"""The My job page: a job described in a form is python -m sim's command line, and the
page and the command name the same winner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import myjob
from sim import SimError
from sim.cli import main as sim_main

VIEW = Path(__file__).resolve().parents[2] / "dashboard" / "views" / "myjob.py"


def test_the_default_job_is_the_command_lines_default():
    assert myjob.Job().argv() == ["--mtbf", "0.5h"]
    assert myjob.Job().command() == "python -m sim --mtbf 0.5h"


def test_a_described_job_reads_back_as_the_simulator_reads_it():
    job = myjob.Job(model="size", params_billion=1.2, step_s=2.0, gpus=64,
                    failures="one GPU's MTBF", gpu_mtbf_h=50_000.0, max_tb=50.0, write_gbps=5.0,
                    gpu_hour_usd=2.0, seeds=3)
    given = myjob.inputs(job.argv())
    assert given.mtbf_s == pytest.approx(50_000 * 3600 / 64)
    assert given.budgets.max_bytes == pytest.approx(50e12)
    assert given.prices.gpus == 64 and given.prices.gpu_hour_usd == 2.0 and given.seeds == 3
    assert given.scenario.workload.full_bytes == pytest.approx(1.2e9 * 14, rel=1e-6)
    assert given.scenario.costs.save_gbps == 5.0
    record = myjob.inputs(myjob.Job(failures="failure record", nodes=256).argv())
    assert record.mtbf_s is None                       # the record's own rate


@pytest.mark.parametrize("fields, says", [
    ({"mtbf_h": 0.0}, "give a positive number"), ({"max_write_share": 5.0}, "fraction"),
    ({"model": "trace"}, "pick one"), ({"preset": "gpt-5"}, "choose one of")])
def test_a_bad_description_says_the_fix(fields, says):
    with pytest.raises(SimError, match=says):
        myjob.Job(**fields)


def test_the_page_opens_on_the_command_lines_job_and_names_its_winner(traces_dir, capsys):
    """The dashboard's default winner is `python -m sim --mtbf 0.5h --json`'s."""
    assert sim_main(["--mtbf", "0.5h", "--json", "--no-bands"]) in (0, None)
    cli = json.loads(capsys.readouterr().out)["verdict"]
    at = AppTest.from_file(str(VIEW), default_timeout=600).run()
    assert not at.exception, [e.value for e in at.exception]
    assert next(m for m in at.metric if m.label == "Use").value == cli["winner"]
    assert at.success[0].value.startswith(f"Use **{cli['winner']}** at **{cli['setting']}**:")
    assert at.code[0].value.startswith("python -m sim --mtbf 0.5h")
    assert len(at.get("plotly_chart")) == 1


def test_a_job_without_a_trace_compares_without_layercheck(traces_dir):
    at = AppTest.from_file(str(VIEW), default_timeout=600)
    at.session_state["job_model"] = "size"
    at.session_state["job_params"] = 1.0
    at.session_state["job_step_s"] = 2.0
    at.session_state["job_seeds"] = 2
    at.session_state["job_window_d"] = 1.0
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "--iteration-time 2s --checkpoint-gb 14" in at.code[0].value
    strategies = set(at.dataframe[0].value["strategy"])
    assert "layercheck" not in strategies and "checkfreq" in strategies
