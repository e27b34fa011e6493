"""A short real capture on the tiny model: the trace is complete, consistent and reads back."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from layercheck import LayerCheckConfig
from layercheck.contract.trace import SCHEMA_VERSION, TABLES, read_trace, write_trace
from tests.profiler.conftest import BUDGET_STEPS, TINY


def test_trace_round_trips_through_read_trace(tiny_capture, tmp_path):
    trace = read_trace(tiny_capture.path)
    for name in TABLES:
        frame = getattr(trace, name)
        assert list(frame.columns) == list(TABLES[name])
        pd.testing.assert_frame_equal(frame, getattr(tiny_capture.trace, name), check_dtype=False)
    assert trace.manifest == read_trace(write_trace(trace, tmp_path / "copy")).manifest


def test_manifest_describes_model_config_and_machine(tiny_capture):
    m = tiny_capture.trace.manifest
    assert m["schema_version"] == SCHEMA_VERSION and m["kind"] == "captured"
    assert [l["name"] for l in m["layers"]] == (
        ["model.embed_tokens", *[f"model.layers.{i}" for i in range(4)], "model.norm", "lm_head"])
    lc = LayerCheckConfig.from_dict(m["config"])
    assert (lc.warmup_steps, lc.smax, lc.base_threshold) == (3, 8, 1e-3)
    assert m["lr_peak"] == pytest.approx(1e-3)
    machine = m["machine"]
    assert machine["device"] == "cpu" and machine["torch"].startswith("2.")
    assert machine["write_bytes_per_s"] > 0 and machine["read_bytes_per_s"] > 0
    assert m["sources"]["capture"]["threads"] == 1
    assert m["sources"]["data"]["chars"] > 500_000
    assert np.isfinite(m["evaluation"]["value"])
    contention = machine["contention"]  # what else used the machine, step by step
    assert contention["checked"] and contention["laps"] == TINY["steps"]
    assert 0 <= contention["other_cores_mean"] <= contention["other_cores_max"]


def test_a_capture_that_shared_the_machine_warns(tmp_path):
    # a process spinning a core next to the capture: its steps are not the job's alone
    import subprocess
    import sys
    from profiler.capture import capture
    from profiler.config import CaptureConfig
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    said: list[str] = []
    try:
        capture(CaptureConfig(**TINY), out=tmp_path / "shared", progress=False,
                say=said.append, calibrate=False)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    record = read_trace(tmp_path / "shared").manifest["machine"]["contention"]
    assert record["other_cores_mean"] >= 0.5, record
    assert [line for line in said if line.startswith("warning: capture of ")
            and "measure again on a quiet machine" in line], said


def test_steps_are_real_measurements(tiny_capture):
    s = tiny_capture.trace.steps
    assert s["step"].tolist() == list(range(1, TINY["steps"] + 1))
    for col in ("forward_s", "backward_s", "optimizer_s", "drift_s"):
        assert (s[col] > 0).all(), col
    assert s["loss"].iloc[0] == pytest.approx(np.log(256), rel=0.1)  # untrained bytes model
    assert s["loss"].tail(3).mean() < s["loss"].iloc[0] - 0.5  # and it learns
    lr = s["lr"].to_numpy()
    assert lr.max() == pytest.approx(1e-3) and lr[-1] < lr.max() / 2  # warm-up, then decay


def test_writes_follow_the_policy_and_the_base(tiny_capture):
    trace = tiny_capture.trace
    w, layers = trace.writes, trace.manifest["layers"]
    base = w[w["reason"] == "base"]
    assert sorted(base["layer"]) == list(range(len(layers))) and (base["step"] == 3).all()
    assert (w["step"] >= 3).all() and set(w["reason"]) <= {"base", "threshold", "smax"}
    for i, layer in enumerate(layers):  # weights + two Adam moments (+ header, step)
        assert layer["bytes"] >= 3 * 4 * layer["params"]
        assert (w.loc[w["layer"] == i, "bytes"] <= layer["bytes"]).all()
    stall = w.groupby("step")["stall_s"].sum()
    steps = trace.steps.set_index("step")["stall_s"]
    np.testing.assert_allclose(stall.to_numpy(), steps.loc[stall.index].to_numpy())
    assert (w["persist_s"] > 0).all()


def test_accumulator_is_drift_added_before_the_reset(tiny_capture):
    trace = tiny_capture.trace
    drift, acc, written = trace.drift_matrix(), trace.accumulator_matrix(), trace.write_matrix()
    expected = np.zeros_like(acc)
    running = np.zeros(acc.shape[1])
    for t in range(acc.shape[0]):
        running = running + drift[t]
        expected[t] = running
        running = np.where(written[t], 0.0, running)
    np.testing.assert_allclose(acc, expected, rtol=1e-12)
    assert (drift > 0).all()


def test_a_real_restore_was_measured(tiny_capture):
    rec = tiny_capture.trace.recovery
    assert rec is not None and len(rec) == 1
    assert rec["step"].iloc[0] == TINY["steps"]
    assert rec["bytes"].iloc[0] == tiny_capture.trace.full_checkpoint_bytes
    assert (rec[["load_s", "restore_s"]] > 0).all(axis=None)


def test_summary_figures(tiny_capture):
    s = tiny_capture.summary
    assert s["layer_writes"] == len(tiny_capture.trace.writes)
    assert 0 < s["bytes_vs_full_every_step"] <= 1
    assert s["base_step"] == 3 and s["drift_share"] > 0


def test_cuda_request_falls_back_to_cpu_with_a_message():
    import torch

    from profiler.machine import resolve_device
    if torch.cuda.is_available():
        assert resolve_device("cuda") == ("cuda", None)
    else:
        device, note = resolve_device("cuda")
        assert device == "cpu" and "sees no CUDA GPU; running on cpu" in note
    assert resolve_device("cpu") == ("cpu", None)


def test_replaying_the_policy_over_the_trace_gives_the_recorded_writes(tiny_capture):
    """drift, lr and lr_peak in the trace are what the live policy saw: the
    torch-free replay decides exactly the writes that were committed."""
    from layercheck.contract.policy import Policy, replay
    trace = tiny_capture.trace
    policy = Policy.from_config(LayerCheckConfig.from_dict(trace.manifest["config"]),
                                trace.layer_names, trace.layers["kind"].tolist())
    decided = np.zeros_like(trace.write_matrix())
    for d in replay(policy, trace.drift_matrix(), trace.lr_ratio()):
        decided[d.step - 1, d.layers] = True
    assert np.array_equal(decided, trace.write_matrix())


def test_a_write_budget_run_records_its_thresholds_and_replays_exactly(budget_capture):
    """Budget mode on a real run: the trace records the factor the controller put on
    K at every step and the sizes it charged; the torch-free replay, given the
    drift, takes the same decisions and the same factors; the realised rate is
    the budget's."""
    from layercheck.contract.fastreplay import fast_replay
    from layercheck.contract.policy import Policy, replay
    trace, steps = budget_capture.trace, BUDGET_STEPS
    lc = budget_capture.config
    assert LayerCheckConfig.from_dict(trace.manifest["config"]).write_budget == lc.write_budget
    sizes = trace.budget_sizes
    assert all("state_bytes" in layer for layer in trace.manifest["layers"])
    assert (sizes <= trace.layer_bytes).all()                  # tensors, without the file header
    policy = Policy.from_config(lc, trace.layer_names, trace.layers["kind"].tolist(), sizes=sizes)
    decided = np.zeros_like(trace.write_matrix())
    for d in replay(policy, trace.drift_matrix(), trace.lr_ratio()):
        decided[d.step - 1, d.layers] = True
        assert d.k_scale == trace.k_scale()[d.step - 1]
    assert np.array_equal(decided, trace.write_matrix())
    twin = fast_replay(policy, trace.drift_matrix(), trace.lr_ratio())
    assert np.array_equal(twin.writes, decided) and np.array_equal(twin.k_scales(), trace.k_scale())
    assert len(set(trace.k_scale())) > 2                       # the controller did act
    charged = trace.write_matrix()[4:] @ sizes                  # steps after the base (step 3)
    assert charged.sum() / (steps - 3) <= lc.write_budget * 1.05


