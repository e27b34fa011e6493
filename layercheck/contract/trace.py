"""The trace format shared by profiler (writes), sim and dashboard (read).

Importable without torch (numpy, pandas, pyarrow only).

A trace is a folder::

    traces/<name>/
        manifest.json      schema_version, name, kind, description, model, layers,
                           config, lr_peak, machine, sources
        steps.parquet      one row per optimizer step 1..T (k_scale: the write
                           budget's factor on every threshold at that step)
        drift.parquet      one row per (step, layer): d_l(t) and the accumulator A_l after it
        writes.parquet     one row per layer write: step, layer, bytes, reason, stall, persist
        recovery.parquet   optional: one row per measured recovery
        drill.json         optional: a recovery-fidelity drill (profiler drill)
        staleness.json     optional: what a stale layer costs, measured (profiler staleness)
        costs.json         optional: what each checkpointing mechanism costs on the
                           capturing machine (``layercheck.contract.calibration``)

``layer`` columns are indices into ``manifest["layers"]``. Times are seconds,
sizes bytes. ``read_trace`` validates everything and raises ``TraceError``
with a message that says what is wrong and where: every column's type and range
(``layercheck.contract.traceschema``: one schema per table, the manifest's layer table
included), steps 1..T, layer and step indices in range, and one drift row per
(step, layer).

Versions: 1 (the first); 2 adds ``steps.k_scale`` (``ADDED_COLUMNS``) and the
optional per-layer ``state_bytes``. Older traces are read and upgraded in
memory (a column a version added gets the value it had before: ``k_scale`` 1,
fixed thresholds); a trace newer than this code is an error that says to
upgrade.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .calibration import COSTS_FILE, Calibration, CalibrationError, read_calibration, write_calibration
from .policy import lr_ratio
from .traceschema import LAYER_SCHEMA, TABLES, WRITE_REASONS, TraceError, check_layers, check_table
from .userfile import RefusedFile, read_json, read_parquet

STUDY_FILE = "staleness.json"
"""The staleness study of a trace (``python -m profiler staleness``)."""

__all__ = ["SCHEMA_VERSION", "TABLES", "TRACE_KINDS", "Trace", "TraceError",
           "read_trace", "write_trace", "upgrade_manifest", "last_written", "weighted_staleness",
           "ADDED_COLUMNS", "STUDY_FILE"]

SCHEMA_VERSION = 2

TRACE_KINDS = ("captured", "synthetic")
"""captured: measured by ``python -m profiler capture``; synthetic: generated to
match published aggregates (a preset), never to be mistaken for a measurement."""

ADDED_COLUMNS: dict[tuple[str, str], tuple[int, float]] = {("steps", "k_scale"): (2, 1.0)}
"""(table, column) -> (the schema version that added it, its value in older traces)."""

OPTIONAL_TABLES = ("recovery",)
MANIFEST_KEYS = ("schema_version", "name", "kind", "description", "model", "layers",
                 "config", "lr_peak", "machine", "sources")
LAYER_KEYS = tuple(k for k, column in LAYER_SCHEMA.items() if not column.optional)
"""Required per layer (``layercheck.contract.traceschema.LAYER_SCHEMA``: every key's type and range)."""


@dataclass(frozen=True, kw_only=True)
class Trace:
    """A validated trace held in memory."""

    manifest: dict[str, Any]
    steps: pd.DataFrame
    drift: pd.DataFrame
    writes: pd.DataFrame
    recovery: pd.DataFrame | None = None
    drill: dict[str, Any] | None = None
    staleness: dict[str, Any] | None = None
    """The staleness study (``STUDY_FILE``, ``python -m profiler staleness``), where one ran."""
    costs: Calibration | None = None
    """The machine's calibration (costs.json), where one was measured."""

    def __post_init__(self) -> None:
        # A frame built by code written for an older schema lacks the newer columns.
        for (table, column), (_, value) in ADDED_COLUMNS.items():
            frame = getattr(self, table)
            if frame is not None and column not in frame.columns:
                object.__setattr__(self, table, frame.assign(**{column: value}))

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def layers(self) -> pd.DataFrame:
        """One row per layer: name, kind, params, bytes (in manifest order)."""
        return pd.DataFrame(self.manifest["layers"], columns=list(LAYER_KEYS))

    @property
    def layer_names(self) -> list[str]:
        return [layer["name"] for layer in self.manifest["layers"]]

    @property
    def layer_bytes(self) -> np.ndarray:
        return np.array([layer["bytes"] for layer in self.manifest["layers"]], dtype=np.int64)

    @property
    def budget_sizes(self) -> np.ndarray:
        """Bytes of one version of each layer as a write budget counts them: the
        recorded ``state_bytes`` where every layer has one, else ``bytes``."""
        layers = self.manifest["layers"]
        key = "state_bytes" if all("state_bytes" in layer for layer in layers) else "bytes"
        return np.array([layer[key] for layer in layers], dtype=np.int64)

    def k_scale(self) -> np.ndarray:
        """The write budget's factor on every threshold, per step (ones without a budget)."""
        return self.steps["k_scale"].to_numpy(dtype=np.float64)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def full_checkpoint_bytes(self) -> int:
        return int(self.layer_bytes.sum())

    def drift_matrix(self) -> np.ndarray:
        """d_l(t) as a steps x layers array (row t-1 is step t)."""
        return self._matrix("drift")

    def accumulator_matrix(self) -> np.ndarray:
        return self._matrix("accumulator")

    def lr_ratio(self) -> np.ndarray:
        """lr(t) / lr_peak per step: what the policy scales thresholds by
        (``policy.lr_ratio``: 1 where a step measured no LR)."""
        lr = self.steps["lr"].to_numpy(dtype=np.float64)
        return lr_ratio(lr, float(self.manifest["lr_peak"]))

    def write_matrix(self) -> np.ndarray:
        """Boolean steps x layers: True where the layer was written at that step."""
        out = np.zeros((self.num_steps, len(self.layer_names)), dtype=bool)
        out[self.writes["step"].to_numpy() - 1, self.writes["layer"].to_numpy()] = True
        return out

    def compute_seconds(self) -> np.ndarray:
        """Useful time per step: forward + backward + optimizer."""
        s = self.steps
        return (s["forward_s"] + s["backward_s"] + s["optimizer_s"]).to_numpy(dtype=np.float64)

    def weighted_staleness(self, written: np.ndarray | None = None) -> np.ndarray:
        """S(t) per step for this trace's writes (or ``written``): see ``weighted_staleness``."""
        written = self.write_matrix() if written is None else written
        return weighted_staleness(written, self.layers["params"].to_numpy(dtype=np.float64))

    def mean_weighted_staleness(self, written: np.ndarray | None = None) -> float:
        """The run's average S(t) from the base checkpoint on (the paper's "observed
        average staleness", and its matched-freshness interval); 0 without a base."""
        series = self.weighted_staleness(written)
        defined = series[~np.isnan(series)]
        return float(defined.mean()) if defined.size else 0.0

    def _matrix(self, column: str) -> np.ndarray:
        out = np.zeros((self.num_steps, len(self.layer_names)), dtype=np.float64)
        d = self.drift
        out[d["step"].to_numpy() - 1, d["layer"].to_numpy()] = d[column].to_numpy()
        return out


def last_written(written: np.ndarray) -> np.ndarray:
    """Steps x layers: the newest step at or before t that wrote layer l (0: none yet),
    from a steps x layers boolean write matrix (row t-1 is step t). A stack of
    them (..., steps, layers) gives a stack of answers."""
    written = np.asarray(written, dtype=bool)
    steps = np.arange(1, written.shape[-2] + 1)
    return np.maximum.accumulate(np.where(written, steps[:, None], 0), axis=-2)


def weighted_staleness(written: np.ndarray, params: np.ndarray) -> np.ndarray:
    """The one definition of staleness every part uses. Staleness of layer l at step t
    is t minus the newest step at or before t that wrote it (a write at t counts: a
    failure strikes after it). Weighted by parameters, S(t) = sum_l params_l *
    staleness_l(t) / sum_l params_l: the average age, in steps, of a parameter that a
    recovery at t would load. NaN before the base checkpoint (every layer written once).
    ``written`` may be a stack (..., steps, layers): one series per run."""
    last = last_written(written)
    steps = np.arange(1, last.shape[-2] + 1)
    params = np.asarray(params, dtype=np.float64)
    weights = params / params.sum() if params.sum() > 0 else np.full(len(params), 1 / len(params))
    out = (steps[:, None] - last) @ weights
    return np.where((last > 0).all(axis=-1), out, np.nan)


def upgrade_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Bring an older manifest to SCHEMA_VERSION (a copy; the tables are upgraded
    by ``read_trace``); a newer one is an error that says to upgrade layercheck."""
    version = manifest.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError(f"manifest.json: schema_version must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise TraceError(f"manifest.json: schema_version {version} is newer than this "
                         f"layercheck reads ({SCHEMA_VERSION}); upgrade layercheck")
    if version < 1:
        raise TraceError(f"manifest.json: schema_version {version} is not a trace version")
    # Version 2 added only a column (ADDED_COLUMNS) and an optional layer key.
    return {**manifest, "schema_version": SCHEMA_VERSION}


def read_trace(path: str | Path) -> Trace:
    """Load and validate the trace folder ``path`` (or its manifest.json)."""
    root = Path(path)
    if root.name == "manifest.json":
        root = root.parent
    if not root.exists():
        raise TraceError(f"{root}: no such trace folder")
    if not root.is_dir():
        raise TraceError(f"{root}: a trace is a folder holding manifest.json and Parquet tables")
    manifest, version = _read_manifest(root / "manifest.json")
    synthetic = manifest.get("kind") == "synthetic"
    tables = {name: _read_table(root, name, required=name not in OPTIONAL_TABLES, version=version,
                                synthetic=synthetic)
              for name in TABLES}
    drill = _read_json(root / "drill.json") if (root / "drill.json").exists() else None
    study = _read_json(root / STUDY_FILE) if (root / STUDY_FILE).exists() else None
    costs = None
    if (root / COSTS_FILE).exists():
        try:
            costs = read_calibration(root / COSTS_FILE)
        except CalibrationError as exc:
            raise TraceError(str(exc)) from None
    trace = Trace(manifest=manifest, steps=tables["steps"], drift=tables["drift"],
                  writes=tables["writes"], recovery=tables["recovery"], drill=drill, staleness=study,
                  costs=costs)
    _validate(trace, root)
    return trace


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Validate ``trace`` and write it to folder ``path`` (created; files replaced)."""
    root = Path(path)
    _validate(trace, root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(_jsonable(trace.manifest), indent=2) + "\n")
    for name in TABLES:
        frame = getattr(trace, name)
        if frame is None:
            continue
        columns = list(TABLES[name])
        frame[columns].to_parquet(root / f"{name}.parquet", index=False, compression="zstd")
    if trace.drill is not None:
        (root / "drill.json").write_text(json.dumps(_jsonable(trace.drill), indent=2) + "\n")
    if trace.staleness is not None:  # compact: it holds every held-out sequence's losses
        (root / STUDY_FILE).write_text(json.dumps(_jsonable(trace.staleness)) + "\n")
    if trace.costs is not None:
        write_calibration(trace.costs, root / COSTS_FILE)
    return root


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path, "study" if path.name == STUDY_FILE else "json")
    except RefusedFile as exc:
        raise TraceError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_manifest(path: Path) -> tuple[dict[str, Any], int]:
    """The manifest upgraded to SCHEMA_VERSION, and the version it was written with."""
    if not path.exists():
        raise TraceError(f"{path.parent}: not a trace (no manifest.json); "
                         "make one with `python -m profiler capture`")
    raw = _read_json(path)
    manifest = upgrade_manifest(raw)
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise TraceError(f"{path}: missing keys {missing}")
    return manifest, raw["schema_version"]


