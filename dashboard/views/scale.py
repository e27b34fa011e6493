"""The dashboard's Scale page (Streamlit): the current trace's job on 8 to 16,384 GPUs.

Over ``dashboard.scale``, which wraps ``sim.scale``."""
import streamlit as st

from dashboard import mtbf, scale, ui
from sim import SimError
from sim.scale import LLAMA3_NODE_MTBF_S

DAY = 86400.0

ui.page("Scale", "The trace's job trained data-parallel on more GPUs: per-node failures, "
        "recovery that grows with the job, shared storage, GEMINI's peer placement "
        "(`python -m sim scale` prints the same; docs/sim-scale.md, The scale model).")
trace = ui.current_trace()
options = mtbf.cost_options(trace)
KEPT = ui.settings({"scale_gpus": (8, 16384), "scale_seeds": 4, "scale_window_d": 7,
                    "scale_node_mtbf_d": round(LLAMA3_NODE_MTBF_S / DAY, 1), "scale_unlimited": True,
                    "scale_spares": 0, "scale_no_spare": "wait", "scale_aggregate": 2000.0})
with st.sidebar:
    st.subheader("Job size")
    low, high = st.select_slider("GPUs", scale.SIZES, key="scale_gpus")
    seeds = st.slider("Seeds", 2, 20, key="scale_seeds")
    days = st.select_slider("Simulated window (days)", [1, 3, 7, 14, 30, 54],
                            key="scale_window_d")
    choice = st.selectbox("Cost model (one node's figures)", options, key="scale_cost_model")
    node_days = st.number_input("One node's MTBF (days)", min_value=1.0,
                                key="scale_node_mtbf_d",
                                help="Default: Llama 3 405B, 419 interruptions in 54 days on "
                                     "2,048 nodes.")
    unlimited = st.toggle("Spare pool never runs out", key="scale_unlimited")
    spares = st.number_input("Hot spare nodes", min_value=0, step=1, key="scale_spares",
                             disabled=unlimited)
    no_spare = st.radio("Without a spare", ("wait", "shrink"), horizontal=True,
                        key="scale_no_spare", help="wait for repair (AIReSim: 120 min) or "
                                                   "restart smaller")
    aggregate = st.number_input("Storage aggregate (GB/s)", min_value=1.0,
                                key="scale_aggregate", help="Default: Llama 3's 2 TB/s.")
ui.keep(KEPT)


@st.cache_data(show_spinner="Simulating every job size...", max_entries=16)
def _curve(_trace, key, choice, low, high, seeds, window_s, settings):
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice), window_s=window_s)
    return scale.curve(scenario, scale.model_for(**settings), low=low, high=high, seeds=seeds)


settings = {"spares": None if unlimited else int(spares), "no_spare": no_spare,
            "node_mtbf_days": float(node_days), "aggregate_gbps": float(aggregate)}
try:
    frame = _curve(trace, ui.trace_key(trace), choice, low, high, seeds, days * DAY, settings)
except SimError as exc:
    st.error(f"The simulator cannot run this job at scale: {exc}")
    st.stop()
top = frame[frame["gpus"] == frame["gpus"].max()]
rows = top[top["strategy"] != "limit"]
best = rows.loc[rows["effective_ratio"].idxmax()]
c1, c2, c3 = st.columns(3)
c1.metric(f"Best at {int(best['gpus']):,} GPUs", best["strategy"],
          f"ratio {best['effective_ratio']:.3f} +-{best['ci95']:.3f}", delta_color="off")
c2.metric("Perfect checkpointer there", f"{top[top['strategy'] == 'limit']['effective_ratio'].iloc[0]:.3f}")
c3.metric("Failures per run there", f"{best['failures']:.1f}")
ui.figure(scale.curve_figure(frame), f"{trace.name}-scale", key="scale_curve")
size = st.select_slider("Where the time goes at", sorted(frame["gpus"].unique()),
                        value=int(frame["gpus"].max()), key="scale_at")
ui.figure(scale.where_figure(frame, int(size), days * DAY), f"{trace.name}-scale-{size}",
          key="scale_where")
ui.table(frame)
ui.table_download(frame, f"{trace.name}-scale", key="scale")