def test_a_recommended_setting_writes_the_bytes_the_tuner_predicted(tmp_path, capsys):
    """Tune on a capture, run the recommendation for real with --config: checkpoint
    decisions do not change training, so the drift is the same and the run writes
    exactly the layers, and the bytes, the tuner predicted."""
    import json

    from profiler.cli import main as profiler
    from sim.cli import main as sim
    from sim.frontier import evaluate
    job = ["--model", "tiny", "--steps", "40", "--batch-size", "4", "--seq-len", "32",
           "--threads", "1", "--quiet", "--no-calibrate"]  # --costs paper-a100: no need
    assert profiler(["capture", *job, "--warmup-steps", "3", "--smax", "30",
                     "--out", str(tmp_path / "first")]) == 0
    first = read_trace(tmp_path / "first")
    budget_gb = 0.6 * first.writes["bytes"].sum() / 1e9
    capsys.readouterr()
    assert sim(["tune", "--trace", str(tmp_path / "first"), "--costs", "paper-a100", "--mtbf", "1h",
                "--max-gb", f"{budget_gb:.6f}", "--json", "--seeds", "2", "--window", "1d"]) == 0
    advice = json.loads(capsys.readouterr().out)
    config = LayerCheckConfig.from_dict(advice["config"])
    predicted = evaluate(first, [config]).written(0)
    assert config != LayerCheckConfig.from_dict(first.manifest["config"])
    assert profiler(["capture", *job, "--config", json.dumps(advice["config"]),
                     "--out", str(tmp_path / "second")]) == 0
    second = read_trace(tmp_path / "second")
    np.testing.assert_array_equal(second.drift_matrix(), first.drift_matrix())
    np.testing.assert_array_equal(second.write_matrix(), predicted)
    assert int(second.writes["bytes"].sum()) == advice["recommended"]["bytes_written"] <= budget_gb * 1e9
    assert len(second.writes) == advice["recommended"]["layer_writes"]


