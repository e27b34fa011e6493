"""What the My job page shows of an answer, kept on disk: read back exactly what the search
gives, and another job is another answer."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import answerstore, jobsummary, myjob

VIEW = Path(__file__).resolve().parents[2] / "dashboard" / "views" / "myjob.py"

SMALL = ["--iteration-time", "2s", "--checkpoint-gb", "14", "--seeds", "2", "--window", "2d"]
"""A job given by size (no LayerCheck, no trace): a search of about half a second."""


def _assert_same(got: jobsummary.Summary, want: jobsummary.Summary) -> None:
    for name in ("winner", "setting", "ratio", "margin", "runner_up", "runner_setting", "text",
                 "gpus", "gpu_hour_usd"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("settings", "budgets", "bill"):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(want, name), check_exact=True)
    assert json.loads(got.figure.to_json()) == json.loads(want.figure.to_json())


def _kept(argv: list[str], calls: list) -> jobsummary.Summary:
    def compute():
        calls.append(argv)
        return jobsummary.summarise(myjob.answer(argv))
    return answerstore.cached(myjob.store_key(argv, bands=False), compute,
                              encode=jobsummary.Summary.payload, decode=jobsummary.Summary.of_payload)


def test_a_kept_answer_is_the_search_s_and_another_job_is_another_answer(answer_store):
    calls = []
    searched = _kept([*SMALL, "--mtbf", "1h"], calls)
    read = _kept([*SMALL, "--mtbf", "1h"], calls)
    assert len(calls) == 1
    _assert_same(read, searched)
    text = json.dumps(searched.payload())                  # plain JSON (NaN as Python writes it)
    assert json.dumps(json.loads(text)) == text
    other = _kept([*SMALL, "--mtbf", "3h"], calls)
    assert len(calls) == 2
    assert other.ratio > searched.ratio                    # fewer failures: more useful time
    _assert_same(other, jobsummary.summarise(myjob.answer([*SMALL, "--mtbf", "3h"])))


def test_a_damaged_kept_answer_is_searched_again(answer_store):
    calls = []
    searched = _kept([*SMALL, "--mtbf", "1h"], calls)
    path, = answer_store.glob("*.json")
    stored = json.loads(path.read_text())
    stored["payload"]["figure"] = stored["payload"]["figure"][:-40]    # cut short
    path.write_text(json.dumps(stored))
    _assert_same(_kept([*SMALL, "--mtbf", "1h"], calls), searched)
    assert len(calls) == 2


def test_a_summary_refuses_what_it_cannot_show():
    with pytest.raises(TypeError, match="DataFrame"):
        jobsummary.Summary(winner="a", setting="s", ratio=0.9, margin=0.0, runner_up=None,
                           runner_setting=None, text="", gpus=8, gpu_hour_usd=2.0, settings={},
                           budgets=pd.DataFrame(), bill=pd.DataFrame(), figure=None)


def test_a_new_server_draws_the_page_from_the_kept_answer(traces_dir, answer_store):
    """A server's in-memory cache emptied (a restart): the page shows the same verdict
    without searching, from the file the first server kept."""
    def page() -> AppTest:
        at = AppTest.from_file(str(VIEW), default_timeout=600)
        for name, value in (("job_model", "size"), ("job_params", 1.0), ("job_step_s", 2.0),
                            ("job_seeds", 2), ("job_window_d", 2.0)):
            at.session_state[name] = value
        return at.run()

    first = page()
    assert not first.exception, [e.value for e in first.exception]
    path, = answer_store.glob("*.json")
    stored = json.loads(path.read_text())
    stored["payload"]["setting"] = "the kept setting"     # marks what the page reads
    path.write_text(json.dumps(stored))
    import streamlit as st
    st.cache_resource.clear()
    again = page()
    assert not again.exception, [e.value for e in again.exception]
    assert "at **the kept setting**" in again.success[0].value
    assert len(again.get("plotly_chart")) == 1


def test_the_page_s_modules_load_no_search_engine():
    """What a page drawn from the store imports leaves the search (sim.fair, numba,
    scipy.special: a second or more of a cold start) unloaded until a job is searched."""
    code = ("import sys\nimport dashboard.ui, dashboard.myjob, dashboard.jobsummary, dashboard.answerstore\n"
            "print(sorted(m for m in ('sim.fair', 'sim.verdict', 'numba', 'scipy.special', 'dashboard.verdict')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=VIEW.parents[2], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
