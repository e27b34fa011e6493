"""View: the verdict: every strategy at its own best setting, what can flip it, the
frontier of ratio against durable bytes, and the bill in hours and dollars."""
import streamlit as st

from dashboard import mtbf, ui, verdict
from sim import SimError
from sim.budgets import Budgets
from sim.fair import compare
from sim.verdict import judge

DAY = 86400.0

ui.page("Verdict", "Every strategy at its own best setting within the same budgets, on the same "
        "failures (python -m sim's fair protocol): who wins, by how much, what can flip it, and "
        "what the run costs.")
trace = ui.current_trace()
options = mtbf.cost_options(trace)
d = verdict.DEFAULTS
KEPT = ui.settings({"v_mtbf_h": 0.5, "v_seeds": 4, "v_window_d": 7, "v_max_tb": 0.0, "v_max_host": 0.0,
                    "v_gpu_hour": float(d["gpu_hour_usd"]), "v_gpus": int(d["gpus"]),
                    "v_storage": float(d["storage_usd_per_gb_month"]),
                    "v_write": float(d["write_usd_per_gb"]), "v_keep": int(d["keep"]),
                    "v_bands": False})
with st.sidebar:
    st.subheader("Comparison")
    hours = st.select_slider("MTBF (hours)", [0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 5.0],
                             key="v_mtbf_h")
    seeds = st.slider("Seeds", 2, 10, key="v_seeds")
    days = st.select_slider("Simulated window (days)", [1, 3, 7, 14, 30], key="v_window_d")
    choice = st.selectbox("Cost model", options, key="v_cost_model")
    st.subheader("Budgets (0: none)")
    max_tb = st.number_input("Durable TB a job", min_value=0.0, step=0.5, key="v_max_tb")
    max_host = st.number_input("Host memory GB", min_value=0.0, step=50.0, key="v_max_host")
    st.subheader("Prices")
    gpu_hour = st.number_input("GPU-hour ($)", min_value=0.0,
                               step=0.1, key="v_gpu_hour")
    gpus = st.number_input("GPUs in the job", min_value=1, step=1, key="v_gpus")
    storage = st.number_input("Storage ($ a GB-month)",
                              min_value=0.0, step=0.005, format="%.4f", key="v_storage")
    write = st.number_input("Writes ($ a GB)", min_value=0.0,
                            step=0.0001, format="%.6f", key="v_write")
    keep = st.number_input("Recovery points kept", min_value=1, step=1,
                           key="v_keep")
    bands = st.toggle("Check every figure's band", key="v_bands")
ui.keep(KEPT)

budgets = Budgets(max_bytes=max_tb * 1e12 or None, max_host_bytes=max_host * 1e9 or None)


@st.cache_resource(show_spinner="Searching every strategy's settings...", max_entries=8)
def _compare(_trace, key, choice, mtbf_s, seeds, window_s, max_bytes, max_host):
    scenario = mtbf.scenario_for(_trace, costs=mtbf.cost_model(_trace, choice))
    return compare(scenario, mtbf_s=mtbf_s, seeds=seeds, window_s=window_s, front=True,
                   budgets=Budgets(max_bytes=max_bytes, max_host_bytes=max_host))


@st.cache_resource(show_spinner="Checking what can flip it...", max_entries=8)
def _judge(_result, key, choice, mtbf_s, seeds, window_s, max_bytes, max_host, bands):
    return judge(_result, bands=bands)


key = ui.trace_key(trace)
args = (key, choice, hours * 3600.0, seeds, days * DAY, budgets.max_bytes, budgets.max_host_bytes)
try:
    result = _compare(trace, *args)
    outcome = _judge(result, *args, bands)
    prices = verdict.prices_from_form(gpu_hour, gpus, storage, write, keep)
except SimError as exc:
    st.error(f"The comparison cannot run: {exc}")
    st.stop()
c1, c2, c3 = st.columns(3)
c1.metric("Winner", outcome.winner, outcome.setting, delta_color="off")
c2.metric("Margin", f"{outcome.margin:+.4f}", f"over {outcome.runner_up}", delta_color="off")
c3.metric("Holds under the checks", "yes" if outcome.robust else "no",
          f"{len(outcome.flips)} flip(s)", delta_color="off")
st.text(outcome.text())
settings = verdict.settings_frame(result)
ui.table(settings)
ui.table_download(settings, f"{trace.name}-fair-{hours}h", key="fair")
flips = verdict.flips_frame(outcome)
if not flips.empty:
    ui.table(flips)

st.subheader("Ratio against durable bytes")
ui.figure(verdict.frontier_figure(result), f"{trace.name}-bytes-frontier-{hours}h", key="bytefront")
ranges = verdict.budget_frame(result)
st.caption("The best strategy under each budget of durable bytes a job: `python -m sim frontier` "
           "prints the same.")
ui.table(ranges)
ui.table_download(ranges, f"{trace.name}-best-by-budget-{hours}h", key="budgets")

st.subheader("In hours and dollars")
bill = verdict.bill_frame(result, prices)
ui.table(bill)
ui.table_download(bill, f"{trace.name}-bill-{hours}h", key="bill")
st.caption("Where each price comes from:")
ui.table(verdict.prices_frame(prices))
