"""View 2: what-if tuning of threshold, Smax, warm-up, interval and write budget; the
frontier of every setting; a recommendation from budgets."""
import time

import streamlit as st

from dashboard import mtbf, tuning, ui, whatif
from dashboard.downloads import human_bytes
from layercheck.contract.config import ConfigError
from sim import SimError
from sim.frontier import BASE_THRESHOLDS, EMBEDDING_THRESHOLDS

THRESHOLDS = sorted({0.0, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2,
                     1e-1, float("inf"), *BASE_THRESHOLDS, *EMBEDDING_THRESHOLDS})
MTBF_HOURS = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
SEEDS, WINDOW_S = 5, 7 * 86400.0

ui.page("What-if tuning", "Re-decide the trace's run under other settings: the same policy as "
        "the library (vectorised replays proven equal to layercheck.contract.policy.replay).")
SLIDERS = ["k_base", "k_emb", "smax", "warmup", "interval", "lr_scaling", "budget_on", "budget_mb"]
trace = ui.current_trace()
ui.restore(SLIDERS)
recorded = whatif.Settings.from_trace(trace)
nearest = lambda v: min(THRESHOLDS, key=lambda k: abs(k - v) if k != v else -1)  # noqa: E731
if st.session_state.get("whatif_trace") != trace.name:  # a new trace opens at its own settings
    recorded_rate = whatif.outcome(trace, whatif.replay_trace(trace, recorded),
                                   recorded).bytes_per_step
    st.session_state.update({
        "whatif_trace": trace.name, "k_base": nearest(recorded.base_threshold),
        "k_emb": nearest(recorded.embedding_threshold), "smax": recorded.smax,
        "warmup": recorded.warmup_steps, "interval": recorded.interval,
        "lr_scaling": recorded.lr_scaling, "budget_on": recorded.write_budget is not None,
        "budget_mb": round((recorded.write_budget or recorded_rate) / 1e6, 3) or 1.0})


def use(settings: whatif.Settings) -> None:
    """Put ``settings`` on the sliders (a callback: it runs before the widgets are drawn)."""
    values = tuning.slider_values(settings)
    values["k_base"], values["k_emb"] = nearest(values["k_base"]), nearest(values["k_emb"])
    st.session_state.update(values)


with st.sidebar:
    st.subheader("Policy")
    base = st.select_slider("Base threshold K", THRESHOLDS, format_func=lambda k: f"{k:g}",
                            key="k_base", help="0 writes at every opportunity, inf only when Smax forces.")
    emb = st.select_slider("Embedding threshold", THRESHOLDS, format_func=lambda k: f"{k:g}", key="k_emb")
    smax = st.slider("Smax (steps)", 1, max(trace.num_steps, recorded.smax), key="smax")
    warmup = st.slider("Warm-up (steps)", 0, max(trace.num_steps, recorded.warmup_steps), key="warmup")
    interval = st.slider("Checkpoint interval (steps)", 1, 100, key="interval")
    lr_scaling = st.toggle("Scale K by lr / lr_peak", key="lr_scaling")
    budget_on = st.toggle("Budget mode (a write budget)", key="budget_on",
                          help="A controller scales every threshold to keep the bytes written per "
                               "step after the base checkpoint at the budget; Smax still forces.")
    budget_mb = st.number_input("Write budget (MB per step)", min_value=0.001, key="budget_mb",
                                disabled=not budget_on, format="%.3f")
ui.keep(SLIDERS)
try:
    settings = whatif.Settings(base_threshold=base, embedding_threshold=emb, smax=smax,
                               warmup_steps=warmup, interval=interval, lr_scaling=lr_scaling,
                               write_budget=budget_mb * 1e6 if budget_on else None)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()
st.sidebar.caption(f"As a config to paste: `{tuning.config_line(settings.config())}`")
start = time.perf_counter()
replayed = whatif.replay_trace(trace, settings)
took = time.perf_counter() - start
result = whatif.outcome(trace, replayed, settings)
c1, c2, c3, c4 = st.columns(4)
c1.metric("Layer writes", f"{result.layer_writes:,}")
c2.metric("Checkpoints", f"{result.checkpoints:,}")
c3.metric("Total written", human_bytes(result.total_bytes))
c4.metric("Mean per checkpoint", human_bytes(result.mean_bytes_per_checkpoint))
c1, c2, c3, c4 = st.columns(4)
c1.metric("I/O saved vs full", f"{result.io_saving:.1%}")
c2.metric("Max staleness", f"{result.max_staleness:,} steps")
c3.metric("Peak weighted staleness", f"{result.peak_weighted_staleness:,.1f} steps")
c4.metric("Mean weighted staleness", f"{result.mean_weighted_staleness:,.1f} steps")
st.caption(f"Replayed {trace.num_steps:,} steps x {len(trace.layer_names)} layers in "
           f"{took * 1e3:.0f} ms ({replayed.method} method). Full checkpoints at every "
           f"opportunity would write {human_bytes(result.full_total_bytes)}.")
if settings.write_budget is not None:
    c1, c2 = st.columns(2)
    c1.metric("Written per step after the base", human_bytes(result.bytes_per_step),
              f"{result.bytes_per_step / settings.write_budget - 1:+.1%} against the budget",
              delta_color="inverse")
    c2.metric("K factor at the end", f"{replayed.k_scales()[-1]:.3g}")
    ui.figure(whatif.budget_figure(trace, replayed, settings), f"{trace.name}-budget", key="budget")
