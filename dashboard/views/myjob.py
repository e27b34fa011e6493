"""View: my job: describe the job, get the verdict, the frontier and the bill (python -m sim's)."""
import streamlit as st

from dashboard import answerstore, catalog, jobsummary, myjob, ui
from sim import SimError
from sim.presets import PRESET_NAMES
from sim.units import parse_duration

ui.page("My job", "Describe your training job in the sidebar; the simulator says which checkpointing strategy, "
        "at which setting, keeps most of the wall clock for useful training, by how much, what "
        "it writes and what the run costs: `python -m sim`'s fair comparison, the same numbers.")
cli = myjob.cli_defaults()
DEFAULTS = {"job_model": "preset", "job_preset": myjob.Job().preset,
            "job_params": 7.6, "job_step_s": 6.0, "job_gpus": 0, "job_write": 0.0, "job_read": 0.0,
            "job_failures": myjob.FAILURES[0], "job_mtbf_h": 0.5, "job_gpu_mtbf_h": 50_000.0,
            "job_nodes": 1024, "job_system": 18, "job_max_tb": 0.0, "job_max_host": 0.0,
            "job_max_share": 0.0, "job_gpu_hour": 0.0, "job_seeds": cli.seeds,
            "job_window_d": parse_duration(cli.window, what="--window") / 86400, "job_bands": False}
KEYS = ui.settings(DEFAULTS)
ui.restore(["job_trace"])           # its default, the first valid trace, is set by the form


def _form() -> None:
    """The sidebar's description of the job. Drawn after the answer: its widgets take
    their values from the session state set above, and the traces folder's scan (every
    trace read and checked, 0.3-1 s) then delays no chart."""
    traces = [e.name for e in ui.entries() if e.valid]
    st.session_state.setdefault("job_trace", traces[0] if traces else None)

    with st.sidebar.form("job"):
        st.subheader("The job")
        st.radio("The model", myjob.MODELS, key="job_model", horizontal=True,
                 format_func={"preset": "a preset", "trace": "a trace", "size": "its size"}.get)
        st.selectbox("Preset", PRESET_NAMES, key="job_preset", help="Published models, with the "
                     "paper's A100/Lustre server as cost model.")
        st.selectbox("Trace", traces, key="job_trace", help="A trace's layers, steps and its "
                     "costs.json (its machine) where it has one.")
        c1, c2 = st.columns(2)
        c1.number_input("Parameters (billions)", min_value=0.001, key="job_params", format="%g",
                        help="Checkpoint: 14 bytes a parameter (bf16 weights, fp32 master, Adam).")
        c2.number_input("Step time (s)", min_value=0.001, key="job_step_s", format="%g")
        st.caption("Size and step time describe a job without a trace: LayerCheck needs one, so "
                   "it is not compared then.")
        st.number_input("GPUs (0: the price list's 8)", min_value=0, step=1, key="job_gpus")
        c1, c2 = st.columns(2)
        c1.number_input("Write GB/s", min_value=0.0, key="job_write", format="%g",
                        help="Storage write bandwidth (0: the cost model's).")
        c2.number_input("Read GB/s", min_value=0.0, key="job_read", format="%g",
                        help="Storage read bandwidth during recovery (0: the cost model's).")
        st.subheader("Its failures")
        st.radio("Given as", myjob.FAILURES, key="job_failures")
        c1, c2 = st.columns(2)
        c1.number_input("Job MTBF (h)", min_value=0.001, key="job_mtbf_h", format="%g")
        c2.number_input("One GPU's MTBF (h)", min_value=1.0, key="job_gpu_mtbf_h", format="%g")
        c1.number_input("Nodes (record)", min_value=1, step=1, key="job_nodes",
                        help="The job's nodes, each replaying a node of LANL's record.")
        c2.number_input("LANL system", min_value=1, step=1, key="job_system")
        st.subheader("Budgets and prices")
        c1, c2 = st.columns(2)
        c1.number_input("Durable TB a job", min_value=0.0, key="job_max_tb", format="%g",
                        help="0: no budget.")
        c2.number_input("Host memory GB", min_value=0.0, key="job_max_host", format="%g",
                        help="0: no budget.")
        c1.number_input("Write share", min_value=0.0, max_value=1.0, key="job_max_share", format="%g",
                        help="Share of the storage's write bandwidth (0: no budget).")
        c2.number_input("GPU-hour ($)", min_value=0.0, key="job_gpu_hour", format="%g",
                        help="0: the price list's.")
        c1.number_input("Seeds", min_value=1, step=1, key="job_seeds", help="Failure sequences.")
        c2.number_input("Window (days)", min_value=0.1, key="job_window_d", format="%g")
        st.toggle("Check every cost figure's band (slower)", key="job_bands")
        st.form_submit_button("Get the verdict", type="primary")
    ui.keep([*KEYS, "job_trace"])


