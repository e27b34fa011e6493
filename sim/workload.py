"""What the simulator needs from a training run: per-step compute, layer sizes, LayerCheck's writes.

A ``Workload`` comes from a trace (captured or synthetic) or from a few
numbers for a what-if question. It is one *job*: steps 1..N. The simulator runs
jobs back to back until its wall-clock window ends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from layercheck.contract.decision import lr_ratio, policy_for
from layercheck.contract.trace import Trace, last_written
from layercheck.contract.policy import Policy

from .errors import SimError
from .nextwrites import next_writes
from .units import DURATION_RANGE, MAX_DURATION_S, MIN_DURATION_S
from .workbound import check_job_steps

__all__ = ["Workload", "LayerWrites", "warmup_from"]


@dataclass(frozen=True, kw_only=True)
class LayerWrites:
    """Which layer LayerCheck wrote at which step, and the layers' sizes (from a trace)."""

    written: np.ndarray
    """Boolean steps x layers: row t-1 is step t."""
    nbytes: np.ndarray
    """Bytes of one version of each layer (weights + Adam moments)."""
    params: np.ndarray
    """Parameters of each layer (the weights of staleness)."""
    interval: int = 1
    """LayerCheck's checkpoint interval: its training state commits every ``interval`` steps."""
    restarted: np.ndarray | None = None
    """(N+1) x layers: the step each layer is next written at after its accumulator was
    reset at step s (``layercheck.contract.resumed.next_writes``; N + 1: not in the job):
    followed from a restore, the writes of the run resumed there. None where the
    drift is not known (then a resumed run is taken to write as the uninterrupted one)."""

    def __post_init__(self) -> None:
        written = np.asarray(self.written, dtype=bool)
        nbytes = np.asarray(self.nbytes, dtype=np.float64)
        params = np.asarray(self.params, dtype=np.float64)
        if written.ndim != 2 or nbytes.shape != (written.shape[1],) or params.shape != nbytes.shape:
            raise SimError("layer writes: written must be steps x layers, with one size and one "
                           "parameter count per layer")
        if (nbytes < 0).any() or (params < 0).any():
            raise SimError("layer writes: sizes and parameter counts must be >= 0")
        if isinstance(self.interval, bool) or not isinstance(self.interval, (int, np.integer)) \
                or self.interval < 1:
            raise SimError(f"layer writes: interval={self.interval!r} must be an integer >= 1")
        arrays = {"written": written, "nbytes": nbytes, "params": params}
        if self.restarted is not None:
            restarted = np.asarray(self.restarted, dtype=np.int64)
            steps = written.shape[0]
            if restarted.shape != (steps + 1, written.shape[1]) or (
                    restarted <= np.arange(steps + 1)[:, None]).any() or (restarted > steps + 1).any():
                raise SimError("layer writes: restarted must be (steps + 1) x layers, each "
                               "row s holding steps in s+1 .. steps+1")
            arrays["restarted"] = restarted
        for name, value in arrays.items():
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @classmethod
    def from_trace(cls, trace: Trace) -> "LayerWrites":
        """The recorded setting's writes on the trace's layers (``replayed``, at the
        recorded run's budget factor)."""
        return cls.replayed(trace, policy_for(trace), trace.write_matrix(), trace.k_scale())

    @classmethod
    def replayed(cls, trace: Trace, policy: Policy, written: np.ndarray,
                 k_scale: np.ndarray) -> "LayerWrites":
        """The writes ``written`` that ``policy`` decided on the trace's drift (``k_scale``:
        its budget factor per step), on the trace's layers, with the writes of its runs
        resumed after a restore (``next_writes`` on the same drift)."""
        return cls(written=written, nbytes=trace.layer_bytes,
                   params=trace.layers["params"].to_numpy(dtype=np.float64),
                   interval=policy.interval,
                   restarted=next_writes(policy, trace.drift_matrix(), lr_ratio(trace), k_scale))

    @property
    def steps(self) -> int:
        return int(self.written.shape[0])

    @cached_property
    def bytes_per_step(self) -> np.ndarray:
        return self.written @ self.nbytes

    @cached_property
    def last(self) -> np.ndarray:
        """(N+1) x layers: the newest step <= position i that wrote each layer (row 0: zeros)."""
        last = last_written(self.written)
        return np.vstack([np.zeros((1, last.shape[1]), dtype=last.dtype), last])

    @property
    def weights(self) -> np.ndarray:
        total = self.params.sum()
        return self.params / total if total > 0 else np.full(len(self.params), 1 / len(self.params))

    @cached_property
    def base_step(self) -> int | None:
        """The first step at which every layer has a saved copy (the base checkpoint)."""
        covered = (self.last[1:] > 0).all(axis=1)
        return int(np.argmax(covered)) + 1 if covered.any() else None

    @cached_property
    def staleness(self) -> float:
        """Mean parameter-weighted staleness from the base on (``layercheck.contract.trace``'s definition)."""
        if self.base_step is None:
            return 0.0
        steps = np.arange(self.base_step, self.steps + 1)
        return float(((steps[:, None] - self.last[steps]) @ self.weights).mean())

    def commits(self) -> np.ndarray:
        """Boolean per position 0..N: LayerCheck commits its training state after step i
        (every ``interval`` steps from the base checkpoint on)."""
        out = np.zeros(self.steps + 1, dtype=bool)
        if self.base_step is not None:
            at = np.arange(self.base_step, self.steps + 1)
            out[at[at % self.interval == 0]] = True
        return out


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One job's per-step costs. Arrays are read-only; index ``i - 1`` is step i."""

    name: str
    """Shown in reports (the trace or preset name, or ``custom``)."""
    compute_s: np.ndarray
    """Useful time per step: forward + backward + optimizer (seconds, > 0)."""
    full_bytes: int
    """A full checkpoint: weights + fp32 master + two Adam moments of every layer."""
    layers: LayerWrites | None = None
    """LayerCheck's writes; None without a trace (then LayerCheck cannot be simulated)."""
    kind: str = "custom"
    """captured, synthetic or custom."""
    meta: dict[str, Any] = field(default_factory=dict)
    warmup_s: float = 0.0
    """What a restarted process's first step costs beyond a steady one: a fresh process
    pays its first forward and backward again (allocator, lazy initialisation, caches).
    From a capture, whose step 1 is a fresh process's first step (``warmup_from``); 0 for
    synthetic and custom jobs, whose steps are all alike. Charged to every recovery that
    resumes past the job's start (``Strategy.schedule``); a resume at the start re-runs
    step 1, whose compute already holds it."""
    trace: Trace | None = field(default=None, repr=False, compare=False)
    """The trace the job was read from (``from_trace``): its drift lets the fair
    comparison re-decide LayerCheck's writes under other settings. None for a custom job."""

    def __post_init__(self) -> None:
        compute = np.asarray(self.compute_s, dtype=np.float64)
        if compute.ndim != 1 or compute.size == 0:
            raise SimError(f"workload {self.name!r}: compute_s must be a non-empty 1-D array")
        if not ((compute >= MIN_DURATION_S) & (compute <= MAX_DURATION_S)).all():
            raise SimError(f"workload {self.name!r}: every step needs a compute time (forward_s "
                           f"+ backward_s + optimizer_s) from {DURATION_RANGE}")
        check_job_steps(compute.size, f"workload {self.name!r}")
        compute.setflags(write=False)
        object.__setattr__(self, "compute_s", compute)
        if not (isinstance(self.full_bytes, (int, np.integer)) and self.full_bytes > 0):
            raise SimError(f"workload {self.name!r}: full_bytes must be a positive integer")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise SimError(f"workload {self.name!r}: warmup_s={self.warmup_s!r} must be a "
                           "finite number of seconds >= 0")
        if self.layers is not None and self.layers.steps != compute.size:
            raise SimError(f"workload {self.name!r}: the layer writes cover {self.layers.steps} "
                           f"steps, the job has {compute.size}")

    @property
    def steps(self) -> int:
        return int(self.compute_s.size)

    @property
    def has_trace(self) -> bool:
        return self.layers is not None

    @property
    def staleness(self) -> float | None:
        """LayerCheck's mean parameter-weighted staleness (the matched-freshness interval)."""
        return None if self.layers is None else self.layers.staleness

    @classmethod
    def custom(cls, *, iteration_s: float, iterations: int, full_bytes: int,
               name: str = "custom") -> "Workload":
        """A job of ``iterations`` equal steps of ``iteration_s`` seconds."""
        if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) \
                or iterations < 1:
            raise SimError(f"iterations={iterations!r} must be a positive integer")
        check_job_steps(int(iterations), f"iterations={iterations}: a job")
        return cls(name=name, compute_s=np.full(int(iterations), float(iteration_s)),
                   full_bytes=int(full_bytes))

    @classmethod
    def from_trace(cls, trace: Trace) -> "Workload":
        """Compute per step from steps.parquet, layer sizes from the manifest, LayerCheck's
        writes from writes.parquet."""
        layers = LayerWrites.from_trace(trace)
        return cls(name=trace.name, compute_s=trace.compute_seconds(),
                   full_bytes=int(trace.full_checkpoint_bytes), layers=layers, kind=trace.kind,
                   meta={"layers": len(layers.nbytes), "layer_writes": int(layers.written.sum())},
                   warmup_s=warmup_from(trace), trace=trace)


def warmup_from(trace: Trace) -> float:
    """A captured trace's restart warm-up (``Workload.warmup_s``): its step 1's forward and
    backward beyond their medians over the steps after it. The optimizer's first step is
    left out: it allocates Adam's moments, which a restored process loads instead. 0 for
    a synthetic trace (its steps are modelled alike) or a job of one step."""
    steps = trace.steps
    if trace.kind != "captured" or len(steps) < 2:
        return 0.0
    passes = (steps["forward_s"] + steps["backward_s"]).to_numpy(dtype=np.float64)
    return max(0.0, float(passes[0] - np.median(passes[1:])))

