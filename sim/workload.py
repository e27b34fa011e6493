"""What the simulator needs from a training run: per-step compute, layer sizes, LayerCheck's writes.

A ``Workload`` comes from a trace (captured or synthetic) or from a few
numbers for a what-if question. It is one *job*: steps 1..N. The simulator runs
jobs back to back until its wall-clock window ends.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layercheck.trace import Trace

from .errors import SimError

__all__ = ["Workload"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One job's per-step costs. Arrays are read-only; index ``i - 1`` is step i."""

    name: str
    """Shown in reports (the trace or preset name, or ``custom``)."""
    compute_s: np.ndarray
    """Useful time per step: forward + backward + optimizer (seconds, > 0)."""
    full_bytes: int
    """A full checkpoint: weights + fp32 master + two Adam moments of every layer."""
    layercheck_bytes: np.ndarray | None = None
    """Bytes LayerCheck writes after each step (0 where it writes nothing); None
    without a trace (then LayerCheck cannot be simulated)."""
    staleness: float | None = None
    """LayerCheck's parameter-weighted average staleness over the run, in steps
    (the paper's matched-freshness interval); None without a trace."""
    kind: str = "custom"
    """captured, synthetic or custom."""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        compute = np.asarray(self.compute_s, dtype=np.float64)
        if compute.ndim != 1 or compute.size == 0:
            raise SimError(f"workload {self.name!r}: compute_s must be a non-empty 1-D array")
        if not np.all(np.isfinite(compute)) or (compute <= 0).any():
            raise SimError(f"workload {self.name!r}: every step needs a positive, finite compute "
                           "time (forward_s + backward_s + optimizer_s)")
        compute.setflags(write=False)
        object.__setattr__(self, "compute_s", compute)
        if not (isinstance(self.full_bytes, (int, np.integer)) and self.full_bytes > 0):
            raise SimError(f"workload {self.name!r}: full_bytes must be a positive integer")
        if self.layercheck_bytes is not None:
            writes = np.asarray(self.layercheck_bytes, dtype=np.float64)
            if writes.shape != compute.shape or (writes < 0).any():
                raise SimError(f"workload {self.name!r}: layercheck_bytes must hold one "
                               "non-negative entry per step")
            writes.setflags(write=False)
            object.__setattr__(self, "layercheck_bytes", writes)

    @property
    def steps(self) -> int:
        return int(self.compute_s.size)

    @property
    def has_trace(self) -> bool:
        return self.layercheck_bytes is not None

    @classmethod
    def custom(cls, *, iteration_s: float, iterations: int, full_bytes: int,
               name: str = "custom") -> "Workload":
        """A job of ``iterations`` equal steps of ``iteration_s`` seconds."""
        if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) \
                or iterations < 1:
            raise SimError(f"iterations={iterations!r} must be a positive integer")
        return cls(name=name, compute_s=np.full(int(iterations), float(iteration_s)),
                   full_bytes=int(full_bytes))

    @classmethod
    def from_trace(cls, trace: Trace) -> "Workload":
        """Compute per step from steps.parquet, layer bytes from the manifest, LayerCheck's
        writes from writes.parquet, staleness from the writes and the layer sizes."""
        layer_bytes = trace.layer_bytes
        per_step = np.zeros(trace.num_steps, dtype=np.float64)
        writes = trace.writes
        np.add.at(per_step, writes["step"].to_numpy() - 1, writes["bytes"].to_numpy(np.float64))
        params = trace.layers["params"].to_numpy(dtype=np.float64)
        return cls(name=trace.name, compute_s=trace.compute_seconds(),
                   full_bytes=int(layer_bytes.sum()), layercheck_bytes=per_step,
                   staleness=weighted_staleness(trace.write_matrix(), params),
                   kind=trace.kind, meta={"layers": len(layer_bytes),
                                          "layer_writes": int(len(writes))})


def weighted_staleness(written: np.ndarray, params: np.ndarray) -> float:
    """Mean over steps of the parameter-weighted staleness, counted from the first
    step at which every layer has a saved copy (the base checkpoint); 0 if none."""
    steps, layers = written.shape
    covered = np.maximum.accumulate(written, axis=0).all(axis=1)
    if not covered.any():
        return 0.0
    start = int(np.argmax(covered))
    idx = np.where(written, np.arange(1, steps + 1)[:, None], 0)
    last = np.maximum.accumulate(idx, axis=0)[start:]
    age = np.arange(start + 1, steps + 1)[:, None] - last
    weights = params / params.sum() if params.sum() > 0 else np.full(layers, 1.0 / layers)
    return float((age @ weights).mean())
