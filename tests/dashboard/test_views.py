"""AppTest for every view: it runs without exceptions, and moving a widget
changes the numbers it should."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

VIEWS = Path(__file__).resolve().parents[2] / "dashboard" / "views"
APP = VIEWS.parent / "app.py"


def run(view: str, **session) -> AppTest:
    at = AppTest.from_file(str(VIEWS / f"{view}.py"), default_timeout=180)
    for key, value in session.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_app_entry_point_runs_the_default_view(traces_dir):
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception
    assert at.title[0].value == "Drift"
    # The default rule opened the captured trace, not the synthetic preset.
    assert at.sidebar.selectbox(key="trace_picker").value == "tiny-captured"


def test_drift_window_changes_the_counts(traces_dir):
    at = run("drift")
    before = metrics(at)
    assert int(before["Layer writes in window"].replace(",", "")) > 0
    at.slider(key="drift_window").set_value((1, 60)).run()
    after = metrics(at)
    assert not at.exception
    assert int(after["Layer writes in window"]) < int(before["Layer writes in window"].replace(",", ""))
    assert after["Mean drift per step"] != before["Mean drift per step"]


def test_whatif_threshold_moves_writes_and_staleness(traces_dir):
    at = run("whatif")
    before = metrics(at)
    at.sidebar.select_slider(key="k_base").set_value(1e-4).run()
    lower = metrics(at)
    assert int(lower["Layer writes"].replace(",", "")) > int(before["Layer writes"].replace(",", ""))
    assert float(lower["Mean weighted staleness"].split()[0]) < \
        float(before["Mean weighted staleness"].split()[0])
    at.sidebar.slider(key="smax").set_value(40).run()
    capped = metrics(at)
    assert int(capped["Max staleness"].split()[0]) <= 40


def test_whatif_bad_combination_says_the_fix(traces_dir):
    at = run("whatif")
    at.sidebar.slider(key="smax").set_value(10).run()  # warm-up 20 > smax 10
    assert not at.exception
    assert "shorten the warm-up or raise smax" in at.error[0].value


def test_whatif_recorded_settings_reproduce_the_recorded_writes(traces_dir):
    """Opened at the trace's own config, the replay writes what the trace recorded."""
    at = run("whatif")
    drift = run("drift")
    assert metrics(at)["Layer writes"] == metrics(drift)["Layer writes in window"]


def test_failures_mtbf_changes_the_ratio(traces_dir):
    at = run("failures", seeds=2, window_d=1)
    before = metrics(at)
    assert before["Best base threshold"]
    at.sidebar.select_slider(key="mtbf_h").set_value(5.0).run()
    assert not at.exception
    after = metrics(at)
    assert float(after["Failures per window"]) < float(before["Failures per window"])
    assert after["LayerCheck effective ratio"] != before["LayerCheck effective ratio"]


def test_failures_says_where_costs_come_from_and_what_stale_layers_discard(traces_dir):
    at = run("failures", seeds=2, window_d=1)
    assert "no costs.json" in at.warning[0].value and "profiler calibrate" in at.warning[0].value
    costs = at.dataframe[1].value
    assert {"figure", "value", "source", "method"} <= set(costs.columns)
    assert costs.set_index("figure").loc["load_gbps", "source"] == "fit"
    assert metrics(at)["Discarded by stale layers (stale_s)"].endswith(" h")
    honest = at.dataframe[0].value.set_index("strategy").loc["layercheck"]
    at.sidebar.toggle(key="stale_useful").set_value(True).run()
    paper = at.dataframe[0].value.set_index("strategy").loc["layercheck"]
    assert honest["stale_s"] > 0
    assert paper["effective_ratio"] == pytest.approx(honest["effective_ratio"] + honest["stale_s"] / 86400)
    at.sidebar.radio(key="protocol").set_value("native").run()
    assert not at.exception
    strategies = at.dataframe[0].value.set_index("strategy")
    assert strategies.loc["layercheck", "stale_s"] > 0


def test_failures_uses_the_traces_own_calibration(traces_dir):
    at = run("failures", seeds=2, window_d=1, trace_name="qwen2.5-7b-synthetic")
    assert not at.warning
    assert at.sidebar.selectbox(key="cost_model").value == "this trace's calibration (costs.json)"


def test_fidelity_window_changes_the_deviation(traces_dir):
    at = run("fidelity")
    before = metrics(at)
    assert before["Max relative deviation"].endswith("%")
    at.slider(key="fid_window").set_value((1, 150)).run()  # before the failure at step 200
    after = metrics(at)
    assert float(after["Max |deviation| in window"]) == 0.0
    assert float(before["Max |deviation| in window"]) > 0.0


def test_fidelity_without_drill_says_how_to_get_one(traces_dir):
    at = run("fidelity", trace_name="qwen2.5-7b-synthetic")
    assert "python -m profiler drill" in at.info[0].value


def test_traces_lists_invalid_ones_and_switching_changes_numbers(traces_dir):
    at = run("traces")
    assert any("broken" in w.value for w in at.warning)
    steps = metrics(at)["Steps"]
    at.sidebar.selectbox(key="trace_picker").set_value("qwen2.5-7b-synthetic").run()
    assert metrics(at)["Steps"] != steps


@pytest.mark.parametrize("name,payload,message", [
    ("junk.zip", b"not a zip", "not a readable .zip"),
    ("notes.txt", b"hello", "not a trace file"),
])
def test_invalid_upload_is_a_message_not_a_stack_trace(traces_dir, name, payload, message):
    from dashboard.catalog import unpack_upload
    from layercheck.trace import TraceError
    with pytest.raises(TraceError, match=message):
        unpack_upload([(name, payload)])


def test_upload_of_a_broken_trace_in_the_app(traces_dir, tmp_path):
    """The Traces page shows read_trace's message for a zip whose manifest is incomplete."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("mine/manifest.json", '{"schema_version": 1, "name": "mine"}')
    at = AppTest.from_file(str(VIEWS / "traces.py"), default_timeout=60)
    at.run()
    # AppTest has no file_uploader driver: exercise the same path the page runs.
    from dashboard.catalog import load, unpack_upload
    from layercheck.trace import TraceError
    with pytest.raises(TraceError, match="missing keys"):
        load(unpack_upload([("mine.zip", buf.getvalue())], into=tmp_path))
