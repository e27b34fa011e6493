"""View 4: recovery fidelity from the profiler's drill."""
import pandas as pd
import streamlit as st

from dashboard import fidelity, ui

ui.page("Recovery fidelity", "A run killed and recovered from LayerCheck's composite checkpoint, "
        "against the same run without failures (python -m profiler drill).")
trace = ui.current_trace()
try:
    drill = fidelity.read_drill(trace.drill)
except fidelity.DrillError as exc:
    st.info(str(exc))
    st.stop()
c1, c2, c3, c4 = st.columns(4)
c1.metric("Max |loss deviation|", f"{drill.max_abs_loss_deviation:.4g}")
c2.metric("Max relative deviation", f"{drill.max_rel_loss_deviation:.2%}", "paper: 0.54%",
          delta_color="off")
c3.metric(f"{drill.metric_name}: failure-free", f"{drill.metric_failure_free:.4g}")
c4.metric(f"{drill.metric_name}: recovered", f"{drill.metric_recovered:.4g}",
          f"{drill.metric_recovered - drill.metric_failure_free:+.4g}", delta_color="off")
steps = drill.curves["step"]
lo, hi = int(steps.min()), int(steps.max())
first, last = st.slider("Steps", lo, max(hi, lo + 1), (lo, max(hi, lo + 1)), key="fid_window")
window = fidelity.deviation_in(drill, first, last)
c1, c2, c3 = st.columns(3)
c1.metric("Max |deviation| in window", f"{window['max_abs']:.4g}")
c2.metric("Max relative in window", f"{window['max_rel']:.2%}")
c3.metric("Recovery time (mean)",
          f"{sum(drill.recovery_seconds) / max(len(drill.recovery_seconds), 1):.2f} s")
show_dev = st.toggle("Show the difference instead of the curves", key="fid_dev")
ui.figure(fidelity.curves_figure(drill, show_deviation=show_dev), f"{trace.name}-fidelity", key="fid")
failures = pd.DataFrame({"failure_step": drill.failure_steps,
                         "recovery_seconds": drill.recovery_seconds[:len(drill.failure_steps)]})
st.dataframe(failures, hide_index=True)
ui.table_download(drill.curves, f"{trace.name}-drill-curves", key="curves")