def _read_table(root: Path, name: str, *, required: bool, version: int,
                synthetic: bool) -> pd.DataFrame | None:
    path = root / f"{name}.parquet"
    if not path.exists():
        if required:
            raise TraceError(f"{path}: missing (a trace needs {', '.join(t for t in TABLES if t not in OPTIONAL_TABLES)})")
        return None
    try:
        frame = read_parquet(path)
    except RefusedFile as exc:
        raise TraceError(str(exc)) from None
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise TraceError(f"{path}: not a readable Parquet table ({type(exc).__name__}: {exc})") from None
    for (table, column), (added, value) in ADDED_COLUMNS.items():
        if table == name and version < added and column not in frame.columns:
            frame[column] = value
    missing = [c for c in TABLES[name] if c not in frame.columns]
    if missing:
        raise TraceError(f"{path}: missing columns {missing}; required: {list(TABLES[name])}")
    return check_table(frame, name, str(path), synthetic=synthetic)


def _validate(trace: Trace, root: Path) -> None:
    """Every table against its schema (``layercheck.contract.traceschema``), then the relations
    between them: steps 1..T, indices in range, one drift row per (step, layer)."""
    m = trace.manifest
    upgrade_manifest(m)
    if m.get("kind") not in TRACE_KINDS:
        raise TraceError(f"{root}/manifest.json: kind must be one of {TRACE_KINDS}, got {m.get('kind')!r}")
    check_layers(m.get("layers"), f"{root}/manifest.json")
    lr_peak = m.get("lr_peak")
    if isinstance(lr_peak, bool) or not isinstance(lr_peak, (int, float)) \
            or not math.isfinite(lr_peak) or lr_peak <= 0:
        raise TraceError(f"{root}/manifest.json: lr_peak must be a positive number, got {lr_peak!r}")
    for name in TABLES:
        frame = getattr(trace, name)
        if frame is not None:
            check_table(frame, name, f"{root}/{name}.parquet", synthetic=trace.kind == "synthetic")
    n_layers, steps = len(m["layers"]), trace.steps["step"].to_numpy()
    if len(steps) == 0 or not np.array_equal(steps, np.arange(1, len(steps) + 1)):
        raise TraceError(f"{root}/steps.parquet: steps must run 1, 2, ..., T without gaps")
    for name in ("drift", "writes", "recovery"):
        frame = getattr(trace, name)
        if frame is None or frame.empty:
            continue
        if name != "recovery":
            bad = ~frame["layer"].between(0, n_layers - 1)
            if bad.any():
                raise TraceError(f"{root}/{name}.parquet: layer index {int(frame['layer'][bad].iloc[0])} "
                                 f"outside 0..{n_layers - 1}")
        first = 0 if name == "recovery" else 1
        bad = ~frame["step"].between(first, len(steps))
        if bad.any():
            raise TraceError(f"{root}/{name}.parquet: step {int(frame['step'][bad].iloc[0])} "
                             f"outside {first}..{len(steps)}")
    _check_drift_grid(trace.drift, len(steps), n_layers, f"{root}/drift.parquet")


def _check_drift_grid(drift: pd.DataFrame, steps: int, layers: int, where: str) -> None:
    """One drift row per (step, layer): the replay reads d_l(t) for every one, and a
    missing row would read as no drift (an empty table recommended a setting)."""
    if len(drift) != steps * layers:
        raise TraceError(f"{where}: drift table: {len(drift)} rows; it needs one per (step, layer): "
                         f"{steps} steps x {layers} layers = {steps * layers}")
    key = (drift["step"].to_numpy() - 1) * layers + drift["layer"].to_numpy()
    seen = np.zeros(steps * layers, dtype=bool)
    first = np.unique(key, return_index=True)[1]
    seen[key[first]] = True
    if first.size < key.size:
        row = int(np.setdiff1d(np.arange(key.size), first)[0])
        raise TraceError(f"{where}: drift table, row {row}: step {int(drift['step'].iloc[row])}, "
                         f"layer {int(drift['layer'].iloc[row])} appears twice; the table needs "
                         "one row per (step, layer)")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value
