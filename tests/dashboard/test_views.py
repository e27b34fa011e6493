"""AppTest for every view: it runs without exceptions, and moving a widget
changes the numbers it should."""
from __future__ import annotations

import io
import re
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
    at = AppTest.from_file(str(APP), default_timeout=600).run()
    assert not at.exception
    assert at.title[0].value == "My job"


def test_a_value_set_before_a_page_switch_is_kept_though_its_page_never_kept_it(traces_dir):
    """Streamlit stops a run when the next is asked for: the What-if run that would have
    kept a slider moved just before a click on another page may never reach ``ui.keep``.
    The value is in session state when the next page's run starts; the app keeps it then."""
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["kept_widget_values"] = {"smax": 100, "interval": 1}
    at.session_state["smax"] = 120                   # applied by the run that was cut short
    at.switch_page("views/drift.py").run()
    assert not at.exception
    assert at.title[0].value == "Drift"
    assert at.session_state["kept_widget_values"] == {"smax": 120, "interval": 1}


def test_a_trace_page_opens_on_the_default_trace(traces_dir):
    # The default rule opened the captured trace, not the synthetic preset.
    assert run("drift").sidebar.selectbox(key="trace_picker").value == "tiny-captured"


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
    assert metrics(at)["Discarded by stale layers"].endswith(" h")
    assert any(c.value.startswith("stale cost phi: ") for c in at.caption)
    model = at.dataframe[0].value.set_index("strategy").loc["layercheck"]
    assert {"ratio at phi's low end", "ratio at phi's high end", "stale, counted lost (h)"} <= \
        set(model.index)
    at.sidebar.radio(key="phi_mode").set_value("given").run()     # phi 1: every stale update lost
    honest = at.dataframe[0].value.set_index("strategy").loc["layercheck"]
    at.sidebar.number_input(key="phi").set_value(0.0).run()       # the paper's accounting
    paper = at.dataframe[0].value.set_index("strategy").loc["layercheck"]
    assert honest["stale training (h)"] > 0          # a day's window: the table is in hours
    assert paper["effective ratio"] == pytest.approx(honest["effective ratio"]
                                                     + honest["stale training (h)"] / 24)
    assert paper["ratio at phi's low end"] == paper["ratio at phi's high end"] == paper["effective ratio"]
    stale_metric = next(m for m in at.metric if m.label == "Discarded by stale layers")
    assert stale_metric.delta == "phi 0 of it lost"
    at.sidebar.radio(key="protocol").set_value("native").run()
    assert not at.exception
    strategies = at.dataframe[0].value.set_index("strategy")
    assert strategies.loc["layercheck", "stale training (h)"] > 0


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
    infos = [i.value for i in at.info]
    assert any("python -m profiler drill" in i for i in infos)
    assert any("python -m profiler staleness" in i for i in infos)


def test_fidelity_shows_what_a_stale_layer_costs(traces_dir):
    at = run("fidelity")
    shown = metrics(at)
    phi = next(label for label in shown if label.startswith("phi (threshold"))
    float(shown[phi])
    assert any("bit for bit" in s.value for s in at.success)
    assert len(at.dataframe) == 2  # the phi table and the drill's failures


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
    from layercheck.contract.trace import TraceError
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
    from layercheck.contract.trace import TraceError
    with pytest.raises(TraceError, match="missing keys"):
        load(unpack_upload([("mine.zip", buf.getvalue())], into=tmp_path))


def test_whatif_frontier_point_goes_to_the_sliders(traces_dir):
    at = run("whatif")
    assert "no costs.json" in at.caption[-1].value or any("no costs.json" in c.value for c in at.caption)
    at.selectbox(key="front_pick").select_index(1).run()   # the second fewest bytes on the front
    chosen = at.dataframe[0].value.iloc[1]
    at.button(key="use_front").click().run()
    assert not at.exception
    assert at.sidebar.select_slider(key="k_base").value == pytest.approx(chosen["base threshold K"])
    assert at.sidebar.slider(key="smax").value == chosen["Smax (steps)"]
    assert at.sidebar.slider(key="interval").value == chosen["interval (steps)"]
    assert int(metrics(at)["Layer writes"].replace(",", "")) == chosen["layer writes"]


