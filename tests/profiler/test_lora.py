"""``python -m profiler capture --lora R``: a capture of adapter fine-tuning (issue 29).

A tiny run (the tiny Qwen2, 8 steps, one thread) through the command line; the
trace must say it is a LoRA run, train only the adapters, and show the layer
versions after the base carrying only them, so the simulator and the dashboard
replay adapter fine-tuning. Needs the ``lora`` extra (peft).
"""
from __future__ import annotations

import json

import pytest

from layercheck.contract.trace import read_trace
from profiler.cli import main
from profiler.config import CaptureConfig, ZeroConfig
from profiler.errors import ProfilerError

pytest.importorskip("peft")

JOB = ["--model", "tiny", "--steps", "8", "--batch-size", "2", "--seq-len", "16",
       "--warmup-steps", "2", "--smax", "4", "--threshold", "0", "--threads", "1", "--quiet",
       "--no-calibrate"]


def test_capture_with_lora_records_an_adapter_run(tmp_path, capsys):
    out = tmp_path / "trace"
    assert main(["capture", *JOB, "--lora", "4", "--out", str(out)]) == 0
    capsys.readouterr()
    trace = read_trace(out)
    model = trace.manifest["model"]
    assert model["lora"]["r"] == 4 and model["lora"]["alpha"] == 8
    assert set(model["lora"]["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert 0 < model["lora"]["trainable_parameters"] < model["parameters"] / 10
    assert "LoRA adapters (r=4" in trace.manifest["description"]
    assert json.loads(json.dumps(trace.manifest["sources"]["capture"]))["lora"] == 4
    writes = trace.writes
    block = next(i for i, name in enumerate(trace.layer_names) if name.endswith("layers.0"))
    blocks = writes[writes["layer"] == block]
    base = int(blocks.loc[blocks["reason"] == "base", "bytes"].iloc[0])
    later = blocks.loc[blocks["step"] > 2, "bytes"]
    assert len(later) > 0 and (later < base / 5).all()  # the adapter and its Adam state only
    assert (trace.drift_matrix()[2:, block] > 0).all()  # the adapter layer drifts
    # what the simulator charges a write of the layer: a version after the base
    layer = trace.manifest["layers"][block]
    assert layer["bytes"] == int(later.max()) and layer["base_bytes"] == base
    assert layer["state_bytes"] < base / 5  # and a write budget too


def test_lora_must_be_a_positive_rank_and_a_plain_capture():
    with pytest.raises(ProfilerError, match="lora"):
        CaptureConfig(lora=0)
    with pytest.raises(ProfilerError, match="--lora"):
        ZeroConfig(capture=CaptureConfig(lora=4))
