"""layercheck.contract.trace: schema versions (old traces still read), k_scale, the one staleness."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from layercheck.contract.trace import (ADDED_COLUMNS, SCHEMA_VERSION, Trace, TraceError, last_written,
                              read_trace, weighted_staleness, write_trace)

ROOT = Path(__file__).resolve().parents[3]


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
    (dict(state_bytes=[1, 2, -3]), r"layers table, column state_bytes, row 2: -3 is negative"),
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


# --- issue 27, item 12: every column's type and range is checked on read ---------------------
SHIPPED = sorted(p for p in (ROOT / "traces").iterdir() if (p / "manifest.json").exists())


def _tampered(tmp_path, table: str, column: str, row: int, value, *, kind: str = "captured"):
    """A valid trace on disk with one cell of ``table`` (a Parquet table, or the manifest's
    ``layers``) set to ``value``, read back with ``read_trace``."""
    trace = small_trace()
    trace.manifest["kind"] = kind
    path = write_trace(trace, tmp_path / "t")
    if table == "layers":
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["layers"][row][column] = value
        (path / "manifest.json").write_text(json.dumps(manifest))
    else:
        frame = pd.read_parquet(path / f"{table}.parquet")
        values = frame[column].astype(str if isinstance(value, str) else np.float64).to_list()
        values[row] = value
        frame[column] = values
        frame.to_parquet(path / f"{table}.parquet")
    return read_trace(path)


@pytest.mark.parametrize("table,column,row,value,words", [
    ("drift", "drift", 4, -1e-4, "negative"),
    ("drift", "accumulator", 0, float("nan"), "not a finite number"),
    ("steps", "lr", 2, -1e-3, "negative"),
    ("steps", "forward_s", 1, float("inf"), "not a finite number"),
    ("steps", "stall_s", 3, -0.5, "negative"),
    ("steps", "step", 2, 2.5, "not an integer"),
    ("writes", "persist_s", 1, float("nan"), "not a finite number"),
    ("writes", "persist_s", 2, -1.0, "negative"),
    ("writes", "stall_s", 0, -0.25, "negative"),
    ("writes", "step", 3, 4.5, "not an integer"),
    ("writes", "bytes", 0, "many", "not an integer"),     # a column of strings
    ("writes", "bytes", 2, 1e30, "more than"),
    ("layers", "params", 1, float("nan"), "not an integer"),
    ("layers", "params", 0, -5, "negative"),
    ("layers", "bytes", 2, 10 ** 30, "more than"),
    ("layers", "name", 1, 7, "not a string"),
])
def test_a_bad_cell_names_the_table_column_and_row(tmp_path, table, column, row, value, words):
    with pytest.raises(TraceError) as info:
        _tampered(tmp_path, table, column, row, value)
    message = str(info.value)
    assert f"{table} table, column {column}, row {row}" in message and words in message, message
    assert "\n" not in message


def test_a_synthetic_trace_may_leave_measured_columns_unmeasured(tmp_path):
    trace = _tampered(tmp_path, "writes", "persist_s", 1, float("nan"), kind="synthetic")
    assert np.isnan(trace.writes["persist_s"][1])   # what the preset traces hold: no measurement
    with pytest.raises(TraceError, match="column persist_s, row 1"):
        _tampered(tmp_path / "b", "writes", "persist_s", 1, -1.0, kind="synthetic")


@pytest.mark.parametrize("keep", [0, 17])
def test_the_drift_table_has_one_row_per_step_and_layer(tmp_path, keep):
    path = write_trace(small_trace(), tmp_path / "t")           # 6 steps x 3 layers
    drift = pd.read_parquet(path / "drift.parquet")
    drift.iloc[:keep].to_parquet(path / "drift.parquet")
    with pytest.raises(TraceError, match=rf"drift table: {keep} rows; it needs one per \(step, "
                                         r"layer\): 6 steps x 3 layers = 18"):
        read_trace(path)


def test_a_duplicated_drift_row_is_named(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t")
    drift = pd.read_parquet(path / "drift.parquet")
    drift.loc[5, ["step", "layer"]] = [1, 0]                    # a second (1, 0), no (2, 2)
    drift.to_parquet(path / "drift.parquet")
    with pytest.raises(TraceError, match=r"drift table, row 5: step 1, layer 0 appears twice"):
        read_trace(path)


def test_the_layers_together_stay_countable(tmp_path):
    trace = small_trace()
    for layer in trace.manifest["layers"]:
        layer["bytes"] = 2 ** 52
    with pytest.raises(TraceError, match="layers table: the layers' bytes add up to"):
        write_trace(trace, tmp_path / "t")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_trace_reads(path):
    trace = read_trace(path)
    assert trace.num_steps > 0 and len(trace.drift) == trace.num_steps * len(trace.layer_names)


@pytest.mark.parametrize("value", [-2.5, float("inf"), float("nan")])
def test_any_loss_reads(tmp_path, value):
    """A loss is any number (a diverged run's is infinite or NaN); nothing computes from it."""
    trace = _tampered(tmp_path, "steps", "loss", 1, value)
    assert trace.steps["loss"][1] == value or np.isnan(value)


def test_the_public_name_is_the_contracts_trace():
    """``layercheck.contract.trace`` (the name the package doc gives users) is the contract's trace."""
    import layercheck.contract.trace as contract
    import layercheck.contract.trace as public
    assert public.__all__ == contract.__all__
    assert all(getattr(public, name) is getattr(contract, name) for name in contract.__all__)
