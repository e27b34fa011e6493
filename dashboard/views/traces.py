"""View 5: the shipped traces, uploading one, and downloads of the current trace's tables."""
import pandas as pd
import streamlit as st

from dashboard import catalog, ui
from dashboard.downloads import human_bytes
from layercheck.contract.trace import TraceError

ui.page("Traces", "Shipped traces (captured by the profiler, or synthetic presets from the "
        "paper's figures) and your own: upload a .zip of a trace folder, or its files.")
listing = ui.entries()
st.write(f"Traces folder: `{catalog.traces_dir()}` (set ${catalog.ENV} to use another).")
if listing:
    ui.table(pd.DataFrame([{"name": e.name, "kind": e.kind, "model": e.model, "steps": e.steps,
                            "layers": e.layers, "recovery drill": e.has_drill,
                            "problem": e.error or ""} for e in listing]))
    for bad in (e for e in listing if not e.valid):
        st.warning(f"{bad.name} is not usable: {bad.error}")

uploaded = st.file_uploader("Upload a trace", type=["zip", "json", "parquet"],
                            accept_multiple_files=True, key="upload")
if uploaded:
    try:
        folder = catalog.unpack_upload([(f.name, f.getvalue()) for f in uploaded])
        trace = catalog.load(folder)
    except TraceError as exc:
        st.error(f"This upload is not a valid trace. {exc}")
    else:
        ui.remember_upload(folder, trace.name)
        st.success(f"Loaded {trace.name}: {trace.num_steps:,} steps, {len(trace.layer_names)} "
                   "layers. It is now selected in the sidebar on every page.")

trace = ui.current_trace()
st.subheader(f"{trace.name}")
st.write(trace.manifest.get("description") or "")
c1, c2, c3, c4 = st.columns(4)
c1.metric("Steps", f"{trace.num_steps:,}")
c2.metric("Layers", len(trace.layer_names))
c3.metric("Full checkpoint", human_bytes(trace.full_checkpoint_bytes))
c4.metric("Layer writes recorded", f"{len(trace.writes):,}")
ui.table(trace.layers)
table = st.selectbox("Table to download", ["layers", "steps", "writes", "drift", "recovery"],
                     key="table_pick")
frame = trace.layers if table == "layers" else getattr(trace, table)
if frame is None:
    st.info(f"This trace has no {table} table.")
else:
    ui.table_download(frame, f"{trace.name}-{table}", key="trace-table",
                      label=f"Download {table} ({len(frame):,} rows, CSV)")
with st.expander("Manifest"):
    st.json(trace.manifest, expanded=False)
