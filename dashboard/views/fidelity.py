"""View 4: recovery fidelity: the profiler's drill, and what a stale layer costs."""
import pandas as pd
import streamlit as st

from dashboard import fidelity, stalecost, ui

ui.page("Recovery fidelity", "A run killed and recovered from LayerCheck's composite checkpoint, "
        "against the same run without failures (python -m profiler drill), and what the stale "
        "layers of a composite cost in convergence (python -m profiler staleness).")
trace = ui.current_trace()


def show_drill() -> None:
    try:
        drill = fidelity.read_drill(trace.drill)
    except fidelity.DrillError as exc:
        st.info(str(exc))
        return
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Max |loss deviation|", f"{drill.max_abs_loss_deviation:.4g}")
    c2.metric("Max relative deviation", f"{drill.max_rel_loss_deviation:.2%}", "paper: 0.54%",
              delta_color="off")
    c3.metric("Final metric, failure-free", f"{drill.metric_failure_free:.4g}",
              help=drill.metric_name)
    c4.metric("Final metric, recovered", f"{drill.metric_recovered:.4g}",
              f"{drill.metric_recovered - drill.metric_failure_free:+.4g}", delta_color="off",
              help=drill.metric_name)
    st.caption(f"Final metric: {drill.metric_name}.")
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
    ui.figure(fidelity.curves_figure(drill, show_deviation=show_dev), f"{trace.name}-fidelity",
              key="fid")
    failures = pd.DataFrame({"failure_step": drill.failure_steps,
                             "recovery_seconds": drill.recovery_seconds[:len(drill.failure_steps)]})
    ui.table(failures)
    ui.table_download(drill.curves, f"{trace.name}-drill-curves", key="curves")


def show_study() -> None:
    st.subheader("What a stale layer costs")
    try:
        study = stalecost.read_study(trace.staleness)
    except stalecost.StudyError as exc:
        st.info(str(exc))
        return
    fig = study.figure
    if fig is not None:
        c1, c2, c3 = st.columns(3)
        n = f", n = {fig['n']}" if "n" in fig else ""
        c1.metric(f"phi (threshold {fig['threshold']:g}, horizon {fig['horizon']})",
                  f"{fig['value']:.2f}", f"[{fig['low']:.2f}, {fig['high']:.2f}]{n}", delta_color="off")
        c2.metric("Delta (steps behind)", f"{fig['delta']:.1f}")
        c3.metric("Staleness at the recovery", f"{fig['staleness']:.1f} steps")
    exact = study.runs[study.runs["kind"] == "exact"]
    if not exact.empty:
        same = bool(exact["identical"].all())
        (st.success if same else st.error)(
            "The exact-state control " + ("equals the failure-free run bit for bit: the "
                                          "recovery itself costs nothing." if same else
                                          "differs from the failure-free run: the measurement "
                                          "is not sound on this machine."))
    ui.figure(stalecost.curves_figure(study), f"{trace.name}-staleness-curves", key="stale_curves")
    ui.figure(stalecost.delta_figure(study), f"{trace.name}-staleness-delta", key="stale_delta")
    table = stalecost.phi_table(study)
    ui.table(table)
    ui.table_download(table, f"{trace.name}-stale-cost", key="stale_table")


show_study()
show_drill()
