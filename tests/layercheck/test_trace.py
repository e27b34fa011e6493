"""layercheck.trace: schema versions (old traces still read), k_scale, the one staleness."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from layercheck.trace import (ADDED_COLUMNS, SCHEMA_VERSION, Trace, TraceError, last_written,
                              read_trace, weighted_staleness, write_trace)



def small_trace(steps: int = 6, *, k_scale=None, state_bytes=None) -> Trace:
    layers = [{"name": f"l{i}", "kind": "block", "params": 10 * (i + 1), "bytes": 140 * (i + 1)}
              for i in range(3)]
    if state_bytes is not None:
        for layer, b in zip(layers, state_bytes):
            layer["state_bytes"] = b
    t = np.arange(1, steps + 1)
    frame = {"step": t, "forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.05, "drift_s": 0.0,
             "stall_s": 0.0, "loss": 1.0, "lr": 1e-3}
    if k_scale is not None:
        frame["k_scale"] = k_scale
    drift = pd.DataFrame({"step": np.repeat(t, 3), "layer": np.tile(np.arange(3), steps),
                          "drift": 1e-4, "accumulator": 1e-4})
    writes = pd.DataFrame({"step": [2, 2, 2, 5], "layer": [0, 1, 2, 1], "bytes": [140, 280, 420, 280],
                           "reason": ["base", "base", "base", "threshold"], "stall_s": 0.0,
                           "persist_s": 0.0})
    manifest = {"schema_version": SCHEMA_VERSION, "name": "small", "kind": "captured",
                "description": "", "model": {}, "layers": layers, "config": {}, "lr_peak": 1e-3,
                "machine": {}, "sources": {}}
    return Trace(manifest=manifest, steps=pd.DataFrame(frame), drift=drift, writes=writes)


def test_a_version_1_folder_on_disk_reads_with_fixed_thresholds(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t")
    steps = pd.read_parquet(path / "steps.parquet").drop(columns="k_scale")
    steps.to_parquet(path / "steps.parquet")
    manifest = json.loads((path / "manifest.json").read_text())
    layers = [{k: v for k, v in layer.items() if k != "state_bytes"} for layer in manifest["layers"]]
    (path / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 1,
                                                    "layers": layers}))
    trace = read_trace(path)
    assert trace.manifest["schema_version"] == SCHEMA_VERSION == 2
    assert (trace.k_scale() == 1.0).all()
    np.testing.assert_array_equal(trace.budget_sizes, trace.layer_bytes)   # no state_bytes then
    (path / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 2}))
    with pytest.raises(TraceError, match=r"missing columns \['k_scale'\]"):
        read_trace(path)                                  # version 2 must have it


def test_k_scale_and_state_bytes_round_trip(tmp_path):
    trace = small_trace(k_scale=[1.0, 1.0, 1.0, 2 ** 0.125, 2 ** 0.25, 2 ** 0.125],
                        state_bytes=[120, 260, 400])
    back = read_trace(write_trace(trace, tmp_path / "t"))
    np.testing.assert_array_equal(back.k_scale(), trace.k_scale())
    np.testing.assert_array_equal(back.budget_sizes, [120, 260, 400])


def test_code_for_an_older_schema_gets_the_new_column():
    trace = small_trace()                                # no k_scale given
    assert ("steps", "k_scale") in ADDED_COLUMNS
    assert (trace.k_scale() == 1.0).all()


@pytest.mark.parametrize("change,message", [
    (dict(k_scale=[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]), "k_scale must be a positive number"),
    (dict(state_bytes=[1, 2, -3]), r"layers\[2\].state_bytes must be a positive integer"),
])
def test_bad_new_fields_say_where(tmp_path, change, message):
    with pytest.raises(TraceError, match=message):
        write_trace(small_trace(**change), tmp_path / "t")


def test_newer_version_says_upgrade(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t")
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(TraceError, match="upgrade layercheck"):
        read_trace(path)


def test_staleness_of_a_stack_is_the_stack_of_staleness():
    rng = np.random.default_rng(1)
    written = rng.random((4, 50, 5)) < 0.1
    written[:, 3] = True
    params = rng.integers(1, 100, size=5)
    stacked = weighted_staleness(written, params)
    for run in range(4):
        np.testing.assert_allclose(stacked[run], weighted_staleness(written[run], params),
                                   rtol=1e-12, equal_nan=True)
        np.testing.assert_array_equal(last_written(written)[run], last_written(written[run]))