def test_whatif_moving_a_budget_changes_the_recommendation(traces_dir):
    at = run("whatif")
    free = at.code[0].value
    assert free.startswith("LayerCheckConfig(")
    gb = float(metrics(at)["Recommended writes"].split()[0])
    unit = metrics(at)["Recommended writes"].split()[1]
    at.number_input(key="budget_gb").set_value({"MB": gb / 1e3, "kB": gb / 1e6}.get(unit, gb) / 3)
    at.button(key="FormSubmitter:tune_form-Recommend").click().run()
    assert not at.exception
    assert at.code[0].value != free
    at.number_input(key="budget_gb").set_value(1e-6)
    at.button(key="FormSubmitter:tune_form-Recommend").click().run()
    assert "--max-gb 1e-06 binds" in at.error[0].value
    at.number_input(key="budget_gb").set_value(0.0)
    at.number_input(key="budget_stale").set_value(60)
    at.button(key="FormSubmitter:tune_form-Recommend").click().run()
    assert not at.error
    assert int(metrics(at)["Recommended max staleness"].split()[0]) <= 60
    at.button(key="use_rec").click().run()
    assert int(metrics(at)["Max staleness"].split()[0]) <= 60


def test_whatif_budget_mode_holds_the_rate(traces_dir):
    at = run("whatif")
    free = metrics(at)
    at.sidebar.toggle(key="budget_on").set_value(True).run()
    budget = at.sidebar.number_input(key="budget_mb").value
    at.sidebar.number_input(key="budget_mb").set_value(budget / 2).run()
    assert not at.exception
    held = metrics(at)
    assert int(held["Layer writes"].replace(",", "")) < int(free["Layer writes"].replace(",", ""))
    delta = next(m.delta for m in at.metric if m.label == "Written per step after the base")
    assert float(delta.split("%")[0]) <= 5.0          # at most 5% over the budget
    assert at.get("plotly_chart")                      # the budget figure among the charts


def test_failures_shows_what_the_ranking_hangs_on(traces_dir):
    at = run("failures", seeds=2, window_d=1, trace_name="qwen2.5-7b-synthetic")
    at.toggle(key="sensitivity").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("ranks first" in w.value for w in at.warning) or \
        any("ranks first" in s.value for s in at.success)
    bands = at.dataframe[-1].value
    assert {"figure", "low", "high", "reason"} <= set(bands.columns)


def test_verdict_names_a_winner_and_prices_move_the_bill(traces_dir):
    at = run("verdict", v_seeds=2, v_window_d=1)
    assert metrics(at)["Winner"]
    before = at.dataframe[-2].value["GPU ($)"].sum()
    at.sidebar.number_input(key="v_gpu_hour").set_value(10.0).run()
    assert not at.exception
    assert at.dataframe[-2].value["GPU ($)"].sum() > before


@pytest.mark.parametrize("view, session", [
    ("drift", {}), ("whatif", {}), ("failures", {"seeds": 2, "window_d": 1}),
    ("verdict", {"v_seeds": 2, "v_window_d": 1}), ("fidelity", {}), ("traces", {}),
    ("scale", {"scale_seeds": 2, "scale_window_d": 1, "scale_gpus": (8, 64)})])
def test_every_table_has_headers_in_words(traces_dir, view, session):
    """No snake_case header on any page: each table goes through dashboard.tables."""
    at = run(view, **session)
    assert at.dataframe, f"{view} shows no table"
    for table in at.dataframe:
        for column in table.value.columns:
            assert not re.search(r"[a-z]_[a-z]", str(column)), (view, column)