def test_a_fused_step_capture_records_the_drift_of_the_same_training(tiny_capture, tmp_path):
    """``--fused-step``: the drift comes from AdamW's own step (layercheck.drift.fusedstep),
    and is the drift the default tracker recorded for the same job (the two runs
    differ only in how the step rounds: one ulp of a weight, so by far less than
    1e-3 of a layer's drift over these steps)."""
    pytest.importorskip("numba")
    from profiler.capture import capture
    from profiler.config import CaptureConfig
    done = capture(CaptureConfig(**TINY, fused_step=True), out=tmp_path / "fused",
                   progress=False, say=lambda _: None, calibrate=False)
    assert done.trace.manifest["sources"]["capture"]["fused_step"] is True
    np.testing.assert_allclose(done.trace.drift_matrix()[:6], tiny_capture.trace.drift_matrix()[:6],
                               rtol=1e-3)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_capture_trains_on_the_gpu_and_records_every_phase(tmp_path):
    from tests.profiler.conftest import JOB, run_command
    import sys
    out = tmp_path / "cuda"
    run_command([sys.executable, "-m", "profiler", "capture", *JOB, "--device", "cuda",
                 "--out", str(out)])
    trace = read_trace(out)
    assert trace.manifest["machine"]["device"].startswith("cuda:")
    assert (trace.steps["drift_s"] > 0).all() and (trace.steps["optimizer_s"] > 0).all()
    assert len(trace.writes) > 0