@st.cache_resource(show_spinner="Searching every strategy's settings on the same failures...",
                   max_entries=8)
def _summary(argv: tuple, bands: bool, stamp: float) -> jobsummary.Summary:
    # kept on disk too: a server started later shows a job answered before at once
    return answerstore.cached(myjob.store_key(list(argv), bands=bands, stamp=stamp),
                              lambda: jobsummary.summarise(myjob.answer(list(argv), bands=bands)),
                              encode=jobsummary.Summary.payload, decode=jobsummary.Summary.of_payload)


def _job() -> myjob.Job:
    """The job the session state describes (stops the page with the fix when it is wrong)."""
    s = st.session_state
    try:
        return myjob.Job(
            model=s.job_model, preset=s.job_preset,
            trace=str(catalog.traces_dir() / s.job_trace)
            if s.job_model == "trace" and s.get("job_trace") else None,
            params_billion=s.job_params, step_s=s.job_step_s, gpus=int(s.job_gpus) or None,
            write_gbps=s.job_write or None, read_gbps=s.job_read or None, failures=s.job_failures,
            mtbf_h=s.job_mtbf_h, gpu_mtbf_h=s.job_gpu_mtbf_h, nodes=int(s.job_nodes),
            system=int(s.job_system), max_tb=s.job_max_tb or None, max_host_gb=s.job_max_host or None,
            max_write_share=s.job_max_share or None, gpu_hour_usd=s.job_gpu_hour or None,
            seeds=None if s.job_seeds == cli.seeds else int(s.job_seeds),
            window_d=None if s.job_window_d == DEFAULTS["job_window_d"] else float(s.job_window_d))
    except SimError as exc:
        st.error(str(exc))
        st.stop()


def _answer(job: myjob.Job, bands: bool) -> jobsummary.Summary:
    """What the page shows for ``job`` (stops the page with the simulator's message)."""
    try:
        stamp = ui.folder_stamp(job.trace) if job.trace else 0.0
        return _summary(tuple(job.argv()), bands, stamp)
    except SimError as exc:
        st.error(f"The simulator cannot run this job: {exc}")
        st.stop()


def _show(shown: jobsummary.Summary) -> None:
    runner = f"{shown.runner_up} ({shown.runner_setting})" if shown.runner_up else None
    st.success(f"Use **{shown.winner}** at **{shown.setting}**: it keeps {shown.ratio:.1%} of "
               "the wall clock for useful training" + (f", {shown.margin * 100:.1f} points more than "
                                                        f"{runner}" if runner else "")
               + f"; the run costs ${shown.cost(shown.winner):,.0f}.")
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Use", shown.winner)
    c2.metric("Keeps of the wall clock", f"{shown.ratio:.1%}", "for useful training",
              delta_color="off")
    c3.metric("Margin", f"{shown.margin * 100:+.1f} points",
              f"over {shown.runner_up}" if shown.runner_up else "alone", delta_color="off")
    saved = shown.cost(shown.winner) - shown.cost(shown.runner_up) if shown.runner_up else None
    c4.metric("The run costs", f"${shown.cost(shown.winner):,.0f}",
              None if saved is None else f"{'-' if saved < 0 else '+'}${abs(saved):,.0f} against "
              f"{shown.runner_up}", delta_color="inverse")
    with st.expander("The verdict in full (what can flip it)"):
        st.text(shown.text)
    ui.table(shown.settings)

    st.subheader("Ratio against durable bytes")
    ui.figure(shown.figure, "my-job-frontier", key="job_front")
    st.caption("The best strategy under each budget of durable bytes a job "
               "(`python -m sim frontier` prints the same):")
    ui.table(shown.budgets)

    st.subheader("In hours and dollars")
    st.caption(f"{shown.gpus:,} GPUs at ${shown.gpu_hour_usd:g} a GPU-hour; storage and writes at "
               "the price list's rates (docs/sim-fair.md, Hours and dollars).")
    ui.table(shown.bill)


try:
    job = _job()
    st.caption("The same on the command line:")
    st.code(job.command() + ("" if st.session_state.job_bands else " --no-bands"), language="bash")
    _show(_answer(job, bool(st.session_state.job_bands)))
finally:                            # the form is drawn whatever the answer, a stop included
    _form()
