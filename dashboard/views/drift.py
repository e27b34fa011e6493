"""View 1: drift heatmap and per-layer drift rates."""
import streamlit as st

from dashboard import driftmap, ui

ui.page("Drift", "Each layer's drift accumulator A_l rises with its updates and resets when "
        "LayerCheck writes the layer (ticks): the paper's motivating picture.")
trace = ui.current_trace()
first, last = st.slider("Steps", 1, trace.num_steps, (1, trace.num_steps), key="drift_window")
log_color = st.toggle("Log colour scale", value=False, key="drift_log")
rates = driftmap.rates_frame(trace, first, last)
stats = driftmap.window_stats(rates)
c1, c2 = st.columns(2)
c1.metric("Layer writes in window", f"{stats['writes']:,}")
c2.metric("Mean drift per step", f"{stats['mean_drift']:.3g}")
st.markdown(f"Fastest layer: **{stats['fastest']}**; slowest: **{stats['slowest']}**.")
ui.figure(driftmap.heatmap_figure(trace, first, last, log_color=log_color),
          f"{trace.name}-drift-heatmap", key="heatmap")
ui.figure(driftmap.rates_figure(rates), f"{trace.name}-drift-rates", key="rates")
ui.table(rates)
ui.table_download(rates, f"{trace.name}-drift-rates-{first}-{last}", key="rates")
