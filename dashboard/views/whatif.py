"""View 2: what-if tuning of threshold, Smax, warm-up and interval."""
import time

import streamlit as st

from dashboard import ui, whatif
from dashboard.downloads import human_bytes
from layercheck.config import ConfigError

THRESHOLDS = [0.0, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1,
              float("inf")]

ui.page("What-if tuning", "Re-decide the trace's run under other settings: the same policy as "
        "the library (a vectorised replay proven equal to layercheck.policy.replay).")
trace = ui.current_trace()
recorded = whatif.Settings.from_trace(trace)
nearest = lambda v: min(THRESHOLDS, key=lambda k: abs(k - v) if k != v else -1)  # noqa: E731
with st.sidebar:
    st.subheader("Policy")
    base = st.select_slider("Base threshold K", THRESHOLDS, value=nearest(recorded.base_threshold),
                            format_func=lambda k: f"{k:g}", key="k_base",
                            help="0 writes at every opportunity, inf only when Smax forces.")
    emb = st.select_slider("Embedding threshold", THRESHOLDS,
                           value=nearest(recorded.embedding_threshold),
                           format_func=lambda k: f"{k:g}", key="k_emb")
    smax = st.slider("Smax (steps)", 1, max(trace.num_steps, recorded.smax), recorded.smax, key="smax")
    warmup = st.slider("Warm-up (steps)", 0, max(trace.num_steps, recorded.warmup_steps),
                       recorded.warmup_steps, key="warmup")
    interval = st.slider("Checkpoint interval (steps)", 1, 100, recorded.interval, key="interval")
    lr_scaling = st.toggle("Scale K by lr / lr_peak", value=recorded.lr_scaling, key="lr_scaling")
try:
    settings = whatif.Settings(base_threshold=base, embedding_threshold=emb, smax=smax,
                               warmup_steps=warmup, interval=interval, lr_scaling=lr_scaling)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()
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
ui.figure(whatif.io_figure(trace, replayed, settings), f"{trace.name}-io", key="io")
ui.figure(whatif.staleness_figure(trace, replayed), f"{trace.name}-staleness", key="staleness")
ui.figure(whatif.writes_figure(trace, replayed), f"{trace.name}-writes", key="writes")
ui.table_download(whatif.summary_frame(result), f"{trace.name}-whatif-summary", key="summary",
                  label="Download summary (CSV)")
ui.table_download(lambda: whatif.written_trace_frame(trace, replayed), f"{trace.name}-whatif-writes",
                  key="writes", label="Download every write (CSV)")