ui.figure(whatif.io_figure(trace, replayed, settings), f"{trace.name}-io", key="io")
ui.figure(whatif.staleness_figure(trace, replayed), f"{trace.name}-staleness", key="staleness")
ui.figure(whatif.writes_figure(trace, replayed), f"{trace.name}-writes", key="writes")
ui.table_download(whatif.summary_frame(result), f"{trace.name}-whatif-summary", key="summary",
                  label="Download summary (CSV)")
ui.table_download(lambda: whatif.written_trace_frame(trace, replayed), f"{trace.name}-whatif-writes",
                  key="writes", label="Download every write (CSV)")

# -- the frontier ----------------------------------------------------------------------
st.header("Frontier: every setting at once")
if trace.costs is None:
    st.caption(f"This trace has no costs.json: effective ratios use the {mtbf.cost_options(trace)[0]} "
               f"cost model. Measure the capturing machine with `python -m profiler calibrate "
               f"--trace traces/{trace.name}`.")
KEPT = ui.settings({"tune_mtbf_h": 0.5, "budget_gb": 0.0, "budget_stale": 0, "budget_share": 0.0})
hours = st.select_slider("MTBF for the effective ratio (hours)", MTBF_HOURS, key="tune_mtbf_h")
key = ui.trace_key(trace)


@st.cache_resource(show_spinner="Replaying every setting...", max_entries=4)
def _frontier(_trace, key):
    start = time.perf_counter()
    return tuning.frontier(_trace, mtbf.scenario_for(_trace)), time.perf_counter() - start


@st.cache_data(show_spinner="Simulating the front...", max_entries=16)
def _rated(_trace, key, mtbf_s):
    evaluation, _ = _frontier(_trace, key)
    return tuning.rate_front(evaluation, mtbf.scenario_for(_trace), mtbf_s=mtbf_s, seeds=SEEDS,
                             window_s=WINDOW_S)


try:
    evaluation, replay_s = _frontier(trace, key)
    table = _rated(trace, key, hours * mtbf.HOUR)
except SimError as exc:
    st.error(f"The frontier cannot be computed for this trace: {exc}")
    st.stop()


def use_row(row: int) -> None:
    use(tuning.settings_for(table, row, lr_scaling=st.session_state["lr_scaling"]))


def on_click() -> None:
    points = st.session_state["chart-frontier"].selection.points
    rows = [p["customdata"] for p in points if p.get("customdata") is not None]
    if rows:
        use_row(int(rows[0]))


st.caption(f"{len(table) - 2} settings replayed exactly in {replay_s:.2f} s; effective ratio "
           f"simulated for the Pareto points and the paper's default at MTBF {hours:g} h "
           f"({SEEDS} seeds, 7 days). Click a point to put it on the sliders.")
chart = st.container()  # drawn once the recommendation below is known
front = tuning.front_frame(table)
rows = {f"K {r.base_threshold:g}, emb {r.embedding_threshold:g}, Smax {int(r.smax)}, interval "
        f"{int(r.interval)}: {r['GB written']:,.3g} GB, staleness {r.mean_weighted_staleness:.1f}": row
        for row, r in front.iterrows()}
pick = st.selectbox("Pareto point", list(rows), key="front_pick")
st.button("Use this setting", key="use_front", on_click=use_row, args=(rows[pick],))
ui.table(front)
ui.table_download(table, f"{trace.name}-frontier-{hours}h", key="frontier")

# -- the recommendation ------------------------------------------------------------------
st.header("Recommendation from budgets")
with st.form("tune_form"):
    c1, c2, c3 = st.columns(3)
    max_gb = c1.number_input("Max GB written over the run (0: none)", min_value=0.0,
                             key="budget_gb", format="%g")
    max_stale = c2.number_input("Max staleness of any layer, steps (0: none)", min_value=0,
                                key="budget_stale")
    max_share = c3.number_input("Max share of write bandwidth, % (0: none)", min_value=0.0,
                                max_value=100.0, key="budget_share")
    st.form_submit_button("Recommend")
ui.keep(KEPT)


@st.cache_data(show_spinner="Finding the best setting...", max_entries=32)
def _advice(_trace, key, budgets, mtbf_s):
    evaluation, _ = _frontier(_trace, key)
    try:
        return tuning.advise(_trace, mtbf.scenario_for(_trace), evaluation, budgets, mtbf_s=mtbf_s,
                             seeds=SEEDS, window_s=WINDOW_S), None
    except SimError as exc:
        return None, str(exc)


try:
    budgets = tuning.budgets_from_form(max_gb, max_stale, max_share)
except SimError as exc:
    st.error(str(exc))
    st.stop()
advice, problem = _advice(trace, key, budgets, hours * mtbf.HOUR)
with chart:
    st.plotly_chart(tuning.frontier_figure(table, result, advice.best if advice else None),
                    width="stretch", key="chart-frontier", on_select=on_click,
                    selection_mode="points")
if problem:
    st.error(problem)
    st.stop()
c1, c2, c3 = st.columns(3)
c1.metric("Recommended effective ratio", f"{advice.best['effective_ratio']:.4f}",
          f"{advice.best['effective_ratio'] - advice.paper['effective_ratio']:+.4f} vs paper default")
c2.metric("Recommended writes", human_bytes(advice.best["bytes_written"]))
c3.metric("Recommended max staleness", f"{advice.best['max_staleness']:,} steps")
st.code(advice.line, language="python")
if advice.budget_mode is not None:
    st.caption("To hold the budget online on a run that drifts differently (budget mode):")
    st.code(tuning.config_line(advice.budget_mode), language="python")
ui.table(tuning.recommendation_frame(advice))
st.button("Use the recommendation", key="use_rec", on_click=use_row, args=(advice.best["row"],))
