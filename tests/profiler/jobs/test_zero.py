"""The ZeRO-3 capture, for real: two ranks under torchrun (gloo, CPU), ZeroLayerCheck on each.

The module's capture runs the tiny model with the settings of the plain
``tiny_capture`` fixture, typed as a user would under torchrun. The tiny
model has no dropout, so the two runs compute the same numbers up to float
rounding: the ZeRO capture must train the plain capture's job, step by step.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("deepspeed")

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.contract.trace import TABLES, read_trace  # noqa: E402
from profiler.cli import main  # noqa: E402
from tests.profiler.conftest import (TINY, assert_trains_the_plain_job,  # noqa: E402
                                     run_command as _run, torchrun_capture)


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
    """``torchrun --nproc_per_node 2 -m profiler capture --deepspeed zero3 ...``, typed by hand
    (no DS_ACCELERATOR, no OMP_NUM_THREADS: the profiler must cope)."""
    return torchrun_capture(tmp_path_factory.mktemp("zero") / "tiny-zero3", "--deepspeed", "zero3")


@pytest.mark.slow
def test_zero3_capture_trains_the_plain_capture_job(zero, tiny_capture):
    """Same weights, batches, optimizer and schedule: the batch split over two ranks,
    DeepSpeed's gradient averaging and ZeRO-3 partitioning change only float rounding."""
    assert_trains_the_plain_job(zero.trace, tiny_capture.trace)


@pytest.mark.slow
def test_zero3_trace_records_the_setup(zero):
    m = zero.trace.manifest
    assert m["kind"] == "captured" and m["name"] == "tiny-zero3"
    assert "DeepSpeed ZeRO-3 capture on 2 ranks" in m["description"]
    ds = m["sources"]["deepspeed"]
    assert (ds["stage"], ds["ranks"], ds["backend"], ds["micro_batch_per_rank"]) == (3, 2, "gloo", 2)
    assert ds["ds_config"]["zero_optimization"]["stage"] == 3
    assert ds["ds_config"]["gradient_clipping"] == 0.0
    assert ds["launched_by"] == "torchrun" and len(ds["median_step_s_per_rank"]) == 2
    assert m["sources"]["command"].startswith("torchrun --nproc_per_node 2 -m profiler capture")
    assert m["machine"]["ranks"] == 2 and m["machine"]["threads_per_rank"] == 1
    assert m["machine"]["write_bytes_per_s"] > 0
    assert m["model"]["architecture"] == "Qwen2ForCausalLM"
    assert LayerCheckConfig.from_dict(m["config"]).warmup_steps == TINY["warmup_steps"]
    for name in TABLES:
        assert list(getattr(zero.trace, name).columns) == list(TABLES[name])
    for col in ("forward_s", "backward_s", "optimizer_s", "drift_s"):
        assert (zero.trace.steps[col] > 0).all(), col


@pytest.mark.slow
def test_zero3_write_bytes_are_every_ranks_shards(zero, tiny_capture):
    """A version's bytes are both ranks' shards: fp32 master + two Adam moments of
    the whole layer (one rank's shard alone would be about half)."""
    plain = {l["name"]: l["bytes"] for l in tiny_capture.trace.manifest["layers"]}
    for layer in zero.trace.manifest["layers"]:
        assert layer["bytes"] >= 12 * layer["params"]
        # the same tensors, cut in two and padded, plus a second safetensors header
        assert abs(layer["bytes"] - plain[layer["name"]]) <= 0.02 * plain[layer["name"]] + 1024
    w = zero.trace.writes
    assert (w.groupby("layer")["bytes"].max().to_numpy() == zero.trace.layer_bytes).all()
    assert sorted(w.loc[w["reason"] == "base", "layer"]) == list(range(len(zero.trace.layer_names)))
    assert (w["persist_s"] > 0).all()


@pytest.mark.slow
def test_zero3_restore_was_measured_on_every_rank(zero):
    rec = zero.trace.recovery
    assert rec is not None and len(rec) == 1 and rec["step"].iloc[0] == TINY["steps"]
    assert rec["bytes"].iloc[0] == zero.trace.full_checkpoint_bytes  # both ranks' shards
    assert (rec[["load_s", "restore_s"]] > 0).all(axis=None)


@pytest.mark.slow
def test_zero3_policy_replay_gives_the_recorded_writes(zero):
    from layercheck.contract.policy import Policy, replay
    policy = Policy.from_config(LayerCheckConfig.from_dict(zero.trace.manifest["config"]),
                                zero.trace.layer_names, zero.trace.layers["kind"].tolist())
    decided = np.zeros_like(zero.trace.write_matrix())
    for d in replay(policy, zero.trace.drift_matrix(), zero.trace.lr_ratio()):
        decided[d.step - 1, d.layers] = True
    assert np.array_equal(decided, zero.trace.write_matrix())


@pytest.mark.slow
def test_a_drill_refuses_a_zero3_trace(zero, capsys):
    assert main(["drill", "--from", str(zero.path)]) == 2
    assert "a DeepSpeed capture" in capsys.readouterr().err


@pytest.mark.slow
def test_python_m_profiler_starts_torchrun_itself(tmp_path):
    out = tmp_path / "self-launched"
    done = _run([sys.executable, "-m", "profiler", "capture", "--deepspeed", "zero3",
                 "--model", "tiny", "--steps", "3", "--warmup-steps", "1", "--batch-size", "2",
                 "--seq-len", "16", "--quiet", "--repeats", "1", "--out", str(out)])
    assert "starting 2 ranks: torchrun --nproc_per_node 2 -m profiler capture" in done.stderr
    trace = read_trace(out)
    ds = trace.manifest["sources"]["deepspeed"]
    assert ds["launched_by"] == "python -m profiler (started torchrun)"
    assert trace.manifest["sources"]["command"].startswith("python -m profiler capture --deepspeed")
    assert trace.manifest["machine"]["threads_per_rank"] == max(1, (os.cpu_count() or 1) // 2)
    assert trace.num_steps == 3 and len(trace.writes) >= len(trace.layer_names)
    # calibrated by default: DeepSpeed's save and LayerCheck under the ZeRO-3 engine on both
    # ranks, the rest single-process on rank 0, and the methods say which
    from sim.calibrated import read_calibration
    costs = read_calibration(out)
    assert "under the capture's ZeRO-3 engine on 2 ranks" in costs.figures["save_gbps"].method
    assert "ZeroLayerCheck on 2 ranks" in costs.figures["lc_write_gbps"].method
    assert "single process on rank 0" in costs.figures["snapshot_gbps"].method
    assert "torchrun of 2 ranks" in costs.figures["restart_s"].method
    assert costs.figures["lc_load_gbps"].bytes == trace.full_checkpoint_bytes


@pytest.mark.parametrize("args, words", [
    (["capture", "--deepspeed", "zero2"], "--deepspeed zero2: use zero3"),
    (["capture", "--deepspeed", "zero3", "--batch-size", "3"], "does not split evenly over 2 ranks"),
    (["capture", "--deepspeed", "zero3", "--ranks", "0"], "ranks=0"),
    (["capture", "--deepspeed", "zero3", "--device", "cuda"], "ZeRO captures run on the CPU"),
    (["capture", "--deepspeed", "zero3", "--model", "gpt5"], "unknown model"),
    (["capture", "--ranks", "2"], "add --deepspeed zero3"),
])
def test_bad_zero_input_is_one_line_and_exit_2_before_any_rank_starts(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "starting" not in err
