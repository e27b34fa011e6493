"""View 3: failures: the simulator at an MTBF, across MTBFs, and the best threshold."""
import dataclasses

import numpy as np
import streamlit as st

from dashboard import mtbf, sensitivity, ui, whatif
from sim import PROTOCOLS, SimError
from sim import sensitivity as sens

MTBF_HOURS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0]
THRESHOLDS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
DAY = 86400.0

ui.page("Failures", "How much wall-clock time goes to useful training at a failure rate, with "
        "LayerCheck and each alternative (the sim package, common random failures).")
trace = ui.current_trace()
options = mtbf.cost_options(trace)
KEPT = ui.settings({"mtbf_h": 0.5, "seeds": 5, "window_d": 7, "protocol": PROTOCOLS[0],
                    "phi_mode": "the cost model's", "phi": 1.0})
with st.sidebar:
    st.subheader("Simulation")
    hours = st.select_slider("MTBF (hours)", MTBF_HOURS, key="mtbf_h")
    seeds = st.slider("Seeds", 2, 20, key="seeds")
    days = st.select_slider("Simulated window (days)", [1, 3, 7, 14, 30], key="window_d")
    choice = st.selectbox("Cost model", options, key="cost_model",
                          help="What each mechanism costs: the calibration measured on the "
                               "machine that captured the trace, or the paper's A100/Lustre server.")
    protocol = st.radio("Protocol", PROTOCOLS, key="protocol", horizontal=True,
                        help="matched: rollback strategies checkpoint every (LayerCheck's mean "
                             "staleness) steps, as the paper compares; native: each as its "
                             "authors designed it.")
    phi_mode = st.radio("Stale cost factor phi", ("the cost model's", "given"), key="phi_mode",
                        horizontal=True,
                        help="The share of the training whose updates a composite recovery "
                             "discarded through stale layers (stale_s) counted as lost, the "
                             "rest as useful: the cost model's carries its interval.")
    given_phi = st.number_input("phi (0: the paper's accounting, 1: every stale update lost)",
                                step=0.1, key="phi", disabled=phi_mode != "given")
ui.keep(KEPT)

if trace.costs is None and trace.kind == "captured":
    st.warning(f"This trace has no costs.json, so the simulator uses the paper's A100/Lustre "
               f"server, not the machine it was captured on. Measure that machine with "
               f"`python -m profiler calibrate --trace traces/{trace.name}`.")
fields = {"protocol": protocol, "stale_cost": float(given_phi) if phi_mode == "given" else None}


@st.cache_data(show_spinner="Simulating...", max_entries=64)
def _table(_trace, key, choice, fields, mtbf_s, seeds, window_s):
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice), **fields)
    return mtbf.strategies_table(scenario, mtbf_s=mtbf_s, seeds=seeds, window_s=window_s)


@st.cache_data(show_spinner="Sweeping MTBF...", max_entries=16)
def _curves(_trace, key, choice, fields, seeds, window_s):
    points = np.geomspace(0.01, 10, 12) * mtbf.HOUR
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice), **fields)
    return mtbf.curves(scenario, mtbf_s=points, seeds=seeds, window_s=window_s)


@st.cache_data(show_spinner="Simulating thresholds...", max_entries=32)
def _thresholds(_trace, key, choice, fields, settings, mtbf_s, seeds, window_s):
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice), **fields)
    return mtbf.threshold_table(_trace, scenario, whatif.Settings(**settings), THRESHOLDS,
                                mtbf_s=mtbf_s, seeds=seeds, window_s=window_s)


@st.cache_data(show_spinner="Varying each figure across its band...", max_entries=8)
def _sensitivity(_trace, key, choice, fields, mtbf_s):
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice), **fields)
    return sens.sensitivity(scenario, mtbf_s=mtbf_s)


key = ui.trace_key(trace)
try:
    table = _table(trace, key, choice, fields, hours * mtbf.HOUR, seeds, days * DAY)
except SimError as exc:
    st.error(f"The simulator cannot run this trace: {exc}")
    st.stop()
scenario = mtbf.scenario_for(trace, costs=mtbf.cost_model(trace, choice), **fields)
phi_line, phi_note = mtbf.stale_notes(scenario, table)
phi = scenario.stale_figure().value
best = table.loc[table["effective_ratio"].idxmax()]
lc = table[table["strategy"] == "layercheck"]
c1, c2, c3, c4 = st.columns(4)
c1.metric("Best strategy", best["strategy"], f"ratio {best['effective_ratio']:.3f}")
if not lc.empty:
    c2.metric("LayerCheck effective ratio", f"{lc['effective_ratio'].iloc[0]:.3f}",
              f"±{lc['ci95'].iloc[0]:.3f} (95%)", delta_color="off",
              help=f"At phi's bounds {lc['ratio_at_phi_low'].iloc[0]:.3f}.."
                   f"{lc['ratio_at_phi_high'].iloc[0]:.3f}.")
    c3.metric("Discarded by stale layers", f"{lc['stale_s'].iloc[0] / mtbf.HOUR:.1f} h",
              f"phi {phi:.3g} of it lost", delta_color="off",
              help="stale_s: training whose updates the stale layers of a composite recovery "
                   f"discarded; phi = {phi:g} of it is counted as lost, the rest as useful.")
c4.metric("Failures per window", f"{table['failures'].mean():.1f}")
with st.expander(f"Where the stale cost phi = {phi:.3g} comes from"):
    st.caption(phi_line)
if phi_note:
    st.warning(phi_note)
ui.figure(mtbf.breakdown_figure(table, days * DAY), f"{trace.name}-breakdown-{hours}h", key="breakdown")
ui.table(table)
ui.table_download(table, f"{trace.name}-strategies-{hours}h", key="strategies")

costs = mtbf.cost_model(trace, choice)
st.subheader("Where the costs come from")
st.caption(f"Cost model **{costs.name}**: {costs.description}. Each figure is measured on the "
           "capturing machine, derived, published, fitted or assumed, and says how.")
cost_table = mtbf.costs_frame(costs)
ui.table(cost_table)
ui.table_download(cost_table, f"{trace.name}-costs", key="costs")

st.subheader("Across MTBFs")
frame = _curves(trace, key, choice, fields, seeds, days * DAY)
ui.figure(mtbf.curves_figure(frame, hours * mtbf.HOUR), f"{trace.name}-mtbf-sweep", key="sweep")
ui.table_download(frame, f"{trace.name}-mtbf-sweep", key="sweep")

st.subheader("Which threshold is best at this MTBF")
settings = whatif.Settings.from_trace(trace)
by_k = _thresholds(trace, key, choice, fields, dataclasses.asdict(settings), hours * mtbf.HOUR,
                   seeds, days * DAY)
winner = by_k.loc[by_k["best"]].iloc[0]
st.metric("Best base threshold", f"{winner['base_threshold']:g}",
          f"ratio {winner['effective_ratio']:.4f}", delta_color="off")
ui.figure(mtbf.threshold_figure(by_k), f"{trace.name}-thresholds-{hours}h", key="thresholds")
ui.table(by_k)
ui.table_download(by_k, f"{trace.name}-thresholds-{hours}h", key="thresholds")

st.subheader("What the ranking hangs on")
st.caption("Every figure of the cost model not measured on this machine, varied one at a time "
           "across its band (the band and its reason are declared with the figure), on the "
           f"same failures: {sens.SEEDS} seeds over {sens.WINDOW_S / DAY:g} days a point. "
           "`python -m sim sensitivity` prints the same.")
if st.toggle("Run the sensitivity (1 + 2 x figures simulations)", key="sensitivity"):
    result = _sensitivity(trace, key, choice, fields, hours * mtbf.HOUR)
    flips = sensitivity.flips_frame(result)
    if flips.empty:
        st.success(f"No figure's band changes which strategy ranks first ({result.leader}).")
    else:
        st.warning(f"{len(flips)} band end(s) change which strategy ranks first (now "
                   f"{result.leader}): " + "; ".join(
                       f"{r.figure} at its {r.end} end puts {r.leader} first"
                       for r in flips.itertuples()))
    pick = st.selectbox("Strategy", list(result.point), key="tornado_strategy",
                        index=list(result.point).index(result.leader))
    ui.figure(sensitivity.tornado_figure(result, pick), f"{trace.name}-tornado-{pick}-{hours}h",
              key="tornado")
    bands = sensitivity.bands_frame(result)
    ui.table(bands)
    ui.table_download(bands, f"{trace.name}-bands", key="bands")
